"""One base for the records kdtree writes, verify's and bench's, and the one place a record's kind is
told: the kind that names each, the meta block (kdtr.records.report.record_meta: the command, the
code, the machine; `meta.format` the layout's version) and reading one back from JSON, with one line
naming the file for anything that is not one. Every reader (`report`, `--merge`, `--html`,
`--compare`, `--balance-from`) goes through `record_kind`; `load_any` gives the record of whichever
kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Iterable, Mapping

from ..errors import UsageError
from ..runtime.gpu_identity import check_ceilings

RECORD_FORMAT = 1                  # meta.format this kdtree writes, and the newest it reads
VERIFY_KIND = "kdtree.verify"
BENCH_KIND = "kdtree.bench"
KINDS = {VERIFY_KIND: "verify", BENCH_KIND: "bench"}      # kind -> how a message names it


def record_kind(data: Any, file: str | Path | None = None, kinds: Iterable[str] = tuple(KINDS)) -> str:
    """The kind of a record's JSON when it is one of `kinds` and its meta block, which every kind
    shares, is one this kdtree reads: meta.format at most RECORD_FORMAT (records before meta.format
    read as 1), the ceilings of meta.gpu (where a bench run measured them) positive numbers.
    UsageError naming the file and the field otherwise."""
    kinds = tuple(kinds)
    kind = data.get("kind") if isinstance(data, Mapping) else type(data).__name__
    if not isinstance(data, Mapping) or kind not in kinds:
        wanted = " or ".join(KINDS[k] for k in kinds)
        raise UsageError(f"not a kdtree {wanted} record (kind {kind!r})" if len(kinds) == 1
                         else f"not a {wanted} record (kind {kind!r})", file=file)
    meta = data.get("meta", {})
    layout = meta.get("format", 1) if isinstance(meta, Mapping) else 1
    if isinstance(layout, bool) or not isinstance(layout, int) or layout < 1:
        raise UsageError(f"{layout!r} is not a record format (a whole number from 1)", file=file, field="meta.format")
    if layout > RECORD_FORMAT:
        raise UsageError(f"record format {layout}, written by a newer kdtree; this one reads formats up to "
                         f"{RECORD_FORMAT}", file=file, field="meta.format")
    gpu = meta.get("gpu") if isinstance(meta, Mapping) else None
    if isinstance(gpu, Mapping) and gpu.get("ceilings") is not None:
        try:
            check_ceilings(gpu["ceilings"], "meta.gpu.ceilings")
        except UsageError as err:
            raise UsageError(err.message, file=file, field=err.field) from None
    return kind


def read_json(path: str | Path, what: str = "record") -> Any:
    """The JSON at `path`; UsageError naming the file when it cannot be read or is not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise UsageError(f"cannot read a {what}: {err.strerror or err}", file=path) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"not JSON: {err}", file=path) from None


class Record:
    """What VerifyRecord and BenchRecord share (each a frozen dataclass with a `meta` field and a
    `from_plain(data, file)`): `KIND` (the JSON's "kind"), `format`, `check_kind`, `read_json`,
    `load`. Each kind registers itself in `Record.by_kind` as its class is defined."""

    KIND: ClassVar[str]
    LABEL: ClassVar[str]               # how a message names it: "verify", "bench"
    by_kind: ClassVar[dict[str, type["Record"]]] = {}
    meta: dict[str, Any]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "KIND" in cls.__dict__:
            Record.by_kind[cls.KIND] = cls

    @property
    def format(self) -> int:
        """The record layout's version (meta.format, written by every record since the first)."""
        return int(self.meta.get("format", 1))

    @classmethod
    def check_kind(cls, data: Any, file: str | Path | None = None) -> Mapping[str, Any]:
        """`data` itself when it is a record of this kind; UsageError naming the file otherwise."""
        record_kind(data, file, (cls.KIND,))
        return data

    @classmethod
    def read_json(cls, path: str | Path) -> Any:
        """The JSON at `path`; UsageError naming the file when it cannot be read or is not JSON."""
        return read_json(path, f"{cls.LABEL} record")

    @classmethod
    def load(cls, path: str | Path):
        """The record at `path` (UsageError naming the file and the field at fault); each kind
        defines `from_plain(data, file)`."""
        return cls.from_plain(cls.read_json(path), path)


def load_any(path: str | Path, kinds: Iterable[str] = tuple(KINDS)) -> Record:
    """The record at `path`, of whichever of `kinds` it is, through that kind's own `load` (a bench
    record with its samples sidecar). The kinds' classes must have been imported (kdtr.verify,
    kdtr.bench): this module sits below them and imports neither."""
    kind = record_kind(read_json(path), path, kinds)
    return Record.by_kind[kind].load(path)

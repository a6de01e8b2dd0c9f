"""One base for the records kdtree writes, verify's and bench's: the kind that names each, the meta
block (kdtr.records.report.record_meta: the command, the code, the machine; `meta.format` the layout's
version) and reading one back from JSON, with one line naming the file for anything that is not one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Mapping

from ..errors import UsageError


class Record:
    """What VerifyRecord and BenchRecord share (each a frozen dataclass with a `meta` field and a
    `from_plain(data, file)`): `KIND` (the JSON's "kind"), `format`, `check_kind`, `read_json`, `load`."""

    KIND: ClassVar[str]
    LABEL: ClassVar[str]               # how a message names it: "verify", "bench"
    meta: dict[str, Any]

    @property
    def format(self) -> int:
        """The record layout's version (meta.format, written by every record since the first)."""
        return int(self.meta.get("format", 1))

    @classmethod
    def check_kind(cls, data: Any, file: str | Path | None = None) -> Mapping[str, Any]:
        """`data` itself when it is a record of this kind; UsageError naming the file otherwise."""
        if not isinstance(data, Mapping) or data.get("kind") != cls.KIND:
            kind = data.get("kind") if isinstance(data, Mapping) else type(data).__name__
            raise UsageError(f"not a kdtree {cls.LABEL} record (kind {kind!r})", file=file)
        return data

    @classmethod
    def read_json(cls, path: str | Path) -> Any:
        """The JSON at `path`; UsageError naming the file when it cannot be read or is not JSON."""
        try:
            return json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as err:
            raise UsageError(f"cannot read a {cls.LABEL} record: {err.strerror or err}", file=path) from None
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise UsageError(f"not JSON: {err}", file=path) from None

    @classmethod
    def load(cls, path: str | Path):
        """The record at `path` (UsageError naming the file and the field at fault); each kind
        defines `from_plain(data, file)`."""
        return cls.from_plain(cls.read_json(path), path)

"""What verify writes: one row per case and implementation (`VerifyRow`), the record of a run
(`VerifyRecord`), and the joining of shards' records (`merge_verify`)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from ..scaleout import parallel
from ..records import report
from ..bundle.case import GOLDEN
from ..ops.compare import OutputCheck
from ..errors import UsageError
from ..bundle.format import MAGIC, PREAMBLE
from ..records.record import VERIFY_KIND, Record

if TYPE_CHECKING:        # kdtr.impl is imported where --impl / --against use it, not at start-up
    from ..impl import Implementation

REFERENCE = "reference"


DEVICE_REFERENCE = "reference (float64, cuda)"
# What a row's outputs were compared with. A trial row (fresh inputs) is always compared with a
# reference computed here; it keeps the default (GOLDEN: the numpy reference, the math that made the
# golden) unless the device reference computed it, so CPU records stay as they were.


EXPECTED = {GOLDEN: "the bundle's stored outputs (exact numpy reference at gen-refs time)",
            REFERENCE: "computed by verify with the numpy reference (the bundle stores no golden)",
            DEVICE_REFERENCE: "computed by verify with the op's float64 torch reference on the GPU "
                              "(bench_reference; trials, or a bundle without a golden)"}


@dataclass(frozen=True)
class VerifyRow:
    """One case (trial 0: the golden's own inputs; trial t > 0: fresh inputs from the generator)."""

    case: str
    file: str
    op: str
    variant: str
    backend: str
    config: dict[str, int]
    passed: bool
    outputs: tuple[OutputCheck, ...] = ()
    error: str | None = None           # why the case could not be compared at all
    trial: int = 0
    seed: int | None = None
    seconds: float = 0.0
    deterministic: bool | None = None  # two runs bitwise equal (None: not probed)
    loosened: bool = False             # some output's tolerance is looser than the op's default
    impl: str | None = None            # the implementation that ran (--impl), or that captured the outputs
    expected_from: str = GOLDEN        # what the outputs were compared with (see EXPECTED; trials too)
    captured: bool = False             # the outputs compared are the bundle's captured ones, not a run
    skipped: str | None = None         # why the implementation could not run here (not a pass)
    not_compared: tuple[str, ...] = ()  # outputs the implementation does not give
    parity: dict[str, Any] | None = None   # --against: kdtr.impl.ParityReport.to_json(), or {"reason"}
    invariance: dict[str, Any] | None = None   # --invariance: kdtr.verify.invariance.to_plain()

    def to_plain(self) -> dict[str, Any]:
        """JSON form; optional fields at their default (no error, trial 0, not probed, not loosened,
        no impl, ...) are left out."""
        full = {"case": self.case, "file": self.file, "op": self.op, "variant": self.variant,
                "backend": self.backend, "config": dict(self.config), "passed": self.passed,
                "outputs": [o.to_plain() for o in self.outputs], "error": self.error, "trial": self.trial,
                "seed": self.seed, "seconds": round(self.seconds, 6), "deterministic": self.deterministic,
                "loosened": self.loosened, "impl": self.impl, "expected_from": self.expected_from,
                "captured": self.captured, "skipped": self.skipped, "not_compared": list(self.not_compared),
                "parity": self.parity, "invariance": self.invariance}
        return report.drop_defaults(full, {"error": None, "trial": 0, "seed": None, "deterministic": None,
                                           "loosened": False, "impl": None, "expected_from": GOLDEN,
                                           "captured": False, "skipped": None, "not_compared": [],
                                           "parity": None, "invariance": None})

    @staticmethod
    def from_plain(data: dict[str, Any]) -> "VerifyRow":
        """The inverse of to_plain; KeyError/TypeError/ValueError if malformed."""
        return VerifyRow(str(data["case"]), str(data["file"]), str(data["op"]), str(data["variant"]),
                         str(data["backend"]), dict(data["config"]), bool(data["passed"]),
                         tuple(OutputCheck.from_plain(o) for o in data["outputs"]), data.get("error"),
                         int(data.get("trial", 0)), data.get("seed"), float(data["seconds"]),
                         data.get("deterministic"), bool(data.get("loosened", False)), data.get("impl"),
                         str(data.get("expected_from", GOLDEN)), bool(data.get("captured", False)),
                         data.get("skipped"), tuple(map(str, data.get("not_compared", ()))),
                         data.get("parity"), data.get("invariance"))

    @property
    def failed(self) -> bool:
        """It ran (or was to be compared) and did not pass; a skipped row neither passed nor failed."""
        return not self.passed and self.skipped is None

    def worst(self, metric: str) -> float:
        values = [getattr(o, metric) for o in self.outputs if not o.tolerance.exact]
        values += [getattr(o, metric) for o in self.outputs if o.tolerance.exact and not o.passed]
        return max(values, default=0.0)

    @property
    def mismatches(self) -> int:
        return sum(o.mismatches for o in self.outputs)


def shard_key(path: str | Path) -> str:
    """goldens/<op>/<case>.kdtr -> "<op>/<case>", the key gen-refs shards cases by."""
    path = Path(path)
    return f"{path.parent.name}/{path.stem}"


def bundle_prints(files: Iterable[str | Path]) -> list[tuple[str, str]]:
    """Each bundle's shard key and the header crc32 of its preamble (which covers its meta and every
    tensor's crc32), read without the tensors; sorted. What a record keeps of its shard's bundles
    (meta `bundles`) and what the suite digest is made of."""
    prints = []
    for key, path in sorted((shard_key(f), Path(f)) for f in files):
        try:
            with open(path, "rb") as handle:
                head = handle.read(PREAMBLE.size)
        except OSError:
            head = b""
        if len(head) == PREAMBLE.size and head.startswith(MAGIC):
            _, _, _, header_len, header_crc, _ = PREAMBLE.unpack(head)
            prints.append((key, f"{header_len}:{header_crc:08x}"))
        else:
            prints.append((key, "unreadable"))          # verify reports the bundle itself
    return prints


def suite_digest(files: Iterable[str | Path]) -> str:
    """sha256 over the selected bundles (before sharding), their `bundle_prints`. Shards of one
    selection of one golden set share it; a shard of another one does not."""
    return prints_digest(bundle_prints(files))


def prints_digest(prints: Iterable[tuple[str, str]]) -> str:
    digest = hashlib.sha256()
    for key, fingerprint in sorted(prints):
        # surrogateescape: a file name that is not UTF-8 still has bytes to digest
        digest.update(f"{key}\0{fingerprint}\n".encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


@dataclass(frozen=True)
class VerifyRecord(Record):
    """What `verify --json` writes and `report --merge` joins: meta (with `shard` and `suite_sha256`),
    the rows, the bundles that could not be read, and (cuda runs) the kernels loaded."""

    KIND = VERIFY_KIND
    LABEL = "verify"

    meta: dict[str, Any]
    rows: tuple[VerifyRow, ...]
    errors: tuple[str, ...] = ()
    kernels: tuple[dict[str, Any], ...] | None = None
    not_run: tuple[str, ...] = ()     # bundles no given implementation serves (--impl)

    @property
    def summary(self) -> dict[str, Any]:
        """Counts; `skipped` and `not_run` only where there are some (--impl runs)."""
        skipped = sum(r.skipped is not None for r in self.rows)
        return {"cases": len(self.rows), "passed": sum(r.passed for r in self.rows),
                "failed": sum(r.failed for r in self.rows), **({"skipped": skipped} if skipped else {}),
                **({"not_run": len(self.not_run)} if self.not_run else {}), "errors": list(self.errors)}

    def to_plain(self) -> dict[str, Any]:
        return {"kind": VERIFY_KIND, "meta": self.meta, "summary": self.summary,
                "rows": [row.to_plain() for row in self.rows], "errors": list(self.errors),
                "kernels": None if self.kernels is None else list(self.kernels), "not_run": list(self.not_run)}

    @staticmethod
    def from_plain(data: Any, file: str | Path | None = None) -> "VerifyRecord":
        """A record read back; UsageError naming the file and the field at fault."""
        VerifyRecord.check_kind(data, file)
        field = "meta"
        try:
            meta = dict(data["meta"])
            rows = []
            for index, row in enumerate(data["rows"]):
                field = f"rows[{index}]"
                rows.append(VerifyRow.from_plain(row))
            field = "errors"
            errors = tuple(str(e) for e in data["errors"])
            kernels = data.get("kernels")
            field = "not_run"
            not_run = tuple(str(e) for e in data.get("not_run", ()))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise UsageError(f"malformed verify record: {type(err).__name__}: {err}", file=file,
                             field=field) from None
        return VerifyRecord(meta, tuple(rows), errors, None if kernels is None else tuple(kernels), not_run)


def verify_record(rows: Iterable[VerifyRow], errors: Iterable[str], *, suite: str,
                  shard: Any = None, kernels: Iterable[dict] | None = None,
                  command: str = "verify", not_run: Iterable[str] = (),
                  implementations: Mapping[str, dict] | None = None,
                  bundles: Iterable[tuple[str, str]] | None = None) -> VerifyRecord:
    """A run's record; `shard` is a parallel.Shard (None: the whole selection, "1/1");
    `implementations` (--impl, --against): name -> what `implementation_info` says of it;
    `bundles`: the `bundle_prints` of this shard's bundles (`report --merge` checks them)."""
    meta = report.record_meta(command) | {
        "shard": parallel.Shard.label(shard), "suite_sha256": suite}
    if bundles is not None:
        meta["bundles"] = [list(pair) for pair in bundles]
    if implementations:
        meta["implementations"] = dict(implementations)
    return VerifyRecord(meta, tuple(rows), tuple(errors), None if kernels is None else tuple(kernels),
                        tuple(not_run))


def implementation_info(impl: Implementation) -> dict[str, Any]:
    """What a record keeps of an implementation: its versions() and why it cannot run here (if so)."""
    return {"versions": impl.versions(), "unavailable": impl.unavailable(), "doc": impl.doc}


def load_verify(path: str | Path) -> VerifyRecord:
    return VerifyRecord.load(report.portable(path))


def check_bundles(records: list[VerifyRecord], labels: list[str]) -> list[str]:
    """Why the shards' own bundles do not make up the suite their digest names (empty: they do):
    each record lists its shard's bundles (meta `bundles`); together they must give the suite
    digest back, none in two shards, each (name-hash split) in the shard its name hashes to, and
    each row of a bundle its record lists. A record's meta alone (its shard, its digest) can be
    copied or edited; the bundles its rows come from are checked here."""
    problems: list[str] = []
    owner: dict[str, str] = {}
    union: list[tuple[str, str]] = []
    for label, record in zip(labels, records):
        listed = record.meta.get("bundles")
        if not isinstance(listed, list) or not all(isinstance(p, list) and len(p) == 2 for p in listed):
            problems.append(f"{label}: no list of its bundles in its meta (re-run it with this kdtree)")
            continue
        prints = [(str(key), str(fingerprint)) for key, fingerprint in listed]
        shard = parallel.Shard.parse(record.meta["shard"].partition("@")[0])
        hashed = "@" not in record.meta["shard"]
        for key, _ in prints:
            if key in owner:
                problems.append(f"{label}: {key} is also in {owner[key]}")
            elif hashed and not shard.owns(key):
                problems.append(f"{label}: {key} is not a bundle of shard {record.meta['shard']}")
            owner.setdefault(key, label)
        keys = {key for key, _ in prints}
        strays = sorted({shard_key(row.file) for row in record.rows} - keys)
        if strays:
            problems.append(f"{label}: rows of {', '.join(strays[:3])}{' …' if len(strays) > 3 else ''}, "
                            "not among its bundles")
        union += prints
    if not problems and prints_digest(union) != records[0].meta["suite_sha256"]:
        problems.append("the shards' bundles together are not the suite their digest names "
                        "(a bundle missing, or another golden set)")
    return problems


def merge_verify(paths: Iterable[str | Path]) -> VerifyRecord:
    """One record from the records of every shard of one run, rows in input order; a duplicate,
    missing or foreign shard is a UsageError listing each problem. meta.shards says what it joined."""
    paths = list(paths)
    records = [load_verify(p) for p in paths]
    labels = [report.portable(p) for p in paths]
    problems = report.check_shards([r.meta for r in records], labels) or check_bundles(records, labels)
    if problems:
        raise UsageError("cannot merge: " + "; ".join(problems))
    meta = report.record_meta("report --merge") | {
        "shard": "1/1", "suite_sha256": records[0].meta["suite_sha256"],
        "shards": [r.meta["shard"] for r in records], "merged_from": [r.meta for r in records]}
    kernels = [k for r in records for k in (r.kernels or ())]
    return VerifyRecord(meta, tuple(row for r in records for row in r.rows),
                        tuple(e for r in records for e in r.errors),
                        tuple(kernels) if any(r.kernels is not None for r in records) else None,
                        tuple(e for r in records for e in r.not_run))

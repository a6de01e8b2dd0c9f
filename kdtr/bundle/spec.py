"""YAML suites -> validated cases.

A suite is one YAML file for one op:

```yaml
op: verify_attn            # required; a registered op
variant: fp32              # default variant of every case (default: the op's first variant)
seed: 1234                 # base seed, int in [0, MAX_SEED] (default 0)
defaults: {heads: 16}      # params applied to every case
tolerance: {out: {atol: 1e-5, rtol: 1e-4}, lse: exact}   # per-output overrides for all cases
cases:                     # explicit cases: params plus the reserved keys of CASE_KEYS
  - name: my_case          #   optional; else op.case_name(variant, params)
    variant: bf16_paged    #   optional
    seed: 7                #   optional; else derive_seed(suite seed, case name)
    tolerance: {...}       #   optional; per output, replaces the suite's entry for that output
    inputs: {logits: [[...]]}  # optional inline inputs (names in op.inline_inputs)
    heads: 8               #   anything else is a param
sweep:                     # optional cartesian product (last key varies fastest); may sweep `variant`
  heads: [8, 16]
```

Params merge as: the op's Param defaults < `defaults` < the case (or the sweep's combination). The file
is composed (never constructed) with a safe loader, then walked here so that every value keeps the
1-based line of its node: every SpecError names the file, the line and the field path
(`cases[3].budget`, `sweep.heads[1]`). Duplicate mapping keys, which YAML's safe_load silently
collapses, are errors. Floats follow YAML 1.2 (`1e-5` is a float, not YAML 1.1's string).

Seeds: a case without `seed` gets `derive_seed(suite_seed, name)` =
`zlib.crc32(f"{suite_seed}:{name}".encode("utf-8"))`, a 32-bit value that depends only on the suite's
seed and the case's name (adding, removing or reordering other cases changes nothing).
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import math
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from ..dtypes import NUMPY_DTYPES
from ..errors import SpecError
from ..ops import get_op, op_names
from ..ops.base import Case, Op, Param, Tolerance
from .yamldoc import Doc, decode_suite, read_suite_bytes

MAX_SWEEP_CASES = 100_000         # cases one sweep may generate
MAX_NAME_LEN = 200                # a case name is a file stem
MAX_SEED = 2**63 - 1              # seeds are stored as int64 in bundles

TOP_KEYS = ("op", "variant", "seed", "defaults", "tolerance", "cases", "sweep")
CASE_KEYS = ("name", "variant", "seed", "tolerance", "inputs")   # reserved inside a case
SUITE_SUFFIXES = (".yaml", ".yml")
DEFAULT_SPECS = Path("specs")     # gen-refs without arguments: the suites directly in it

_NAME_RE = re.compile(r"[A-Za-z0-9_.-]+")
NAME_RULE = f"a safe file stem ([A-Za-z0-9_.-], not starting with '.', at most {MAX_NAME_LEN} characters)"


Lookup = Callable[[str], Op]


@dataclass(frozen=True)
class Suite:
    path: Path
    op: str
    sha256: str                   # of the file's bytes
    cases: tuple[Case, ...]


# -- public API ---------------------------------------------------------------------------------

def derive_seed(suite_seed: int, name: str) -> int:
    """The seed of a case that gives none: crc32 of "<suite seed>:<case name>" (UTF-8)."""
    return zlib.crc32(f"{suite_seed}:{name}".encode("utf-8"))


def load_suite(path: str | os.PathLike, *, lookup: Lookup = get_op) -> Suite:
    """Read and validate one suite; every problem is a SpecError naming file, line and field."""
    return _load(Path(path), lookup)[0]


def load_suites(paths: Iterable[str | os.PathLike] | str | os.PathLike, *,
                lookup: Lookup = get_op) -> list[Suite]:
    """Load files and directories (a directory: the *.yaml / *.yml files directly in it, sorted,
    hidden ones skipped; subfolders are other collections, e.g. specs/bench/, and are not read).

    A file named twice is loaded once. Two cases of the same op with the same name, in different
    suites, are an error (their goldens would overwrite each other).
    """
    seen: dict[tuple[str, str], str] = {}
    suites = []
    for file in _expand(paths):
        suite, origins = _load(file, lookup)
        for case in suite.cases:   # names are unique within a suite: a repeat is from another
            key = (suite.op, case.name)
            if key in seen:
                field, line = origins[case.name]
                raise SpecError(f"duplicate case name {case.name!r} for op {suite.op} "
                                f"(also defined at {seen[key]})", file=file, line=line, field=field)
            seen[key] = case.source or str(file)
        suites.append(suite)
    return suites


def name_matches(name: str, pattern: str | None) -> bool:
    """The `-k` rule: None matches all; a pattern with `*` or `?` is a glob over the whole name
    (`*` any run, `?` one character, nothing else special); otherwise a substring. Case-sensitive."""
    if pattern is None:
        return True
    if "*" in pattern or "?" in pattern:
        regex = "".join(".*" if ch == "*" else "." if ch == "?" else re.escape(ch) for ch in pattern)
        return re.fullmatch(regex, name) is not None
    return pattern in name


def select(cases: Iterable[Case], pattern: str | None) -> list[Case]:
    """The cases whose names match the `-k` pattern (see name_matches)."""
    return [c for c in cases if name_matches(c.name, pattern)]


# -- reading and composing ----------------------------------------------------------------------

def _expand(paths: Iterable[str | os.PathLike] | str | os.PathLike) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files, seen = [], set()
    for given in map(Path, paths):
        if given.is_dir():
            found = sorted(f for f in given.iterdir()
                           if f.suffix in SUITE_SUFFIXES and f.is_file() and not f.name.startswith("."))
            if not found:
                raise SpecError("no *.yaml or *.yml suites in this directory", file=given)
        else:
            found = [given]
        for file in found:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                files.append(file)
    return files




# -- validating ---------------------------------------------------------------------------------

def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"{type(value).__name__} {value!r}"


def _hint(word: Any, options: Iterable[str]) -> str:
    options = list(options)
    close = difflib.get_close_matches(str(word), options, n=1)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (expected one of: {', '.join(options)})" if options else ""


def _check_value(param: Param, value: Any) -> Any:
    """The value, normalised (int -> float for float params); ValueError with the reason."""
    kind = param.type
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"expected a number, got {_describe(value)}")
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value!r}")
    elif kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"expected an integer, got {_describe(value)}")
    elif not isinstance(value, kind):
        quote = " (quote it: YAML reads yes/no/on/off as booleans)" \
            if kind is str and isinstance(value, bool) else ""
        raise ValueError(f"expected {kind.__name__}, got {_describe(value)}{quote}")
    if param.choices is not None and value not in param.choices:
        raise ValueError(f"{value!r} is not one of {list(param.choices)}")
    if param.min is not None and value < param.min:
        raise ValueError(f"{value!r} is below the minimum {param.min!r}")
    if param.max is not None and value > param.max:
        raise ValueError(f"{value!r} is above the maximum {param.max!r}")
    return value


def is_safe_name(name: str) -> bool:
    """A case name that is a safe file stem (NAME_RULE)."""
    return (bool(_NAME_RE.fullmatch(name)) and not name.startswith(".")
            and len(name) <= MAX_NAME_LEN)


Given = dict[str, tuple[Any, str]]     # param name -> (validated value, field path it came from)


class _SuiteReader:
    """Turns one composed suite into cases; every check raises through `doc.error`."""

    def __init__(self, doc: Doc, lookup: Lookup):
        """Checks the suite-level keys; `read` then builds the cases."""
        self.doc = doc
        self.lookup = lookup
        root = doc.root
        if not isinstance(root, dict):
            raise doc.error("", f"the top level must be a mapping, got {_describe(root)}")
        for key in root:
            if key not in TOP_KEYS:
                raise doc.error(str(key), f"unknown top-level key {key!r}{_hint(key, TOP_KEYS)}")
        self.root = root
        self.op_name, self.op = self._op(root)
        self.params = {p.name: p for p in self.op.params}
        self.variant = self._variant(root["variant"], "variant") if "variant" in root \
            else self.op.variants[0]
        self.seed = self._seed(root["seed"], "seed") if "seed" in root else 0
        self.defaults = self._defaults(root.get("defaults", {}), "defaults")
        self.tolerance = self._tolerances(root["tolerance"], "tolerance") if "tolerance" in root else {}

    def read(self) -> tuple[str, list[tuple[Case, str]]]:
        """The op's registry name and every case with the field path that defines it."""
        root = self.root
        if "cases" not in root and "sweep" not in root:
            raise self.doc.error("", "a suite needs `cases`, `sweep` or both")
        cases = self._explicit_cases(root["cases"]) if "cases" in root else []
        if "sweep" in root:
            cases += self._sweep(root["sweep"], "sweep")
        if not cases:
            raise self.doc.error("cases", "the suite defines no cases")
        self._check_unique(cases)
        return self.op_name, cases

    # top-level pieces -----------------------------------------------------------------------
    def _op(self, root: dict) -> tuple[str, Op]:
        if "op" not in root:
            raise self.doc.error("", "missing required key `op`")
        name = root["op"]
        if not isinstance(name, str):
            raise self.doc.error("op", f"expected an op name, got {_describe(name)}")
        try:
            return name, self.lookup(name)
        except KeyError:
            hint = _hint(name, op_names()) if self.lookup is get_op else ""
            raise self.doc.error("op", f"unknown op {name!r}{hint}") from None

    def _variant(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or value not in self.op.variants:
            raise self.doc.error(field, f"unknown variant {value!r} of op {self.op_name}"
                                        f"{_hint(value, self.op.variants)}")
        return value

    def _seed(self, value: Any, field: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEED:
            raise self.doc.error(field, f"a seed is an integer in [0, 2**63-1], got {_describe(value)}")
        return value

    def _mapping(self, value: Any, field: str) -> dict:
        if not isinstance(value, dict):
            raise self.doc.error(field, f"expected a mapping, got {_describe(value)}")
        return value

    def _param(self, name: Any, value: Any, field: str) -> Any:
        param = self.params.get(name) if isinstance(name, str) else None
        if param is None:
            raise self.doc.error(field, f"unknown parameter {name!r} of op {self.op_name}"
                                        f"{_hint(name, self.params)}")
        try:
            return _check_value(param, value)
        except ValueError as e:
            raise self.doc.error(field, str(e)) from None

    def _defaults(self, value: Any, field: str) -> Given:
        given = {}
        for name, v in self._mapping(value, field).items():
            sub = f"{field}.{name}"
            if name in CASE_KEYS:
                raise self.doc.error(sub, f"{name!r} is not a parameter; set it at the top level "
                                          "or in a case")
            given[name] = (self._param(name, v, sub), sub)
        return given

    def _tolerances(self, value: Any, field: str) -> dict[str, Tolerance]:
        out = {}
        for name, spec in self._mapping(value, field).items():
            sub = f"{field}.{name}"
            if name not in self.op.outputs:
                raise self.doc.error(sub, f"unknown output {name!r} of op {self.op_name}"
                                          f"{_hint(name, self.op.outputs)}")
            try:
                out[name] = Tolerance.parse(spec)
            except ValueError as e:
                raise self.doc.error(sub, str(e)) from None
        return out

    def _inputs(self, value: Any, field: str) -> dict[str, np.ndarray]:
        out = {}
        for name, data in self._mapping(value, field).items():
            sub = f"{field}.{name}"
            if name not in self.op.inline_inputs:
                allowed = _hint(name, self.op.inline_inputs) or " (this op takes none)"
                raise self.doc.error(sub, f"{name!r} cannot be given inline{allowed}")
            if not isinstance(data, list):
                raise self.doc.error(sub, f"expected a nested list of numbers, got {_describe(data)}")
            _, floating = self._array_shape(data, sub)
            try:
                out[name] = np.array(data, dtype=np.float64 if floating else np.int64)
            except OverflowError:
                raise self.doc.error(sub, "an integer does not fit in int64") from None
        return out

    def _array_shape(self, value: Any, field: str) -> tuple[tuple[int, ...], bool]:
        """Shape of a rectangular nested list of numbers, and whether any number is a float."""
        if not isinstance(value, list):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.doc.error(field, f"expected a number, got {_describe(value)}")
            return (), isinstance(value, float)
        items = [self._array_shape(v, f"{field}[{i}]") for i, v in enumerate(value)]
        for i, (shape, _) in enumerate(items[1:], 1):
            if shape != items[0][0]:
                raise self.doc.error(f"{field}[{i}]", f"not rectangular: shape {list(shape)} "
                                                      f"but {field}[0] has {list(items[0][0])}")
        inner = items[0][0] if items else ()
        return (len(value),) + inner, any(f for _, f in items)

    # cases ----------------------------------------------------------------------------------
    def _finish(self, variant: str, given: Given, field: str, label: str = "") -> dict[str, Any]:
        """All params in the op's order, Param defaults filled in, cross-checked by the op."""
        params, missing = {}, []
        for p in self.op.params:
            if p.name in given:
                params[p.name] = given[p.name][0]
            elif p.default is not None:
                params[p.name] = p.default
            else:
                missing.append(p.name)
        if missing:
            raise self.doc.error(field, f"missing required parameter(s) {', '.join(missing)}{label}")
        try:
            self.op.check_params(variant, params)
        except ValueError as e:
            raise self.doc.error(field, f"{e}{label}") from None
        return params

    def _make(self, *, name: str | None, variant: str, params: dict, seed: int | None,
              tolerance: dict, inline: dict, field: str) -> Case:
        if name is None:
            name = self.op.case_name(variant, params)
            if not isinstance(name, str) or not is_safe_name(name):
                raise self.doc.error(field, f"op {self.op_name} generated the case name {name!r}, "
                                            "which is not a safe file stem; give a `name`")
        return Case(name=name, op=self.op_name, variant=variant,
                    seed=derive_seed(self.seed, name) if seed is None else seed,
                    params=params, tolerance=tolerance, inline=inline,
                    source=f"{self.doc.path}:{self.doc.line(field)}")

    def _explicit_cases(self, value: Any) -> list[tuple[Case, str]]:
        if not isinstance(value, list):
            raise self.doc.error("cases", f"expected a list of cases, got {_describe(value)}")
        return [self._explicit_case(entry, f"cases[{i}]") for i, entry in enumerate(value)]

    def _explicit_case(self, entry: Any, field: str) -> tuple[Case, str]:
        if not isinstance(entry, dict):
            raise self.doc.error(field, f"a case is a mapping, got {_describe(entry)}")
        variant = self._variant(entry["variant"], f"{field}.variant") if "variant" in entry \
            else self.variant
        given = dict(self.defaults)
        for key, v in entry.items():
            if key not in CASE_KEYS:
                given[key] = (self._param(key, v, f"{field}.{key}"), f"{field}.{key}")
        name = entry.get("name")
        if "name" in entry and (not isinstance(name, str) or not is_safe_name(name)):
            raise self.doc.error(f"{field}.name", f"a case name is {NAME_RULE}, got {_describe(name)}")
        tolerance = dict(self.tolerance)
        if "tolerance" in entry:
            tolerance.update(self._tolerances(entry["tolerance"], f"{field}.tolerance"))
        case = self._make(
            name=name, variant=variant, params=self._finish(variant, given, field),
            seed=self._seed(entry["seed"], f"{field}.seed") if "seed" in entry else None,
            tolerance=tolerance, field=field,
            inline=self._inputs(entry["inputs"], f"{field}.inputs") if "inputs" in entry else {})
        if case.inline:
            self._check_inline(case, f"{field}.inputs", given)
        return case, f"{field}.name" if "name" in entry else field

    def _check_inline(self, case: Case, field: str, given: Given) -> None:
        """Inline inputs fit their dtypes, are what the generator uses (not ignored, not reshaped),
        agree with the shape params the suite declares (`given`) and pass the op's input check, so
        a bad one is refused here, not written as a golden."""
        specs = self.op.input_specs(case.variant)
        for name, array in case.inline.items():
            if name in specs:
                self._check_range(array, NUMPY_DTYPES[specs[name]], specs[name], f"{field}.{name}")
        try:
            generated = self.op.generate(case)
        except (ValueError, IndexError) as e:
            raise self.doc.error(_field_naming(field, str(e), case.inline), f"inline inputs: {e}") from None
        for name in sorted(case.inline.keys() & generated.inputs.keys()):
            used, inline = generated.inputs[name], case.inline[name]
            try:
                same = np.array_equal(np.broadcast_to(inline, used.shape), used)
            except ValueError:
                same = False
            if not same:
                raise self.doc.error(f"{field}.{name}", f"{self.op_name} does not use {name} as given "
                                     f"(shape {list(inline.shape)}, it takes {list(used.shape)}); give "
                                     f"the inline inputs it reads together: {', '.join(self.op.inline_inputs)}")
        for name in self.op.shape_params:
            made = generated.params.get(name)
            if name in given and made is not None and made != case.params[name]:
                shapes = ", ".join(f"{k} {list(np.shape(v))}" for k, v in case.inline.items())
                raise self.doc.error(given[name][1], f"{name}: {case.params[name]!r} declared, but the inline "
                                                     f"inputs ({shapes}) make {name} {made!r}")
        try:
            self.op.check_inputs(case.variant, generated.inputs, generated.params)
        except ValueError as e:
            raise self.doc.error(_field_naming(field, str(e), case.inline), f"inline inputs: {e}") from None

    def _check_range(self, array: np.ndarray, dtype: np.dtype, kind: str, field: str) -> None:
        """Integers must be whole and fit the input's dtype (a cast would wrap them silently)."""
        if np.dtype(dtype).kind not in "iu":
            return
        info = np.iinfo(dtype)
        for bad, why in ((array != np.round(array), "is not an integer"),
                         ((array < info.min) | (array > info.max), f"does not fit {kind} "
                                                                   f"[{info.min}, {info.max}]")):
            where = np.argwhere(bad)
            if where.size:
                index = tuple(int(i) for i in where[0])
                value = array[index].item()
                raise self.doc.error(field + "".join(f"[{i}]" for i in index), f"{value!r} {why}")

    def _sweep(self, value: Any, field: str) -> list[tuple[Case, str]]:
        axes = []
        for key, values in self._mapping(value, field).items():
            sub = f"{field}.{key}"
            if key in CASE_KEYS and key != "variant":
                raise self.doc.error(sub, f"{key!r} cannot be swept")
            if not isinstance(values, list) or not values:
                raise self.doc.error(sub, f"a sweep axis is a non-empty list, got {_describe(values)}")
            check = self._variant if key == "variant" else \
                (lambda v, f, key=key: self._param(key, v, f))
            axes.append((key, [check(v, f"{sub}[{i}]") for i, v in enumerate(values)]))
        if not axes:
            raise self.doc.error(field, "the sweep is empty")
        total = math.prod(len(values) for _, values in axes)
        if total > MAX_SWEEP_CASES:
            raise self.doc.error(field, f"the sweep makes {total} cases (limit {MAX_SWEEP_CASES})")
        cases = []
        for combo in itertools.product(*(values for _, values in axes)):
            chosen = dict(zip((key for key, _ in axes), combo))
            label = " (sweep point " + ", ".join(f"{k}={v!r}" for k, v in chosen.items()) + ")"
            variant = chosen.pop("variant", self.variant)
            given = {**self.defaults, **{k: (v, field) for k, v in chosen.items()}}
            params = self._finish(variant, given, field, label)
            cases.append((self._make(name=None, variant=variant, params=params, seed=None,
                                     tolerance=dict(self.tolerance), inline={}, field=field), field))
        return cases

    def _check_unique(self, cases: list[tuple[Case, str]]) -> None:
        first: dict[str, int] = {}
        for case, field in cases:
            line = self.doc.line(field)
            if case.name in first:
                raise self.doc.error(field, f"duplicate case name {case.name!r} "
                                            f"(first defined at line {first[case.name]})")
            first[case.name] = line


def _field_naming(field: str, message: str, inline: dict) -> str:
    """`field.<name>` for the one inline input a message names, else `field`."""
    named = [name for name in inline if re.search(rf"\b{re.escape(name)}\b", message)]
    return f"{field}.{named[0]}" if len(named) == 1 else field


def suite_from_text(text: str, name: str = "<suite>", *, lookup: Lookup = get_op) -> Suite:
    """A suite from YAML text (JSON is YAML too), checked as `load_suite` checks a file; errors name
    `name` where they would name the file (kdtr.testing builds a case from keyword params so)."""
    return _read(Doc(Path(name), text), text.encode("utf-8"), lookup)[0]


def _load(path: Path, lookup: Lookup) -> tuple[Suite, dict[str, tuple[str, int]]]:
    data = read_suite_bytes(path)
    return _read(Doc(path, decode_suite(path, data)), data, lookup)


def _read(doc: Doc, data: bytes, lookup: Lookup) -> tuple[Suite, dict[str, tuple[str, int]]]:
    """The suite, and for each case name the field path and line that define it."""
    path = doc.path
    op, cases = _SuiteReader(doc, lookup).read()
    origins = {case.name: (field, doc.line(field)) for case, field in cases}
    suite = Suite(path=path, op=op, sha256=hashlib.sha256(data).hexdigest(),
                  cases=tuple(case for case, _ in cases))
    return suite, origins

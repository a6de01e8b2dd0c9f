"""From a spec string to an Implementation (one-line UsageError for anything that does not resolve).

Specs, tried in this order:
- a built-in name: `cuda`, `torch`, `numpy`, or a peer (`sglang_triton`, `sgl_kernel`, `flashinfer_fa2`,
  `flashmla`);
- the name of an entry point in the `kdtree.implementations` group of an installed package. Its
  object is an Implementation (it declares what it serves itself), or a callable `fn(inputs, params)`
  that declares `kdtree_serves`: "OP[/VARIANT]" or a sequence of them (no variant: every variant),
  and optionally `kdtree_outputs`, the subset of the op's outputs it returns;
- `OP[/VARIANT]=module:function` or `OP[/VARIANT]=path/to/file.py:function`: a user's own callable
  `fn(inputs, params)` for that op (every variant when none is named), returning all the op's outputs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable

from ..errors import UsageError, reason
from ..ops import get_op, op_names
from .base import Implementation, Serves
from .builtin import BUILTINS
from .evaluation import stdout_to_stderr
from .peers import PEER_MODULES, peer

GROUP = "kdtree.implementations"


def builtin_names() -> tuple[str, ...]:
    return (*BUILTINS, *PEER_MODULES)


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def resolve(spec: str) -> Implementation:
    """The Implementation a spec names (see the module docstring)."""
    if not isinstance(spec, str) or not spec.strip():
        raise UsageError(f"an implementation spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec in BUILTINS:
        return BUILTINS[spec]
    if spec in PEER_MODULES:
        return peer(spec)
    if "=" in spec:
        target_op, _, target = spec.partition("=")
        serves = _serves(target_op, spec)
        return callable_impl(spec, _load(target, spec), (serves,))
    points = _entry_points()
    if spec in points:
        return _from_entry_point(points[spec])
    known = ", ".join([*builtin_names(), *sorted(points)])
    raise UsageError(f"unknown implementation {spec!r}; choose one of {known}, or give "
                     "OP[/VARIANT]=module:function or OP[/VARIANT]=path/to/file.py:function")


@functools.lru_cache(maxsize=None)
def resolved(spec: str) -> Implementation:
    """`resolve(spec)` once per process: verify and bench call it per case (a worker process resolves
    the specs it was handed again)."""
    return resolve(spec)


def resolve_all(specs: Iterable[str]) -> tuple[Implementation, ...]:
    """Each spec resolved once, in order; a name given twice is one implementation."""
    return tuple(ref.load() for ref in resolve_refs(specs))


@dataclass(frozen=True)
class ImplRef:
    """A resolved implementation as a picklable record: the spec it was resolved from and the name
    it answers to (which need not be the spec: an entry point's Implementation names itself).
    `load()` gives the Implementation back (the per-process cache; a worker process resolves the
    spec once): ours (cuda, torch, numpy) to run in the calling process, any other in a worker
    process of its own, where the spec is resolved again (kdtr.impl.isolation)."""

    spec: str
    name: str

    def load(self) -> Implementation:
        impl = resolved(self.spec)
        if self.spec in BUILTINS:
            return impl
        from .isolation import isolated

        return isolated(impl, functools.partial(resolved, self.spec))


def resolve_refs(specs: Iterable[str]) -> tuple[ImplRef, ...]:
    """Each spec resolved once (a UsageError up front for one that does not resolve, a ConfigError
    for a bad KDTREE_ISOLATE), in order; a name given twice is one implementation."""
    from .isolation import isolation_on

    isolation_on()
    out: dict[str, ImplRef] = {}
    for spec in specs:
        out.setdefault(resolved(spec).name, ImplRef(spec.strip() if isinstance(spec, str) else spec,
                                                     resolved(spec).name))
    return tuple(out.values())


def _serves(text: str, spec: str, outputs: tuple[str, ...] | None = None) -> Serves:
    """`OP` or `OP/VARIANT`, checked against the op registry."""
    op_name, slash, variant = text.strip().partition("/")
    if op_name not in op_names():
        raise UsageError(f"{spec}: unknown op {op_name!r}; ops: {', '.join(op_names())}")
    op = get_op(op_name)
    if slash and variant not in op.variants:
        raise UsageError(f"{spec}: {op_name} has no variant {variant!r}; its variants: {', '.join(op.variants)}")
    if outputs is not None:
        unknown = [n for n in outputs if n not in op.outputs]
        if unknown or not outputs:
            raise UsageError(f"{spec}: kdtree_outputs {list(outputs)} must be a non-empty subset of "
                             f"{op_name}'s outputs {list(op.outputs)}")
    return Serves(op_name, variant if slash else None, outputs)


def _load(target: str, spec: str) -> Callable:
    """`module:function` or `path.py:function` -> the callable."""
    where, colon, name = target.rpartition(":")
    if not colon or not where or not name:
        raise UsageError(f"{spec}: expected OP[/VARIANT]=module:function or OP[/VARIANT]=path/to/file.py:function")
    if where.endswith(".py") or "/" in where or "\\" in where:
        module = _load_file(Path(where), spec)
    else:
        try:
            with stdout_to_stderr():
                module = importlib.import_module(where)
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # noqa: BLE001 - a module that fails (or exits) at import is the user's to fix
            raise UsageError(f"{spec}: cannot import {where}: {reason(err)}") from None
    fn = getattr(module, name, None)
    if fn is None:
        raise UsageError(f"{spec}: {where} has no {name!r}")
    if not callable(fn):
        raise UsageError(f"{spec}: {where}:{name} is a {type(fn).__name__}, not a callable")
    return fn


def _load_file(path: Path, spec: str):
    """Execute a user's .py file as a module of its own (named after its resolved path)."""
    if not path.is_file():
        raise UsageError(f"{spec}: {path}: no such file")
    resolved = path.resolve()
    name = "kdtree_user_" + hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, resolved)
    if loader_spec is None or loader_spec.loader is None:
        raise UsageError(f"{spec}: {path}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        with stdout_to_stderr():
            loader_spec.loader.exec_module(module)
    except KeyboardInterrupt:
        del sys.modules[name]
        raise
    except BaseException as err:  # noqa: BLE001 - a file that fails (or exits) as it runs is the user's to fix
        del sys.modules[name]
        raise UsageError(f"{spec}: {path} failed to load: {reason(err)}") from None
    return module


def callable_impl(name: str, fn: Callable, serves: tuple[Serves, ...]) -> Implementation:
    """A user's `fn(inputs, params)` as an Implementation (the call is the whole of the work)."""
    def prepare(op, variant, inputs, params):
        return lambda: fn(inputs, params)
    return Implementation(name, serves, prepare, doc=getattr(fn, "__doc__", None) or "")


def _from_entry_point(ep: metadata.EntryPoint) -> Implementation:
    where = f"entry point {ep.name!r} ({ep.value}) of group {GROUP}"
    try:
        with stdout_to_stderr():
            obj = ep.load()
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 - a broken plug-in is reported, not raised
        raise UsageError(f"{where}: cannot be loaded: {reason(err)}") from None
    if isinstance(obj, Implementation):
        return obj
    if not callable(obj):
        raise UsageError(f"{where}: is a {type(obj).__name__}, neither an Implementation nor a callable")
    declared: Any = getattr(obj, "kdtree_serves", None)
    if declared is None:
        raise UsageError(f"{where}: a callable must declare kdtree_serves (\"OP[/VARIANT]\" or a list of them)")
    if isinstance(declared, str):
        declared = [declared]
    outputs = getattr(obj, "kdtree_outputs", None)
    outputs = None if outputs is None else tuple(outputs)
    serves = tuple(_serves(str(s), where, outputs) for s in declared)
    return callable_impl(ep.name, obj, serves)

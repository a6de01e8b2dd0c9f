"""`sglang_triton`: SGLang's unmodified Triton target-verify kernel, `extend_attention_fwd`, for
verify_attn/bf16_paged (docs/ops/verify_attn.md's bf16_paged layout is SGLang's page-size-1 token pool).

The arguments are built the way SGLang's Triton attention backend builds them for an MLA model in
target-verify (forward mode TARGET_VERIFY): qo_indptr = arange(0, (B+1)·Q, Q) (int32), kv_indptr over
the prefix only, kv_indices int64, the tree tokens' own rows passed as k_extend / v_extend (k: the
576-wide latent+rope rows, v: their first 512 entries, contiguous), k_buffer the pool viewed
[N, 1, 576] and v_buffer its first 512 columns (the strided view SGLang's MLA token pool returns),
the tree mask as bool with mask_indptr (int64), max_len_extend = Q, is_causal=True,
skip_prefix_custom_mask=True, logit_cap=0, k_scale = v_scale = 1 where the installed version takes
them. Releases whose extend_attention_fwd takes `lse_extend` also give `lse`; older ones give `out`
only, and the implementation declares just that output for them.

Only the kernel's own module runs, not SGLang's runtime: sglang's package __init__s are bypassed,
and where `sglang.srt.utils` (whose __init__ imports the serving runtime: orjson, psutil, zmq, ...)
does not import, a stand-in with just the five platform probes the attention kernels import is
registered in its place (`versions()["platform_probes"]` says so, and why). The kernel code itself
is SGLang's, unmodified.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
import types
from pathlib import Path
from typing import Any, Mapping

from . import package_version
from ...errors import reason
from ..base import Implementation, ImplUnavailable, Serves
from ...ops.verify_attn.layouts import LATENT, ROW

MODULES = ("sglang.kernels.ops.attention.extend_attention",          # 0.5.23 and later
           "sglang.srt.layers.attention.triton_ops.extend_attention")  # older releases
KERNEL = "extend_attention_fwd"


# -- (a) conversions ---------------------------------------------------------------------------------

def to_sglang(inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """extend_attention_fwd's keyword arguments for docs/ops/verify_attn.md's bf16_paged inputs (torch tensors), plus
    the optional ones (`k_scale`, `v_scale`, `lse_extend`) that `bind` keeps where the installed
    signature has them. `o_extend` (and `lse_extend`) are fresh buffers the kernel writes."""
    import torch

    sm_scale = float(params["sm_scale"])
    if sm_scale == 0.0:   # `sm_scale or 1/sqrt(Lq)` in the wrapper: a zero scale would be replaced
        raise ImplUnavailable("sm_scale 0 is replaced by 1/sqrt(576) inside extend_attention_fwd")
    q, pool = inputs["q"], inputs["kv_buffer"]
    kv_indptr = inputs["kv_indptr"]
    batch = kv_indptr.numel() - 1
    q_len = inputs["tree_slots"].numel() // batch
    rows, heads = q.shape[0], q.shape[1]
    k_buffer = pool.view(pool.shape[0], 1, ROW)
    k_extend = k_buffer[inputs["tree_slots"].long()]                      # [B·Q, 1, 576], contiguous
    return {
        "q_extend": q.contiguous(),
        "k_extend": k_extend,
        "v_extend": k_extend[..., :LATENT].contiguous(),
        "o_extend": q.new_empty((rows, heads, LATENT)),
        "k_buffer": k_buffer,
        "v_buffer": k_buffer[..., :LATENT],
        "qo_indptr": torch.arange(0, (batch + 1) * q_len, q_len, dtype=torch.int32, device=q.device),
        "kv_indptr": kv_indptr,
        "kv_indices": inputs["kv_indices"].to(torch.int64),
        "custom_mask": inputs["custom_mask"] != 0,
        "is_causal": True,
        "mask_indptr": inputs["mask_indptr"].to(torch.int64),
        "max_len_extend": q_len,
        "sm_scale": sm_scale,
        "logit_cap": 0.0,
        "skip_prefix_custom_mask": True,
        # optional: only where the installed signature names them
        "k_scale": 1.0,
        "v_scale": 1.0,
        "lse_extend": torch.empty((rows, heads), dtype=torch.float32, device=q.device),
    }


OPTIONAL = ("k_scale", "v_scale", "lse_extend")


def bind(parameters: tuple[str, ...], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments the installed extend_attention_fwd takes (by name): every required one of
    to_sglang's, the optional ones only where `parameters` lists them; a name it needs that
    to_sglang does not make is an ImplUnavailable naming it."""
    unknown = [n for n in arguments if n not in parameters and n not in OPTIONAL]
    if unknown:
        raise ImplUnavailable(f"{KERNEL} takes no {unknown} (its parameters: {list(parameters)})")
    return {n: v for n, v in arguments.items() if n in parameters}


def from_sglang(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Our outputs from what the kernel wrote: `out` always, `lse` when it was asked for."""
    out = {"out": arguments["o_extend"]}
    if "lse_extend" in arguments:
        out["lse"] = arguments["lse_extend"]
    return out


# -- (b) the call ----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _kernel() -> tuple[Any, str, str | None] | str:
    """(extend_attention_fwd, its module name, why the platform probes are a stand-in or None), or
    why it cannot be had."""
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not importable (no module named 'sglang')"
    faults = []
    for name in MODULES:
        try:
            stand_in = _platform_probes()
            module = _import_light(name)
        except Exception as err:  # noqa: BLE001 - each module path's failure is part of the reason
            faults.append(f"{name}: {reason(err)}")
            continue
        fn = getattr(module, KERNEL, None)
        if fn is not None:
            return fn, name, stand_in
        faults.append(f"{name} has no {KERNEL}")
    return "SGLang's Triton extend attention cannot be imported: " + "; ".join(faults)


def _bare_parents(name: str) -> None:
    """Register each parent package of `name` not yet in sys.modules as a bare package over its
    real folder, so no package __init__ of sglang runs (they import SGLang's serving runtime)."""
    loaded = sys.modules.get("sglang")
    root = Path((loaded.__path__ if loaded is not None else
                 importlib.util.find_spec("sglang").submodule_search_locations)[0])
    parts = name.split(".")
    for depth in range(1, len(parts)):
        package = ".".join(parts[:depth])
        if package in sys.modules:
            continue
        folder = root.joinpath(*parts[1:depth])
        if not folder.is_dir():
            raise ModuleNotFoundError(f"no package {package} in {root}")
        module = types.ModuleType(package)
        module.__spec__ = importlib.machinery.ModuleSpec(package, None, is_package=True)
        module.__spec__.submodule_search_locations = [str(folder)]
        module.__path__ = [str(folder)]
        module.__package__ = package
        module.__kdtree_bare__ = True
        sys.modules[package] = module


def _runtime_loaded() -> bool:
    """sglang itself (its __init__ run) is imported in this process: import through it as it is."""
    return "sglang" in sys.modules and not getattr(sys.modules["sglang"], "__kdtree_bare__", False)


def _import_light(name: str):
    """Import `name` without running the __init__ of sglang's packages when sglang's runtime is not
    already loaded (`_bare_parents`): only the kernel module and what it imports itself execute.
    (Those bare packages stay registered: a later `import sglang` in this process sees a package
    without its __init__'s names.)"""
    if not _runtime_loaded():
        _bare_parents(name)
    return importlib.import_module(name)


UTILS = "sglang.srt.utils"
PROBES = ("is_hip", "is_cuda", "is_gfx95_supported", "is_gfx1250_supported", "get_device_core_count")


def _platform_probes() -> str | None:
    """SGLang's attention kernels import five platform probes from sglang.srt.utils, whose
    __init__ imports SGLang's serving runtime (orjson, psutil, zmq, ...), absent where only the
    kernels are wanted. Its real module is used when it imports (None); otherwise a stand-in with
    the five probes is registered in its place and the first line of the import error returned."""
    if UTILS in sys.modules:
        return None
    if not _runtime_loaded():
        _bare_parents(UTILS)
    try:
        importlib.import_module(UTILS)
        return None
    except Exception as err:  # noqa: BLE001 - any failure of the runtime's import is the reason
        for name in [n for n in sys.modules if n == UTILS or n.startswith(UTILS + ".")]:
            del sys.modules[name]           # half-imported leftovers of the failed import
        sys.modules[UTILS] = _stand_in()
        return reason(err)


def _stand_in() -> types.ModuleType:
    """`sglang.srt.utils` with only the probes, defined as SGLang 0.5.23's utils/common.py defines them."""
    module = types.ModuleType(UTILS, "kdtree's stand-in for SGLang's platform probes (" + ", ".join(PROBES) + ")")
    for name in PROBES:
        setattr(module, name, globals()["_" + name])
    return module


def _is_hip() -> bool:
    import torch

    return torch.version.hip is not None


def _is_cuda() -> bool:
    import torch

    return torch.cuda.is_available() and torch.version.cuda is not None


def _gcn_arch_has(gfx: str) -> bool:
    import torch

    return bool(torch.version.hip) and gfx in torch.cuda.get_device_properties(0).gcnArchName


def _is_gfx95_supported() -> bool:
    return _gcn_arch_has("gfx95")


def _is_gfx1250_supported() -> bool:
    return _gcn_arch_has("gfx1250")


def _get_device_core_count(device_id: int = 0) -> int:
    import torch

    return torch.cuda.get_device_properties(device_id).multi_processor_count if torch.cuda.is_available() else 0


def _probe() -> str | None:
    from ..builtin import _cuda_probe

    got = _kernel()
    if isinstance(got, str):
        return got
    return _cuda_probe()


def _parameters() -> tuple[str, ...]:
    fn = _kernel()[0]
    return tuple(inspect.signature(fn).parameters)


def _prepare(op, variant, inputs, params):
    fn = _kernel()[0]
    arguments = bind(_parameters(), to_sglang(inputs, params))

    def call():
        fn(**arguments)
        return from_sglang(arguments)
    return call


def _versions() -> dict:
    got = _kernel()
    if isinstance(got, str):
        return {"sglang": package_version("sglang"), "triton": package_version("triton"), "module": None}
    probes = UTILS if got[2] is None else f"kdtree's stand-in ({UTILS} does not import: {got[2]})"
    return {"sglang": package_version("sglang"), "triton": package_version("triton"), "module": got[1],
            "platform_probes": probes}


def _outputs() -> tuple[str, ...]:
    """`out` and `lse` where the installed kernel can write an lse; `out` alone otherwise."""
    got = _kernel()
    if not isinstance(got, str) and "lse_extend" in _parameters():
        return ("out", "lse")
    return ("out",)


class _SGLangTriton(Implementation):
    """Its outputs depend on the installed release, so `provides` asks the signature."""

    def provides(self, op, variant):
        return tuple(n for n in super().provides(op, variant) if n in _outputs())


IMPL = _SGLangTriton("sglang_triton", (Serves("verify_attn", "bf16_paged"),), _prepare, probe=_probe,
                     version_info=_versions, device="cuda",
                     doc="SGLang's Triton extend_attention_fwd as its MLA backend calls it in target-verify")

"""sglang_triton imports SGLang's kernel without SGLang's runtime: a fake installed sglang tree
whose package __init__s (and, in one test, sglang.srt.utils) fail the way the real ones do
without the serving runtime's packages."""

from __future__ import annotations

import sys
import textwrap

import pytest

from kdtr.impl.peers import sglang_triton
from kdtr.ops import get_op

FAIL = "raise ImportError('{what} must not run: it imports SGLang\\'s serving runtime')\n"
KERNEL = """
    from sglang.srt.environ import envs
    from sglang.srt.utils import is_cuda, is_gfx95_supported, is_gfx1250_supported, is_hip
    from sglang.srt.utils import get_device_core_count

    PROBED = {"is_hip": is_hip(), "is_cuda": is_cuda(), "gfx95": is_gfx95_supported(),
              "gfx1250": is_gfx1250_supported(), "cores": get_device_core_count()}

    def extend_attention_fwd(q_extend, k_extend, v_extend, o_extend, k_buffer, v_buffer, qo_indptr,
                             kv_indptr, kv_indices, custom_mask, is_causal, mask_indptr, max_len_extend,
                             k_scale, v_scale, sm_scale=None, logit_cap=0.0, skip_prefix_custom_mask=True,
                             sliding_window_size=-1, sinks=None, window_kv_offsets=None,
                             xai_temperature_len=-1, lse_extend=None, skip_prefix=False, skip_extend=False,
                             page_size=1, score_mod=None, aux_tensors=None, extend_seq_lens_cpu=None,
                             identity_kv_indices=False):
        raise NotImplementedError
"""
REAL_UTILS = """
    def is_hip(): return "real is_hip"
    def is_cuda(): return "real is_cuda"
    def is_gfx95_supported(): return "real gfx95"
    def is_gfx1250_supported(): return "real gfx1250"
    def get_device_core_count(device_id=0): return -1
"""


def _forget_sglang():
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]
    sglang_triton._kernel.cache_clear()


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    """An installed-looking sglang 0.5.23 layout under tmp_path, on sys.path; `utils` is the source
    of sglang/srt/utils/__init__.py."""
    def make(utils: str):
        root = tmp_path / "sglang"
        attention = root / "kernels" / "ops" / "attention"
        (root / "srt" / "utils").mkdir(parents=True)
        attention.mkdir(parents=True)
        for package in (root, root / "kernels", root / "kernels" / "ops", attention, root / "srt"):
            (package / "__init__.py").write_text(FAIL.format(what=package.name + "/__init__.py"))
        (root / "srt" / "environ.py").write_text("envs = object()\n")
        (root / "srt" / "utils" / "__init__.py").write_text(textwrap.dedent(utils))
        (attention / "extend_attention.py").write_text(textwrap.dedent(KERNEL))
        monkeypatch.syspath_prepend(str(tmp_path))
        _forget_sglang()
        return root
    yield make
    _forget_sglang()


def test_without_the_runtime_the_probes_are_a_stand_in_and_say_why(fake_sglang):
    fake_sglang("import orjson  # as utils/common.py does: SGLang's serving runtime\n")
    got = sglang_triton._kernel()
    assert not isinstance(got, str), got
    fn, module, why = got
    assert module == "sglang.kernels.ops.attention.extend_attention" and fn.__name__ == "extend_attention_fwd"
    assert "orjson" in why
    kernel = sys.modules[module]
    # SGLang's own definitions on this CPU-only torch: no HIP, no CUDA device, no gfx arch, 0 cores
    assert kernel.PROBED == {"is_hip": False, "is_cuda": False, "gfx95": False, "gfx1250": False, "cores": 0}
    assert sys.modules["sglang.srt.utils"].__doc__.startswith("kdtree's stand-in")
    versions = sglang_triton.IMPL.versions()
    assert versions["module"] == module and "stand-in" in versions["platform_probes"]
    assert "orjson" in versions["platform_probes"]
    params = sglang_triton._parameters()
    assert params.index("k_scale") < params.index("sm_scale")      # required, positional in 0.5.23
    assert sglang_triton.IMPL.provides(get_op("verify_attn"), "bf16_paged") == ("out", "lse")


def test_the_real_utils_are_preferred_when_they_import(fake_sglang):
    fake_sglang(REAL_UTILS)
    fn, module, why = sglang_triton._kernel()
    assert why is None
    assert sys.modules[module].PROBED == {"is_hip": "real is_hip", "is_cuda": "real is_cuda",
                                          "gfx95": "real gfx95", "gfx1250": "real gfx1250", "cores": -1}
    assert sglang_triton.IMPL.versions()["platform_probes"] == "sglang.srt.utils"


def test_a_kernel_that_imports_a_name_the_stand_in_lacks_is_unavailable_with_the_reason(fake_sglang):
    root = fake_sglang("import orjson\n")
    kernel = root / "kernels" / "ops" / "attention" / "extend_attention.py"
    kernel.write_text("from sglang.srt.utils import is_npu\n")
    got = sglang_triton._kernel()
    assert isinstance(got, str) and "is_npu" in got and "sglang.kernels.ops.attention.extend_attention" in got

"""kdtr.ops.custom_ops: our kernels as torch custom ops. CPU: registration and the fake
implementations' shapes (what torch.compile traces with). GPU: each op eager, inside a captured
CUDA graph and under torch.compile, against the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kdtr.ops.custom_ops as kk
from kdtr.impl.backends import upload
from tests.impl_cases import ACCEPT_SMALL, VERIFY_SMALL, small_case

CASES = [  # function, op, variant, generator sizes, the function's scalar argument (a kernel param)
    ("verify_attn_bf16_paged", "verify_attn", "bf16_paged", VERIFY_SMALL, "sm_scale"),
    ("verify_attn_fp32", "verify_attn", "fp32", VERIFY_SMALL, "sm_scale"),
    ("tree_build", "tree_build", "default", dict(batch=3, budget=6, depth=3), "budget"),
    ("tree_accept", "tree_accept", "default", ACCEPT_SMALL, None),
]


def arguments(op, variant, tensors, params, scalar):
    args = [tensors[name] for name in op.input_specs(variant)]
    return args + ([params[scalar]] if scalar else [])


@pytest.mark.parametrize("fn, op_name, variant, size, scalar", CASES)
def test_each_op_is_registered_with_a_fake_of_the_right_shapes(fn, op_name, variant, size, scalar):
    op, inputs, params = small_case(op_name, variant, **size)
    assert getattr(torch.ops.kdtree, fn) is not None
    with FakeTensorMode():        # fake CUDA tensors: shapes and dtypes only, no device needed
        tensors = {k: torch.empty(v.shape, dtype=v.dtype, device="cuda") for k, v in upload(inputs, "cpu").items()}
        got = getattr(kk, fn)(*arguments(op, variant, tensors, params, scalar))
    specs = op.output_specs(variant, inputs, params)
    assert len(got) == len(op.outputs)
    for name, tensor in zip(op.outputs, got):
        kind, shape = specs[name]
        assert tuple(tensor.shape) == tuple(shape), name
        assert tensor.dtype == {"bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64,
                                "i32": torch.int32, "u8": torch.uint8}[kind], name
        assert tensor.device.type == "cuda"


def test_torch_compile_traces_through_the_fake():
    """fullgraph=True: a graph break at the custom op would fail here (meta tensors, no device)."""
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    meta = {k: torch.empty(v.shape, dtype=torch.int32, device="meta") for k, v in inputs.items()}
    compiled = torch.compile(lambda t, p, g: kk.tree_accept(t, p, g)[1] + 1, backend="aot_eager", fullgraph=True)
    assert compiled(meta["tokens"], meta["parents"], meta["target_ids"]).shape == inputs["tokens"].shape


def test_cpu_tensors_are_refused():
    op, inputs, params = small_case("tree_accept", **ACCEPT_SMALL)
    with pytest.raises(NotImplementedError):
        kk.tree_accept(*arguments(op, "default", upload(inputs, "cpu"), params, None))


def _within(op, variant, names, got, expected):
    """Exact outputs bitwise; the others within the op's own tolerance (their reasons are in the op)."""
    from kdtr.dtypes import to_numpy

    for name, tensor in zip(names, got):
        tol, g, r = op.tolerances(variant)[name], to_numpy(tensor), expected[name]
        if tol.exact:
            assert g.dtype == r.dtype and np.array_equal(g.view(np.uint8), r.view(np.uint8)), name
        else:
            g, r = g.astype(np.float64), r.astype(np.float64)
            assert np.all(np.abs(g - r) <= tol.atol + tol.rtol * np.abs(r)), name


@pytest.mark.gpu
@pytest.mark.parametrize("fn, op_name, variant, size, scalar", CASES)
def test_on_the_gpu_eager_graph_and_compile_match_the_reference(fn, op_name, variant, size, scalar):
    op, inputs, params = small_case(op_name, variant, **size)
    expected = op.reference(variant, inputs, params)
    args = arguments(op, variant, upload(inputs, "cuda"), params, scalar)
    call = getattr(kk, fn)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):              # warm up off the default stream (compiles, loads)
        _within(op, variant, op.outputs, call(*args), expected)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(*args)
    graph.replay()
    torch.cuda.synchronize()
    _within(op, variant, op.outputs, captured, expected)
    compiled = torch.compile(call, fullgraph=True, dynamic=False)
    _within(op, variant, op.outputs, compiled(*args), expected)

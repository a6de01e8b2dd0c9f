"""The contract every registered op and variant keeps (kdtr.ops), on the CPU: a new op gets these
tests by registering itself. generate -> reference -> the torch twin within the op's tolerances ->
a KDTR bundle round trip -> compare passes, and a perturbed output fails it."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from kdtr.ops.compare import compare_output
from kdtr.dtypes import NUMPY_DTYPES, to_numpy, to_torch
from kdtr.bundle.format import read_bundle, write_bundle
from kdtr.ops import get_op, op_names
from kdtr.ops.base import H200, Case, Tolerance
from kdtr.bundle.refs import make_bundle

OPS_VARIANTS = [(name, variant) for name in op_names() for variant in get_op(name).variants]


def default_case(op, variant, seed=3) -> Case:
    return Case(f"contract-{variant}", op.name, variant, seed, {p.name: p.default for p in op.params})


@pytest.fixture(scope="module", params=OPS_VARIANTS, ids=[f"{o}/{v}" for o, v in OPS_VARIANTS])
def generated(request):
    name, variant = request.param
    op = get_op(name)
    case = default_case(op, variant)
    g = op.generate(case)
    return op, variant, case, g, op.reference(variant, g.inputs, g.params)


def test_inputs_and_outputs_have_the_declared_names_dtypes_and_shapes(generated):
    op, variant, _, g, ref = generated
    op.check_inputs(variant, g.inputs, g.params)
    assert {n: str(NUMPY_DTYPES[d]) for n, d in op.input_specs(variant).items()} == \
        {n: str(a.dtype) for n, a in g.inputs.items()}
    assert set(ref) == set(op.outputs) == set(op.tolerances(variant))
    for name, (dtype, shape) in op.output_specs(variant, g.inputs, g.params).items():
        assert ref[name].shape == shape, name
        # the reference stores exact outputs in their dtype, floats at reference precision (f32/f64)
        if op.tolerances(variant)[name].exact:
            assert ref[name].dtype == NUMPY_DTYPES[dtype], name


def test_generation_is_deterministic_and_seed_sensitive(generated):
    op, variant, case, g, _ = generated
    again, other = op.generate(case), op.generate(default_case(op, variant, seed=4))
    assert all(g.inputs[k].tobytes() == again.inputs[k].tobytes() for k in g.inputs)
    assert any(g.inputs[k].tobytes() != other.inputs[k].tobytes() for k in g.inputs)


def test_the_torch_twin_agrees_within_the_tolerances(generated):
    op, variant, _, g, ref = generated
    got = op.run_torch(variant, {n: to_torch(a) for n, a in g.inputs.items()}, g.params)
    for name, tol in op.tolerances(variant).items():
        check = compare_output(name, to_numpy(got[name]), ref[name], tol)
        assert check.passed, (name, check.reason)


def perturbed(expected: np.ndarray, tol: Tolerance) -> np.ndarray:
    """The expected output with its first element moved past the tolerance (ints: +1)."""
    bad = expected.copy()
    flat = bad.reshape(-1)
    if np.issubdtype(bad.dtype, np.integer):
        flat[0] += 1
    else:
        finite = np.flatnonzero(np.isfinite(flat))[0]
        flat[finite] += 1.0 + 10 * (tol.atol + tol.rtol * abs(float(flat[finite])))
    return bad


def test_a_bundle_round_trip_compares_and_a_perturbed_output_fails(generated, tmp_path):
    op, variant, case, g, ref = generated
    meta, tensors = make_bundle(case, None)
    path = tmp_path / "case.kdtr"
    write_bundle(path, meta, tensors)
    bundle = read_bundle(path)
    assert bundle.meta["op"] == op.name and bundle.meta["variant"] == variant
    for name, array in g.inputs.items():
        assert bundle.array(name).tobytes() == array.tobytes(), name
    for name in op.outputs:
        expected = bundle.array(name)
        assert expected.tobytes() == ref[name].tobytes(), name
        tol = Tolerance.parse(bundle.meta["tolerance"][name])
        assert tol == op.tolerances(variant)[name]
        assert compare_output(name, np.array(ref[name]), expected, tol).passed, name
        assert not compare_output(name, perturbed(np.array(expected), tol), expected, tol).passed, name


def test_the_cuda_binding_has_the_base_signature_and_a_choice(generated):
    """run_cuda(variant, inputs, params, outputs, *, kernel=None, defines=None), and the launch's
    choice on the target H200 is one of the variant's registered kernels, whose sources exist."""
    op, variant, _, g, _ = generated
    params = inspect.signature(op.run_cuda).parameters
    assert list(params)[:4] == ["variant", "inputs", "params", "outputs"]
    assert all(params[k].kind is inspect.Parameter.KEYWORD_ONLY and params[k].default is None
               for k in ("kernel", "defines"))
    assert op.kernel_choice(variant, g.inputs, g.params, H200) in op.cuda_kernels(variant)
    assert op.kernel_sources(variant) and all(k.op == op.name for k in op.kernels)


def test_the_bench_baselines_are_implementations_of_exactly_this_variant(generated):
    """Op.baselines as kdtr.impl.baselines builds them: Implementations, each with its bench role,
    names unique and not "cuda" (ours), serving this op and variant alone, with a non-empty subset
    of the op's outputs."""
    from kdtr.impl import BenchRole, Implementation, baselines as make_baselines

    op, variant, _, g, _ = generated
    baselines = make_baselines(op, variant, g.inputs, g.params)
    names = [b.name for b in baselines]
    assert baselines and len(set(names)) == len(names) and "cuda" not in names
    for b in baselines:
        assert isinstance(b, Implementation) and isinstance(b.bench, BenchRole), b.name
        assert b.serves(op.name, variant) and set(b.provides(op, variant)) <= set(op.outputs), b.name
        assert b.provides(op, variant), b.name
        others = [(o, v) for o, v in OPS_VARIANTS if (o, v) != (op.name, variant)]
        assert not any(b.serves(o, v) for o, v in others), b.name

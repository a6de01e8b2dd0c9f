"""bf16_wgmma2's launches: run_cuda's grids, arguments and knobs for the balanced schedule, the
segment schedule and the uniform grid, with the kernels recorded instead of run (a stand-in H100);
and, on an H100 / H200, the balanced and segment launches against the reference and inside CUDA
graphs. The schedule itself and its merge, on the CPU emulator: test_attn_schedule.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kdtr.config import REPO_ROOT
from kdtr.ops.verify_attn.cuda import CHUNK_KNOB, LPT_MAX_BATCH, SPLITS_KNOB, balanced_chunk, balanced_jobs, splits_for

from .test_attn_schedule import H100, WGMMA2


class Recorder:
    """A kernel whose launches are written down, not run."""

    def __init__(self, name, defines, log):
        self.name, self.defines, self.log = name, defines, log

    def launch(self, grid, block, args, shared_mem=0, stream=None, *, dependent=False):
        self.log.append(dict(entry=self.name, grid=grid, block=block, args=args, dependent=dependent,
                             defines=self.defines))


class RecordingGpu:
    """A stand-in GPU (kdtr.runtime.device.stand_in) whose kernels write their launches down."""

    def __init__(self, arch, sms, smem_optin, log):
        self.arch, self.sms, self.smem_optin, self.log = arch, sms, smem_optin, log

    def get_kernel(self, source, name, defines, arch):
        return Recorder(name, dict(defines), self.log)


# the session-15 paths, opt-in (the kernel's header, kernels/NOTES.md session 16): on in these tests
ON = {"WG2_LPT": "1", "WG2_PDL": "1", "WG2_STAGED_STORE": "1"}
HINT = {"WG2_KV_HINT": "1"}     # what the launch adds for a call of at most KV_HINT_MAX_BYTES of keys
NO_KNOBS = {k: None for k in ON}   # `launches` / `gpu_run` defines: none of ON passed (the source defaults)
SEG = {"WG2_LPT": "2", "WG2_STAGED_STORE": None}    # the segment schedule
SEG_PREFETCH = {**SEG, "WG2_SEG_PREFETCH": "1"}     # ... loading the next segment early


def launches(batch, defines=None, splits=None, seed=None, **params):
    """run_cuda's launches of bf16_wgmma2 on a stand-in H100 for a generated bf16_paged case (the
    session's fresh seed unless `seed`), with the session-15 knobs on (ON) unless `defines` turns
    one off (a value None: not passed at all)."""
    defines = {k: v for k, v in {**ON, **(defines or {})}.items() if v is not None}
    from kdtr.dtypes import to_torch
    from kdtr.runtime import device

    from .test_cuda_kernels import FRESH_SEED, VERIFY_ATTN, generated, poisoned_outputs

    gen = generated(VERIFY_ATTN, "bf16_paged", FRESH_SEED if seed is None else seed, batch=batch, **params)
    inputs = {name: to_torch(a, "cpu") for name, a in gen.inputs.items()}
    outputs = poisoned_outputs(VERIFY_ATTN, "bf16_paged", gen.inputs, gen.params, device="cpu")
    log = []
    with device.stand_in(RecordingGpu(*H100, log)):
        VERIFY_ATTN.run_cuda("bf16_paged", inputs, gen.params, outputs, kernel="bf16_wgmma2",
                             defines=defines, splits=splits)
    return gen, log


def value(arg):
    return getattr(arg, "value", arg)


def test_a_mixed_batch_launches_the_schedule_and_its_merge():
    gen, log = launches(4, heads=16, prefix=1024, budget=16, prefix_mode="mixed")
    main, merge = log
    q_len, heads, rows = 17, 16, 17 * 16
    kv_mean = -(-int(np.diff(gen.inputs["kv_indptr"]).sum()) // 4) + q_len
    splits = splits_for(WGMMA2, 5 * 4, kv_mean, H100[1], 4 * rows)
    chunk = balanced_chunk(WGMMA2, kv_mean, splits)
    jobs = balanced_jobs(4, kv_mean, chunk)
    # 4 requests: plain launches (programmatic dependents only up to PDL_MAX_BATCH requests)
    assert (main["entry"], main["grid"], main["dependent"]) == ("verify_attn_bf16_wgmma2", (5, jobs, 1), False)
    assert value(main["args"][11]) == 0                             # n_splits 0: the schedule
    ws_o, ws_m, ws_l, chunk_arg, sms_arg, meta = main["args"][-6:]
    assert tuple(ws_o.shape) == (jobs, rows, 512) and tuple(ws_m.shape) == tuple(ws_l.shape) == (jobs, rows)
    assert (value(chunk_arg), value(sms_arg), tuple(meta.shape)) == (chunk, H100[1], (8,))
    assert (merge["entry"], merge["grid"], merge["block"], merge["dependent"]) == (
        "verify_attn_bf16_wgmma2_merge_lpt", (rows, 4), 128, False)
    assert merge["args"][:4] == [ws_o, ws_m, ws_l, meta] and value(merge["args"][4]) == rows


def test_the_segment_schedule_launches_a_block_an_sm_and_the_merge():
    _, log = launches(4, defines=SEG, heads=16, prefix=1024, budget=16, prefix_mode="mixed")
    main, merge = log
    rows, blocks = 17 * 16, H100[1] // 5
    assert (main["entry"], main["grid"]) == ("verify_attn_bf16_wgmma2", (5, blocks, 1))
    assert value(main["args"][11]) == 0 and main["defines"]["WG2_LPT"] == "2"
    ws_o, ws_m, ws_l, chunk_arg, sms_arg, meta = main["args"][-6:]
    assert tuple(ws_o.shape) == (blocks + 4, rows, 512) and tuple(ws_l.shape) == (blocks + 4, rows)
    assert (value(chunk_arg), value(sms_arg), tuple(meta.shape)) == (0, 0, (8,))
    assert (merge["entry"], merge["grid"]) == ("verify_attn_bf16_wgmma2_merge_lpt", (rows, 4))
    assert merge["args"][:4] == [ws_o, ws_m, ws_l, meta]


def test_the_segment_schedule_takes_no_chunk():
    with pytest.raises(ValueError, match="takes no chunk"):
        launches(4, defines={**SEG, CHUNK_KNOB: "256"}, heads=16, prefix=1024, budget=16, prefix_mode="mixed")


def test_one_request_launches_the_uniform_grid():
    _, log = launches(1, heads=16, prefix=2048, budget=16)
    main, merge = log
    assert main["grid"][:2] == (5, 1) and main["grid"][2] > 1
    assert [value(a) for a in main["args"][-3:]] == [0, 0, None]   # no schedule
    assert merge["entry"] == "verify_attn_bf16_wgmma2_merge" and merge["grid"] == 17 * 16
    assert main["dependent"] and merge["dependent"]                 # one request: PDL


@pytest.mark.parametrize("how", ["splits_knob", "splits_argument", "lpt_off", "too_many_requests"])
def test_the_uniform_grid_where_the_schedule_is_off(how):
    kw = dict(heads=8, prefix=300, budget=8, prefix_mode="mixed")
    batch, defines, splits = 3, None, None
    if how == "splits_knob":
        defines = {SPLITS_KNOB: "2"}
    elif how == "splits_argument":
        splits = 2
    elif how == "lpt_off":
        defines = {"WG2_LPT": "0", SPLITS_KNOB: "2"}
    else:
        batch, kw = LPT_MAX_BATCH + 1, dict(heads=1, prefix=1, budget=0)
    _, log = launches(batch, defines=defines, splits=splits, **kw)
    assert log[0]["grid"][1] == batch and [value(a) for a in log[0]["args"][-3:]] == [0, 0, None]
    if how != "too_many_requests":
        assert log[0]["grid"][2] == 2 and log[1]["entry"] == "verify_attn_bf16_wgmma2_merge"
    if how == "lpt_off":                                        # the build without the schedule
        assert all(entry["defines"] == {**ON, "WG2_LPT": "0", **HINT} for entry in log)


# A fixed seed where a test counts on a split (and so a merge) of the mixed batch of 3: about one
# fresh seed in 50 draws prefixes so short (e.g. 300, 33 and 3) that the uniform grid splits nothing.
SPLIT_SEED = 11


def test_pdl_off_launches_plainly():
    _, log = launches(3, defines={"WG2_PDL": "0"}, heads=8, prefix=300, budget=8, prefix_mode="mixed",
                      seed=SPLIT_SEED)
    assert [entry["dependent"] for entry in log] == [False, False]
    assert all(entry["defines"] == {**ON, "WG2_PDL": "0", **HINT} for entry in log)


def test_a_forced_chunk_is_taken_as_given():
    gen, log = launches(3, defines={CHUNK_KNOB: "128"}, heads=8, prefix=300, budget=8, prefix_mode="mixed")
    kv_mean = -(-int(np.diff(gen.inputs["kv_indptr"]).sum()) // 3) + 9
    assert log[0]["grid"] == (2, balanced_jobs(3, kv_mean, 128), 1)
    assert [value(a) for a in log[0]["args"][-3:-1]] == [128, 0]    # sms 0: no fair-share rule
    assert all(CHUNK_KNOB not in entry["defines"] for entry in log)


@pytest.mark.parametrize("batch,chunk,says", [(1, "128", "runs the uniform grid"), (3, "100", "multiple of 64")])
def test_a_chunk_the_launch_cannot_take_is_refused(batch, chunk, says):
    with pytest.raises(ValueError, match=says):
        launches(batch, defines={CHUNK_KNOB: chunk}, heads=8, prefix=300, budget=8)


@pytest.mark.parametrize("dims,want", [
    ((8, 8, 17, 21), False),        # a few microseconds, nothing split: no schedule, no merge
    ((8, 8, 17, 2048), True),       # the uniform grid splits (a merge either way)
    ((64, 128, 2, 8192), True),     # one wave of long requests: worth balancing
    ((32, 8, 65, 4096), True),      # the mixed serving batch
    ((1, 16, 17, 2048), False),     # one request
])
def test_the_launch_balances_where_it_can_gain(dims, want):
    from kdtr.ops.verify_attn.cuda import balanced

    batch, heads, q_len, prefix = dims
    tiles, kv = math.ceil(q_len * heads / 64), prefix + q_len
    splits = splits_for(WGMMA2, tiles * batch, kv, H100[1], batch * q_len * heads)
    assert balanced(WGMMA2, batch, tiles, kv, splits, H100[1]) == want


def test_a_forced_chunk_balances_a_small_batch_too():
    _, log = launches(3, defines={CHUNK_KNOB: "64"}, heads=8, prefix=5, budget=2, prefix_mode="mixed")
    assert log[0]["grid"][2] == 1 and log[1]["entry"] == "verify_attn_bf16_wgmma2_merge_lpt"


# -- on an H100 / H200 (the balanced launch runs only there) -------------------------------------------

def test_the_default_launch_is_the_uniform_grid():
    """Without defines a mixed batch gets the uniform grid and its merge as plain launches, from a
    build given no knob (WG2_PDL's default 1 since session 17, but a batch of 3 is past
    PDL_MAX_BATCH; the balanced schedule and the staged epilogue stay off): the launch reads the
    build's defaults from the kernel's source, so the two agree."""
    _, log = launches(3, defines=NO_KNOBS, heads=8, prefix=300, budget=8, prefix_mode="mixed",
                      seed=SPLIT_SEED)
    from kdtr.ops.verify_attn.cuda import PDL_MAX_BATCH, knob_on

    assert {k: knob_on(WGMMA2, {}, k) for k in ON} == {"WG2_LPT": False, "WG2_PDL": True,
                                                        "WG2_STAGED_STORE": False}
    source = (REPO_ROOT / "kernels" / "verify_attn_bf16_wgmma2.cu").read_text()
    defaults = {"WG2_LPT": 0, "WG2_PDL": 1, "WG2_STAGED_STORE": 0}
    assert all(f"#ifndef {k}\n#define {k} {v}\n" in source for k, v in defaults.items())   # the build's too
    assert all(entry["defines"] == HINT for entry in log)     # a small call: the L2 hint build
    assert PDL_MAX_BATCH < 3 and [entry["dependent"] for entry in log] == [False, False]
    assert log[0]["grid"][1] == 3 and log[1]["entry"] == "verify_attn_bf16_wgmma2_merge"
    assert [value(a) for a in log[0]["args"][-3:]] == [0, 0, None]


def test_a_large_call_runs_the_build_without_hints(monkeypatch):
    """Past KV_HINT_MAX_BYTES of keys (here lowered below this case's ~0.5 MB) the launch builds the kernel
    without the gather's L2 hints; a caller's WG2_KV_HINT is kept either way."""
    from kdtr.ops.verify_attn import cuda

    monkeypatch.setattr(cuda, "KV_HINT_MAX_BYTES", 40_000)
    _, log = launches(3, defines=NO_KNOBS, heads=8, prefix=300, budget=8, prefix_mode="mixed",
                      seed=SPLIT_SEED)
    assert all(entry["defines"] == {} for entry in log)
    _, log = launches(3, defines=NO_KNOBS | {"WG2_KV_HINT": "2"}, heads=8, prefix=300, budget=8,
                      prefix_mode="mixed", seed=SPLIT_SEED)
    assert all(entry["defines"] == {"WG2_KV_HINT": "2"} for entry in log)


def test_the_default_launch_of_one_request_is_dependent():
    _, log = launches(1, defines=NO_KNOBS, heads=16, prefix=2048, budget=16)
    assert [entry["dependent"] for entry in log] == [True, True]


def test_pdl_off_is_the_f651642_launch():
    """`WG2_PDL=0` gives f651642's launch: plain launches of the uniform grid and its merge."""
    _, log = launches(3, defines={"WG2_LPT": None, "WG2_STAGED_STORE": None, "WG2_PDL": "0"}, heads=8,
                      prefix=300, budget=8, prefix_mode="mixed", seed=SPLIT_SEED)
    assert [entry["dependent"] for entry in log] == [False, False]
    assert log[0]["grid"][1] == 3 and log[1]["entry"] == "verify_attn_bf16_wgmma2_merge"


def test_the_launch_follows_the_source_default(monkeypatch):
    """A kernel source whose default turns the schedule on gets the balanced launch without a define."""
    from kdtr.ops.verify_attn import cuda

    monkeypatch.setattr(cuda, "source_default", lambda source, name: "1" if name == "WG2_LPT" else None)
    _, log = launches(3, defines=NO_KNOBS, heads=8, prefix=300, budget=8, prefix_mode="mixed",
                      seed=SPLIT_SEED)
    assert log[0]["grid"][2] == 1 and log[1]["entry"] == "verify_attn_bf16_wgmma2_merge_lpt"
    assert [entry["dependent"] for entry in log] == [False, False]


def gpu_run(gen, defines=None, graph_calls=0):
    """bf16_wgmma2's outputs on the GPU; with graph_calls, from that many replays of a graph that
    first overwrites q from a copy (a kernel right before ours, as a server's projection is) and
    then runs the op, the copy's source changed between replays."""
    import torch

    from kdtr.dtypes import to_numpy, to_torch

    from .test_cuda_kernels import VERIFY_ATTN, poisoned_outputs

    inputs = {name: to_torch(a, "cuda") for name, a in gen.inputs.items()}
    outputs = poisoned_outputs(VERIFY_ATTN, "bf16_paged", gen.inputs, gen.params)

    defines = {k: v for k, v in {**ON, **(defines or {})}.items() if v is not None}   # None: not passed

    def call():
        VERIFY_ATTN.run_cuda("bf16_paged", inputs, gen.params, outputs, kernel="bf16_wgmma2", defines=defines)

    if not graph_calls:
        call()
        torch.cuda.synchronize()
        return [{n: to_numpy(t) for n, t in outputs.items()}]
    source = inputs["q"].clone()
    call()                                                           # compile and load before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        inputs["q"].copy_(source)
        call()
    runs = []
    for i in range(graph_calls):
        source.copy_(to_torch(gen.inputs["q"], "cuda") * (1 - 2 * (i % 2)))      # q, then -q
        graph.replay()
        torch.cuda.synchronize()
        runs.append({n: to_numpy(t) for n, t in outputs.items()})
    return runs


CASES_GPU = {   # name: (case parameters, defines)
    "mixed_b5_split_and_direct": (dict(batch=5, heads=8, prefix=3000, budget=8, prefix_mode="mixed"),
                                  {CHUNK_KNOB: "1024"}),
    "mixed_b64_chain": (dict(batch=64, heads=16, prefix=2048, budget=3, prefix_mode="mixed", tree="chain",
                             slots="pages64"), None),
    "mixed_b200_small": (dict(batch=200, heads=2, prefix=700, budget=4, prefix_mode="mixed"), {CHUNK_KNOB: "128"}),
    "equal_b6_lpt_off": (dict(batch=6, heads=16, prefix=1500, budget=16), {"WG2_LPT": "0"}),
    "equal_b6_pdl_off": (dict(batch=6, heads=16, prefix=1500, budget=16), {"WG2_PDL": "0"}),
    # the segment schedule (its build refuses the staged epilogue): blocks across requests, requests
    # across blocks, one block's several requests written directly; b3: a batch the launch does not
    # balance (3 one-tile requests), the 2 build's uniform grid in one pass (fewer tiles than blocks
    # is the emulator's `fewer_tiles_than_blocks`)
    "seg_mixed_b5": (dict(batch=5, heads=8, prefix=3000, budget=8, prefix_mode="mixed"), SEG),
    "seg_mixed_b64_chain": (dict(batch=64, heads=16, prefix=2048, budget=3, prefix_mode="mixed", tree="chain",
                                 slots="pages64"), SEG),
    "seg_mixed_b200_small": (dict(batch=200, heads=2, prefix=700, budget=4, prefix_mode="mixed"), SEG),
    "seg_equal_b6": (dict(batch=6, heads=16, prefix=1500, budget=16), SEG),
    "seg_b3_under_a_block_each": (dict(batch=3, heads=8, prefix=40, budget=2, prefix_mode="mixed"), SEG),
    # 256 requests of 1 to 10 tiles (about a tenth of them one tile): blocks run one-tile segments after
    # longer ones
    "seg_b256_short_requests": (dict(batch=256, heads=2, prefix=600, budget=4, prefix_mode="mixed"), SEG),
    # the next segment's Q and first tiles gathered during this one (WG2_SEG_PREFETCH=1): each prefetch
    # count (0 to 2 tiles) in the short requests, the partials of requests across blocks, equal
    # requests, and the build's one-pass uniform grid
    "seg_prefetch_b256_short_requests": (dict(batch=256, heads=2, prefix=600, budget=4, prefix_mode="mixed"),
                                         SEG_PREFETCH),
    "seg_prefetch_mixed_b5": (dict(batch=5, heads=8, prefix=3000, budget=8, prefix_mode="mixed"), SEG_PREFETCH),
    "seg_prefetch_mixed_b64_chain": (dict(batch=64, heads=16, prefix=2048, budget=3, prefix_mode="mixed",
                                          tree="chain", slots="pages64"), SEG_PREFETCH),
    "seg_prefetch_equal_b6": (dict(batch=6, heads=16, prefix=1500, budget=16), SEG_PREFETCH),
    "seg_prefetch_b3_under_a_block_each": (dict(batch=3, heads=8, prefix=40, budget=2, prefix_mode="mixed"),
                                           SEG_PREFETCH),     # its uniform grid: no next segment
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES_GPU)
def test_the_balanced_launch_matches_the_reference(name):
    from .test_cuda_kernels import FRESH_SEED, VERIFY_ATTN, check_attn, generated, skip_unless_runs_here

    skip_unless_runs_here("bf16_paged", "bf16_wgmma2")
    params, defines = CASES_GPU[name]
    gen = generated(VERIFY_ATTN, "bf16_paged", FRESH_SEED, **params)
    (got,) = gpu_run(gen, defines)
    check_attn("bf16_paged", f"{name} seed {FRESH_SEED}", got, VERIFY_ATTN.reference("bf16_paged", gen.inputs,
                                                                                        gen.params), gen.inputs, gen.params)


@pytest.mark.gpu
def test_a_graph_of_the_balanced_launch_reads_the_inputs_written_before_it(monkeypatch):
    """Programmatic dependent launches: the replays alternate q and -q, written by the copy kernel
    right before ours; each replay's outputs are those of its own q (none read before the wait).
    PDL_MAX_BATCH is raised here so that the balanced launch of 6 requests is dependent too."""
    from kdtr.ops.verify_attn import cuda

    from .test_cuda_kernels import FRESH_SEED, VERIFY_ATTN, check_attn, generated, skip_unless_runs_here

    skip_unless_runs_here("bf16_paged", "bf16_wgmma2")
    monkeypatch.setattr(cuda, "PDL_MAX_BATCH", 6)
    gen = generated(VERIFY_ATTN, "bf16_paged", FRESH_SEED, batch=6, heads=16, prefix=2000, budget=8,
                    prefix_mode="mixed")
    both = (gen.inputs, dict(gen.inputs, q=-gen.inputs["q"]))
    want = [VERIFY_ATTN.reference("bf16_paged", inputs, gen.params) for inputs in both]
    for i, got in enumerate(gpu_run(gen, graph_calls=4)):
        check_attn("bf16_paged", f"replay {i} seed {FRESH_SEED}", got, want[i % 2], both[i % 2], gen.params)


@pytest.mark.gpu
def test_a_graph_of_one_request_reads_the_inputs_written_before_it():
    """The default build's launch of one request (main and merge as programmatic dependents, the
    keys split): as above, each replay's outputs are those of the q written right before it."""
    from .test_cuda_kernels import FRESH_SEED, VERIFY_ATTN, check_attn, generated, skip_unless_runs_here

    skip_unless_runs_here("bf16_paged", "bf16_wgmma2")
    gen = generated(VERIFY_ATTN, "bf16_paged", FRESH_SEED, batch=1, heads=16, prefix=2048, budget=16)
    both = (gen.inputs, dict(gen.inputs, q=-gen.inputs["q"]))
    want = [VERIFY_ATTN.reference("bf16_paged", inputs, gen.params) for inputs in both]
    for i, got in enumerate(gpu_run(gen, defines=NO_KNOBS, graph_calls=4)):
        check_attn("bf16_paged", f"replay {i} seed {FRESH_SEED}", got, want[i % 2], both[i % 2], gen.params)

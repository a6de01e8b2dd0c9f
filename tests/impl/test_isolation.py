"""Implementations under test in worker processes of their own (kdtr.impl.isolation, issue 35
section 2): a death, a signal or a hang is one failing row with its cause, the run goes on, exit 1,
the record written; in real subprocesses where the exit code or the stream is the point."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from multiprocessing import Pipe

import numpy as np
import pytest

from kdtr.impl import CaseData, ImplRef, Status, evaluate, resolve
from kdtr.impl import isolation
from kdtr.impl.carry import SHARED_MIN_BYTES, Carrier, CarryFolder
from kdtr.ops import get_op
from kdtr.ops.base import Case
from tests.helpers import SMALL_SUITE, invoke, kdtree_env, run_kdtree

TWO_CASES = "  - {batch: 4, budget: 12, mode: mixed}\n  - {batch: 2, budget: 6, depth: 3}"
# an implementation of tree_accept that does CRASH on its first call (a marker file beside it
# remembers, across its worker processes) and is right on every later one
CRASHING_ONCE = """
    import ctypes, os, signal, time
    from pathlib import Path
    from kdtr.ops import get_op
    MARK = Path(__file__).with_suffix(".crashed")
    def fn(inputs, params):
        if not MARK.exists():
            MARK.touch()
            {crash}
        return get_op("tree_accept").run_torch("default", inputs, params)
"""
CRASHES = {
    "os._exit(0)": "it exited with status 0",
    "ctypes.string_at(0)": "killed by SIGSEGV",
    "os.abort()": "killed by SIGABRT",
    "os.kill(os.getpid(), signal.SIGKILL)": "killed by SIGKILL",
}


def _crashing_once(tmp_path, crash: str, name: str = "crashing") -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(CRASHING_ONCE).replace("{crash}", crash))
    return f"tree_accept={path}:fn"


@pytest.fixture
def two_cases(tmp_path):
    """Two tree_accept goldens."""
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "tree_accept.yaml").write_text(SMALL_SUITE.format(op="tree_accept", cases=TWO_CASES))
    result = invoke("gen-refs", specs, "-o", tmp_path / "goldens", "-q")
    assert result.exit_code == 0, result.output
    return tmp_path / "goldens"


@pytest.fixture(autouse=True)
def _isolation_as_by_default(monkeypatch):
    """These tests hold the default (isolation on) whatever the caller's environment says: a device
    round that exported KDTREE_ISOLATE=0 for its benches ran their crashes in-process."""
    monkeypatch.delenv("KDTREE_ISOLATE", raising=False)


def _kdtree(*args, cwd, **env):
    return run_kdtree(*args, cwd=cwd, env=kdtree_env(OMP_NUM_THREADS="1", **env))


@pytest.mark.parametrize("crash", CRASHES)
def test_verify_a_crashing_impl_fails_one_row_and_the_run_goes_on(two_cases, tmp_path, crash):
    """Before: exit 0, no output, no record. Now: the crashed case fails with the cause, the worker
    is started again and the other case passes; stdout holds the JSON alone."""
    done = _kdtree("verify", two_cases, "--impl", _crashing_once(tmp_path, crash), "--json", "-", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    rows = json.loads(done.stdout)["rows"]
    failed = [r for r in rows if not r["passed"]]
    assert len(rows) == 2 and len(failed) == 1, rows
    assert "its worker process died running this case" in failed[0]["error"]
    assert CRASHES[crash] in failed[0]["error"]


def test_against_a_crashing_impl_loses_one_comparison_not_the_run(two_cases, tmp_path):
    record = tmp_path / "r.json"
    done = _kdtree("verify", two_cases, "--backend", "numpy", "--against",
                   _crashing_once(tmp_path, "ctypes.string_at(0)"), "--quiet", "--json", record, cwd=tmp_path)
    assert done.returncode == 0, done.stderr                # the backend passed; one case was compared
    parities = [r["parity"] for r in json.loads(record.read_text())["rows"]]
    reasons = [p.get("reason") for p in parities]
    assert len(parities) == 2 and reasons.count(None) == 1, parities
    assert "killed by SIGSEGV" in next(r for r in reasons if r)


def test_a_hang_past_the_case_timeout_is_killed_and_the_next_case_runs(tmp_path, monkeypatch):
    """SIGALRM blocked and a sleep: the in-process timer cannot stop it; the worker is killed once
    the case timeout and the grace have passed, and the next case gets a fresh worker."""
    monkeypatch.setattr(isolation, "GRACE_S", 3.0)
    spec = _crashing_once(tmp_path, "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM}); time.sleep(60)")
    impl = ImplRef(spec, spec).load()
    data = _small()
    hung = evaluate(impl, data, timeout_s=0.5)
    assert hung.status is Status.ERROR and hung.error_type == "CaseTimeout", hung
    assert "did not return (its worker process was killed)" in hung.reason and hung.seconds < 30
    assert evaluate(impl, data, timeout_s=0.5).status is Status.PASSED


def test_one_worker_serves_every_case_and_a_crash_starts_another(tmp_path):
    path = tmp_path / "pids.py"
    path.write_text(textwrap.dedent("""
        import os
        from pathlib import Path
        from kdtr.ops import get_op
        def fn(inputs, params):
            with open(Path(__file__).with_suffix(".log"), "a") as log:
                log.write(f"{os.getpid()}\\n")
            if params.get("crash"):
                os._exit(0)
            return get_op("tree_accept").run_torch("default", inputs, params)
    """))
    spec = f"tree_accept={path}:fn"
    impl = ImplRef(spec, spec).load()
    data = _small()
    crash = CaseData(data.op, data.variant, data.inputs, {**data.params, "crash": True})
    assert [evaluate(impl, case).status for case in (data, data, crash, data)] == \
        [Status.PASSED, Status.PASSED, Status.ERROR, Status.PASSED]
    pids = path.with_suffix(".log").read_text().split()
    assert pids[0] == pids[1] == pids[2] != pids[3]


def test_an_isolated_impl_is_judged_as_it_is_in_process(tmp_path):
    """The same checks, outputs and determinism whether it runs here or in its worker."""
    path = tmp_path / "mine.py"
    path.write_text("from kdtr.ops import get_op\n"
                    "def fn(inputs, params):\n    return get_op('verify_attn').run_torch('fp32', inputs, params)\n")
    spec = f"verify_attn={path}:fn"
    data = _small("verify_attn", "fp32", batch=2, heads=2, prefix=8, budget=4)
    expected = data.op.reference(data.variant, data.inputs, data.params)
    tols = data.op.tolerances(data.variant)
    here = evaluate(resolve(spec), data, expected, tols, determinism=True)
    there = evaluate(ImplRef(spec, spec).load(), data, expected, tols, determinism=True)
    assert ImplRef(spec, spec).load().worker is not None and resolve(spec).worker is None
    assert there.status is here.status is Status.PASSED and there.checks == here.checks
    assert there.deterministic is here.deterministic is True
    assert all((there.outputs[n] == here.outputs[n]).all() for n in here.outputs)


def test_ours_run_in_process_and_kdtree_isolate_0_keeps_any_there(monkeypatch, tmp_path):
    spec = _crashing_once(tmp_path, "pass")
    assert ImplRef("torch", "torch").load().worker is None
    monkeypatch.setenv("KDTREE_ISOLATE", "0")
    assert ImplRef(spec, spec).load().worker is None


def test_a_bad_kdtree_isolate_is_one_line_exit_2(two_cases, tmp_path):
    done = _kdtree("verify", two_cases, "--impl", _crashing_once(tmp_path, "pass"), cwd=tmp_path,
                   KDTREE_ISOLATE="yes")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "KDTREE_ISOLATE='yes'" in done.stderr


LATE_CRASH = """
    import os
    from kdtr.ops import get_op
    CALLS = []
    def fn(inputs, params):
        CALLS.append(1)
        if len(CALLS) > 3:              # the check passed; bench is timing it
            os._exit(0)
        return get_op("tree_accept").run_torch("default", inputs, params)
"""


@pytest.mark.parametrize("where", ["check", "timing"])
def test_bench_a_crashing_impl_fails_its_row_and_the_run_goes_on(tmp_path, where):
    """Its first call (the check before timing) or a timed call (in its worker) ends its process:
    its row fails with the cause, ours is timed all the same, exit 1, the record written."""
    from tests.bench.fakes import SUITES

    suites = tmp_path / "suites"
    suites.mkdir()
    for op, text in SUITES.items():
        (suites / f"{op}.yaml").write_text(text)
    if where == "check":
        spec = _crashing_once(tmp_path, "os._exit(0)")
    else:
        (tmp_path / "late.py").write_text(textwrap.dedent(LATE_CRASH))
        spec = f"tree_accept={tmp_path / 'late.py'}:fn"
    record = tmp_path / "b.json"
    done = _kdtree("bench", suites, "-k", "ta_small", "--time-budget", "0.05", "--target", "0.2",
                   "--no-baselines", "--impl", spec, "--json", record, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    rows = {r["impl"]: r for r in json.loads(record.read_text())["rows"]}
    mine = rows[spec]
    assert mine["check_passed"] is False and mine["timing"] is None
    assert ("crashed while timed: its worker process died" if where == "timing"
            else "its worker process died running this case") in mine["check"]
    assert rows["torch"]["timing"] is not None


def _small(op_name="tree_accept", variant="default", **params):
    op = get_op(op_name)
    params = params or dict(batch=2, budget=6, depth=3)
    generated = op.generate(Case("t", op_name, variant, 3, dict(op._defaults, **params)))
    return CaseData(op, variant, generated.inputs, generated.params)


def test_a_large_array_goes_through_a_shared_file_and_only_its_name_through_the_pipe():
    """Arrays of SHARED_MIN_BYTES or more (contiguous, Fortran-ordered or strided) are written to the
    carry folder and come back equal, each file unlinked as it is read; a smaller one is pickled;
    where the folder cannot take a file the array is pickled through the pipe instead."""
    folder = CarryFolder()
    try:
        big = np.arange(SHARED_MIN_BYTES // 2, dtype=np.float32)            # 2 MiB
        arrays = {"big": big, "fortran": np.asfortranarray(big.reshape(512, -1)), "strided": big[::2],
                  "small": np.arange(10)}
        carrier = Carrier(folder.path)
        packed = bytes(carrier.pack(("produce", arrays)))
        assert len(packed) < 4096 and folder.path.encode() in packed and carrier.inlined == 0
        assert len(os.listdir(folder.path)) == 3
        folder.clear()
        ours, theirs = Pipe(duplex=False)
        carrier.send(theirs, ("produce", arrays))
        kind, got = Carrier.recv(ours)
        assert kind == "produce" and os.listdir(folder.path) == []
        for name, array in arrays.items():
            assert got[name].dtype == array.dtype and (got[name] == array).all()
        assert got["fortran"].flags.f_contiguous and not np.shares_memory(got["big"], big)
        full = Carrier(os.path.join(folder.path, "gone"))
        assert len(full.pack(big)) > big.nbytes and full.inlined == big.nbytes
    finally:
        folder.remove()
    assert not os.path.exists(folder.path)


def test_the_carry_folder_is_on_dev_shm_unless_that_is_small(monkeypatch):
    from kdtr.impl import carry

    folders = [CarryFolder()]
    roomy = os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").total >= carry.SHM_MIN_BYTES
    monkeypatch.setattr(carry, "SHM_MIN_BYTES", 1 << 60)        # a container's 64 MB /dev/shm
    folders.append(CarryFolder())
    for folder in folders:
        folder.remove()
    assert os.path.dirname(folders[0].path) == ("/dev/shm" if roomy else tempfile.gettempdir())
    assert os.path.dirname(folders[1].path) == tempfile.gettempdir()
    assert not any(os.path.exists(folder.path) for folder in folders)


def test_no_carry_file_is_left_when_the_worker_dies_after_writing_its_arrays(tmp_path, monkeypatch):
    """A case with a large input; the worker writes a large array to the carry folder and dies
    before its reply goes: the case fails with the cause as before, and the folder is gone."""
    folders = []
    monkeypatch.setattr(isolation, "CarryFolder", lambda: folders.append(CarryFolder()) or folders[-1])
    path = tmp_path / "dies.py"
    path.write_text(textwrap.dedent("""
        import os
        import numpy as np
        from pathlib import Path
        from kdtr.impl import carry
        def fn(inputs, params):
            def pack_then_die(self, message):
                real(self, np.zeros(2 << 20, np.uint8))        # an array written to the folder ...
                Path(__file__).with_suffix(".log").write_text(" ".join(os.listdir(self.folder)))
                os._exit(0)                                     # ... and the worker dies before it goes
            real, carry.Carrier.pack = carry.Carrier.pack, pack_then_die
            return {}
    """))
    spec = f"tree_accept={path}:fn"
    data = _small()
    data = CaseData(data.op, data.variant, {**data.inputs, "pad": np.ones(4 << 20, np.uint8)}, data.params)
    outcome = evaluate(ImplRef(spec, spec).load(), data)
    assert outcome.status is Status.ERROR and outcome.error_type == "WorkerDied", outcome
    assert "its worker process died running this case: it exited with status 0" in outcome.reason
    assert len(path.with_suffix(".log").read_text().split()) == 1 and len(folders) == 1
    assert not os.path.exists(folders[0].path)


@pytest.mark.gpu
def test_a_sticky_cuda_error_fails_one_case_and_the_next_gets_a_fresh_context(two_cases, tmp_path):
    """A device-side assert (an out-of-bounds index on the GPU) leaves the CUDA context unusable
    for every later call of that process: the worker sees so after the failed case and is replaced,
    so the other case passes in a fresh one."""
    crash = ("import torch; x = torch.zeros(4, device='cuda'); "
             "x[torch.tensor([1 << 20], device='cuda')] = 1.0; torch.cuda.synchronize()")
    done = _kdtree("verify", two_cases, "--impl", _crashing_once(tmp_path, crash), "--json", "-", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout.strip(), done.stderr
    rows = json.loads(done.stdout)["rows"]
    failed = [r for r in rows if not r["passed"]]
    assert len(rows) == 2 and len(failed) == 1, rows
    assert "CUDA" in failed[0]["error"] or "device-side assert" in failed[0]["error"], failed[0]["error"]

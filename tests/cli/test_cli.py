"""The command line through typer's CliRunner, plus real subprocesses for exit codes and streams."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from xml.etree import ElementTree

import numpy as np
import pytest

from kdtr.config import REPO_ROOT
from kdtr.bundle.format import write_bundle
from tests.helpers import SMALL_CASES, SMALL_SUITE, invoke, kdtree_command, perturbed_copy, run_kdtree


def test_version_and_help():
    assert invoke("--version").output.strip().startswith("kdtree ")
    result = invoke("--help")
    assert result.exit_code == 0 and "gen-refs" in result.output and "verify" in result.output


def test_gen_refs_then_verify_torch_and_numpy(goldens):
    assert len(list(goldens.rglob("*.kdtr"))) == 5
    for backend in ("torch", "numpy"):
        result = invoke("verify", goldens, "--backend", backend)
        assert result.exit_code == 0, result.output
        assert "5 passed, 0 failed" in result.output


def test_gen_refs_skips_fresh_and_is_byte_identical(goldens, tmp_path):
    before = {p: p.read_bytes() for p in goldens.rglob("*.kdtr")}
    result = invoke("gen-refs", tmp_path / "specs", "-o", goldens, "-q")
    assert result.exit_code == 0 and "0 written, 5 fresh" in result.output
    result = invoke("gen-refs", tmp_path / "specs", "-o", goldens, "--force", "-q")
    assert "5 written" in result.output
    assert {p: p.read_bytes() for p in goldens.rglob("*.kdtr")} == before


@pytest.mark.parametrize("op", sorted(SMALL_CASES))
def test_a_perturbed_golden_fails_with_exit_1(goldens, tmp_path, op):
    src = sorted((goldens / op).glob("*.kdtr"))[0]
    bad = tmp_path / "bad" / src.name
    perturbed_copy(src, bad)
    result = invoke("verify", bad, "--backend", "torch", "-v")
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output and "got" in result.output


def test_tolerance_overrides_and_trials(goldens):
    tight = invoke("verify", goldens / "verify_attn", "--backend", "torch", "--atol", "0", "--rtol", "0")
    assert tight.exit_code == 1                 # float results are not bit-equal to float64 goldens
    result = invoke("verify", goldens, "--backend", "torch", "--trials", "2", "--determinism", "-q")
    assert result.exit_code == 0, result.output
    assert "15 passed, 0 failed" in result.output


def test_json_and_junit_records(goldens, tmp_path):
    record, junit = tmp_path / "r.json", tmp_path / "r.xml"
    result = invoke("verify", goldens, "--backend", "torch", "--json", record, "--junit", junit)
    assert result.exit_code == 0
    data = json.loads(record.read_text())
    assert data["summary"] == {"cases": 5, "passed": 5, "failed": 0, "errors": []}
    assert {"commit", "dirty", "argv", "device"} <= set(data["meta"])
    suite = ElementTree.parse(junit).getroot()
    assert suite.get("tests") == "5" and suite.get("failures") == "0"


def test_k_selects_cases(goldens):
    result = invoke("verify", goldens, "--backend", "numpy", "-k", "fp32_*", "-q")
    assert result.exit_code == 0 and "1 passed" in result.output
    assert invoke("verify", goldens, "-k", "nothing-matches").exit_code == 2


def test_corrupt_bundle_is_exit_2_with_one_line(goldens, tmp_path):
    bad = tmp_path / "corrupt.kdtr"
    data = bytearray(sorted(goldens.rglob("*.kdtr"))[0].read_bytes())
    data[-1] ^= 0xFF
    bad.write_bytes(bytes(data))
    for args in (("verify", bad, "--backend", "torch"), ("inspect", bad)):
        result = invoke(*args)
        assert result.exit_code == 2
        assert "corrupt.kdtr" in result.output and "Traceback" not in result.output


def test_missing_paths_and_bad_options_exit_2(tmp_path):
    assert invoke("verify", tmp_path / "nope.kdtr").exit_code == 2
    assert invoke("verify", tmp_path, "--backend", "tpu").exit_code == 2
    assert invoke("gen-refs", tmp_path / "nope.yaml").exit_code == 2
    assert invoke("verify", tmp_path, "--trials", "-1").exit_code == 2


def test_bad_suite_is_exit_2_naming_file_and_line(tmp_path):
    suite = tmp_path / "bad.yaml"
    suite.write_text("op: tree_build\ncases:\n  - {budget: 4, bogus: 1}\n")
    result = invoke("gen-refs", suite, "-o", tmp_path / "g")
    assert result.exit_code == 2 and "bad.yaml:3" in result.output and "bogus" in result.output


def test_inspect_json(goldens):
    bundle = sorted((goldens / "tree_build").glob("*.kdtr"))[0]
    result = invoke("inspect", bundle, "--json", "-")
    summary = json.loads(result.output)
    assert summary["meta"]["op"] == "tree_build"
    assert {t["name"] for t in summary["tensors"]} >= {"topk_logp", "tokens", "visibility"}


def test_doctor_runs_without_gpu():
    result = invoke("doctor", "--json", "-")
    assert result.exit_code == 0
    facts = json.loads(result.output)
    assert facts["packages"]["numpy"] and "gpus" in facts


def test_cuda_backend_without_gpu_is_exit_2(goldens):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU path cannot be exercised here")
    result = invoke("verify", goldens, "--backend", "cuda")
    assert result.exit_code == 2 and "GPU" in result.output
    assert result.output.count("no CUDA GPU") == 1 and "passed" not in result.output   # once, up front


def test_forced_kernel_names_are_checked_before_anything_runs(goldens):
    result = invoke("verify", goldens, "--backend", "torch", "--kernel", "smem")
    assert result.exit_code == 2 and "needs the cuda backend" in result.output
    result = invoke("verify", goldens, "--backend", "cuda", "--kernel", "smem", "--kernel", "nope")
    assert result.exit_code == 2 and "unknown kernel 'nope'" in result.output and "sorted (tree_build)" in result.output


def test_a_define_is_checked_before_anything_runs(goldens):
    """--define (a knob build of one of our kernels, as bench takes it): a bad one is one line, exit 2,
    before any bundle is read or a GPU looked for."""
    for args, says in [(["--backend", "torch", "--define", "bf16_wgmma2:WG2_LPT=2"], "needs the cuda backend"),
                       (["--backend", "cuda", "--define", "bf16_wgmma2:WG2_LPT=3"], "WG2_LPT=3: a launch knob takes"),
                       (["--backend", "cuda", "--define", "nope:X=1"], "unknown kernel 'nope'"),
                       (["--backend", "cuda", "--define", "bf16_wgmma2:WG2_LPT=1", "--define",
                         "bf16_wgmma2:WG2_LPT=2"], "verify runs one build a kernel"),
                       (["--impl", "torch", "--define", "bf16_wgmma2:WG2_LPT=2"], "--define")]:
        result = invoke("verify", goldens, *args)
        assert result.exit_code == 2 and says in result.output, (args, result.output)
        assert "Traceback" not in result.output and "passed" not in result.output


def test_a_define_reaches_the_launch_with_its_knobs(monkeypatch):
    """The forced build runs through cuda_build with the --define's knobs (the invariance probe's split
    runs keep them and add SPLITS); the config names the build; a kernel forced plainly beside it
    keeps its plain build."""
    from kdtr.ops import get_op
    from kdtr.verify import Options, check_kernels
    from kdtr.verify.invariance import backend_runner
    from kdtr.verify.run import _ours

    names, knobs = check_kernels(["smem"], "cuda", ["bf16_wgmma2:WG2_LPT=2,WG2_PDL=0"])
    options = Options(backend="cuda", kernels=names, defines=knobs)
    assert names == ("smem", "bf16_wgmma2") and options.kernel_for(get_op("verify_attn"), "bf16_paged") == "bf16_wgmma2"
    assert options.kernel_label("bf16_wgmma2") == "bf16_wgmma2[WG2_LPT=2,WG2_PDL=0]"
    assert _ours(options, "bf16_wgmma2").prepare.keywords == {"kernel": "bf16_wgmma2",
                                                              "defines": {"WG2_LPT": "2", "WG2_PDL": "0"}}
    assert _ours(options, "smem").prepare.keywords == {"kernel": "smem", "defines": None}
    monkeypatch.setattr("kdtr.verify.invariance.impl_runner", lambda implementation, op, variant: implementation)
    implementation = backend_runner("cuda", get_op("verify_attn"), "bf16_paged", "bf16_wgmma2",
                                    options.defines_for("bf16_wgmma2"))
    built = implementation(3).prepare.keywords["defines"]
    assert built == {"WG2_LPT": "2", "WG2_PDL": "0", "SPLITS": 3}


def test_a_forced_kernel_reaches_run_cuda_only_for_ops_that_have_it(monkeypatch):
    """Options.kernel_for picks the forced name per op/variant, None where the op lacks it."""
    from kdtr.ops import get_op
    from kdtr.verify import Options

    options = Options(backend="cuda", kernels=("bf16_mma", "smem"))
    assert options.kernel_for(get_op("verify_attn"), "bf16_paged") == "bf16_mma"
    assert options.kernel_for(get_op("verify_attn"), "fp32") is None
    assert options.kernel_for(get_op("tree_build"), "default") == "smem"
    assert options.kernel_for(get_op("tree_accept"), "default") is None   # it has "walk" only


def test_real_subprocess_streams_and_exit_codes(goldens, tmp_path):
    """stdout carries the data, stderr the diagnostics; the console script's exit code is real."""
    exe = shutil.which("kdtree") or None
    cmd = [exe] if exe else kdtree_command()
    env = dict(os.environ, NO_COLOR="1")        # no PYTHONPATH: an installed script imports its own kdtr
    ok = subprocess.run([*cmd, "verify", str(goldens), "--backend", "torch", "--quiet"], capture_output=True,
                        text=True, env=env, cwd=REPO_ROOT)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("PASS ") == 5 and "5 passed, 0 failed" in ok.stdout
    bad = subprocess.run([*cmd, "inspect", str(tmp_path / "none.kdtr")], capture_output=True, text=True,
                         env=env, cwd=REPO_ROOT)
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr


def test_a_budget_beyond_the_kernel_is_refused_up_front(tmp_path):
    suite = tmp_path / "big.yaml"
    suite.write_text("op: tree_build\ncases:\n  - {budget: 4000, depth: 64}\n")
    result = invoke("gen-refs", suite, "-o", tmp_path / "g")
    assert result.exit_code == 2
    assert "big.yaml:3" in result.output and "shared memory" in result.output and str(227 * 1024) in result.output


def test_a_bundle_with_equal_sibling_tokens_is_refused(tmp_path):
    tokens = np.array([[5, 7, 7]], np.int32)
    parents = np.array([[-1, 0, 0]], np.int32)
    target = np.array([[7, 1, 1]], np.int32)
    outputs = {"accept_len": np.array([2], np.int32), "accept_nodes": np.array([[0, 1, -1]], np.int32),
               "accept_tokens": np.array([[5, 7, -1]], np.int32), "bonus": np.array([1], np.int32)}
    bad = tmp_path / "siblings.kdtr"
    write_bundle(bad, {"op": "tree_accept", "variant": "default", "params": {}},
                 [("tokens", "input", tokens), ("parents", "input", parents), ("target_ids", "input", target)]
                 + [(name, "output", array) for name, array in outputs.items()])
    result = invoke("verify", bad, "--backend", "numpy")
    assert result.exit_code == 2 and "same token" in result.output


def test_a_failed_launch_fails_its_case_and_a_lost_device_stops_the_run(goldens, monkeypatch):
    import dataclasses

    from kdtr.errors import DeviceError, LaunchError
    from kdtr.impl import builtin
    from kdtr.verify import Options, verify_file

    bundle = sorted((goldens / "tree_accept").glob("*.kdtr"))[0]

    def cuda_raising(err):
        def prepare(op, variant, inputs, params):
            def call():
                raise err
            return call
        return dataclasses.replace(builtin.CUDA, probe=lambda: None, device="cpu", prepare=prepare)

    launch_fails = LaunchError("kernel tree_accept (tree_accept.cu, sm_90): cuLaunchKernel: too many resources")
    monkeypatch.setitem(builtin.BUILTINS, "cuda", cuda_raising(launch_fails))
    rows, problem = verify_file(bundle, Options(backend="cuda"))
    assert problem is None and len(rows) == 1 and not rows[0].passed
    assert bundle.stem in rows[0].error and "tree_accept.cu" in rows[0].error

    device_lost = DeviceError("tree_accept/default: the kernel failed on the device: illegal address")
    monkeypatch.setitem(builtin.BUILTINS, "cuda", cuda_raising(device_lost))
    rows, problem = verify_file(bundle, Options(backend="cuda"))
    assert rows == [] and str(bundle) in problem and "illegal address" in problem


# bench and report join once cli/bench.py declares its booleans with cli.app.flag (the bench helper's)
COMMANDS = ("gen-refs", "verify", "inspect", "doctor", "build", "e2e", "bench", "report")


def test_boolean_options_are_plain_flags_in_help():
    """Every boolean option reads as a flag in help: no `<bool>` after it (typer's own --help aside)."""
    from cli.main import app as assembled
    from typer.main import get_command

    group = get_command(assembled)
    for name in COMMANDS:
        command = group.commands[name]
        flags = [opt for p in command.params if getattr(p, "is_flag", False) for opt in p.opts]
        text = invoke(name, "--help").output
        for line in text.splitlines():
            if "<bool>" in line:
                assert "--help" in line, (name, line)
        assert all(f in text for f in flags if f.startswith("--")), name
    assert "--force" in invoke("gen-refs", "--help").output


def test_a_flag_does_not_swallow_the_next_word(tmp_path):
    result = run_kdtree("gen-refs", "--force", "true", "-o", "g", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("kdtree: error: true:") and result.stderr.count("\n") == 1
    assert not (tmp_path / "g").exists()


def test_json_to_stdout_is_pure_json(goldens, tmp_path):
    """With --json -, stdout parses as one JSON document; the table went to stderr."""
    bundle = sorted((goldens / "tree_build").glob("*.kdtr"))[0]
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "a.yaml").write_text(SMALL_SUITE.format(op="tree_accept", cases=SMALL_CASES["tree_accept"]))
    for args, key in ((("verify", goldens, "-b", "numpy"), "rows"), (("verify", goldens, "-b", "numpy", "-q"), "rows"),
                      (("gen-refs", "s", "-o", "g"), "results"), (("inspect", bundle), "tensors"),
                      (("doctor",), "packages")):
        result = run_kdtree(*args, "--json", "-", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert key in json.loads(result.stdout), args
    table = run_kdtree("verify", goldens, "-b", "numpy", "--json", "-", cwd=tmp_path)
    assert "kdtree verify" in table.stderr and "5 passed, 0 failed" in table.stderr


@pytest.mark.parametrize("option", ["--json", "--junit"])
def test_an_unusable_output_path_is_refused_before_any_work(goldens, tmp_path, option):
    (tmp_path / "file").write_text("")
    for target, fault in ((tmp_path, "is a directory"), (tmp_path / "file" / "r.json", "not a directory")):
        before = sorted(tmp_path.rglob("*"))
        result = run_kdtree("verify", goldens, "-b", "numpy", option, target, cwd=tmp_path)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.count("\n") == 1 and fault in result.stderr and option in result.stderr
        assert sorted(tmp_path.rglob("*")) == before


def test_gen_refs_json_dir_is_refused_before_any_bundle_is_written(tmp_path):
    result = invoke("gen-refs", REPO_ROOT / "specs" / "tree_accept.yaml", "-o", tmp_path / "g", "--json", tmp_path)
    assert result.exit_code == 2 and "is a directory" in result.output
    assert not (tmp_path / "g").exists()


def test_records_take_their_mode_from_the_umask(goldens, tmp_path):
    old = os.umask(0o027)
    try:
        result = invoke("verify", goldens, "-b", "numpy", "--json", tmp_path / "r.json", "--junit", tmp_path / "r.xml")
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    assert {p.name: p.stat().st_mode & 0o777 for p in tmp_path.glob("r.*")} == {"r.json": 0o640, "r.xml": 0o640}


def test_verify_table_shows_the_tolerance_share(goldens, tmp_path):
    """The column a reader can trust: at most 1 passes; the raw max_rel only under -v."""
    result = invoke("verify", goldens / "verify_attn", "-b", "torch")
    assert result.exit_code == 0
    assert "tol share" in result.output and "max_rel" not in result.output
    assert "max_rel" in invoke("verify", goldens / "verify_attn", "-b", "torch", "-v").output


@pytest.mark.parametrize("kind", ["dangling link", "fifo"])
def test_a_bundle_that_is_not_a_file_is_reported(goldens, kind):
    odd = goldens / "tree_accept" / "odd.kdtr"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to(goldens / "gone.kdtr")
    result = invoke("verify", goldens, "-b", "numpy")
    assert result.exit_code == 2 and "odd.kdtr" in result.output and "passed" not in result.output


def test_the_tolerance_share_shown_is_the_worst_outputs(capsys):
    """Until kdtr.ops.compare fills OutputCheck.tol_share, a row without it shows no share at all."""
    from types import SimpleNamespace

    from cli import render
    from kdtr.verify import VerifyRow

    def check(share):
        return SimpleNamespace(name="o", passed=share <= 1, reason=None, tol_share=share, max_abs=0.0,
                               rel_l2=0.0, max_rel=0.0, mismatches=0, tolerance=SimpleNamespace(exact=False))

    row = VerifyRow(case="c", file="f", op="tree_build", variant="default", backend="numpy", config={},
                    passed=False, outputs=(check(0.25), check(2.5)))
    assert "tol_share=2.5 " in render.verify_lines([row]) + " "
    legacy = SimpleNamespace(**{k: v for k, v in vars(check(0.0)).items() if k != "tol_share"})
    assert "tol_share" not in render.verify_lines([VerifyRow(**{**vars(row), "outputs": (legacy,)})])


def test_a_quiet_line_of_a_row_that_compared_nothing_has_no_figures(goldens, tmp_path):
    """Issue 35: an errored (or timed out) row's -q line read `max_abs=0 rel_l2=0` beside the error,
    figures of a comparison that never happened."""
    mine = tmp_path / "raising.py"
    mine.write_text("import time\ndef fn(inputs, params):\n    if params['batch'] == 4:\n        time.sleep(30)\n"
                    "    raise ValueError('no kernel here')\n")
    result = invoke("verify", goldens / "tree_build", goldens / "tree_accept", "-q", "--case-timeout", "1",
                    "--impl", f"tree_build={mine}:fn", "--impl", f"tree_accept={mine}:fn")
    assert result.exit_code == 1, result.output
    failed = [line for line in result.output.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 3 and any("ValueError: no kernel here" in line for line in failed), result.output
    assert any("case timeout" in line for line in failed)
    assert not any("max_abs" in line or "rel_l2" in line for line in failed), failed


def _verify_into(goldens, tmp_path, stdout, *extra):
    return subprocess.run(kdtree_command("verify", goldens, "--backend", "numpy", *extra), stdout=stdout,
                          stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=300,
                          env=dict(os.environ, NO_COLOR="1", PYTHONPATH=str(REPO_ROOT)))


@pytest.mark.parametrize("extra", [(), ("-q",)])
def test_a_closed_stdout_pipe_neither_fails_the_run_nor_loses_the_record(goldens, tmp_path, extra):
    """Issue 35: `verify … --json r.json | head -1` exited 1 with no r.json and no message (rich
    turns a broken pipe into exit 1). The reader is gone before the first line here."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = _verify_into(goldens, tmp_path, write, "--json", "r.json", *extra)
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["passed"] == 5


def test_a_full_stdout_is_one_line_exit_2_and_the_record_is_written(goldens, tmp_path):
    """Issue 35: `> /dev/full` gave a traceback and no record."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = _verify_into(goldens, tmp_path, full, "--json", "r.json")
        to_stdout = _verify_into(goldens, tmp_path, full, "--json", "-")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "kdtree: error: stdout: cannot write: No space left on device (the tables were lost; the files asked "
        "for were written)"]
    assert json.loads((tmp_path / "r.json").read_text())["summary"]["passed"] == 5
    assert to_stdout.returncode == 2 and "Traceback" not in to_stdout.stderr
    assert to_stdout.stderr.strip().splitlines()[-1] == \
        "kdtree: error: --json -: cannot write to stdout: No space left on device"


def test_a_sanitized_verify_passes_its_defines_on(monkeypatch, goldens, tmp_path):
    """--sanitize runs verify again under compute-sanitizer: the child gets the same --kernel and
    --define, so the sanitizer checks the build that was asked for."""
    from kdtr.runtime import sanitize

    seen = []

    def fake_run(tool, args, result, cli_module="cli"):
        seen.append(args)
        result.errors = 0
        return iter(())

    monkeypatch.setattr(sanitize, "run", fake_run)
    result = invoke("verify", goldens, "--sanitize", "racecheck", "--define", "bf16_wgmma2:WG2_LPT=2",
                    "--kernel", "smem", "--json", str(tmp_path / "s.json"))
    assert result.exit_code == 0, result.output
    [args] = seen
    assert "--kernel=smem" in args and "--kernel=bf16_wgmma2" in args and "--define=bf16_wgmma2:WG2_LPT=2" in args

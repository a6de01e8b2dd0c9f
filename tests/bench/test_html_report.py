"""`kdtree report --html`: the page's content, its escaping, and a real headless Chromium rendering it
with no page error (Debian's chromium; the browser tests skip where it is absent)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path

import pytest

from kdtr.config import REPO_ROOT
from kdtr.errors import UsageError
from kdtr.reports.html_report import load_records, write_html_report
from tests.helpers import run_kdtree

BENCH = REPO_ROOT / "results" / "bench.json"
VERIFY = REPO_ROOT / "results" / "verify-cuda.json"
CHROMIUM = Path("/usr/bin/chromium")
HOSTILE = '<img src=x onerror="document.title=1">&"\'</td></table><script>alert(1)</script>'
# Set on the page's root by any error event (a script error, a resource that failed to load: captured)
# or a Content-Security-Policy violation (a fetch the page tried). Put before the page's own CSP meta,
# which would forbid it otherwise.
MARKER = ("<script>addEventListener('error',e=>document.documentElement.setAttribute('data-page-error',"
          "String(e.message||(e.target&&e.target.outerHTML)||e.type)),true);"
          "document.addEventListener('securitypolicyviolation',e=>document.documentElement.setAttribute("
          "'data-page-error','CSP '+e.violatedDirective+' '+e.blockedURI));</script>")
needs_chromium = pytest.mark.skipif(not CHROMIUM.is_file(), reason="no /usr/bin/chromium (apt-get install chromium)")


def hostile_verify(tmp_path) -> Path:
    """A small verify record whose case name, error and argv are markup."""
    data = json.loads(VERIFY.read_text())
    rows = copy.deepcopy(data["rows"][:3])
    rows[0]["case"] = HOSTILE
    rows[1].update(passed=False, error=HOSTILE)
    data.update(rows=rows, summary={"cases": 3, "passed": 2, "failed": 1, "errors": []})
    data["meta"]["argv"] = ["kdtree", "verify", HOSTILE]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(data))
    return path


def test_the_page_holds_tables_plots_peers_and_provenance(tmp_path):
    out = write_html_report([BENCH, VERIFY], tmp_path / "r.html")
    page = out.read_text()
    meta = json.loads(BENCH.read_text())["meta"]
    assert page.count("<table>") == 2 and page.count('class="chart"') == 2
    assert "sglang_triton (ours ×faster)" in page and "roofline" in page and "latency against prefix" in page
    assert meta["sources_sha256"] in page and meta["commit"] in page and "NVIDIA H200 (sm_90" in page
    assert "1029 passed, 0 failed" in page and "tol share" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)      # nothing to fetch


def test_every_record_string_is_escaped(tmp_path):
    page = write_html_report([hostile_verify(tmp_path)], tmp_path / "r.html").read_text()
    assert "<img" not in page and "alert(1)</script>" not in page and "<script" not in page
    assert "&lt;img src=x onerror=&quot;document.title=1&quot;&gt;" in page


def test_a_bad_record_writes_nothing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "something else"}')
    with pytest.raises(UsageError, match="not a verify or bench record"):
        write_html_report([BENCH, bad], tmp_path / "r.html")
    assert not (tmp_path / "r.html").exists()


def test_several_bench_records_get_the_gpu_comparison(tmp_path):
    from tests.bench.fakes import h200, other_gpu

    other = tmp_path / "b200.json"
    other.write_text(json.dumps(other_gpu(h200())))
    page = write_html_report([BENCH, other], tmp_path / "r.html").read_text()
    assert "GPUs side by side" in page and "NVIDIA B200 (sm_100" in page and "2.00×" in page
    assert len(load_records([BENCH, other])) == 2


def render(page: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """Chromium on a copy of `page` with MARKER first in its head."""
    probe = tmp_path / f"probe-{page.name}"
    probe.write_text(page.read_text().replace("<head>", "<head>" + MARKER, 1))
    profile = tmp_path / "profile"
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *extra, probe.as_uri()],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)


def page_errors(result: subprocess.CompletedProcess) -> list[str]:
    """The marker's text and the console's errors (Chromium logs them to stderr as CONSOLE lines)."""
    found = re.findall(r'data-page-error="([^"]*)"', result.stdout)
    return found + [line for line in result.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


@needs_chromium
def test_the_harness_sees_a_page_error(tmp_path):
    """The check below can fail: a page that fetches from the network or throws is caught."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="default-src '
                   "'none'\"></head><body><img src=\"https://example.invalid/x.png\"></body></html>")
    assert any("example.invalid" in e for e in page_errors(render(bad, tmp_path, "--dump-dom")))
    thrower = tmp_path / "thrower.html"
    thrower.write_text("<!DOCTYPE html><html><head></head><body><script>undefined_function()</script></body></html>")
    assert any("undefined_function" in e for e in page_errors(render(thrower, tmp_path, "--dump-dom")))


@needs_chromium
def test_chromium_renders_the_report_without_errors(tmp_path):
    page = write_html_report([BENCH, VERIFY, hostile_verify(tmp_path)], tmp_path / "report.html")
    dom = render(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert page_errors(dom) == []
    assert dom.stdout.count("<table>") == 3 and dom.stdout.count("<svg") >= 2 and "<img" not in dom.stdout
    shot = tmp_path / "shot.png"
    result = render(page, tmp_path, f"--screenshot={shot}", "--window-size=1000,900")
    assert result.returncode == 0 and page_errors(result) == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) < 400_000      # small enough to look at


def test_html_from_the_command_line(tmp_path):
    out = tmp_path / "r.html"
    run = run_kdtree("report", BENCH, "--html", out, cwd=REPO_ROOT)
    assert run.returncode == 0 and run.stdout == "" and "html:" in run.stderr
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]

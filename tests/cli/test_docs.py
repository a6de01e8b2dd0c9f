"""docs/ is the contract inside the repository: its links resolve, nothing cites the old design
folder outside it, its PyTorch snippet computes the reference's numbers, the README's results
table is what scripts/readme-results.py prints from results/, and docs/measuring.md's roofline
table is what scripts/roofline.py prints from the bench suites and kdtr/gpus.py."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kdtr.config import REPO_ROOT

DOCS = REPO_ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md")) + [REPO_ROOT / "README.md"]
# built from parts so that this file does not match itself
OLD_CITATIONS = re.compile("shared" + "/design|design" + " folder", re.I)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```$", re.M | re.S)


def tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: no tracked files to scan")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    return [REPO_ROOT / name for name in listed.decode().split("\0") if name]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_no_tracked_file_cites_the_design_folder_outside_the_repository():
    offenders = []
    for path in tracked_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue                              # binary records (.npz, .gz)
        offenders += [f"{path.relative_to(REPO_ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
                      for m in OLD_CITATIONS.finditer(text)]
    assert not offenders, "cite docs/ instead: " + ", ".join(offenders)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page):
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue                              # https:, mailto:
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(REPO_ROOT)}: " + ", ".join(broken)


def test_the_docs_name_each_ops_executable_spec():
    """Each op page names its numpy reference as module:function, and that function exists."""
    import importlib

    for op in ("tree_build", "verify_attn", "tree_accept"):
        text = (DOCS / "ops" / f"{op}.md").read_text(encoding="utf-8")
        spec = re.search(r"\*\*Executable spec:\*\* `([\w.]+):([\w.]+)`", text)
        assert spec, f"docs/ops/{op}.md names no executable spec"
        target = importlib.import_module(spec.group(1))
        for part in spec.group(2).split("."):
            target = getattr(target, part)
        assert callable(target)


def test_the_verify_attn_pytorch_snippet_matches_the_reference():
    """The page's 'equivalent PyTorch code' against attend_reference on a generated fp32 case with
    mixed prefixes. Both compute in float64 and round once to f32: 1e-6 relative is a few f32 ulps
    of accumulation-order difference in float64, far below any real error."""
    import torch

    from kdtr.ops import verify_attn
    from kdtr.ops.base import Case

    text = (DOCS / "ops" / "verify_attn.md").read_text(encoding="utf-8")
    (snippet,) = re.findall(r"^```python\n(.*?)^```$", text, flags=re.M | re.S)
    namespace: dict = {}
    exec(compile(snippet, "docs/ops/verify_attn.md", "exec"), namespace)
    op = verify_attn.OP
    params = dict(op._defaults, batch=3, heads=4, prefix=40, prefix_mode="mixed", budget=6)
    generated = op.generate(Case("doc_snippet", "verify_attn", "fp32", 7, params))
    expected = op.reference("fp32", generated.inputs, generated.params)
    tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in generated.inputs.items()}
    out, lse = namespace["verify_attn_fp32"](tensors["q"], tensors["kv"], tensors["prefix_len"],
                                             tensors["visibility"], generated.params["sm_scale"])
    assert len(set(generated.inputs["prefix_len"].tolist())) > 1      # the mixed prefixes are exercised
    np.testing.assert_allclose(out.numpy(), expected["out"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(lse.numpy(), expected["lse"], rtol=1e-6, atol=1e-7)


def test_the_readme_is_short():
    assert len((REPO_ROOT / "README.md").read_bytes()) <= 10_000


@pytest.mark.parametrize("page,marker,script", [("README.md", "results", "readme-results.py"),
                                                 ("docs/measuring.md", "roofline", "roofline.py")])
def test_a_generated_block_is_its_scripts_output(page, marker, script):
    text = (REPO_ROOT / page).read_text(encoding="utf-8")
    block = re.search(rf"^<!-- {marker}:begin[^\n]*-->\n(.*?)^<!-- {marker}:end -->$", text, flags=re.M | re.S)
    assert block, f"{page} has no {marker}:begin / {marker}:end block"
    printed = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / script)],
                             capture_output=True, text=True, check=True).stdout
    assert block.group(1) == printed, f"run scripts/{script} and paste its output into {page}"

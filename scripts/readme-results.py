#!/usr/bin/env python3
"""Print the README's headline results (markdown) from the committed records in results/.

The README holds this output verbatim between its `results:begin` and `results:end` markers, and
tests/cli/test_docs.py keeps the two equal, so a new record cannot leave stale figures in the README.
Each figure is named by its record file, the code it ran (the commit results/README.md gives for
the record's `sources_sha256`, else the record's own `meta.commit`) and the run's date.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results"
CHAIN = "h100/s19/bench-chain.json"   # the serving suite's chain cases: ours, FlashMLA, one plan a case
SMALL = "h100/s16/bench-mma99.json"   # the serving suite: the 99 KB kernel beside bf16_mma, SGLang
PEERS = ("flashmla", "sglang_triton")
LABELS = {"flashmla": "FlashMLA", "sglang_triton": "SGLang"}


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def code_of(meta: dict) -> str:
    """The commit whose code a record ran: results/README.md maps digests to commits."""
    digest = meta.get("sources_sha256", "")[:8]
    mapping = dict(re.findall(r"`([0-9a-f]{8})…` = (?:the code of )?`([0-9a-f]{7,})`",
                              (RESULTS / "README.md").read_text(encoding="utf-8")))
    commit = mapping.get(digest) or meta.get("commit", "")[:7] + (" (dirty)" if meta.get("dirty") else "")
    return f"code of {commit}, `sources_sha256` {digest}…"


def duration(ms: float) -> str:
    return f"{ms * 1e3:.3g} µs" if ms < 1 else f"{ms:.3g} ms"


def config(row: dict) -> str:
    c = row["config"]
    if row["op"] == "verify_attn":
        mixed = " mixed" if row["params"].get("prefix_mode") == "mixed" else ""
        return f"{row['variant']} B={c['B']} H={c['H']} Q={c['Q']} P={c['prefix']}{mixed}"
    return f"{row['op']} " + " ".join(f"{k}={v}" for k, v in c.items())


def headline(row: dict) -> float:
    """The slower of the interleaved and back-to-back medians: what the ratios are quoted on."""
    return max(row["timing"]["median"], (row.get("alone") or {}).get("median", 0.0))


def plan(record: dict, row: dict) -> str:
    p = record["timing_plans"][f"{row['op']}/{row['variant']} {row['case']}"]["cold"]
    return f"{p['mode']} ×{p['calls_per_sample']}"


def chain_table() -> list[str]:
    bench = load(CHAIN)
    meta, rows = bench["meta"], bench["rows"]
    # ours: the default launch, by backend or as the plain forced build of its kernel (no --define)
    ours = [r for r in rows if (r["impl"] == "cuda" or (r.get("kernel") == r["impl"] and not r.get("defines")))
            and r["primary"] and r["timing"]]
    peer = {(r["case"], r["impl"]): r for r in rows if r["impl"] in PEERS and r["timing"]}
    present = [name for name in PEERS if any(impl == name for _, impl in peer)]
    device = meta["device"]
    lines = [
        f"`results/{CHAIN}`: {meta['started'][:10]}, {device['gpu']}, {code_of(meta)}; the serving suite's "
        "chain drafts, cold L2, **every implementation of a case timed by its one plan** "
        "([docs/measuring.md](docs/measuring.md)); ratio > 1: ours faster.",
        "",
        "| case | plan | ours | " + " | ".join(f"{LABELS[name]} | ratio" for name in present) + " |",
        "|---|---|---|" + "---|---|" * len(present),
    ]
    for row in ours:
        cells = [config(row).replace("bf16_paged ", ""), plan(bench, row), duration(headline(row))]
        for name in present:
            other = peer.get((row["case"], name))
            cells += [duration(headline(other)) if other else "—",
                      f"{row['speedups'][name]:.2f}" if name in row["speedups"] else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    wins = sum(1 for r in ours if r["speedups"].get("flashmla", 0) >= 1)
    lines += ["", f"Ours (bf16_wgmma2) is at or below FlashMLA's time in {wins} of {len(ours)} (the bar: all; "
              "kernels/NOTES.md, session 19)."]
    if "sglang_triton" not in present:
        lines += ["SGLang's Triton kernel on the same cases took 20.7-167× session 15's kernel's time: `results/h100/bench-chain.json` "
                  "(session 15's code)."]
    return lines


def small_table() -> list[str]:
    bench = load(SMALL)
    rows = [r for r in bench["rows"] if r["timing"]]
    mma = {r["case"]: r for r in rows if r["impl"] == "bf16_mma"}
    m99 = {r["case"]: r for r in rows if r["impl"] == "bf16_mma99"}
    ratios = sorted(headline(m99[c]) / headline(mma[c]) for c in m99 if c in mma)
    sglang = sorted(r["speedups"]["sglang_triton"] for r in m99.values() if "sglang_triton" in r["speedups"])
    within = sum(x <= 1.25 for x in ratios)
    eight = sum(x >= 8 for x in sglang)
    return ["", f"`results/{SMALL}` (H100, {code_of(bench['meta'])}; 48-row tiles): "
            f"bf16_mma99 takes {ratios[0]:.2f}-{ratios[-1]:.2f}× bf16_mma's time (median "
            f"{ratios[len(ratios) // 2]:.2f}×; ≤ 1.25× in {within} of {len(ratios)} cases) and beats SGLang "
            f"{sglang[0]:.1f}-{sglang[-1]:.1f}× (≥ 8× in {eight} of {len(sglang)})."]


def table() -> str:
    verify = load("verify-cuda.json")
    summary = verify["summary"]
    lines = chain_table() + small_table() + [
        "", f"`results/verify-cuda.json` (H200, {code_of(verify['meta'])}): **{summary['passed']} of "
        f"{summary['cases']} rows pass** with `--backend cuda`. `results/bench.json` (H200, every default suite) "
        "predates the one plan: only its figures of our own kernels stand ([docs/results.md](docs/results.md))."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table())

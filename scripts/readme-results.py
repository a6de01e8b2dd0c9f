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
# the headline cases of results/bench.json: the serving shapes (TP8) and the large ones, then fp32
# and the two latency-bound ops
HEADLINE = (
    ("verify_attn", "b1_h8_q9_p21"), ("verify_attn", "b1_h16_q17_p2048"), ("verify_attn", "b8_h8_q33_p8192"),
    ("verify_attn", "b32_h8_q65_p4096_mixed"), ("verify_attn", "b8_h64_q33_p8192"),
    ("verify_attn", "b1_h128_q65_p131072"), ("verify_attn", "b64_h16_q65_p32768"),
    ("verify_attn", "fp32_b1_h16_q17_p2048"), ("verify_attn", "fp32_b4_h16_q17_p8192"),
    ("tree_build", "b64_n64_l15"), ("tree_accept", "b64_n64_l15"),
)
PEER = "sglang_triton"


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


def table() -> str:
    bench = load("bench.json")
    meta, rows = bench["meta"], bench["rows"]
    ours = {(r["op"], r["case"]): r for r in rows if r["impl"] == "cuda" and r["primary"] and r["mode"] == "cold"}
    peer = {(r["op"], r["case"]): r for r in rows if r["impl"] == PEER and r["timing"]}
    verify = load("verify-cuda.json")
    summary = verify["summary"]
    ceilings = bench["ceilings"]
    device = meta["device"]
    lines = [
        f"From `results/bench.json`: `kdtree bench` run {meta['started'][:10]} on an {device['gpu']} "
        f"(driver {device['driver']}), {code_of(meta)}; cold L2, CUDA-graph replays, ceilings measured in "
        f"the same run (bf16 MMA {ceilings['bf16_mma_tflops']:.0f} TFLOP/s, HBM read "
        f"{ceilings['hbm_read_gbps'] / 1e3:.2f} TB/s). `results/verify-cuda.json` ({code_of(verify['meta'])}): "
        f"**{summary['passed']} of {summary['cases']} rows pass** with `--backend cuda`.",
        "",
        "| case | kernel, grid | ours | TFLOP/s (% of its ceiling) | SGLang Triton | ours faster |",
        "|---|---|---|---|---|---|",
    ]
    mixed = False
    for key in HEADLINE:
        row = ours[key]
        extra = row["extra"]
        kernel = " ".join([extra.get("kernel", "")] + (["×".join(map(str, extra["grid"]))] if extra.get("grid") else []))
        if not row["flops"]:
            rate = "latency-bound"
        elif row["pct_compute"] < 0.01:
            rate = f"{row['tflops']:.3g} (launch-bound)"
        else:
            rate = f"{row['tflops']:.3g} ({row['pct_compute']:.0%})"
        other = peer.get(key)
        faster = f"{row['speedups'][PEER]:.1f}×" if other and PEER in row["speedups"] else "—"
        theirs = duration(other["timing"]["median"]) if other else "—"
        if other and other["timing"].get("method") != row["timing"].get("method"):
            # timed by another method than ours: the ratio is not a like-for-like headline
            theirs, faster = f"{theirs} ({other['timing']['method']})", f"({faster})"
            mixed = True
        lines.append(f"| {config(row)} | {kernel} | {duration(row['timing']['median'])} "
                     f"| {rate} | {theirs} | {faster} |")
    if mixed:
        lines += ["", "In this record SGLang's kernel was timed eagerly (its Python launch path included) while "
                  "ours was replayed from a CUDA graph, so the ratios in parentheses are not like for like; "
                  "at the small shapes they count SGLang's launch path against it. "
                  "`kdtree bench` now times every implementation by graph replay where it can be "
                  "captured ([docs/timing.md](docs/timing.md)); the next H200 record replaces this table."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table())

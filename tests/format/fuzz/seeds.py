"""Seed corpus for the KDTR fuzzers: a few small, valid bundles written by kdtr.bundle.format.write_bundle
at run time (no binaries are committed). Shared by fuzz_kdtr_h.c's runs and fuzz_format.py.

    python tests/format/fuzz/seeds.py DIR      writes the seeds into DIR and prints their paths
"""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from kdtr.bundle.format import write_bundle


def _every_dtype(rng: np.random.Generator) -> list[tuple[str, str, np.ndarray]]:
    tensors = []
    for name, dtype in [("f64", "<f8"), ("f32", "<f4"), ("f16", "<f2"),
                        ("bf16", ml_dtypes.bfloat16)]:
        values = rng.standard_normal((2, 3)) * 4
        values[0, 0] = np.nan if name != "bf16" else np.inf
        tensors.append((name, "input", values.astype(dtype)))
    for dtype in ["<i8", "<i4", "<i2", "i1", "<u8", "<u4", "<u2", "u1"]:
        info = np.iinfo(dtype)
        tensors.append((np.dtype(dtype).name, "output",
                        rng.integers(info.min, info.max, 5, dtype=dtype, endpoint=True)))
    return tensors + [("mask", "output", rng.random(13) < 0.5),
                      ("scalar", "aux", np.array(-1.5, "<f4")),
                      ("empty", "aux", np.zeros((2, 0, 3), "<i4")),
                      ("n\u00e4me \"q\"", "aux", np.arange(3, dtype="<u2"))]


def seed_bundles() -> dict[str, tuple[dict, list[tuple[str, str, np.ndarray]]]]:
    """name -> (meta, tensors): the shapes of the real ops' bundles, only smaller."""
    rng = np.random.default_rng(2024)
    return {
        "verify_attn_fp32": (
            {"op": "verify_attn", "variant": "fp32", "case": "h2_p8_b3", "seed": 1234,
             "params": {"batch": 1, "heads": 2, "prefix": 8, "budget": 3, "sm_scale": 0.125},
             "tolerance": {"out": {"atol": 1e-5, "rtol": 1e-4}, "lse": {"atol": 1e-5}}},
            [("q", "input", rng.standard_normal((1, 4, 2, 8)).astype("<f4")),
             ("kv", "input", rng.standard_normal((1, 12, 8)).astype("<f4")),
             ("mask", "input", rng.random((1, 4, 4)) < 0.5),
             ("out", "output", rng.standard_normal((1, 4, 2, 4)).astype("<f4")),
             ("lse", "output", rng.standard_normal((1, 4, 2)).astype("<f4"))]),
        "tree_build": (
            {"op": "tree_build", "variant": "default", "case": "k4_d3",
             "params": {"budget": 6, "depth": 3, "topk": 4}, "seed": -7},
            [("logp", "input", np.sort(rng.standard_normal((3, 4)))[:, ::-1].copy()),
             ("tokens", "input", rng.integers(0, 50000, (3, 4), dtype="<i8")),
             ("parents", "output", np.array([-1, 0, 0, 1, 2, 3], "<i4")),
             ("scores", "output", rng.standard_normal(6)),
             ("logits", "aux", rng.standard_normal((2, 16)).astype(ml_dtypes.bfloat16))]),
        "every_dtype": (
            {"op": "demo", "case": "every dtype \u2713", "nested": {"a": [1, 2.5, None, True],
                                                                     "b": {"c": "\u00e9\n"}}},
            _every_dtype(rng)),
        "no_tensors": ({"op": "demo", "params": {}}, []),
    }


def write_seeds(folder: Path) -> list[Path]:
    """Write every seed bundle into `folder`; their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (meta, tensors) in seed_bundles().items():
        paths.append(folder / f"{name}.kdtr")
        write_bundle(paths[-1], meta, tensors)
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: seeds.py DIR")
    for path in write_seeds(Path(sys.argv[1])):
        print(path)

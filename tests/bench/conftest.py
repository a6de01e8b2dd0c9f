"""Tests of `kdtree bench`: the timing engine with fake clocks and a fake CUDA, records, compare, telemetry, ceilings
across GPUs, the roofline's floors and the HTML report (the fakes themselves are in tests/bench/fakes.py)."""

from __future__ import annotations

import pytest

from tests.bench.fakes import SUITES


@pytest.fixture
def suites(tmp_path):
    folder = tmp_path / "bench"
    folder.mkdir()
    for op, text in SUITES.items():
        (folder / f"{op}.yaml").write_text(text)
    return folder

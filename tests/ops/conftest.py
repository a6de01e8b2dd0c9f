"""Tests of each op's contract: references, generators, torch twins, tolerances, cost models, the gate (same-precision controls).

Fixtures shared by this folder's tests live here; those of the whole suite (goldens, cache_dir, the
skip of GPU tests without a GPU) are in tests/conftest.py, helpers in tests/helpers.py."""

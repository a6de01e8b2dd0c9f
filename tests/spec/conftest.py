"""Tests of YAML suites and gen-refs: validation, error lines and fields, sweeps, golden bundles and their provenance.

Fixtures shared by this folder's tests live here; those of the whole suite (goldens, cache_dir, the
skip of GPU tests without a GPU) are in tests/conftest.py, helpers in tests/helpers.py."""

"""Tests of implementations: the one evaluator, built-ins, user callables and entry points, peers and their models, parity.

Fixtures shared by this folder's tests live here; those of the whole suite (goldens, cache_dir, the
skip of GPU tests without a GPU) are in tests/conftest.py, helpers in tests/helpers.py."""

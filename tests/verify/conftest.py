"""Tests of verify as a library and a command: the comparison, records, shards, devices, invariance, e2e and the pytest plugin.

Fixtures shared by this folder's tests live here; those of the whole suite (goldens, cache_dir, the
skip of GPU tests without a GPU) are in tests/conftest.py, helpers in tests/helpers.py."""

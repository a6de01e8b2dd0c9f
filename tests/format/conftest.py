"""Tests of the KDTR format: the Python reader and writer, the C reader kdtr.h, their fuzzers, atomic writes, bundles captured from live tensors.

Fixtures shared by this folder's tests live here; those of the whole suite (goldens, cache_dir, the
skip of GPU tests without a GPU) are in tests/conftest.py, helpers in tests/helpers.py."""

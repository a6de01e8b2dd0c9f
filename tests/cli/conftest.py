"""Tests of the command line as a user meets it: exit codes, one-line errors, hostile inputs, interrupts, start-up time, the wheel, the docs and README.

Fixtures shared by this folder's tests live here; those of the whole suite (goldens, cache_dir, the
skip of GPU tests without a GPU) are in tests/conftest.py, helpers in tests/helpers.py."""

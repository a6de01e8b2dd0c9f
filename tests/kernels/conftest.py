"""Tests of our CUDA kernels: NVRTC builds, the registry and the launch's choice per GPU, the kernels on a GPU, and the CPU models of their tiling and loops.

Fixtures shared by this folder's tests live here; those of the whole suite (goldens, cache_dir, the
skip of GPU tests without a GPU) are in tests/conftest.py, helpers in tests/helpers.py."""

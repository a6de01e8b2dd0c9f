"""kdtree: exact references, golden bundles and honest benchmarks for DDTree's CUDA kernels."""

__version__ = "0.1.0"

"""kdtree: exact references, golden bundles and honest benchmarks for DDTree's CUDA kernels.

The library is a stack of packages, each importing only those below it (its `__init__` says which;
tests/test_layout.py holds every import to that): `runtime` (the GPU), `records`, `scaleout`
(shards and workers), `ops`, `impl`, `bundle`, `verify` and `bench`, `reports` and `testing` (the
public testing API). Under all of them the root modules `errors`, `gpus`, `config`, `atomic` and
`dtypes`, which import only each other; above all of them `pytest_plugin`, the pytest entry point.
Nothing here prints: `cli/` renders.
"""

__version__ = "0.1.0"

"""The timing engine behind `kdtree bench`: honest device timings, ceilings and baselines in one run
(the items a run times, its settings, timers, schedule, statistics, ceilings, sanity rows, records
and their comparison; how a figure is made: docs/measuring.md). It prints nothing:
`run_bench(Selection, BenchSettings, progress)` is the entry point (`kdtree bench` parses options
into those and renders the record it returns), `bench_items` times a list of cases in this process;
progress comes through a callback. Without a GPU it times the torch backend on the host, a degraded
run labelled as such. Below are its public names; the rest is in its modules. It may import the root
modules, `kdtr.runtime`, `kdtr.scaleout`, `kdtr.records`, `kdtr.ops`, `kdtr.impl` and
`kdtr.bundle`, and nothing else of kdtr.
"""

from __future__ import annotations

from ..impl.builds import kernel_builds
from .ceilings import Ceilings
from .record import (RECORD_KIND, BenchRecord, BenchRow, bench_csv, default_record_path, load_record, merge_records,
                     merge_shards, record_text, write_record)
from .regression import compare_records, exit_status
from .run import Selection, run_bench
from .runner import bench_items
from .settings import COMPUTE_UNITS, MODES, QUICK_TIMING, BenchSettings, TimingOptions
from .stats import Timing

__all__ = ["COMPUTE_UNITS", "MODES", "QUICK_TIMING", "RECORD_KIND", "BenchRecord", "BenchRow", "BenchSettings",
           "Ceilings", "Selection", "Timing", "TimingOptions", "bench_csv", "bench_items", "compare_records",
           "default_record_path", "exit_status", "kernel_builds", "load_record", "merge_records", "merge_shards",
           "record_text", "run_bench", "write_record"]

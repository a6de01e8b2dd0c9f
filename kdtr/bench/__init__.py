"""The timing engine behind `kdtree bench`: honest device timings, ceilings and baselines in one run
(the items a run times, its settings, timers, schedule, statistics, ceilings, sanity rows, records
and their comparison). It may import the root modules, `kdtr.runtime`, `kdtr.scaleout`,
`kdtr.records`, `kdtr.ops`, `kdtr.impl` and `kdtr.bundle`, and nothing else of kdtr.

How a figure is made (docs/measuring.md, "One figure"):

- Our kernel (`op.run_cuda` into preallocated, poisoned outputs) is captured into a CUDA graph of k
  calls and timed with CUDA events around each replay; a sample is replay time / k, with k chosen so a
  sample lasts about `TimingOptions.sample_ms` (an eager launch costs ~5.7 us here, more than our small
  kernels; a graph node ~0.6 us). What cannot be captured is timed eagerly, k calls between events.
  A short spin kernel is queued before each sample's start event, so the host's enqueueing of the
  timed work never shows up as device idle time inside the interval.
- Each implementation of a case is checked, warmed, captured and calibrated first (`prepare`);
  then all of them, ours included (twice with --repeat), are timed in interleaved turns
  (`interleave`): a turn is a batch of samples (one round of that implementation), the turns follow
  cycles in which every implementation runs right after every other exactly once
  (`balanced_turns`), so drift of the GPU's clocks, power and temperature over the case, and
  whatever one implementation leaves behind for the next, hit every implementation alike. A figure is the median of its samples; its noise (`rel_ci`) is the larger of that
  median's 95% CI (distribution-free, order statistics) and the 95% CI of its rounds' medians
  (Student t): how much the figure moves between rounds, which one timing's samples cannot show.
- Rounds stop, after `min_rounds`, when every implementation's noise is under `target`, or the
  time budget (`budget_s` per implementation), the sample or round cap, or the run's time limit
  runs out. Each Timing says which (`stop_reason`) and keeps its raw samples and round medians.
- Modes, named in every Timing: `hot` (the same inputs again and again: L2 may hold them);
  `cold-rotate` (k calls over enough copies of the inputs and outputs to cover twice the L2);
  `cold-flush` (a buffer twice the L2 size, allocated once, is written before every sample, one
  call per sample); `host` (perf_counter, for work on the CPU or a run without a GPU).
- Ceilings are measured in the same run (HBM read and copy bandwidth; dense bf16 and fp32 matrix
  products through torch), and every row's achieved TFLOP/s and GB/s (from the op's cost model) is
  given as % of them; a figure over 100% is flagged as a measurement error, not a result.
- Baselines (`op.baselines`, made Implementations with a `bench` role by `kdtr.impl.baselines`) run on
  the same inputs in the same run; before any implementation is
  timed its outputs on those inputs are checked against the reference (`compare_output`, the op's
  tolerances). Speedup = baseline median / our median, same run, same mode.

The library prints nothing: it returns frozen dataclasses (Timing, BenchRow, Ceilings, BenchRecord)
and reports progress through a callback. Without a GPU, `run_bench` times the torch backend on the
host (mode `host`), a degraded run for smoke tests, labelled as such in its record.
"""

from __future__ import annotations

# in the order they stack: each module uses only the ones above it
from .stats import Z95, Timing, agree, between_rounds, median_ci, relative_spread, summarize, t95
from .settings import (COMPUTE_UNITS, FLAG_LIMIT, MODES, QUICK_CASES_PER_SUITE, QUICK_TIMING, SLOW_CALL_MS, STOP_REASONS,
                       BenchSettings, KernelBuild, Progress, TimingOptions,
                       kernel_builds)
from .schedule import Sampler, balanced_turns, interleave
from .timers import (BLOCK_CYCLES, DEFAULT_L2_BYTES, EVENT_RESOLUTION_MS, MAX_ROTATE_SETS, DeviceTimer, HostTimer,
                     rotation_sets)
from .ceilings import CEILING_OPTIONS, EMPTY_KERNEL_SOURCE, Ceilings, gpu_clocks, measure_ceilings
from .record import (BENCH_FORMAT, CSV_HEADER, RECORD_KIND, TIME_LIMIT_SKIP, BenchRecord, BenchRow, bench_csv,
                    bench_meta, csv_table, default_record_path, load_record, merge_records, merge_shards,
                    record_text, samples_path, settings_dict, with_figures, with_speedups, write_record)
from .regression import CompareRow, Comparison, compare_records, exit_status, judge
from .cases import (BenchItem, collect_items, estimated_cost, items_for_kernels, items_from_bundles,
                    items_from_suites, selection_meta)
from .sanity import sanity_rows
from .runner import WorkerJob, check_note, run_bench, run_worker

__all__ = ["Z95", "Timing", "agree", "between_rounds", "median_ci", "relative_spread", "summarize", "t95",
           "COMPUTE_UNITS", "FLAG_LIMIT", "MODES", "QUICK_CASES_PER_SUITE", "QUICK_TIMING", "SLOW_CALL_MS",
           "STOP_REASONS", "BenchSettings", "KernelBuild", "kernel_builds", "Progress", "TimingOptions", "Sampler", "balanced_turns",
           "interleave", "BLOCK_CYCLES", "DEFAULT_L2_BYTES", "EVENT_RESOLUTION_MS", "MAX_ROTATE_SETS",
           "DeviceTimer", "HostTimer", "rotation_sets", "CEILING_OPTIONS", "EMPTY_KERNEL_SOURCE", "Ceilings",
           "gpu_clocks", "measure_ceilings", "BENCH_FORMAT", "CSV_HEADER", "RECORD_KIND", "TIME_LIMIT_SKIP",
           "BenchRecord", "BenchRow", "bench_csv", "bench_meta", "csv_table",
           "default_record_path", "load_record", "merge_records", "merge_shards", "record_text",
           "samples_path", "settings_dict", "with_figures", "with_speedups", "write_record", "CompareRow",
           "Comparison", "compare_records", "exit_status", "judge", "BenchItem", "collect_items",
           "estimated_cost", "items_for_kernels", "items_from_bundles", "items_from_suites", "selection_meta",
           "sanity_rows", "WorkerJob", "check_note", "run_bench", "run_worker"]

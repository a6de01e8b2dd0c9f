"""Verify as a library: run implementations on bundles' cases and compare every output (`run`,
`options`, `tolerance`, `record`), probe whether rows are invariant to batching, order and splits
(`invariance`) and decode end to end against greedy decoding (`e2e`). It may import the root
modules, `kdtr.runtime`, `kdtr.scaleout`, `kdtr.records`, `kdtr.ops`, `kdtr.impl` and
`kdtr.bundle`, and nothing else of kdtr.

The public API (`kdtree verify` is a thin CLI over it; the pytest plugin uses `verify_item`):

- `run_verify(Selection(paths, pattern, shard, devices), Options(...), progress=None) -> VerifyRecord`:
  the bundles of the selection (folders: every *.kdtr below), each case through the one evaluator
  (kdtr.impl.evaluate), the record. `progress(BundleDone)` is called as each bundle finishes.
  Raises KdtreeError when nothing is selected, DeviceError up front for the cuda backend without a
  GPU, and `NothingRan` (carrying `.record`) when nothing was verified (a skip is not a pass);
- `verify_item(path, impl, options) -> [VerifyRow]`: one bundle with one resolved implementation
  (an Implementation or an ImplRef; None: the backend), the same comparison, tolerances and row
  fields as `kdtree verify`;
- `Options`: backend, atol/rtol overrides, trials, determinism, forced kernels and their knobs
  (`defines`, from `check_kernels`), `impls` and
  `against` (ImplRefs from `kdtr.impl.resolve_refs`), `case_timeout`;
- the record: `VerifyRow`, `VerifyRecord` (`to_plain`/`from_plain`), `load_verify`, `merge_verify`;
- the tolerance policy: `default_tolerances`, `tolerances`, `loosened`;
- the case layer it stands on lives in `kdtr.bundle.case` (`load_case`, `input_fault`, `reference_outputs`).
"""

from ..bundle.case import GOLDEN, LoadedCase, bundle_case, load_case
from .options import Options, check_kernels
from .record import (DEVICE_REFERENCE, EXPECTED, REFERENCE, VerifyRecord, VerifyRow, implementation_info,
                     load_verify, merge_verify, shard_key, suite_digest, verify_record)
from .run import (BundleDone, NothingRan, Selection, check_case, crashed, find_bundles, nothing_ran, run_verify,
                  trial_seed, trial_window, verify_bundle, verify_file, verify_item, verify_row, with_parity)
from .tolerance import default_tolerances, looser, loosened, tolerances

__all__ = ["DEVICE_REFERENCE", "EXPECTED", "GOLDEN", "REFERENCE", "BundleDone", "LoadedCase", "NothingRan", "Options",
           "Selection", "VerifyRecord", "VerifyRow", "bundle_case", "check_case", "check_kernels", "crashed",
           "default_tolerances", "find_bundles", "implementation_info", "load_case", "load_verify", "looser",
           "loosened", "merge_verify", "nothing_ran", "run_verify", "shard_key", "suite_digest", "tolerances",
           "trial_seed", "trial_window", "verify_bundle", "verify_file", "verify_item", "verify_record",
           "verify_row", "with_parity"]

"""Implementations of the ops: ours (`cuda`), the built-in backends (`torch`, `numpy`) and what they
share (`backends`), the ops' bench baselines, the peers (`peers/`), a user's own; how a spec
resolves to one, the one evaluator that runs and judges it, and parity between two. It may import
the root modules, `kdtr.runtime`, `kdtr.scaleout`, `kdtr.records` and `kdtr.ops`, and nothing else
of kdtr.

The public API (verify, bench and the CLI wire it in):
- `resolve(spec) -> Implementation` (`resolved(spec)`: cached), `resolve_all(specs)`, `builtin_names()`;
- `Implementation.serves(op, variant)`, `.provides(op, variant)`, `.unavailable()`, `.versions()`,
  `.prepare(op, variant, inputs, params) -> call`, `impl(op, variant, inputs, params) -> outputs`;
  `baselines(op, variant, inputs, params)`: an op's bench baselines (`Op.baselines` declares them)
  as Implementations too, each with a `BenchRole`;
- `resolve_refs(specs) -> (ImplRef, ...)`: picklable records of resolved implementations
  (`.load()`), what verify and bench carry to the end of a run and into worker processes; any but
  ours loads to run in a worker process of its own (kdtr.impl.isolation, KDTREE_ISOLATE);
- `evaluate(impl, CaseData(op, variant, inputs, params), expected, tolerances) -> Outcome`: the one
  evaluator (run, output contract, comparison; Status: passed, failed, error, skipped, not run);
- `check_outputs(op, variant, outputs, expected_specs, provides=None, reference=None) -> str | None`;
- `parity(op, variant, ours, theirs, reference=None, inputs=None, params=None) -> ParityReport`;
- `kernel_builds(kernels, defines) -> (KernelBuild, ...)` (kdtr.impl.builds): our kernels forced by
  name with their knobs, as `--kernel` and `--define` give them to bench, verify and the GPU scripts,
  checked once; `cuda_build(name, kernel, defines)` (kdtr.impl.builtin) runs one.
Importing it imports neither torch nor any peer.
"""

from ..ops.base import BenchRole
from .base import Implementation, ImplUnavailable, Serves, check_outputs
from .builtin import baselines
from .evaluation import CaseData, Outcome, Status, evaluate
from .parity import OutputParity, ParityReport, bf16_ulp, parity
from .resolve import GROUP, ImplRef, builtin_names, resolve, resolve_all, resolve_refs, resolved

__all__ = ["GROUP", "BenchRole", "CaseData", "ImplRef", "ImplUnavailable", "Implementation", "Outcome",
           "OutputParity", "ParityReport", "Serves", "Status", "baselines", "bf16_ulp", "builtin_names", "check_outputs",
           "evaluate", "parity", "resolve", "resolve_all", "resolve_refs", "resolved"]

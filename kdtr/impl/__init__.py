"""Implementations of the ops: ours (`cuda`), the baselines (`torch`, `numpy`), peers, a user's own.

The public API (verify, bench and the CLI wire it in):
- `resolve(spec) -> Implementation` (`resolved(spec)`: cached), `resolve_all(specs)`, `builtin_names()`;
- `Implementation.serves(op, variant)`, `.provides(op, variant)`, `.unavailable()`, `.versions()`,
  `.prepare(op, variant, inputs, params) -> call`, `impl(op, variant, inputs, params) -> outputs`;
- `run(impl, op, variant, inputs, params, reference=None) -> ImplResult` and
  `check_outputs(op, variant, outputs, expected_specs, provides=None, reference=None) -> str | None`;
- `parity(op, variant, ours, theirs, reference=None, inputs=None, params=None) -> ParityReport`.
Importing it imports neither torch nor any peer.
"""

from .base import Implementation, ImplResult, ImplUnavailable, Serves, check_outputs, run
from .parity import OutputParity, ParityReport, bf16_ulp, parity
from .resolve import GROUP, builtin_names, resolve, resolve_all, resolved

__all__ = ["GROUP", "ImplResult", "ImplUnavailable", "Implementation", "OutputParity", "ParityReport",
           "Serves", "bf16_ulp", "builtin_names", "check_outputs", "parity", "resolve", "resolve_all", "resolved", "run"]

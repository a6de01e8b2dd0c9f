"""What a bench run was asked to do: timing options, modes, the run's settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..errors import UsageError

if TYPE_CHECKING:
    from ..impl import ImplRef

SLOW_CALL_MS = 10.0               # calls slower than this are calibrated from one run
QUICK_CASES_PER_SUITE = 2         # --quick: the first cases of each suite (suites list small ones first)
FLAG_LIMIT = 1.0                  # a figure above 100% of its ceiling is a measurement error
# bf16_mma_x6: bf16 tensor cores doing six piece products for each fp32 product (fp32_bf16x3)
COMPUTE_UNITS = ("bf16_mma", "fp32_fma", "bf16_mma_x6")
MODES = ("hot", "cold", "both")


@dataclass(frozen=True)
class TimingOptions:
    budget_s: float = 0.5          # wall-clock seconds of samples per implementation (a case: this x its implementations)
    target: float = 0.01           # stop once every implementation's reported noise is below this
    min_samples: int = 10          # per implementation, before "converged" may stop the rounds
    max_samples: int = 400
    warmup_s: float = 0.1          # the GPU's clocks drop while the host works between timings
    sample_ms: float = 0.5         # aim for samples at least this long (k calls per sample)
    max_calls: int = 1000          # k at most
    rounds: int = 8                # a turn lasts budget_s / rounds (at least one sample)
    min_rounds: int = 5            # every implementation takes part in at least this many rounds
    max_rounds: int = 64
    # The least noise a median reports; 0: the measured noise alone. (Before the rounds, a floor of
    # 0.5% stood in for the drift between two timings that one timing's samples cannot see; the
    # spread between interleaved rounds now measures that drift.)
    noise_floor: float = 0.0

    def check(self) -> None:
        if not (self.budget_s > 0 and self.target > 0 and self.warmup_s >= 0 and self.sample_ms > 0
                and 0 <= self.noise_floor < 1):
            raise UsageError("timing budget, target and sample length must be > 0, the noise floor in [0, 1)")
        if not 1 <= self.min_samples <= self.max_samples or self.max_calls < 1:
            raise UsageError("need 1 <= min_samples <= max_samples and max_calls >= 1")
        if not 2 <= self.min_rounds <= self.max_rounds or self.rounds < 1:
            raise UsageError("need 2 <= min_rounds <= max_rounds and rounds >= 1 (the noise comes from "
                             "the spread between rounds)")


QUICK_TIMING = TimingOptions(budget_s=0.1, target=0.05, min_samples=5, max_samples=100, warmup_s=0.01,
                             sample_ms=0.2, max_calls=200, rounds=4, min_rounds=3)
STOP_REASONS = ("converged", "budget", "max_samples", "max_rounds", "time_limit")


@dataclass(frozen=True)
class BenchSettings:
    backend: str = "auto"                 # auto | cuda | torch
    mode: str = "cold"                    # hot | cold | both (a run without GPU is always host)
    timing: TimingOptions = TimingOptions()
    baselines: tuple[str, ...] | None = None    # None: the op's default baselines (BenchRole.default)
    quick: bool = False
    repeat: bool = False                  # time our kernel a second time, interleaved with the first
    sanity: bool = True                   # empty-kernel and copy sanity cases
    # For the whole run, checked before each case and each baseline's setup: cases past it are
    # listed as not run, baselines as skipped; a case already in its rounds stops once it has
    # min_rounds (so one case may run over by its minimum rounds).
    time_limit_s: float | None = None
    # Our kernels forced by name, timed against each other (the first is the reference point of
    # their speedups) in every case whose op and variant have them; () times the launch's own choice.
    kernels: tuple[KernelBuild, ...] = ()
    # Other implementations (kdtr.impl specs: --impl), each timed as a row of its own in the cases
    # whose op and variant it serves, checked against the reference with the op's tolerances first.
    impls: tuple[ImplRef, ...] = ()   # --impl, resolved (picklable: workers load them)
    # After the interleaved rounds, every implementation again alone, call after call: the table
    # quotes the slower of the two figures (docs/timing.md).
    back_to_back: bool = True
    lock_clocks: bool = False             # the SM clock locked at its base (TDP) clock during the run


Progress = Callable[[str, int, int], None]        # (what is running, cases done, cases in all)

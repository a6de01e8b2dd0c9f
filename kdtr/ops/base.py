"""What every op module provides: the contract the CLI, gen-refs, verify and bench rely on.

An op module defines one subclass of `Op` and exposes an instance as `OP`. Nothing outside the
module knows an op by name: adding an op = one module + one .cu + one spec (and a line in
`kdtr.ops.OP_MODULES`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

import numpy as np

from ..config import config
from ..dtypes import NUMPY_DTYPES
from ..errors import DeviceError
from ..gpus import GPU_MODELS
from ..runtime.device import device_arch, gpu_available, max_shared_optin, multiprocessor_count

EXACT = "exact"


@dataclass(frozen=True)
class Tolerance:
    """Pass iff |x - r| <= atol + rtol * |r| elementwise; `exact` means bitwise equality.

    `l2` (optional, kdtree's extension of docs/ops/) also bounds ||x - r|| / ||r|| over the whole
    output: elementwise bounds must leave room for cancellation near zero, the norm does not.
    """

    atol: float = 0.0
    rtol: float = 0.0
    l2: float | None = None
    exact: bool = False

    @staticmethod
    def parse(value: Any) -> "Tolerance":
        """From the bundle/spec form: "exact" or {"atol": a, "rtol": r}. Raises ValueError."""
        if value == EXACT:
            return Tolerance(exact=True)
        if isinstance(value, Mapping):
            unknown = set(value) - {"atol", "rtol", "l2"}
            if unknown:
                raise ValueError(f"unknown tolerance key(s) {sorted(unknown)}; expected atol, rtol, l2")
            out = {}
            for key in ("atol", "rtol", "l2"):
                if key not in value:
                    continue
                v = value[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                    raise ValueError(f"{key} must be a finite number >= 0, got {v!r}")
                out[key] = float(v)
            return Tolerance(**out)
        raise ValueError(f'a tolerance is "exact" or {{atol: a, rtol: r}}, got {value!r}')

    def to_json(self) -> Any:
        if self.exact:
            return EXACT
        out = {"atol": self.atol, "rtol": self.rtol}
        if self.l2 is not None:
            out["l2"] = self.l2
        return out


@dataclass(frozen=True)
class Param:
    """One case parameter an op accepts in a suite (validated by kdtr.bundle.spec)."""

    name: str
    type: type                      # int, float, str or bool
    default: Any = None             # None: required
    min: float | None = None
    max: float | None = None
    choices: tuple | None = None
    doc: str = ""


@dataclass(frozen=True)
class Cost:
    """The op's cost model for one case: useful FLOPs and the fewest bytes it must move."""

    flops: float
    bytes: float


@dataclass
class Case:
    """One generated test case, ready for an op's generate()."""

    name: str
    op: str
    variant: str
    seed: int
    params: dict[str, Any]
    tolerance: dict[str, Tolerance] = field(default_factory=dict)
    inline: dict[str, Any] = field(default_factory=dict)   # small hand-given inputs
    source: str | None = None                              # "specs/x.yaml:12"


@dataclass
class Generated:
    """What gen-refs stores: kernel inputs, optional debugging aux tensors, bundle params."""

    inputs: dict[str, np.ndarray]
    params: dict[str, Any]                                 # meta.params of the bundle
    aux: dict[str, np.ndarray] = field(default_factory=dict)


CLOCKS = ("device", "host")


@dataclass(frozen=True)
class BenchRole:
    """How `kdtree bench` times one of an op's baselines (`Op.baselines`); nothing else looks at
    it. `clock`: how a call is timed, "device" (CUDA events around device work) or "host"
    (perf_counter, for work done on the CPU; the call then includes its own device<->host copies).
    `slow_setup`: left out by `kdtree bench --quick` (compilers). `default`: timed unless
    `--baseline` names others (False: only when named). `backend`: the built-in backend it is
    ("torch": op.run_torch), left out when that backend is the one under test.
    """

    clock: str = "device"
    slow_setup: bool = False
    default: bool = True
    backend: str | None = None

    def __post_init__(self):
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}, got {self.clock!r}")


@dataclass(frozen=True)
class Baseline:
    """One implementation `kdtree bench` times beside our kernel on a case, as the op declares it
    (`Op.baselines`); kdtr.impl.baselines makes it an Implementation serving exactly that op and
    variant. `prepare(op, variant, inputs, params) -> call` as an Implementation's; None: the
    built-in backend `role.backend` itself. `outputs`: the subset of the op's outputs it returns
    (None: all); `probe`: why it cannot run this case here (None: it can), shown as the row's skip.
    """

    name: str
    doc: str
    role: BenchRole = BenchRole()
    prepare: Callable | None = None
    outputs: tuple[str, ...] | None = None
    probe: Callable[[], str | None] | None = None

    def __post_init__(self):
        if self.prepare is None and self.role.backend is None:
            raise ValueError(f"baseline {self.name}: give its prepare or the built-in backend it is")


ROLES = ("default", "fallback", "experimental")


@dataclass(frozen=True)
class Gpu:
    """What a launch's kernel choice reads off the device."""

    arch: int            # compute capability as an integer: 90 for sm_90
    sms: int             # multiprocessors
    smem_optin: int      # the largest dynamic shared memory one block may opt in to, bytes

    @staticmethod
    def here() -> "Gpu":
        """The GPU launches choose kernels for: this machine's current GPU, the target H200 where
        there is none; with KDTREE_GPU, its arch and shared-memory limit instead (the SM count
        stays the present GPU's, whose grid the split count fills; without a GPU the table's)."""
        run_as = config().run_as
        if run_as is None:
            return Gpu.present() if gpu_available() else H200
        sms = Gpu.present().sms if gpu_available() else (GPU_MODELS.get(run_as.arch) or H200).sms
        return Gpu(run_as.arch, sms, run_as.smem_optin)

    @staticmethod
    def present() -> "Gpu":
        """This machine's current GPU as it is (KDTREE_GPU aside); DeviceError without one."""
        return Gpu(int(device_arch().removeprefix("sm_")), multiprocessor_count(), max_shared_optin(own=True))


H200 = Gpu(arch=90, sms=132, smem_optin=232448)


@dataclass(frozen=True, kw_only=True)
class CudaKernel:
    """One CUDA kernel of an op, as kernels/README.md's table lists it (a test holds the two equal).

    `name` is the registry key `--kernel` takes; the source is kernels/<op>_<name>.cu and its entry
    symbol <op>_<name> (helper entries append to it: _merge, _pieces). `role`: "default" (the launch
    picks it where it runs), "fallback" (picked where the default cannot serve the shape or the GPU)
    or "experimental" (only by name). `serves`: the one line saying which shapes on which GPUs.
    `threads` and `smem` (0: sized per launch) are the main entry's block and dynamic shared memory;
    `arch_feature` "a" builds it for the arch-specific target (sm_90a: wgmma, setmaxnreg); `min_sm` /
    `only_sm` bound the architectures whose instructions it uses. `launch_knobs`: the `--define`
    knobs its launch reads instead of the compiler (each a positive integer, e.g. a split count);
    they may change how results round, so bench checks such a build as it would another kernel.
    `compute_unit`: the ceiling bench rates it against where not the variant's (bench.COMPUTE_UNITS).
    """

    op: str
    variant: str
    name: str
    role: str
    serves: str
    threads: int
    smem: int = 0
    arch_feature: str = ""
    min_sm: int = 0
    only_sm: int | None = None
    launch_knobs: tuple[str, ...] = ()
    compute_unit: str = ""

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"{self.name}: role must be one of {ROLES}, got {self.role!r}")

    @property
    def source(self) -> str:
        return f"{self.op}_{self.name}.cu"

    @property
    def entry(self) -> str:
        return f"{self.op}_{self.name}"

    def runs_on(self, gpu: Gpu, smem: int | None = None) -> bool:
        """Its instructions exist on `gpu` and `smem` bytes (default: its own) fit there (+ 64 B of
        static shared memory)."""
        need = self.smem if smem is None else smem
        return self.has_instructions(gpu.arch) and need + 64 <= gpu.smem_optin

    def has_instructions(self, arch: int) -> bool:
        """The instructions it uses exist on sm_<arch>."""
        return arch >= self.min_sm and (self.only_sm is None or arch == self.only_sm)

    def require_present(self) -> None:
        """DeviceError, one line, unless the GPU present runs it: KDTREE_GPU may choose a kernel for
        an architecture whose instructions (wgmma: sm_90) or shared memory this one lacks."""
        present = Gpu.present()
        if self.runs_on(present):
            return
        run_as = config().run_as
        why = (f"KDTREE_GPU={run_as.label} picks {self.name} for {self.op}/{self.variant}" if run_as
               else f"{self.op}/{self.variant} kernel {self.name}")
        need = (f"sm_{self.only_sm} instructions" if self.only_sm is not None else f"sm_{self.min_sm}+ instructions")
        raise DeviceError(f"{why}; it needs {need} and {self.smem + 64} B of shared memory a block, and "
                          f"this GPU is sm_{present.arch} with {present.smem_optin} B")


class Op:
    """Base class; subclasses fill in the class attributes and the methods below."""

    name: str = ""
    variants: tuple[str, ...] = ("default",)
    params: tuple[Param, ...] = ()
    inline_inputs: tuple[str, ...] = ()     # names a suite may give inline
    shape_params: tuple[str, ...] = ()      # params that inline inputs' shapes decide (Generated.params)
    outputs: tuple[str, ...] = ()
    kernel_params: tuple[str, ...] = ()    # meta.params a bundle must carry for the kernel
    kernels: tuple["CudaKernel", ...] = ()  # the op's CUDA kernels (kernels/README.md is their table)

    # -- suites ---------------------------------------------------------------------------
    def case_name(self, variant: str, params: Mapping[str, Any]) -> str:
        """A unique, readable name generated from the parameters (e.g. `h16_p2048_b16`)."""
        raise NotImplementedError

    def check_params(self, variant: str, params: Mapping[str, Any]) -> None:
        """Cross-parameter checks beyond each Param's range; raise ValueError with the reason."""

    def input_specs(self, variant: str) -> dict[str, str]:
        """Name -> KDTR dtype of every input the variant takes."""
        raise NotImplementedError

    def check_inputs(self, variant: str, inputs: Mapping[str, np.ndarray],
                     params: Mapping[str, Any]) -> None:
        """Shape and index consistency of inputs read from a bundle (which is trusted for nothing);
        raise ValueError naming the fault. Names and dtypes are checked before this is called."""

    # -- goldens --------------------------------------------------------------------------
    def generate(self, case: Case) -> Generated:
        """Deterministic inputs from the case's params and seed (numpy Generator, no global state)."""
        raise NotImplementedError

    def reference(self, variant: str, inputs: Mapping[str, np.ndarray],
                  params: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The exact numpy reference, per docs/ops/<op>.md; outputs in their stored dtypes."""
        raise NotImplementedError

    def tolerances(self, variant: str) -> dict[str, Tolerance]:
        """Default tolerance per output (each with its reason written beside it)."""
        raise NotImplementedError

    def control(self, variant: str, inputs: Mapping[str, np.ndarray], params: Mapping[str, Any],
                order: int) -> dict[str, np.ndarray]:
        """The outputs computed as an honest implementation in the op's working precision computes
        them, in another summation order (`order`, a seed: each a different one): the same-precision
        control whose distance from the golden kdtr.ops.numerics turns into the gate for implementations
        other than the reference and our kernels (docs/numerics.md). By default none (the
        tolerances alone: exact outputs need no control)."""
        return {}

    def estimate_bytes(self, variant: str, params: Mapping[str, Any]) -> int | None:
        """Peak host memory that generate + reference take for a case with these (suite) params,
        read off the shapes they allocate, so gen-refs can refuse a case before it exhausts the
        machine; None: no estimate (small enough not to matter)."""
        return None

    def run_bytes(self, variant: str, params: Mapping[str, Any], backend: str) -> int | None:
        """Peak host memory one run of `backend` takes on a case of these (suite) params, beside
        the inputs it is given, so verify and bench can refuse a case before it exhausts the
        machine; None: no estimate. numpy runs the reference (estimate_bytes covers it); the
        device backends hold their tensors on the GPU."""
        return self.estimate_bytes(variant, params) if backend == "numpy" else None

    # -- requests (verify --invariance) ----------------------------------------------------
    def request_count(self, variant: str, inputs: Mapping[str, Any]) -> int | None:
        """How many independent requests the inputs batch; None: they are not batched by request
        (the invariance probe then says n/a, with `unbatched_reason`)."""
        return None

    unbatched_reason: str = "its inputs are not batched by request"

    def take_requests(self, variant: str, inputs: Mapping[str, np.ndarray], params: Mapping[str, Any],
                      indices) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """A batch of the given requests (in that order): inputs and params (numpy)."""
        raise NotImplementedError

    def by_request(self, variant: str, outputs: Mapping[str, np.ndarray],
                   batch: int) -> dict[str, np.ndarray]:
        """Each output of a `batch`-request run viewed with one leading axis per request."""
        raise NotImplementedError

    # -- backends -------------------------------------------------------------------------
    def run_torch(self, variant: str, inputs: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        """The vectorised torch implementation; inputs are torch tensors on one device."""
        raise NotImplementedError

    def run_cuda(self, variant: str, inputs: Mapping[str, Any], params: Mapping[str, Any],
                 outputs: Mapping[str, Any], *, kernel: str | None = None,
                 defines: Mapping[str, Any] | None = None) -> None:
        """Launch our kernel on torch CUDA tensors, writing into the given (poisoned) outputs;
        `kernel` forces one of `cuda_kernels(variant)` instead of the launch's own choice, `defines`
        adds compile-time knobs (each kernel's header names its own)."""
        raise NotImplementedError

    def cuda_kernels(self, variant: str) -> tuple[str, ...]:
        """Names of the kernels `run_cuda(kernel=...)` can force for this variant."""
        return tuple(k.name for k in self.kernels if k.variant == variant)

    def cuda_kernel(self, name: str, variant: str) -> "CudaKernel":
        """The registry entry `name` of this variant; ValueError naming the ones there are."""
        for k in self.kernels:
            if k.name == name and k.variant == variant:
                return k
        raise ValueError(f"{self.name}/{variant} has no CUDA kernel {name!r} (have {self.cuda_kernels(variant)})")

    def launch_grid(self, variant: str, inputs: Mapping[str, np.ndarray], params: Mapping[str, Any],
                    kernel: str) -> tuple[int, ...] | None:
        """The grid `run_cuda` launches `kernel`'s main entry with on this machine's GPU (bench
        shows it beside the kernel, so that a shape-dependent choice is visible); None: not told."""
        return None

    def kernel_choice(self, variant: str, inputs: Mapping[str, np.ndarray],
                      params: Mapping[str, Any], gpu: "Gpu | None" = None) -> str:
        """The kernel `run_cuda` launches for these inputs on `gpu` (default: this machine's GPU,
        or the target H200 where there is none). By default the variant's one kernel."""
        (name,) = self.cuda_kernels(variant)
        return name

    def kernels_serving(self, variant: str, gpu: "Gpu") -> tuple[str, ...]:
        """The kernels kernel_choice picks for some shape of the variant on `gpu`. By default every
        one of the variant's kernels that runs there (ops whose choice is by shape alone)."""
        return tuple(k.name for k in self.kernels if k.variant == variant and k.runs_on(gpu))

    def output_specs(self, variant: str, inputs: Mapping[str, np.ndarray],
                     params: Mapping[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Name -> (kdtr dtype, shape) of each output, for allocating and poisoning."""
        raise NotImplementedError

    def kernel_sources(self, variant: str) -> tuple[str, ...]:
        """The .cu files (relative to kernels/) this variant compiles."""
        return tuple(k.source for k in self.kernels if k.variant == variant)

    # -- reports --------------------------------------------------------------------------
    def describe(self, variant: str, inputs: Mapping[str, np.ndarray],
                 params: Mapping[str, Any]) -> dict[str, int]:
        """Configuration columns for tables (B, H, Q, prefix, ...), read off the shapes."""
        raise NotImplementedError

    def cost(self, variant: str, inputs: Mapping[str, np.ndarray], params: Mapping[str, Any]) -> Cost:
        """FLOP/byte model for the roofline; by default a latency-bound op that reads its inputs
        and writes its outputs once and does no floating-point work worth counting."""
        specs = self.output_specs(variant, inputs, params)
        out_bytes = sum(NUMPY_DTYPES[d].itemsize * int(np.prod(s)) for d, s in specs.values())
        return Cost(flops=0.0, bytes=float(sum(a.nbytes for a in inputs.values()) + out_bytes))

    def case_cost(self, case: Case) -> Cost | None:
        """`cost` of the inputs `generate(case)` would draw, priced from the case's shapes alone
        (the roofline's large cases hold GBs of K/V); None where the op gives no such form."""
        return None

    # -- bench ----------------------------------------------------------------------------
    def baselines(self, variant: str, inputs: Mapping[str, np.ndarray],
                  params: Mapping[str, Any]) -> tuple[Baseline, ...]:
        """What `kdtree bench` times beside our kernel on this case, each with its BenchRole and its
        name as bench shows and records it (kdtr.impl.baselines makes them Implementations);
        `inputs` are the case's numpy arrays, for size estimates (a baseline's probe may refuse the
        case). By default: the torch backend, eager."""
        return (Baseline("torch", "the torch backend (run_torch), eager", BenchRole(backend="torch")),)

    def compute_unit(self, variant: str, kernel: str | None = None) -> str:
        """The measured ceiling that bench rates this variant's FLOP/s against, run by our CUDA
        `kernel` where named (its registry entry's compute_unit, where it has one): "bf16_mma" (dense
        bf16 tensor-core matrix products), "fp32_fma" (FP32 without tensor cores) or "bf16_mma_x6"
        (bf16 tensor cores at six products an FP32 product)."""
        own = self.cuda_kernel(kernel, variant).compute_unit if kernel is not None else ""
        return own or self.variant_compute_unit(variant)

    def variant_compute_unit(self, variant: str) -> str:
        """The variant's own unit (its math as the reference states it): "bf16_mma" by default."""
        return "bf16_mma"

    def bench_reference(self, variant: str, inputs: Mapping[str, Any],
                        params: Mapping[str, Any]) -> dict[str, Any] | None:
        """Expected outputs computed on the bench device from torch `inputs`, at the reference's
        precision, for shapes whose numpy reference is too slow for a bench run; None (the default):
        bench uses `reference`."""
        return None

    def bench_extra(self, variant: str, inputs: Mapping[str, np.ndarray],
                    params: Mapping[str, Any]) -> dict[str, Any]:
        """Extra per-case facts a bench record keeps beside `describe` (JSON-ready values)."""
        return {}

    def baseline_tolerances(self, variant: str) -> dict[str, Tolerance]:
        """What a baseline's outputs must meet before bench times it; by default the op's own."""
        return self.tolerances(variant)

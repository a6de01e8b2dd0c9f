"""Every environment variable kdtree reads, in one place (option > environment > default).

NO_COLOR is honoured by rich itself (cli/render.py), so it has no field here. The kernels and the
default suites come from the environment, else the checkout kdtree runs from, else the copies an
installed wheel carries as package data (kdtr/_kernels, kdtr/_specs)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from .errors import ConfigError
from .gpus import RunAs, parse_run_as

REPO_ROOT = Path(__file__).resolve().parent.parent


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    return Path(value).expanduser()


def _env_bool(name: str) -> bool | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"environment variable {name}={value!r} is not a boolean (use 1/0, true/false)")


@dataclass(frozen=True)
class Config:
    cache_dir: Path        # KDTREE_CACHE_DIR: compiled cubins
    kernels_dir: Path      # KDTREE_KERNELS_DIR: the CUDA sources
    kernels_from: str      # where kernels_dir came from, in words (for doctor and errors)
    specs_dir: Path        # the default suites (a command's own ./specs wins over these)
    specs_from: str
    no_cache: bool         # KDTREE_NO_CACHE: compile every time
    mem_limit: str | None  # KDTREE_MEM_LIMIT: gen-refs' memory bound (e.g. 8G; --mem-limit wins)
    run_as: RunAs | None   # KDTREE_GPU: launches choose kernels as on this GPU (docs/gpus.md)


def _env_run_as() -> RunAs | None:
    value = os.environ.get("KDTREE_GPU")
    if value is None or value == "":
        return None
    try:
        return parse_run_as(value)
    except ValueError as err:
        raise ConfigError(f"environment variable KDTREE_GPU={value!r}: {err}") from None


def _packaged(checkout_name: str, package_name: str) -> tuple[Path, str]:
    """The checkout's folder where kdtree runs from one, else the installed package data."""
    local = REPO_ROOT / checkout_name
    if (REPO_ROOT / "pyproject.toml").is_file() and local.is_dir():
        return local, "the checkout"
    return Path(str(resources.files("kdtr") / package_name)), "the installed package"


@lru_cache(maxsize=1)
def config() -> Config:
    """Read the environment once, on first use (nothing happens at import)."""
    cache = _env_path("KDTREE_CACHE_DIR")
    if cache is None:
        base = _env_path("XDG_CACHE_HOME") or Path.home() / ".cache"
        cache = base / "kdtree"
    kernels = _env_path("KDTREE_KERNELS_DIR")
    if kernels is None:
        kernels, kernels_from = _packaged("kernels", "_kernels")
    elif kernels.is_dir():
        kernels_from = "KDTREE_KERNELS_DIR"
    else:
        raise ConfigError(f"environment variable KDTREE_KERNELS_DIR={str(kernels)!r} is not a folder")
    specs, specs_from = _packaged("specs", "_specs")
    return Config(
        cache_dir=cache,
        kernels_dir=kernels,
        kernels_from=kernels_from,
        specs_dir=specs,
        specs_from=specs_from,
        no_cache=bool(_env_bool("KDTREE_NO_CACHE")),
        mem_limit=os.environ.get("KDTREE_MEM_LIMIT") or None,
        run_as=_env_run_as(),
    )


# The shard variables of the schedulers `--shard auto` understands (kdtr/scaleout/shards.py interprets them).
SCHEDULER_VARIABLES = ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT",
                       "SLURM_ARRAY_TASK_STEP", "BUILDKITE_PARALLEL_JOB", "BUILDKITE_PARALLEL_JOB_COUNT",
                       "CIRCLE_NODE_INDEX", "CIRCLE_NODE_TOTAL", "JOB_COMPLETION_INDEX")


def scheduler_variables() -> dict[str, int]:
    """The scheduler shard variables that are set, as integers written in ASCII digits alone (no
    sign, no `_`, no other script's digits: what Python's int() would also take is a typo here).
    Read on each call, not cached with `config()`: only `--shard auto` asks, once per run."""
    found: dict[str, int] = {}
    for name in SCHEDULER_VARIABLES:
        value = os.environ.get(name)
        if value is None or value.strip() == "":
            continue
        if not (value.isascii() and value.isdigit()):
            raise ConfigError(f"environment variable {name}={value!r} is not an integer in plain digits (0-9)")
        found[name] = int(value)
    return found

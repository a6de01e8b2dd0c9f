"""Every environment variable kdtree reads, in one place (option > environment > default).

NO_COLOR is honoured by rich itself (cli/render.py), so it has no field here."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import ConfigError

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
    no_cache: bool         # KDTREE_NO_CACHE: compile every time


@lru_cache(maxsize=1)
def config() -> Config:
    """Read the environment once, on first use (nothing happens at import)."""
    cache = _env_path("KDTREE_CACHE_DIR")
    if cache is None:
        base = _env_path("XDG_CACHE_HOME") or Path.home() / ".cache"
        cache = base / "kdtree"
    kernels = _env_path("KDTREE_KERNELS_DIR") or REPO_ROOT / "kernels"
    return Config(
        cache_dir=cache,
        kernels_dir=kernels,
        no_cache=bool(_env_bool("KDTREE_NO_CACHE")),
    )

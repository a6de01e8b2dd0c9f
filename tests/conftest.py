"""Shared test setup: tests marked `@pytest.mark.gpu` skip with a reason where there is no CUDA GPU."""

from __future__ import annotations

import os
import secrets

import pytest

from kdtr.config import config


def gpu_skip_reason() -> str | None:
    """None where a CUDA GPU is usable, else why GPU tests skip ("no CUDA GPU: ...")."""
    from kdtr.runtime.device import gpu_available

    if gpu_available():
        return None
    try:
        import torch

        detail = f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA {torch.version.cuda})"
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason itself
        detail = f"torch cannot be imported ({exc})"
    return f"no CUDA GPU: {detail}"


def pytest_configure(config):
    """Draw the session's fresh test seed once, here in the main process, so that pytest-xdist's
    workers (which inherit this environment) all see the same one: it is in test ids
    (tests/kernels/test_cuda_kernels.py's FRESH_SEED), and workers that collect different ids
    stop the run. Set KDTREE_TEST_SEED yourself to replay a seed."""
    if not hasattr(config, "workerinput") and not os.environ.get("KDTREE_TEST_SEED"):
        os.environ["KDTREE_TEST_SEED"] = str(secrets.randbelow(1 << 31))


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = gpu_skip_reason()
    if reason is None:
        return
    for item in gpu_items:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    """A private cubin cache folder for one test (config() is re-read)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("KDTREE_CACHE_DIR", str(folder))
    monkeypatch.delenv("KDTREE_NO_CACHE", raising=False)
    config.cache_clear()
    yield folder
    config.cache_clear()


@pytest.fixture
def goldens(tmp_path):
    """Goldens of the small suites (tests.helpers.SMALL_CASES) in a fresh folder."""
    from tests.helpers import make_goldens

    return make_goldens(tmp_path)

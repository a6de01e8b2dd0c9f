"""The mutation suite (docs/mutation.md): honest variants and mutants per op, the kill table."""

from __future__ import annotations

import functools
import os

from kdtr.impl.base import Implementation, Serves

THREAD_COUNTS = {"torch_threads1": 1, "torch_threads2": 2, "torch_threads_all": os.cpu_count() or 1}


def _torch_threads(threads: int, op, variant, inputs, params):
    """The torch backend with `threads` intra-op threads (restored after the call)."""
    import torch

    def call():
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return op.run_torch(variant, inputs, params)
        finally:
            torch.set_num_threads(before)
    return call


def torch_at_thread_counts(serves: Serves) -> list[Implementation]:
    """The torch backend at 1, 2 and all threads, serving `serves`: honest variants of every op."""
    return [Implementation(name, (serves,), functools.partial(_torch_threads, count), device="cpu",
                           doc=f"the torch backend at {count} thread(s)") for name, count in THREAD_COUNTS.items()]

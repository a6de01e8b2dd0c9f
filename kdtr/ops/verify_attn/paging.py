"""Chain drafts and paged pools: the two case shapes production serving on Hopper verifies with.

A *chain* draft (`tree: chain`) is what MTP and EAGLE with topk 1 propose: node i's parent is i − 1,
so tree row i sees nodes 0..i and the tree mask is the causal (lower-triangular) one FlashMLA and
every causal kernel apply. A *paged* pool (`slots: pages64`) keeps each request's keys, its prefix
then its tree nodes, in pages of 64 consecutive slots, the pages in random order: the layout a
paged engine (SGLang with page size 64, FlashMLA's block table) keeps. `slots: tokens` is the
page-size-1 pool whose every key sits in a random slot.
"""

from __future__ import annotations

import numpy as np

PAGE = 64                                        # tokens per page of `slots: pages64` (FlashMLA's block size)
SLOT_LAYOUTS = ("tokens", "pages64")
TREE_SHAPES = ("best", "chain")


def chain_visibility(batch: int, q_len: int) -> np.ndarray:
    """[B, Q, Q] u8: row i sees nodes 0..i (node i's parent is i − 1)."""
    return np.ascontiguousarray(np.broadcast_to(np.tril(np.ones((q_len, q_len), np.uint8)), (batch, q_len, q_len)))


def is_chain(visibility: np.ndarray) -> bool:
    """Every request's tree mask is the causal one."""
    q_len = visibility.shape[-1]
    return bool(np.array_equal(visibility.astype(bool), np.broadcast_to(np.tri(q_len, dtype=bool), visibility.shape)))


def page_size(slots: str) -> int:
    return PAGE if slots == "pages64" else 1


def pool_rows(keys: np.ndarray, slots: str) -> int:
    """Rows of the pool for requests holding `keys` tokens each: a quarter more pages (page size 1
    for `tokens`) than the requests use, at least one, stays unused."""
    page = page_size(slots)
    used_pages = int((-(-keys.astype(np.int64) // page)).sum())
    return (used_pages + max(1, used_pages // 4)) * page


def request_slots(rng: np.random.Generator, prefix_len: np.ndarray, q_len: int,
                  slots: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(kv_indices: every request's prefix slots, requests in order; tree_slots [B·Q]; the pool's
    row count). `tokens`: one permutation of the pool's rows, dealt out to the prefixes, then to
    the trees (a fragmented page-size-1 pool); `pages64`: one permutation of the pool's pages, each
    request taking the next ceil((P_b + Q) / 64) of them, its key t (prefix, then tree nodes) at
    page[t // 64]·64 + t % 64."""
    keys = prefix_len.astype(np.int64) + q_len
    rows = pool_rows(keys, slots)
    page = page_size(slots)
    order = rng.permutation(rows // page).astype(np.int32)
    if page == 1:
        total = int(prefix_len.sum())
        return order[:total].copy(), order[total:total + keys.size * q_len].copy(), rows
    prefixes, trees, at = [], [], 0
    for count, prefix in zip(keys, prefix_len):
        pages = -(-int(count) // page)
        own = (order[at:at + pages, None] * page + np.arange(page, dtype=np.int32)).reshape(-1)[:count]
        at += pages
        prefixes.append(own[:prefix])
        trees.append(own[prefix:])
    return np.concatenate(prefixes).astype(np.int32), np.concatenate(trees).astype(np.int32), rows


def pages_of(slots: np.ndarray, page: int = PAGE) -> np.ndarray | None:
    """The page numbers holding `slots` (one request's keys in order) when they are whole pages of
    `page` consecutive slots, each starting at a multiple of `page` (the last may be partial);
    None otherwise."""
    slots = np.asarray(slots, np.int64)
    count = slots.size
    if count == 0:
        return np.zeros(0, np.int64)
    first = slots[::page]
    if np.any(first % page):
        return None
    expected = (np.repeat(first, page)[:count] + np.tile(np.arange(page), -(-count // page))[:count])
    return first // page if np.array_equal(slots, expected) else None

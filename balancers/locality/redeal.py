"""Re-deal items of equal length among the places such items take, keeping the most bytes local.

Items of one length cost the same and hold the same tokens, so any permutation among them
leaves every rank's load and tokens unchanged: per length, the permutation that keeps the
most bytes on their node (exactly), and of those as many on their rank as its places allow.
"""

from __future__ import annotations

import numpy as np

from .partial_plan import runs


def _match_by_key(items: np.ndarray, item_keys: np.ndarray, slots: np.ndarray, slot_keys: np.ndarray,
                  item_rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pair items with slots of the same key, most bytes first: (matched items, their slots).

    Within a key, items go in `item_rank` order (bytes descending, ties by index) and
    slots in index order; the k-th item takes the k-th slot while slots last.
    """
    n = item_rank.size
    items = items[np.argsort(item_keys[items] * n + item_rank[items])]  # unique keys: no ties
    slots = slots[np.argsort(slot_keys[slots] * n + slots)]
    keys, available = item_keys[items], slot_keys[slots]
    _, position = runs(keys)
    first = np.searchsorted(available, keys, side="left")
    count = np.searchsorted(available, keys, side="right") - first
    taken = position < count
    return items[taken], slots[first[taken] + position[taken]]


def redeal_equal_items(lengths: np.ndarray, destinations: np.ndarray, sources: np.ndarray,
                      item_bytes: np.ndarray, gpus_per_node: int, num_ranks: int) -> np.ndarray:
    """Re-deal items of equal length among the places such items take, keeping the most bytes local.

    Items of one length cost the same and hold the same tokens, so any permutation among
    them leaves every rank's load and tokens (padded or not) unchanged.  Per length: the
    items with the most bytes that the node's places can hold stay on their node; of
    those, as many as the rank's places allow stay on their rank (most bytes first); the
    rest of the node's kept items take its other places; everything else takes what is
    left.  This maximises, per length, the bytes kept on their node (exactly), and keeps
    on their rank as many of those as the rank's places allow.

    >>> redeal_equal_items(np.array([4, 4]), np.array([1, 0]), np.array([0, 1]), np.array([1., 1.]), 1, 2).tolist()
    [0, 1]
    """
    n = lengths.size
    length_class = np.unique(lengths, return_inverse=True)[1].astype(np.int64).ravel()
    item_rank = np.empty(n, dtype=np.int64)
    item_rank[np.lexsort((np.arange(n), -item_bytes))] = np.arange(n)
    everything = np.arange(n, dtype=np.int64)
    by_node = length_class * num_ranks + sources // gpus_per_node
    # Which items stay on their node: the most bytes, as many as the node has places.
    stay, _ = _match_by_key(everything, by_node, everything, length_class * num_ranks + destinations // gpus_per_node,
                            item_rank)
    result = np.full(n, -1, dtype=np.int64)
    free = np.ones(n, dtype=bool)
    levels = ((stay, length_class * num_ranks + sources, length_class * num_ranks + destinations),
              (stay, by_node, length_class * num_ranks + destinations // gpus_per_node),
              (everything, length_class, length_class))
    for candidates, item_keys, slot_keys in levels:
        waiting = candidates[result[candidates] < 0]
        matched, slots = _match_by_key(waiting, item_keys, np.flatnonzero(free), slot_keys, item_rank)
        result[matched] = destinations[slots]
        free[slots] = False
    return result

"""Re-deal items of equal length among the places such items take, keeping the most bytes local.

Items of one length cost the same and hold the same tokens, so any permutation among them
leaves every rank's load and tokens unchanged: per length, the permutation that keeps the
most bytes on their node (exactly), and of those as many on their rank as its places allow.
"""

from __future__ import annotations

import numpy as np

from ..problem import sorted_order


def _by_key(members: np.ndarray, keys: np.ndarray, order: np.ndarray, of_order: np.ndarray) -> np.ndarray:
    """`members` sorted by (keys, order), keys non-negative, `order` a permutation of range(n) and `of_order` its
    inverse: where the members' keys fit 16 bits, numpy's radix argsort of them, stable, over the members listed in
    `order` (already so where `order` is the identity, passed as both, and they ascend); else one sort of the packed
    keys key · n + order, decoded (a third of an argsort's time, and several times a 16-bit radix's)."""
    member_keys = keys[members]
    if not member_keys.size or int(member_keys.max()) >= 2**16:
        return of_order[np.sort(member_keys * order.size + order[members]) % order.size]
    if order is not of_order or not bool(np.all(members[1:] > members[:-1])):
        chosen = np.zeros(order.size, dtype=bool)
        chosen[members] = True
        members = of_order[chosen[of_order]]
        member_keys = keys[members]
    return members[np.argsort(member_keys.astype(np.uint16), kind="stable")]


def _match_sorted(items: np.ndarray, item_keys: np.ndarray, slots: np.ndarray,
                  slot_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pair items with slots of the same key, both listed in key order (`_by_key`: items by bytes
    descending, ties by index, within a key; slots by index): the k-th item of a key takes its k-th
    slot while slots last.  Returns (matched items, their slots).  A key's slots are found once for
    its run of items (binary searches per distinct key, not per item)."""
    keys, available = item_keys[items], slot_keys[slots]
    if not keys.size:
        return items, slots[:0]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    sizes = np.diff(starts, append=keys.size)
    first = np.searchsorted(available, keys[starts], side="left")
    count = np.searchsorted(available, keys[starts], side="right") - first
    position = np.arange(keys.size) - np.repeat(starts, sizes)
    taken = position < np.repeat(count, sizes)
    return items[taken], slots[(np.repeat(first, sizes) + position)[taken]]


DENSE_TABLE = 4  # `_dense_ranks` tables the lengths below this many times their count


def _dense_ranks(lengths: np.ndarray) -> np.ndarray:
    """Each length's rank among the distinct lengths (`np.unique`'s inverse), int64: by a table of the values
    where they are integers (non-negative, as a problem's) below a few times their count (no sort), else `np.unique`.

    >>> _dense_ranks(np.array([7, 3, 7, 5])).tolist()
    [2, 0, 2, 1]
    """
    longest = int(lengths.max(initial=0))
    if lengths.dtype.kind not in "iu" or longest >= DENSE_TABLE * lengths.size:
        return np.unique(lengths, return_inverse=True)[1].astype(np.int64).ravel()
    present = np.zeros(longest + 1, dtype=np.int64)
    present[lengths] = 1
    return (np.cumsum(present) - 1)[lengths]


def redeal_equal_items(lengths: np.ndarray, destinations: np.ndarray, sources: np.ndarray,
                      item_bytes: np.ndarray, gpus_per_node: int, num_ranks: int,
                      cells_per_rank: int = 1) -> np.ndarray:
    """Re-deal items of equal length among the places such items take, keeping the most bytes local.

    Items of one length cost the same and hold the same tokens, so any permutation among
    them leaves every rank's load and tokens (padded or not) unchanged.  Per length: the
    items with the most bytes that the node's places can hold stay on their node; of
    those, as many as the rank's places allow stay on their rank (most bytes first); the
    rest of the node's kept items take its other places; everything else takes what is
    left.  This maximises, per length, the bytes kept on their node (exactly), and keeps
    on their rank as many of those as the rank's places allow.  With `cells_per_rank` K,
    destinations are cells r·K + k of rank r (a rank's micro-batches), and so is the result.

    >>> redeal_equal_items(np.array([4, 4]), np.array([1, 0]), np.array([0, 1]), np.array([1., 1.]), 1, 2).tolist()
    [0, 1]
    """
    n = lengths.size
    length_class = _dense_ranks(lengths)
    everything = np.arange(n, dtype=np.int64)
    by_bytes = sorted_order(item_bytes)  # the items by bytes descending, ties by index; item_rank their places
    item_rank = np.empty(n, dtype=np.int64)
    item_rank[by_bytes] = everything
    by_node = length_class * num_ranks + sources // gpus_per_node
    node_places = length_class * num_ranks + destinations // (gpus_per_node * cells_per_rank)
    # Which items stay on their node: the most bytes, as many as the node has places.
    items_by_node = _by_key(everything, by_node, item_rank, by_bytes)
    slots_by_node = _by_key(everything, node_places, everything, everything)
    stay, _ = _match_sorted(items_by_node, by_node, slots_by_node, node_places)
    staying = np.zeros(n, dtype=bool)
    staying[stay] = True
    result = np.full(n, -1, dtype=np.int64)
    free = np.ones(n, dtype=bool)

    def match(items, item_keys, slots, slot_keys):
        matched, slots = _match_sorted(items, item_keys, slots, slot_keys)
        result[matched] = destinations[slots]
        free[slots] = False

    # On their rank as its places allow; then on their node; then everything left, anywhere.
    on_rank, rank_places = length_class * num_ranks + sources, length_class * num_ranks + destinations // cells_per_rank
    match(_by_key(stay, on_rank, item_rank, by_bytes), on_rank,
          _by_key(everything, rank_places, everything, everything), rank_places)
    # the node's order, kept: its stayers not placed yet and its free slots
    match(items_by_node[staying[items_by_node] & (result[items_by_node] < 0)], by_node,
          slots_by_node[free[slots_by_node]], node_places)
    match(_by_key(np.flatnonzero(result < 0), length_class, item_rank, by_bytes), length_class,
          _by_key(np.flatnonzero(free), length_class, everything, everything), length_class)
    return result

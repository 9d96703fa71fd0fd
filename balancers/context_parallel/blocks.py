"""Aligned blocks of ranks: where a context-parallel group of c ranks may sit.

A group of degree c is the block [s, s + c) with s a multiple of c, so a runtime can build
the groups of every degree once at start-up (never per step).  Rank r is on node r // g; a
block is inside a node when its first and last rank are, and only such blocks are used
unless inter-node groups are allowed.  Groups of one plan never share a rank.
"""

from __future__ import annotations

import numpy as np


def within_node(starts, degree, gpus_per_node: int) -> np.ndarray:
    """Whether each block [start, start + degree) lies inside one node.

    >>> within_node([0, 4, 8], 4, 6).tolist()
    [True, False, True]
    """
    starts = np.asarray(starts, dtype=np.int64)
    return starts // gpus_per_node == (starts + np.asarray(degree) - 1) // gpus_per_node


def free_blocks(taken: np.ndarray, degree: int, gpus_per_node: int, allow_inter_node: bool) -> np.ndarray:
    """Starts of the aligned blocks of `degree` ranks none of which is `taken`, ascending;
    inside a node (those first, then crossing ones where allowed).

    >>> free_blocks(np.array([True, False, False, False, False, False, False, False]), 2, 4, False).tolist()
    [2, 4, 6]
    """
    count = taken.size // degree
    starts = np.arange(count, dtype=np.int64) * degree
    free = ~taken[: count * degree].reshape(count, degree).any(axis=1)
    if gpus_per_node % degree == 0:  # every aligned block lies inside a node
        return starts[free]
    inside = within_node(starts, degree, gpus_per_node)
    if not allow_inter_node:
        return starts[free & inside]
    return np.concatenate((starts[free & inside], starts[free & ~inside]))


def groups_disjoint(starts: np.ndarray, degrees: np.ndarray, num_ranks: int) -> bool:
    """Whether the distinct blocks (start, degree) cover no rank twice.

    >>> groups_disjoint(np.array([0, 0, 4]), np.array([4, 4, 2]), 8)
    True
    >>> groups_disjoint(np.array([0, 2]), np.array([4, 2]), 8)
    False
    """
    keys = np.sort(starts.astype(np.int64) * (num_ranks + 1) + degrees)
    distinct = np.ones(keys.size, dtype=bool)  # `np.unique` as a sort and a mask: ~4x faster on a plan's items
    distinct[1:] = keys[1:] != keys[:-1]
    keys = keys[distinct]
    first, width = np.divmod(keys, num_ranks + 1)
    cover = np.bincount(first, minlength=num_ranks + 1) - np.bincount(first + width, minlength=num_ranks + 1)
    return bool(np.cumsum(cover).max(initial=0) <= 1)

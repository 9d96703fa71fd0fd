"""Communication-aware balancing: reach the plain makespan while moving only what must move.

Items start on `sources[i]`; moving item i to another rank costs `item_bytes[i]`, across
nodes far more than within one.  Given a plain plan with makespan M (any kernel), find an
assignment with makespan <= M · (1 + slack) that minimises, in this order, the bytes
crossing nodes and the bytes leaving their rank:

    minimise  sum(item_bytes[i] for i if node[dest[i]] != node[sources[i]])   (then same-rank)
    s.t.      max(loads(dest)) <= M · (1 + slack),  tokens(dest) <= cap

Plain code: keep every item home; while some rank is over the target, it sheds items to
under-loaded ranks of its own node first (cheapest bytes per cost first), then to other
nodes; then swaps between node pairs undo inter-node moves where they fit.  A heuristic
(the exact problem is a generalised assignment problem, NP-hard); the result is never
returned above the plain makespan times (1 + slack): if the repair cannot reach the
target, the plain plan re-labelled onto ranks (groups → ranks keeping the most bytes) is
returned instead.
"""

from __future__ import annotations

import numpy as np


def as_sources(sources, num_items: int, num_ranks: int, name: str = "sources") -> np.ndarray:
    """Validate source ranks: 1-D integers in [0, num_ranks), one per item; int64 copy."""
    if isinstance(sources, (str, bytes)) or sources is None:
        raise TypeError(f"`{name}` must be a 1-D sequence of rank indices; got {type(sources).__name__}")
    array = np.asarray(sources)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D; got shape {array.shape}")
    if array.size != num_items:
        raise ValueError(f"`{name}` must have one rank per item: {array.size} entries != {num_items} items")
    if array.size and (array.dtype == object or array.dtype.kind not in "iu"):
        if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.floor(array)):
            array = array.astype(np.int64)
        else:
            raise TypeError(f"`{name}` must hold integer ranks; got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.int64)
    bad = np.flatnonzero((array < 0) | (array >= num_ranks))
    if bad.size:
        raise ValueError(f"`{name}` must be ranks in [0, {num_ranks}); got {array[bad[0]]} at index {bad[0]}")
    return array


def as_item_bytes(item_bytes, num_items: int, name: str = "item_bytes") -> np.ndarray:
    """Validate per-item byte counts: 1-D finite non-negative numbers; float64 copy."""
    if isinstance(item_bytes, (str, bytes)) or item_bytes is None:
        raise TypeError(f"`{name}` must be a 1-D sequence of byte counts; got {type(item_bytes).__name__}")
    array = np.asarray(item_bytes)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D; got shape {array.shape}")
    if array.size != num_items:
        raise ValueError(f"`{name}` must have one entry per item: {array.size} entries != {num_items} items")
    if array.size and (array.dtype == object or array.dtype.kind not in "iuf"):
        raise TypeError(f"`{name}` must hold numbers; got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if bad.size:
        raise ValueError(f"`{name}` must be finite and non-negative; got {array[bad[0]]} at index {bad[0]}")
    return array

"""Diving on the pattern LP: a packing of integer costs into m bins of one capacity, or None.

find bins B_1..B_m with sum(w[i] for i in B_j) <= C holding every item, by residual rounding
of the Gilmore–Gomory LP (`exact_bounds.PatternLP`), the primal heuristic of column-generation
solvers for cutting stock (e.g. Vanderbeck 2000; Dell'Amico, Iori, Martello & Monaci 2008
dive on the same LP for P||Cmax; our own code):

    while items are left:
        LP over the items left, from the columns of the last one (a few pricing rounds)
        if it needs more bins than are left: fail
        fix floor(x_p) bins of every pattern p (residual rounding); if no x_p >= 1, one
        bin of the largest x_p (ties: the first column)
        once few items are left: pack them exactly (`finish`, branch and bound)

It never proves infeasibility, only finds packings; the LPs are solved by HiGHS
(deterministic), so the result depends on the input alone.  A dive cut by the clock
returns None.

>>> bins = dive(np.array([6, 5, 4, 3, 2]), 10, 2, [], np.inf)
>>> sorted(sorted(b) for b in bins)
[[2, 3, 5], [4, 6]]
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from .bounds import PatternLP, item_types

DIVE_ROUNDS = 3
"""Pricing rounds of the LP at each step of the dive (the first LP converges, up to `FIRST_ROUNDS`)."""

FIRST_ROUNDS = 400

FINISH_ITEMS = 16
"""The dive hands the items left to `finish` (exact) once at most this many are left."""

_INTEGRAL = 1e-9


def dive(w: np.ndarray, capacity: int, num_bins: int, columns: list[np.ndarray], deadline: float,
         finish: Callable[[np.ndarray, int], list[list[int]] | None] | None = None,
         rounding: bool = True) -> list[list[int]] | None:
    """Bins (lists of item costs) packing `w` (sorted descending) into `num_bins` bins of
    `capacity`, or None; `columns` are count vectors over the types of `w` to start from.
    `finish(items, bins)` packs the last `FINISH_ITEMS` items exactly (or says None).  Without
    `rounding`, each step fixes one bin of the largest x_p only (slower, another dive)."""
    if w.size and w[0] > capacity:
        return None
    sizes = item_types(w)[0]
    bins: list[list[int]] = []
    left = w
    rounds = FIRST_ROUNDS
    while left.size:
        if time.perf_counter() > deadline:
            return None
        if finish is not None and left.size <= FINISH_ITEMS:
            rest = finish(left, num_bins - len(bins))
            return None if rest is None else bins + rest
        residual_sizes, _, demand = item_types(left)
        pool = {}
        for column in _recount(columns, sizes, residual_sizes, demand):
            pool.setdefault(column.tobytes(), column)
        lp = PatternLP(left, capacity, pool)
        bins_left = num_bins - len(bins)
        if lp.bins(bins_left, rounds, deadline, converge=True) > bins_left or lp.solution is None:
            return None
        if lp.solution.sum() > bins_left * (1 + _INTEGRAL) and (
                lp.bins(bins_left, FIRST_ROUNDS, deadline, converge=True) > bins_left
                or lp.solution.sum() > bins_left * (1 + _INTEGRAL)):
            return None
        rounds = DIVE_ROUNDS
        x = lp.solution
        whole = np.floor(x + _INTEGRAL).astype(np.int64)
        picks = np.flatnonzero(whole) if rounding and whole.any() else [int(np.argmax(x))]
        counts = demand.copy()
        for j in picks:
            for _ in range(max(1, int(whole[j])) if rounding else 1):
                column = np.minimum(lp.columns[j], counts)
                if not column.any() or len(bins) == num_bins:
                    break
                counts -= column
                bins.append(np.repeat(residual_sizes, column).tolist())
        if counts.sum() == demand.sum():
            return None  # nothing placed (cannot happen with an LP that covers the items)
        left = np.repeat(residual_sizes, counts)
        sizes, columns = residual_sizes, list(lp.columns)
        if left.size and len(bins) == num_bins:
            return None
    return bins


def _recount(columns: list[np.ndarray], sizes: np.ndarray, new_sizes: np.ndarray,
             demand: np.ndarray) -> list[np.ndarray]:
    """Columns over the types `sizes` as columns over `new_sizes` (a subset), capped at `demand`."""
    position = {int(size): index for index, size in enumerate(new_sizes.tolist())}
    where = np.array([position.get(int(size), -1) for size in sizes.tolist()])
    kept = where >= 0
    result = []
    for column in columns:
        new = np.zeros(new_sizes.size, dtype=np.int64)
        new[where[kept]] = column[kept]
        new = np.minimum(new, demand)
        if new.any():
            result.append(new)
    return result


def assign(bins: list[list[int]], w: np.ndarray) -> list[int]:
    """The bin of each item of `w` (sorted descending) from bins given as lists of costs.

    >>> assign([[4, 6], [2, 3, 5]], np.array([6, 5, 4, 3, 2]))
    [0, 1, 0, 1, 1]
    """
    items_of: dict[int, list[int]] = {}
    for index in range(w.size - 1, -1, -1):
        items_of.setdefault(int(w[index]), []).append(index)
    where = [0] * w.size
    for number, costs in enumerate(bins):
        for cost in costs:
            where[items_of[cost].pop()] = number
    return where

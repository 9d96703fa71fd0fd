"""Lower bounds for P||Cmax on integer costs: can m bins of capacity C hold every item?

minimise C such that the items (integer costs w, sorted largest first) fit m bins of capacity C.

- `simple_bound`: max(ceil(sum / m), and for k >= 0 the k+1 smallest of the k·m+1 largest
  items, since some machine holds k+1 of them) — the bound `bounds.lower_bound` states.
- `l2_bins`: Martello & Toth's L2 bin-packing bound for capacity C, for every threshold
  alpha at once (numpy): items above C - alpha need a bin each, items in (C/2, C - alpha]
  too, and items in [alpha, C/2] must fit the room those leave or open more bins.
  Scanning C upward while L2 > m lifts the bound (Dell'Amico & Martello 1995 use the same
  reduction of P||Cmax to bin packing).
- `farley_bins`: the Gilmore–Gomory (pattern LP) bound by column generation, priced by an
  exact 0/1 knapsack DP over the capacity (numpy, one shift per item).  Any duals y >= 0
  give Farley's bound sum(y) / max_pattern(y) <= bins needed, so every step proves what
  it claims even before the LP converges; floats are compared with a relative margin of
  1e-9, far above their rounding error for n <= a few thousand items.  The LP optimum
  rounded up is the bin-packing optimum on nearly every instance (the IRUP property),
  which makes it the strong bound of arc-flow and branch-and-price solvers.
"""

from __future__ import annotations

import time

import numpy as np
from scipy.sparse import csc_array

_MARGIN = 1e-9
_COLUMNS_PER_ROUND = 20
_SMOOTHING = 0.8
"""Wentges dual smoothing: price at this mix of the best (Farley) duals so far and the LP's."""
MAX_PRICING_CELLS = 8_000_000
"""Largest knapsack table (items × (C + 1)) the pattern LP builds; beyond it the LP bound is skipped."""


def simple_bound(w: np.ndarray, m: int) -> int:
    """max(ceil(sum / m), max_k sum(w[k·m - k : k·m + 1])) for `w` sorted descending.

    >>> simple_bound(np.array([5, 4, 3, 3, 3]), 2)
    9
    """
    n = w.size
    bound = -(-int(w.sum()) // m)
    prefix = np.concatenate(([0], np.cumsum(w)))
    ks = np.arange(0, (n - 1) // m + 1)
    tops = ks * m + 1
    return max(bound, int((prefix[tops] - prefix[tops - ks - 1]).max()))


def l2_bins(w: np.ndarray, capacity: int) -> int:
    """Martello–Toth L2: bins of `capacity` that items `w` (sorted descending) need at least.

    >>> l2_bins(np.array([6, 6, 6, 4, 4, 4]), 10)
    3
    >>> l2_bins(np.array([6, 6, 6, 5, 5]), 10)
    4
    """
    if w.size == 0:
        return 0
    if w[0] > capacity:
        return w.size + 1  # no packing: more bins than any m <= n
    ascending = w[::-1]
    prefix = np.concatenate(([0], np.cumsum(ascending)))
    alphas = np.unique(np.concatenate(([0], ascending[ascending <= capacity // 2])))
    n = w.size

    def count_above(threshold):  # items > threshold, and their sum
        first = np.searchsorted(ascending, threshold, side="right")
        return n - first, prefix[n] - prefix[first]

    def count_from(threshold):  # items >= threshold, and their sum
        first = np.searchsorted(ascending, threshold, side="left")
        return n - first, prefix[n] - prefix[first]

    big_count, _ = count_above(capacity - alphas)
    half_count, half_sum = count_above(capacity // 2)
    mid_count, mid_sum = half_count - big_count, half_sum - count_above(capacity - alphas)[1]
    small_sum = count_from(alphas)[1] - half_sum
    room = mid_count * capacity - mid_sum
    extra = np.maximum(0, -(-(small_sum - room) // capacity))
    return int((half_count + extra).max())


def knapsack(weights: np.ndarray, values: np.ndarray, capacity: int, count: int = 1) -> tuple[float, list]:
    """max sum(values[S]) with sum(weights[S]) <= capacity over subsets S, for `weights`
    sorted descending: (that value, masks of up to `count` sets S of value above 1, the
    best set for each largest item, best first — diverse columns for column generation).

    A DP over the capacity adds the items smallest first and keeps each stage, so the best
    completion of every item as the largest of its set is one lookup.

    >>> value, masks = knapsack(np.array([5, 4, 3]), np.array([1.2, 0.9, 0.6]), 7, count=2)
    >>> value, [mask.tolist() for mask in masks]
    (1.5, [[False, True, True], [True, False, False]])
    """
    n = weights.size
    up_weights, up_values = weights[::-1].tolist(), values[::-1].tolist()
    stages = np.zeros((n + 1, capacity + 1))
    took = np.zeros((n, capacity + 1), dtype=bool)
    for index, (weight, value) in enumerate(zip(up_weights, up_values)):
        best = stages[index]
        stages[index + 1] = best
        if value <= 0 or weight > capacity:
            continue
        candidate = best[:capacity + 1 - weight] + value
        better = candidate > best[weight:]
        took[index, weight:] = better
        stages[index + 1, weight:] = np.where(better, candidate, best[weight:])
    last_of_size = [k for k in range(n) if k == n - 1 or up_weights[k + 1] != up_weights[k]]
    openers = [(up_values[k] + stages[k, capacity - up_weights[k]], k) for k in last_of_size
               if up_weights[k] <= capacity and up_values[k] > 0]
    openers.sort(key=lambda pair: (-pair[0], pair[1]))
    masks = []
    for value, opener in openers[:count]:
        if value <= 1 + _MARGIN:
            break
        chosen = np.zeros(n, dtype=bool)
        chosen[opener] = True
        room = capacity - up_weights[opener]
        for index in range(opener - 1, -1, -1):
            if took[index, room]:
                chosen[index] = True
                room -= up_weights[index]
        masks.append(chosen[::-1])
    return float(stages[n, capacity]), masks


def item_types(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct sizes descending, type of each item, demand of each type) of `w` sorted descending.

    >>> [a.tolist() for a in item_types(np.array([5, 5, 3]))]
    [[5, 3], [0, 0, 1], [2, 1]]
    """
    sizes, type_of, demand = np.unique(-w, return_inverse=True, return_counts=True)
    return -sizes, type_of, demand


class PatternLP:
    """Column generation for the bin-packing LP of items `w` (sorted descending) at one capacity.

    Items of equal cost form one type with a demand; `pool` maps a pattern's bytes to its
    count vector over the types, shared by every capacity of one search (a pattern that
    fits C fits every larger C), and grows with the columns this LP prices.
    """

    def __init__(self, w: np.ndarray, capacity: int, pool: dict[bytes, np.ndarray],
                 center: np.ndarray | None = None):
        self.w, self.capacity, self.pool = w, capacity, pool
        self.center = center
        """Duals (one per type) of the best Farley bound so far; another capacity's are a warm start."""
        self.sizes, self.type_of, self.demand = item_types(w)
        singles = np.eye(self.sizes.size, dtype=np.int64)
        self.columns = [c for c in pool.values() if int(c @ self.sizes) <= capacity] + list(singles)
        self._keys = {column.tobytes() for column in self.columns}
        self.converged = False
        self.solution: np.ndarray | None = None
        """x of the last LP solved, over the first len(x) columns."""

    def bins(self, num_bins: int, max_rounds: int, deadline: float, converge: bool = False) -> float:
        """A proven lower bound on the bins needed, from at most `max_rounds` LP solves
        before the `deadline` (perf_counter seconds).  Stops once it exceeds `num_bins`
        (infeasible), once the LP's value is at most `num_bins` (no proof can come) unless
        `converge` asks for all columns, or when the LP has converged."""
        from scipy.optimize import linprog  # the LP stack, loaded by the first bound that needs it

        best, smooth = 0.0, True
        if self.w.size * (self.capacity + 1) > MAX_PRICING_CELLS:
            return best
        if self.center is not None:  # Farley's bound at the warm-start duals costs one knapsack
            value = knapsack(self.w, self.center[self.type_of], self.capacity)[0]
            best = float(self.center @ self.demand) / value * (1 - _MARGIN) if value > 0 else 0.0
            if best > num_bins:
                return best
        for _ in range(max_rounds):
            if time.perf_counter() > deadline:
                break
            matrix = csc_array(-np.array(self.columns, dtype=float).T)
            lp = linprog(np.ones(matrix.shape[1]), A_ub=matrix, b_ub=-self.demand.astype(float),
                         bounds=(0, None), method="highs")
            if lp.status != 0 or (not converge and lp.fun <= num_bins * (1 - _MARGIN)):
                break
            duals = np.maximum(0.0, -lp.ineqlin.marginals)
            self.solution = lp.x
            center = self.center
            priced = duals if center is None or not smooth else _SMOOTHING * center + (1 - _SMOOTHING) * duals
            value, masks = knapsack(self.w, priced[self.type_of], self.capacity, count=_COLUMNS_PER_ROUND)
            if value > 0 and float(priced @ self.demand) / value * (1 - _MARGIN) > best:
                best, self.center = float(priced @ self.demand) / value * (1 - _MARGIN), priced
            if best > num_bins:
                return best
            added = 0
            for mask in masks:
                column = np.bincount(self.type_of[mask], minlength=self.sizes.size)
                key = column.tobytes()
                if float(column @ duals) > 1 + _MARGIN and key not in self._keys:
                    self.pool.setdefault(key, column)
                    self._keys.add(key)
                    self.columns.append(column)
                    added += 1
            if added == 0 and priced is duals:
                self.converged = True
                return best
            smooth = added > 0  # a smoothed price that found nothing: price the LP's own duals next
        return best

"""Certified bounds of the micro-batch problem: the fewest micro-batches, the least step cost.

Fewest micro-batches: the D·M cells are bins of capacity T (tokens), so M >= ⌈B / D⌉ for
any lower bound B on the number of bins.  B is Martello and Toth's L2 (1990): for every
threshold a <= T/2, the items longer than T - a need a bin each, the items in (T/2, T - a]
one more each, and the items in [a, T/2] fill what those leave free before opening
⌈rest / T⌉ more (a = 0 gives ⌈Σ l / T⌉).  Padded cells hold count · max l >= Σ l tokens,
so the bound holds for them too.

Least step cost (Σ_m max_r load(r, m), the overhead added by the caller):
- Σ c / D: every micro-batch's max is at least the mean of its D cells;
- Σ_j b[j·D]: items longer than T/2 pairwise share no cell, so the k-th most loaded cell
  costs at least b[k], the k-th largest of their costs, and the max of the micro-batch
  holding the j·D-th most loaded cell costs at least b[j·D];
- max c: the micro-batch holding the costliest item;
- max c + cover / D: that micro-batch holds at most D·T tokens, so the other items hold at least
  Σ l - D·T of theirs, which cost at least `cover`, the cheapest such tokens (a fractional cover, items by
  cost per token), and the other micro-batches' maxima at least a D-th of that (`beyond_one_microbatch`;
  probe22 P22-12: a long-context batch whose costliest item exceeds a rank's mean read 8-16 % above the max c
  bound, within 0.02-0.9 % of this one);
all hold for padded cells (count · max c >= Σ c, count · max l >= Σ l) and for every M.  `step_cost_bound`
is the largest of the first three, which the kernels' gates read (`MicroBatchProblem.cost_bound`); the plan's
certificate takes the fourth too (`MicroBatchProblem.certified_bound`).
"""

from __future__ import annotations

import math

import numpy as np

from ..problem import exact_sum


def min_bins(lengths: np.ndarray, capacity: int, longest_first: np.ndarray | None = None) -> int:
    """Martello–Toth L2: a number of bins of `capacity` every packing of `lengths` needs
    (`longest_first`: the same lengths sorted longest first, when known, spares the sort), and the count bound:
    a bin holds at most as many items as the shortest fit in it (probe22 P22-03: 81 920 lengths of 2000-2002 in
    bins of 5004 hold two a bin, 40 960 bins, where L2 said 32 736 and M = 13-15 were each searched in vain).

    >>> min_bins(np.array([6, 6, 6, 2, 2]), 10), min_bins(np.array([5, 5, 5]), 10), min_bins(np.array([4] * 6), 10)
    (3, 2, 3)
    """
    if longest_first is None:
        longest_first = np.sort(lengths)[::-1]
    lengths = longest_first[:np.count_nonzero(longest_first)]  # the positive ones (none is negative)
    if lengths.size == 0:
        return 0
    total = int(lengths.sum())
    most = int(np.searchsorted(np.cumsum(lengths[::-1]), capacity, side="right"))  # the most items a bin holds
    best = max(-(-total // capacity), -(-lengths.size // max(most, 1)))
    half = capacity / 2
    large = lengths[:np.count_nonzero(lengths > half)]  # descending
    small = np.ascontiguousarray(lengths[large.size:][::-1])  # ascending
    if large.size == 0:
        return best
    thresholds = np.concatenate(([0], small))  # ascending: its distinct values without np.unique's hashing
    thresholds = thresholds[np.concatenate(([True], thresholds[1:] != thresholds[:-1]))]
    # per threshold a: J1 = large items > T - a, J2 = large items <= T - a, J3 = small items >= a
    large_asc = large[::-1]
    large_prefix = np.concatenate(([0], np.cumsum(large_asc)))
    in_j2 = np.searchsorted(large_asc, capacity - thresholds, side="right")  # large items <= T - a
    j2_sum = large_prefix[in_j2]
    small_prefix = np.concatenate(([0], np.cumsum(small)))
    j3_sum = small_prefix[-1] - small_prefix[np.searchsorted(small, thresholds, side="left")]
    free = in_j2 * capacity - j2_sum
    extra = np.maximum(0, -(-(j3_sum - free) // capacity))
    return max(best, int(large.size + extra.max()))


def min_microbatches(lengths: np.ndarray, num_ranks: int, capacity: int,
                     longest_first: np.ndarray | None = None) -> int:
    """Fewest micro-batches any plan of D ranks with token budget `capacity` can use (>= 1)."""
    return max(1, -(-min_bins(lengths, capacity, longest_first) // num_ranks))


def step_cost_bound(costs: np.ndarray, lengths: np.ndarray, num_ranks: int, capacity: int,
                    total: float | None = None) -> float:
    """A Σ_m max_r load(r, m) no plan with any number of micro-batches can beat (see the module); `total`:
    Σ costs correctly rounded (`exact_sum`), when the caller has it.

    >>> step_cost_bound(np.array([6., 6., 6., 2.]), np.array([6, 6, 6, 2]), 2, 10)
    12.0
    """
    mean = (exact_sum(np.ascontiguousarray(costs, dtype=np.float64)) if total is None else total) / num_ranks
    conflicting = np.sort(costs[lengths > capacity / 2])[::-1]
    leaders = math.fsum(memoryview(np.ascontiguousarray(conflicting[::num_ranks])))
    return float(max(mean, leaders, float(costs.max()) if costs.size else 0.0))


def beyond_one_microbatch(costs: np.ndarray, lengths: np.ndarray, num_ranks: int, capacity: int, total: float,
                          tokens: int, bound: float) -> float:
    """max c + cover / D (see the module) of items of `total` cost (Σ c) and `tokens` (Σ l), a hair lowered (1e-9:
    float sums), or 0.0 where it cannot pass `bound`: no tokens beyond one micro-batch, a negative cost, or where
    even the mean cost per token of the other items (which the cheapest cover cannot exceed; they hold at least
    Σ l - T) leaves it at most `bound`; the items by cost per token (a sort) only past that test, which the default
    mix at 2560 × 32 does not pass (the test: one O(n) max).

    >>> round(beyond_one_microbatch(np.array([9., 1., 1., 4.]), np.array([8, 2, 2, 8]), 2, 8, 15.0, 20, 9.0), 6)
    10.0
    """
    beyond = tokens - num_ranks * capacity  # tokens outside the micro-batch of the costliest item
    if beyond <= 0 or not costs.size:
        return 0.0
    most = float(costs.max())
    if most + (total - most) * beyond / ((tokens - capacity) * num_ranks) <= bound or float(costs.min()) < 0:
        return 0.0
    top = int(np.argmax(costs))
    holding = np.flatnonzero(lengths > 0)
    holding = holding[holding != top]
    costs, lengths = costs[holding], lengths[holding]
    whole, part, short = _cheapest_cover(costs / lengths, lengths, beyond)
    cover = exact_sum(costs[whole]) + float(costs[part]) * short / float(lengths[part])
    return (most + cover / num_ranks) * (1.0 - 1e-9)


def _cheapest_cover(ratios: np.ndarray, lengths: np.ndarray, tokens: int) -> tuple[np.ndarray, int, int]:
    """The first `tokens` (0 < tokens <= Σ lengths) of items ordered by `ratios` (cost per token), ties by index, as
    a stable sort gives them: (a mask of the items taken whole, the index of the one taken in part, its tokens).
    Only the costliest items are sorted: those above the k-th largest ratio (`np.partition`, k growing 4x) once
    they hold more than the tokens left out; every other item precedes them in that order and is taken whole
    (probe: capped Pareto 2560 × 32, ~2.6k items left out of 82k, where the stable sort of all cost 8 ms)."""
    n, left_out = ratios.size, int(lengths.sum()) - tokens
    last = np.ones(n, dtype=bool)  # the items sorted: all, unless a tail of the order holds more than `left_out`
    size = max(64, n >> 6)
    while size < n and not math.isnan(float(ratios.max())):  # NaN sorts last yet compares false: all sorted
        tail = ratios > np.partition(ratios, n - size)[n - size]
        if int(lengths[tail].sum()) > left_out:
            last = tail
            break
        size *= 4
    sorted_tail = np.flatnonzero(last)
    sorted_tail = sorted_tail[np.argsort(ratios[sorted_tail], kind="stable")]
    before = int(lengths.sum() - lengths[sorted_tail].sum())
    covered = before + np.cumsum(lengths[sorted_tail])
    taken = int(np.searchsorted(covered, tokens))  # of the tail, taken whole; the next one in part
    whole = ~last
    whole[sorted_tail[:taken]] = True
    return whole, int(sorted_tail[taken]), tokens - (int(covered[taken - 1]) if taken else before)

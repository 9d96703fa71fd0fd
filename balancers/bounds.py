"""Lower bounds on the makespan: what no plan of a `Problem` can beat (plain and equal counts).

Every certificate starts here: `plan.make_plan` clamps a kernel's claimed bound with it, and
the exact solvers stop when a plan reaches it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .problem import InfeasibleError, KernelResult, Problem, count_limits, exact_sum, rank_tokens


def lower_bound(problem: Problem) -> float:
    """A makespan no plan can beat.

    Unpadded: max(total / D, and for k >= 0 the k+1 smallest of the k·D+1 largest costs,
    since some rank holds k+1 of them).  k = 0 is the largest item, k = 1 the classic
    w_D + w_{D+1}.  Padded costs dominate unpadded ones (count · f(max) >= sum f), so the
    same bound holds for both.
    """
    costs = problem.sorted_costs
    n, d = costs.size, problem.num_ranks
    if n and costs[0] == costs[-1] > 0 and n < ONE_COST_ITEMS and not problem.equal_counts:
        return _one_cost_bound(float(costs[0]), n, d)
    bound = exact_sum(costs) / d
    if problem.equal_counts:
        return _equal_counts_bound(costs, d, bound)
    ks = np.arange(0, (n - 1) // d + 1)
    tops = ks * d + 1  # the k+1 smallest of the top k·D+1 items are [top-k-1, top)
    # A group's fsum rounds a sum of k+1 costs each at most its first, so it is at most
    # the rounded product (k+1) · first: when no product passes the mean, no group does.
    if np.all((ks + 1) * costs[tops - ks - 1] <= bound):
        return float(bound)
    prefix = np.concatenate(([0.0], np.cumsum(costs)))
    best = int(np.argmax(prefix[tops] - prefix[tops - ks - 1]))
    group = costs[tops[best] - best - 1: tops[best]]
    return float(max(bound, math.fsum(memoryview(group))))


ONE_COST_ITEMS = 2**24  # below, the prefix sums of one cost rise by it from each k to the next, rounding and all


def _one_cost_bound(cost: float, n: int, d: int) -> float:
    """`lower_bound` of n items that all cost `cost`, without passes over them: the same float.

    Their exact sum is n · cost, which fsum rounds once as the product does.  The k+1 smallest of the
    k·D+1 largest sum (k+1) · cost, which no group passes whose product does not pass the mean (the
    check `lower_bound` makes first); else the largest k's group is the one its prefix sums pick: a
    float prefix sum of i costs lies within i · n · 2**-53 · cost of i · cost, so below 2**24 items each k's
    difference of two of them rises by more than half a cost (first of the maxima: the last one), and
    fsum gives the group's sum as the product rounded once.

    >>> _one_cost_bound(0.1, 10, 4), _one_cost_bound(3.0, 8, 4)
    (0.30000000000000004, 6.0)
    """
    return float(max(float(n) * cost / d, float((n - 1) // d + 1) * cost))


def _equal_counts_bound(costs: np.ndarray, d: int, mean: float) -> float:
    """The bound under equal counts, for costs sorted largest first and their mean per rank.

    For k >= 0 some rank holds k+1 of the k·D+1 largest costs and, with at least q items,
    m = q - k - 1 more: at least the k+1 smallest of those plus the m smallest of the
    rest.  The r ranks of q + 1 items hold at least the r·(q+1) smallest costs between
    them, the D - r others the (D - r)·q smallest: each set's mean is a bound too.
    """
    n = costs.size
    q, r = count_limits(n, d)
    prefix = np.concatenate(([0.0], np.cumsum(costs)))
    ks = np.arange(0, (n - 1) // d + 1)
    tops = ks * d + 1
    extra = np.maximum(q - ks - 1, 0)
    # Enough items below the top set: its k+1 smallest and the m smallest overall; else the q smallest overall.
    below = n - tops >= extra
    starts = np.where(below, tops - ks - 1, n - q)
    ends = np.where(below, tops, n)
    candidates = [(prefix[ends] - prefix[starts] + np.where(below, prefix[n] - prefix[n - extra], 0.0),
                   list(zip(starts.tolist(), ends.tolist(), np.where(below, n - extra, n).tolist())))]
    sets = []  # (first sorted position of the smallest costs, how many ranks share them)
    if r:
        sets.append((n - r * (q + 1), r))
    if q and d > r:
        sets.append((n - (d - r) * q, d - r))
    best_value, best_parts, best_ranks = mean, None, 1
    for values, parts in candidates:
        index = int(np.argmax(values))
        if values[index] > best_value:
            start, end, low = parts[index]
            best_value, best_parts, best_ranks = float(values[index]), (start, end, low), 1
    for start, ranks in sets:
        value = (prefix[n] - prefix[start]) / ranks
        if value > best_value:
            best_value, best_parts, best_ranks = float(value), (start, n, n), ranks
    if best_parts is None:
        return float(mean)
    start, end, low = best_parts
    exact = math.fsum(memoryview(costs[start:end])) + math.fsum(memoryview(costs[low:n]))
    return float(max(mean, exact / best_ranks))


def pigeonhole_cap(lengths: np.ndarray, num_ranks: int) -> tuple[int, int]:
    """(cap, k): a token cap every unpadded plan of `lengths` on `num_ranks` ranks needs, and the k it comes from.

    Of the k·D + 1 longest items some rank holds k + 1, at least the k + 1 shortest of them: with x the lengths
    longest first, cap >= x[kD − k] + … + x[kD] for every k with n > kD (k = 0: the longest item).  Sorts the
    lengths: for error paths, where a heuristic found no room and the cap may be provably infeasible.
    """
    longest = np.sort(np.asarray(lengths, dtype=np.int64))[::-1]
    sums = np.concatenate(([0], np.cumsum(longest)))
    ks = np.arange((longest.size - 1) // num_ranks + 1)
    needed = sums[ks * num_ranks + 1] - sums[ks * num_ranks - ks]
    k = int(np.argmax(needed))
    return int(needed[k]), k


def cap_refusal(lengths: np.ndarray, num_ranks: int, cap: int) -> InfeasibleError | None:
    """The refusal of a cap below `pigeonhole_cap` (no plan fits it: say so, not "try another algorithm"), for a
    heuristic that found no room; None where the bound allows the cap."""
    needed, k = pigeonhole_cap(lengths, num_ranks)
    if needed <= cap:
        return None
    return InfeasibleError(f"no plan fits max_tokens_per_rank={cap} on {num_ranks} ranks: of the {k * num_ranks + 1} "
                           f"longest items some rank holds {k + 1}, at least {needed} tokens; a cap of at least "
                           f"{needed} is needed", min_cap=needed)


def uncapped_fit(problem: Problem, solve) -> KernelResult | None:
    """`solve`'s plan of `problem` without its cap, where it meets the cap (None where it does not): the answer after a
    heuristic's refusal under the cap, whose own plan without it may fit (probe22 P22-17: auto and equal counts
    refused 61 % of caps at their own plans' tokens; P22-18: exact's uncapped optimum).  Callers raise a proof
    (`InfeasibleError.heuristic` None) before asking."""
    free = solve(dataclasses.replace(problem, max_tokens_per_rank=None))
    return free if rank_tokens(problem, free.assignment).max() <= problem.max_tokens_per_rank else None

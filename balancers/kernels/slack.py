"""SLACK (Della Croce & Scatamacchia 2020): LPT on tuples of D items ordered by their spread.

minimise max(loads) where loads[r] = sum(cost[i] for i on r):

    items = sorted(items, key=lambda i: (-cost[i], i))            # the LPT order
    tuples = [items[k:k + D] for k in range(0, n, D)]              # the last one padded with zeros
    tuples.sort(key=lambda t: -(cost[t[0]] - cost[t[-1]]))         # largest spread first, stable
    list-schedule the items tuple by tuple: each to the least-loaded rank (ties by rank)

LPT places the D largest items first, one per rank, and the next D on top of them; with two
or three items per rank the tuples with the widest spread decide the makespan, so SLACK
schedules them first, when there is still freedom.  Guarantee (the paper's): makespan
<= (4/3 - 1/(3D)) · OPT, LPT's, and usually tighter with few items per rank.  O(n log n).

Our own implementation after the paper's description.  With a memory cap the plan falls
back to the capped LPT plan when it overflows; padded problems are scheduled on f(l), a
surrogate (`padded` is exact for them).
"""

from __future__ import annotations

import heapq

import numpy as np

from ..problem import KernelResult, Problem, rank_tokens
from . import lpt


def slack_order(sorted_costs: np.ndarray, num_ranks: int) -> np.ndarray:
    """Positions in the LPT order (`sorted_costs`, largest first) in SLACK's order.

    >>> slack_order(np.array([9.0, 8, 5, 1]), 2).tolist()   # spreads: (9, 8) 1, (5, 1) 4
    [2, 3, 0, 1]
    """
    n = sorted_costs.size
    starts = np.arange(0, n, num_ranks)
    ends = np.minimum(starts + num_ranks, n)
    last = np.where(ends - starts == num_ranks, sorted_costs[ends - 1], 0.0)  # padded with zeros
    spread = sorted_costs[starts] - last
    tuples = np.argsort(-spread, kind="stable")
    return np.concatenate([np.arange(starts[t], ends[t]) for t in tuples.tolist()])


def list_schedule(costs: np.ndarray, num_ranks: int) -> np.ndarray:
    """Each cost in turn to the least-loaded rank (ties by rank); the rank of each."""
    heap = [(0.0, rank) for rank in range(num_ranks)]
    ranks = np.empty(costs.size, dtype=np.int64)
    for position, cost in enumerate(costs.tolist()):
        load, rank = heapq.heappop(heap)
        ranks[position] = rank
        heapq.heappush(heap, (load + cost, rank))
    return ranks


def solve(problem: Problem) -> KernelResult:
    """SLACK kernel; the capped LPT plan when the SLACK plan overflows a cap."""
    order = problem.cost_order
    positions = slack_order(problem.sorted_costs, problem.num_ranks)
    assignment = np.empty(problem.num_items, dtype=np.int64)
    assignment[order[positions]] = list_schedule(problem.sorted_costs[positions], problem.num_ranks)
    cap = problem.max_tokens_per_rank
    if cap is not None and rank_tokens(problem, assignment).max() > cap:
        return lpt.solve(problem)
    return KernelResult(assignment)

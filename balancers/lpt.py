"""Longest processing time first (Graham 1969), the OrchMLLM paper's greedy.

minimise max(loads) where loads[r] = sum(cost[i] for i on r): sort items by cost,
largest first (ties by index), give each to the least-loaded rank (ties by rank).
Guarantee: makespan <= (4/3 - 1/(3D)) · OPT for the unpadded cost.
"""

from __future__ import annotations

import heapq

import numpy as np

from .problem import InfeasibleError, KernelResult, Problem


def solve(problem: Problem) -> KernelResult:
    order = np.lexsort((np.arange(problem.num_items), -problem.item_costs))
    assignment = np.empty(problem.num_items, dtype=np.int64)
    cap = problem.max_tokens_per_rank
    if not problem.padded and cap is None:
        heap = [(0.0, rank) for rank in range(problem.num_ranks)]
        for item in order.tolist():
            load, rank = heapq.heappop(heap)
            assignment[item] = rank
            heapq.heappush(heap, (load + float(problem.item_costs[item]), rank))
        return KernelResult(assignment)
    loads = np.zeros(problem.num_ranks)
    counts = np.zeros(problem.num_ranks, dtype=np.int64)
    longest = np.zeros(problem.num_ranks, dtype=np.int64)
    tokens = np.zeros(problem.num_ranks, dtype=np.int64)
    for item in order.tolist():
        length = int(problem.lengths[item])
        if problem.padded:
            new_longest = np.maximum(longest, length)
            new_tokens = (counts + 1) * new_longest
            new_loads = (counts + 1) * problem.cost.item_costs(new_longest)
        else:
            new_tokens = tokens + length
            new_loads = loads + problem.item_costs[item]
        fits = new_tokens <= cap if cap is not None else np.ones(problem.num_ranks, dtype=bool)
        if not fits.any():
            raise InfeasibleError(
                f"`lpt` found no rank with room for item {item} ({length} tokens) under "
                f"max_tokens_per_rank={cap}; try algorithm='ilp' or a larger cap", min_cap=cap + 1)
        rank = int(np.argmin(np.where(fits, new_loads, np.inf)))
        assignment[item] = rank
        loads[rank], tokens[rank] = new_loads[rank], new_tokens[rank]
        counts[rank] += 1
        longest[rank] = max(longest[rank], length)
    return KernelResult(assignment)

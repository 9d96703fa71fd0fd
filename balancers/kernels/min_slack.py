"""Minimum bin slack packing at a target makespan: each rank filled as fully as its items allow.

minimise max(loads) where loads[r] = sum(cost[i] for i on r), by packing to a capacity C:

    items = sorted(items, key=lambda i: (-cost[i], i))
    for rank in range(D):
        first = the largest item left (if it fits C)
        fill = the subset of the other items left with the largest sum <= C - cost[first]
        rank gets first + fill
    the items left over go one by one (largest first) to the least-loaded rank

A fill is an exact subset-sum over the items left (a bitset of reachable sums, one shift
per item, as Python integers), so every rank but the last ones is filled to C or as close
as any subset gets.  With two or three items per rank and C the lower bound this leaves
the few awkward items for the end, a plan that looks poor but from which the pair and
triple search (`group_search`) reaches optima that it misses from LPT-like plans.

After the minimum bin slack heuristic of Gupta & Ho (1999) in the variant that fixes the
largest item (Fleszar & Hindi 2002); our own code from their descriptions.  No guarantee
beyond a plan (every item placed once); integer costs only.
"""

from __future__ import annotations

import heapq

import numpy as np

MAX_STEPS = 10_000
"""Largest ranks × items a packing may cost (Python steps, ~0.5 µs each)."""

MAX_BIT_WORK = 4_000_000
"""Largest ranks × items × (C / 64) a packing may cost (64-bit words shifted), so a
long-tailed cost model never builds huge bitsets.  Above either limit `pack` declines."""


def pack(costs: np.ndarray, num_ranks: int, capacity: int) -> np.ndarray | None:
    """Rank per item of the minimum-slack packing of integer `costs` at `capacity` (ties by
    index), or None when it would exceed `MAX_STEPS` or `MAX_BIT_WORK`.

    >>> pack(np.array([5, 4, 3, 3, 2, 1]), 3, 6).tolist()   # 5+1, 4+2, 3+3
    [0, 1, 2, 2, 1, 0]
    """
    n = costs.size
    if num_ranks * n > MAX_STEPS or num_ranks * n * (capacity // 64 + 1) > MAX_BIT_WORK:
        return None
    weight = costs.tolist()
    left = np.lexsort((np.arange(n), -costs)).tolist()  # largest first, ties by index
    assignment = np.empty(n, dtype=np.int64)
    loads = [0] * num_ranks
    for rank in range(num_ranks):
        if not left or weight[left[0]] > capacity:
            break
        first, rest = left[0], left[1:]
        room = capacity - weight[first]
        full = (1 << (room + 1)) - 1
        reach = [1]  # reach[k]: sums reachable with rest[:k]
        for item in rest:
            reach.append((reach[-1] | (reach[-1] << weight[item])) & full)
        total = reach[-1].bit_length() - 1
        chosen, remaining = {first}, total
        for k in range(len(rest) - 1, -1, -1):  # take rest[k] when rest[:k] cannot reach what remains
            if remaining == 0:
                break
            if not (reach[k] >> remaining) & 1:
                chosen.add(rest[k])
                remaining -= weight[rest[k]]
        assignment[list(chosen)] = rank
        loads[rank] = weight[first] + total
        left = [item for item in left if item not in chosen]
    heap = [(load, rank) for rank, load in enumerate(loads)]
    heapq.heapify(heap)
    for item in left:
        load, rank = heapq.heappop(heap)
        assignment[item] = rank
        heapq.heappush(heap, (load + weight[item], rank))
    return assignment

"""Plain-code references of the LPT and Karmarkar–Karp kernels, for tests and same-run baselines.

minimise max(loads) where loads[r] = sum(cost[i] for i on r), the textbook way, in pure
Python: slow (O(n log D) heap steps; O(n · D log D) for differencing on full D-vectors),
but with the tie rules of `lpt` and `karmarkar_karp`, so the fast kernels must reach
exactly what these reach (the tests assert it; the benchmarks time them as baselines).
"""

from __future__ import annotations

import heapq

import numpy as np


def heap_lpt(costs: np.ndarray, num_ranks: int) -> np.ndarray:
    """The textbook LPT loop: largest cost first (ties by index) onto the least-loaded rank
    (ties by rank); returns the assignment."""
    order = np.lexsort((np.arange(costs.size), -costs))
    heap = [(0.0, rank) for rank in range(num_ranks)]
    assignment = np.empty(costs.size, dtype=np.int64)
    for item in order.tolist():
        load, rank = heapq.heappop(heap)
        assignment[item] = rank
        heapq.heappush(heap, (load + float(costs[item]), rank))
    return assignment


def dense_kk(costs: np.ndarray, num_ranks: int) -> list[float]:
    """Largest differencing on full D-vectors with `karmarkar_karp`'s tie rules (waiting items
    by cost then index, parts before waiting items of equal difference, older parts first);
    returns the rank loads, ascending."""
    order = sorted(range(costs.size), key=lambda i: (-costs[i], i))
    heap = [(-float(costs[i]), 1, k, [float(costs[i])] + [0.0] * (num_ranks - 1))
            for k, i in enumerate(order)]
    heapq.heapify(heap)
    age = 0
    while len(heap) > 1:
        first, second = heapq.heappop(heap)[-1], heapq.heappop(heap)[-1]
        merged = sorted(x + y for x, y in zip(sorted(first, reverse=True), sorted(second)))
        heapq.heappush(heap, (-(merged[-1] - merged[0]), 0, age, merged))
        age += 1
    return sorted(heap[0][-1])

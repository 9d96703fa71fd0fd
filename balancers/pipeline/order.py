"""Where each cell runs in its replica: the order of a replica's cells for the schedule.

In a pipeline step any cell may run in any slot of its replica (replicas meet only at the end
of the step, `schedules`):

    mountain  each replica's cells in the order light, ..., heavy, ..., light: the lightest
              runs last (the drain waits on the last backward, k times a forward), the next
              first (the fill waits on the first forward), and so on inward; GPipe's time
              does not depend on the order, 1F1B's fill and drain do, and the interleaved
              schedule's groups of P take the same order
"""

from __future__ import annotations

import numpy as np


def mountain(costs: np.ndarray) -> np.ndarray:
    """(D, M) slot order per replica (row): position k runs column order[r, k] (see the module).

    >>> mountain(np.array([[1.0, 5.0, 3.0, 2.0, 4.0]])).tolist()
    [[3, 4, 1, 2, 0]]
    """
    m = costs.shape[1]
    lightest_first = np.argsort(costs, axis=1, kind="stable")
    rank = np.arange(m)
    position = np.where(rank % 2 == 0, m - 1 - rank // 2, rank // 2)  # 0th lightest last, 1st first, ...
    order = np.empty_like(lightest_first)
    order[:, position] = lightest_first
    return order

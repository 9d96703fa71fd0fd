"""Where each cell runs: which replica (padded cells) and in which slot of it.

In a pipeline step any cell may run on any replica in any slot (replicas meet only at the end
of the step, `schedules`):

    deal      cells by cost, heaviest first, in rounds of D: round j gives one cell to every
              replica, the heaviest to the replica with the least cost so far (ties by index),
              so every replica gets one cell of every tier and near-equal sums (padded cells,
              which the search's item moves do not reshape)
    mountain  each replica's cells in the order light, ..., heavy, ..., light: the lightest
              runs last (the drain waits on the last backward, k times a forward), the next
              first (the fill waits on the first forward), and so on inward; GPipe's time
              does not depend on the order, 1F1B's fill and drain do, and the interleaved
              schedule's groups of P take the same order
"""

from __future__ import annotations

import numpy as np


def deal(cell_costs: np.ndarray, num_ranks: int) -> np.ndarray:
    """(D, M) indices into `cell_costs` (M·D of them): the cells of each replica (see the module)."""
    m = cell_costs.size // num_ranks
    order = np.argsort(-cell_costs, kind="stable")
    grid = np.empty((num_ranks, m), dtype=np.int64)
    sums = np.zeros(num_ranks)
    for j in range(m):
        tier = order[j * num_ranks:(j + 1) * num_ranks]
        lightest = np.argsort(sums, kind="stable")
        grid[lightest, j] = tier
        sums[lightest] += cell_costs[tier]
    return grid


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


def places(grid: np.ndarray, cell: np.ndarray, num_microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """(replica, slot) per item when replica r runs flat cell grid[r, k] in slot k (item i in flat cell cell[i]).

    >>> [array.tolist() for array in places(np.array([[1, 0], [3, 2]]), np.array([0, 3, 3]), 2)]
    [[0, 1, 1], [1, 0, 0]]
    """
    replica_of, slot_of = np.empty(grid.size, dtype=np.int64), np.empty(grid.size, dtype=np.int64)
    replica_of[grid.ravel()] = np.repeat(np.arange(grid.shape[0]), num_microbatches)
    slot_of[grid.ravel()] = np.tile(np.arange(num_microbatches), grid.shape[0])
    return replica_of[cell], slot_of[cell]

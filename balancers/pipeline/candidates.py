"""The rows a pipeline search step times (`search.CellSearch`): a replica's cells with an item taken out or added,
or with two slots swapped, one row per candidate, and the replicas of least and of most time it takes candidates
from.  Plain numpy, no state: each row is a copy, timed alone (`schedules.replica_times`: the same floats at once).
"""

from __future__ import annotations

import numpy as np

MAX_SWAPS = 1024  # slot pairs tried per step: all of them up to M = 46, else swaps with the neighbours and ends


def without(grid: np.ndarray, values: np.ndarray, replica: np.ndarray, slot: np.ndarray, items: np.ndarray
            ) -> np.ndarray:
    """Per item, its replica's row of `grid` without its value."""
    rows = grid[replica[items]]
    cells = (np.arange(items.size), slot[items])
    rows[cells] = np.maximum(rows[cells] - values[items], 0.0)  # float sums of what is left: never below 0
    return rows


def without_each(grids: tuple, replica: np.ndarray, slot: np.ndarray, items: np.ndarray) -> tuple:
    """`without` of each of `grids`, ((cell costs, item costs), (first-stage parts, items' parts) or (None, None)):
    (costs, first-stage parts or None), the parts capped at the costs (float sums of what is left cross by a
    rounding, ~2.2e-16 of the rows' max: `Pipeline.stage_times` refuses a part above its cell's cost)."""
    (cost, values), (first, parts) = grids
    left = without(cost, values, replica, slot, items)
    return left, None if first is None else np.minimum(without(first, parts, replica, slot, items), left)


def added(grid: np.ndarray, values: np.ndarray, replicas: np.ndarray, items: np.ndarray, slots: np.ndarray
          ) -> np.ndarray:
    """Per (replica, item, slot): the replica's row of `grid` with the item's value added to that slot."""
    rows = grid[replicas]
    rows[np.arange(items.size), slots] += values[items]
    return rows


def swapped(row: np.ndarray, swaps: np.ndarray) -> np.ndarray:
    """`row` with each pair of `swaps` exchanged, one row per pair."""
    rows = np.repeat(row[None, :], len(swaps), axis=0)
    index = np.arange(len(swaps))
    rows[index, swaps[:, 0]], rows[index, swaps[:, 1]] = row[swaps[:, 1]], row[swaps[:, 0]]
    return rows


def swap_pairs(m: int) -> np.ndarray:
    """(pairs, 2) slot pairs a reordering step tries (see MAX_SWAPS)."""
    pairs = [(i, j) for i in range(m) for j in range(i + 1, m)]
    if len(pairs) > MAX_SWAPS:
        pairs = sorted({(i, i + 1) for i in range(m - 1)} | {(0, j) for j in range(1, m)}
                       | {(i, m - 1) for i in range(m - 1)})
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def lightest(times: np.ndarray, count: int) -> np.ndarray:
    """The `count` replicas of least time, ties by index (a stable argsort's first `count`).

    >>> lightest(np.array([3.0, 1.0, 1.0, 0.0, 1.0, 2.0]), 3).tolist()
    [3, 1, 2]
    """
    if times.size > count:
        pool = np.flatnonzero(times <= np.partition(times, count - 1)[count - 1])
    else:
        pool = np.arange(times.size)
    return pool[np.argsort(times[pool], kind="stable")][:count]


def heaviest(times: np.ndarray, count: int) -> np.ndarray:
    """The `count` replicas of most time, most first, ties by the higher index (a stable argsort's last `count`,
    reversed): from the candidates alone, where a stable sort of all D floats took 10x a partition (2560: 250 µs).

    >>> heaviest(np.array([3.0, 1.0, 3.0, 0.0, 1.0, 2.0]), 3).tolist()
    [2, 0, 5]
    """
    if times.size > count:
        pool = np.flatnonzero(times >= np.partition(times, times.size - count)[times.size - count])
    else:
        pool = np.arange(times.size)
    return pool[np.argsort(times[pool], kind="stable")][::-1][:count]

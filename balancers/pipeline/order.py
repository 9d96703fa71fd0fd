"""Where each cell runs: which replica and in which slot, before any item moves.

A plan's cells are bins of items; in a pipeline step any cell may run on any replica in any
slot (replicas meet only at the end of the step, `schedules`), so the cells are dealt
afresh for the schedule:

    deal      cells by cost, heaviest first, in rounds of D: round j gives one cell to every
              replica, the heaviest to the replica with the least cost so far (ties by index),
              so every replica gets one cell of every tier and near-equal sums
    mountain  each replica's cells in the order light, ..., heavy, ..., light: the lightest
              runs last (the drain waits on the last backward, k times a forward), the next
              first (the fill waits on the first forward), and so on inward; GPipe's time
              does not depend on the order, 1F1B's fill and drain do, and the interleaved
              schedule's groups of P take the same order
    reshape   each replica's items cut afresh into cells of a target shape (`profile`): its
              items costliest first, each to the slot of its replica furthest below its target
              that has room; rounds of one item per replica, so it costs O(n + rounds · M·D)
"""

from __future__ import annotations

import numpy as np


def deal(cell_costs: np.ndarray, num_ranks: int) -> np.ndarray:
    """(D, M) indices into `cell_costs` (M·D of them): the cells of each replica (see the module)."""
    size = cell_costs.size
    m = size // num_ranks
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


def reshape(item_costs: np.ndarray, lengths: np.ndarray, replica: np.ndarray, targets: np.ndarray,
            max_tokens: int, costliest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(slot per item, failed per replica): each replica's items re-cut toward `targets` (D, M) of
    cost per slot (see the module); a replica where an item found no room is flagged, its slots -1.
    `costliest`: the items by cost, largest first, ties by index (the problem's `cost_order`).

    The rounds first run without the token budget (tokens only grow: a replica whose cells end
    within it met it at every choice, so it chose as the budgeted rounds do); the replicas over
    it are re-cut by `_budgeted_rounds`.

    >>> reshape(np.array([4.0, 3.0, 2.0, 1.0]), np.ones(4, dtype=np.int64), np.zeros(4, dtype=np.int64),
    ...         np.array([[3.0, 7.0]]), 4, np.arange(4))[0].tolist()
    [1, 0, 1, 1]
    """
    n = item_costs.size
    num_ranks, m = targets.shape
    order = costliest[_grouped(replica[costliest], num_ranks)]  # by replica, costliest first
    counts = np.bincount(replica, minlength=num_ranks)
    # each one's place in its replica (turn) and its replica, as a place in the round grid turn · D + replica
    place = np.arange(n) * num_ranks + np.repeat(np.arange(num_ranks) - (np.cumsum(counts) - counts) * num_ranks,
                                                  counts)
    grid = np.full((int(counts.max(initial=0)), num_ranks), n)  # round t: the t-th item of every replica
    grid.ravel()[place] = order  # (n: none, an item of cost 0)
    costs = np.append(item_costs, 0.0)[grid]
    load, gap, chosen = np.zeros((num_ranks, m)), np.empty((num_ranks, m)), np.empty(grid.shape, dtype=np.int64)
    rows = np.arange(num_ranks) * m
    for t in range(grid.shape[0]):
        np.argmax(np.subtract(targets, load, out=gap), axis=1, out=chosen[t])
        load.ravel()[rows + chosen[t]] += costs[t]
    slot = np.empty(n + 1, dtype=np.int64)
    slot[grid] = chosen
    slot = slot[:n]
    over = np.bincount(replica * m + slot, weights=lengths, minlength=num_ranks * m).reshape(num_ranks, m)
    over = np.flatnonzero((over > max_tokens).any(axis=1))
    failed = np.zeros(num_ranks, dtype=bool)
    if over.size:
        mine = np.zeros(num_ranks, dtype=np.int64) - 1
        mine[over] = np.arange(over.size)
        items = np.flatnonzero(mine[replica] >= 0)
        local = np.full(n, -1, dtype=np.int64)
        local[items] = np.arange(items.size)
        ranked = local[costliest]
        slot[items], failed[over] = _budgeted_rounds(item_costs[items], lengths[items], mine[replica[items]],
                                                     targets[over], max_tokens, ranked[ranked >= 0])
    return slot, failed


def _budgeted_rounds(item_costs: np.ndarray, lengths: np.ndarray, replica: np.ndarray, targets: np.ndarray,
                     max_tokens: int, costliest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`reshape`'s rounds within the token budget: each item to the slot furthest below its target
    that has room; a replica where one finds none is flagged."""
    n = item_costs.size
    num_ranks, m = targets.shape
    order = costliest[_grouped(replica[costliest], num_ranks)]
    counts = np.bincount(replica, minlength=num_ranks)
    first = np.cumsum(counts) - counts  # round t takes order[first[r] + t] of every replica r with counts[r] > t
    load, tokens = np.zeros((num_ranks, m)), np.zeros((num_ranks, m), dtype=np.int64)
    slot, failed = np.full(n, -1, dtype=np.int64), np.zeros(num_ranks, dtype=bool)
    for t in range(int(counts.max(initial=0))):
        rows = np.flatnonzero(counts > t)
        items = order[first[rows] + t]
        room = tokens[rows] + lengths[items][:, None] <= max_tokens
        chosen = np.argmax(np.where(room, targets[rows] - load[rows], -np.inf), axis=1)
        fits = room[np.arange(items.size), chosen]
        failed[rows[~fits]] = True
        items, cell, chosen = items[fits], rows[fits] * m + chosen[fits], chosen[fits]
        load.ravel()[cell] += item_costs[items]
        tokens.ravel()[cell] += lengths[items]
        slot[items] = chosen
    return slot, failed


def _grouped(rows: np.ndarray, count: int) -> np.ndarray:
    """The stable order of `rows` (values in [0, count)): as unique keys (row, position), sorted as
    int32 when they fit (2-3x faster than a radix argsort at 82k rows), else as uint16 keys, which numpy
    sorts by radix, else as int64 keys.

    >>> rows = np.array([2, 0, 2, 1, 0])
    >>> _grouped(rows, 3).tolist(), _grouped(rows, 2**40).tolist(), _grouped(np.arange(40_000) % 3, 60_000)[:3]
    ([1, 4, 3, 0, 2], [1, 4, 3, 0, 2], array([0, 3, 6]))
    """
    size = rows.size
    shift = max(size - 1, 1).bit_length()
    if count << shift <= 2**31:  # keys row · 2^shift + position: a mask, not a division, reads the position back
        keys = (rows.astype(np.int32) << np.int32(shift)) | np.arange(size, dtype=np.int32)
        keys.sort()
        keys &= np.int32((1 << shift) - 1)
        return keys.astype(np.int64)
    if count <= 2**16:
        return np.argsort(rows.astype(np.uint16), kind="stable")
    return np.sort(rows * size + np.arange(size)) % size

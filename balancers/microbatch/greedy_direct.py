"""Items of the unpadded joint greedy whose best fit is known without its search (`greedy._sorted_greedy`).

An item of cost c > 0 takes the best fit, the largest excess (load + c) - level <= 0, the lowest cell of a tie
(`greedy._best_fit`, a binary search per micro-batch, ~6.5 us an item at 2560 x 32).  Two cases need none:
- Empty cells (`take_empties`, many runs at once, checked in numpy in the greedy's own floats): where micro-batch t
  has empty cells that fit and no other cell's excess reaches theirs, the item takes t's lowest empty cell, and so do
  the next ones while no cell fits them better (t's least filled load, every other micro-batch's best fit, the
  waiting cells that come back), no cell an item took fits a later one (the latest holds the least cost and the most
  room: costs and lengths do not grow along the order) and empty cells are left.
- The top (`take_tops`, an item at a time): where only micro-batch t has fits and its fullest cell with room fits,
  that cell is the best fit (its lowest cell of that load; a rounding tie with the next load below goes to the
  search), best-fit-decreasing of distinct items.
Capped Pareto at 2560 x 32 (T 16k): items 2.4k-4.2k and 8.7k-10.3k go to empty cells (mb1, then mb2), 4.2k-8.2k to
the tops of mb1, ~5k runs in all, most of one item.  The levels do not move (every item fits).  Original to orchmllm.
"""

from __future__ import annotations

import bisect
import heapq
import math
from operator import itemgetter

import numpy as np

from .greedy_rows import first_above
from .greedy_sweep import CELLS, merge

FEWEST = 4  # items a window takes at least (fewer: the search places them, as quick)


def take_empties(state, costs: np.ndarray, lengths: np.ndarray, bounds: np.ndarray, at: int) -> int:
    """How many runs from run `at` go, one item each to the lowest empty cell of one micro-batch, as the search would
    place them (`state`: a `greedy._Rows` after the run's `release`; per run its cost and length, run j the items
    bounds[j]:bounds[j + 1]); placed."""
    rows, level, cap, first = state.rows, state.level, state.cap, float(costs[at])
    target, others = -1, []
    for m, row in enumerate(rows):
        if row and row[0][0] == 0.0 and first - level[m] <= 0.0:
            if target >= 0:
                return 0  # two micro-batches' empty cells fit: their excesses decide, to the search
            target = m
        elif row:
            others.append(m)
    if target < 0:
        return 0
    row, top = rows[target], level[target]
    empty = bisect.bisect_right(row, (0.0, math.inf))
    if empty < len(row) and (row[empty][0] + first) - top <= 0.0:
        return 0  # a filled cell of t fits (the best fit: it is fuller), the common case: no numpy
    if int(bounds[at + 1] - bounds[at]) > 1 and (first + first) - top <= 0.0 and 2 * int(lengths[at]) <= cap:
        return 0  # the first run's cell fits its next item
    for m in others:  # another micro-batch's best fit beats the empty cell for the first run
        fit = first_above(rows[m], len(rows[m]), level[m], first, 0.0)
        if fit and (rows[m][fit - 1][0] + first) - level[m] >= first - top:
            return 0
    last = min(int(np.searchsorted(bounds, bounds[at] + empty, side="right")) - 1, at + 512, len(costs) - 1)
    if last <= at + 1 or int(bounds[last] - bounds[at]) < FEWEST or ((first + float(costs[at + 1])) - top <= 0.0 and (
            cap - int(lengths[at]) >= int(lengths[at + 1]))):
        return 0  # few runs, or the next run refits the first's cell
    cost, length, count = costs[at:last], lengths[at:last], np.diff(bounds[at:last + 1])
    fits = (cost - top <= 0.0) & (cost > 0.0)
    if empty < len(row):  # nor t's least load above its empty cells
        fits &= (row[empty][0] + cost) - top > 0.0
    fits &= ~((count > 1) & ((cost + cost) - top <= 0.0) & (cap - length >= length))  # a run's next item
    fits[1:] &= ~(((cost[:-1] + cost[1:]) - top <= 0.0) & (cap - length[:-1] >= length[1:]))  # the run before's
    for m in others:
        fits &= _below(rows[m], level[m], cost, cost - top)
    runs = int(np.argmin(fits)) if not fits.all() else fits.size
    if int(count[:runs].sum()) < FEWEST:
        return 0
    cost, length, count, fits = cost[:runs], length[:runs], count[:runs], fits[:runs]
    back = _back(state, cost, length, cost - top, fits)
    runs = int(np.argmin(fits)) if not fits.all() else fits.size
    placed = int(count[:runs].sum())
    if placed >= FEWEST:
        _fill(state, target, np.repeat(cost[:runs], count[:runs]), np.repeat(length[:runs], count[:runs]))
    end = int(length[runs - 1]) if placed >= FEWEST else math.inf
    for key in back:  # as the runs' `release`s: back to their rows, or still waiting
        if -(key // CELLS) >= end:
            bisect.insort(rows[key % CELLS // state.d], (state.loads[key % CELLS], key % CELLS))
        else:
            heapq.heappush(state.waiting, key)
    return runs if placed >= FEWEST else 0


def _back(state, cost: np.ndarray, length: np.ndarray, bar: np.ndarray, fits: np.ndarray) -> list:
    """The waiting cells that come back within the runs (room for the last one's length), off the heap; `fits` False
    from the first run for which one of them is a fit with an excess of at least `bar` (the empty cell's)."""
    waiting, back, limit = state.waiting, [], (1 - int(length[-1])) * CELLS  # keys below: room for length[-1]
    while waiting and waiting[0] < limit:
        back.append(heapq.heappop(waiting))
    if back:
        room = -np.array([key // CELLS for key in back])
        loads = np.array([state.loads[key % CELLS] for key in back])
        tops = np.array([state.level[key % CELLS // state.d] for key in back])
        # weighed run by run: those that fit the last (least) cost, and whose slack load - level is not below the
        # empty cell's, -level, by more than the rounding of the excesses could make up
        error = 2.0 ** -45 * (float(loads.max()) + float(cost[0]) + float(tops.max()) + (float(cost[0]) - bar[0]))
        near = ((loads + cost[-1]) - tops <= 0.0) & ((loads - tops) - (bar[0] - cost[0]) >= -error)
        room, loads, tops = room[near], loads[near], tops[near]
        excess = (loads[:, None] + cost[None, :]) - tops[:, None]
        fits &= ~((length[None, :] <= room[:, None]) & (excess <= 0.0) & (excess >= bar[None, :])).any(axis=0)
    return back


def _below(row: list, top: float, cost: np.ndarray, bar: np.ndarray) -> np.ndarray:
    """Per item cost, whether every fit in `row` (a micro-batch's sorted (load, cell) pairs at level `top`) has an
    excess (load + cost) - top below `bar` (the empty cell's; equal: to the search, the lower micro-batch wins).  The
    excess grows with the load: the fits are the loads below the first whose excess is > 0, found by a binary search
    and moved in the greedy's floats."""
    least = (row[0][0] + cost) - top
    if (least > 0.0).all():
        return least > 0.0
    loads = np.fromiter(map(itemgetter(0), row), dtype=np.float64, count=len(row))
    fit = np.searchsorted(loads, top - cost, side="right")
    while True:  # rounding: the first load whose excess is > 0
        down = (fit > 0) & ((loads[np.maximum(fit - 1, 0)] + cost) - top > 0.0)
        up = (fit < loads.size) & ((loads[np.minimum(fit, loads.size - 1)] + cost) - top <= 0.0)
        if not (down.any() or up.any()):
            break
        fit = fit - down + up
    return (fit == 0) | ((loads[np.maximum(fit - 1, 0)] + cost) - top < bar)


def _fill(state, m: int, item_costs: np.ndarray, item_lengths: np.ndarray) -> None:
    """The items, in turn, to micro-batch m's lowest empty cells: loads, tokens, the cells taken; each back into the
    row where it has room for the last item, else to the waiting heap (as the runs' `release`s would leave it)."""
    row, cap, loads, tokens = state.rows[m], state.cap, state.loads, state.tokens
    count = item_costs.size
    cells = [cell for _, cell in row[:count]]
    del row[:count]
    costs, lengths, last = item_costs.tolist(), item_lengths.tolist(), int(item_lengths[-1])
    state.chosen += cells
    back, waiting = [], state.waiting
    for cell, cost, length in zip(cells, costs, lengths):
        loads[cell], tokens[cell] = cost, length
        if cap - length >= last:
            back.append((cost, cell))
        else:
            heapq.heappush(waiting, (length - cap) * CELLS + cell)
    back.sort()
    merge(row, back)


def take_tops(state, cost: float, length: int, count: int) -> int:
    """Up to `count` items of `cost` > 0 and `length`, each to the best fit while it is the top of one micro-batch's
    row (its fullest cell with room, the lowest of a load) and no other micro-batch has a fit: best-fit-decreasing of
    distinct items into micro-batch 1 (capped Pareto 2560 x 32, items 4.2k-8.2k, one item a run), as the search
    would place them without its search; how many (the rest to the search)."""
    rows, level, cap, d = state.rows, state.level, state.cap, state.d
    target = -1
    for m, row in enumerate(rows):
        if row and (row[0][0] + cost) - level[m] <= 0.0:
            if target >= 0:
                return 0
            target = m
    if target < 0:
        return 0
    row, top, loads, tokens, chosen, waiting = rows[target], level[target], state.loads, state.tokens, state.chosen, \
        state.waiting
    taken = 0
    while taken < count and row:
        load, cell = row[-1]
        if (load + cost) - top > 0.0:
            break  # the top does not fit: the best fit is below, to the search
        at = len(row) - 1
        if at and row[at - 1][0] == load:  # a load's lowest cell first
            at = bisect.bisect_left(row, (load, -1))
            cell = row[at][1]
        if at and (row[at - 1][0] + cost) - top == (load + cost) - top:
            break  # an excess tied by rounding with the next load's
        total, held = load + cost, tokens[cell] + length
        if not total > load:
            break
        del row[at]
        loads[cell], tokens[cell] = total, held
        chosen.append(cell)
        taken += 1
        if cap - held >= length:
            row.append((total, cell))  # the fullest now
        else:
            heapq.heappush(waiting, (held - cap) * CELLS + cell)
    return taken

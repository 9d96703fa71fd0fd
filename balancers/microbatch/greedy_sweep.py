"""The unpadded joint greedy within a run of equal items of cost c > 0 (`greedy._Rows.run`): passes over the
micro-batches' sorted rows of (load, cell) pairs instead of a search (M binary searches, a del, an insort) an item.

Fits (`descend`): the best fit, the largest excess (load + c) - level <= 0, stays the best while it takes more (its
excess grows, the others' do not), so the cells take the items in the order of their excess, greatest first (equal:
the lowest cell), each while it fits and has room: down each row from its last fit, the rows merged by a heap of
their next cells.  The excess grows with the load, so excesses tied by rounding of unequal loads are adjacent in a
row: a pass stops above them (the search takes those).  Rises (`climb`): once no cell fits an item and micro-batch
m rose to take it, no cell fits the next equal items but those at the new level: each takes m's least loaded cell,
in the row's order, while that beats the least rise of the other micro-batches (unchanged meanwhile) and the cells
lifted, now at or above the level, offer no less than level + c.  Each choice is checked in the greedy's own
floats: excess = (load + c) - level, exact where load + c <= 2 · level (Sterbenz), so unequal sums never tie; sums
tied by rounding of unequal loads end the pass before their load.  Original to orchmllm.
"""

from __future__ import annotations

import bisect
import heapq
import math
from itertools import islice
from operator import itemgetter, lt

WHOLE = 8  # `_Group.take` takes whole loads at once where they hold this many cells
_LOAD, _CELL = itemgetter(0), itemgetter(1)  # a (load, cell) pair's load, its cell
SPAN = 8  # `merge` sorts a span of the row up to this many pairs per pair it merges
CELLS = 1 << 40  # a waiting cell's key in the heap: (tokens - T) · CELLS + cell (cells number fewer), one int for the
# pair (tokens - T, cell), which heapq compares quicker (~17k pushes and pops a plan at 2560 x 32; 1.2 % fewer
# instructions in all)


def climb(state, m: int, cost: float, length: int, count: int) -> int:
    """Up to `count` items of `cost` (> 0) and `length` to micro-batch m's least loaded cells in turn, after an item
    rose m (`state`: a `greedy._Rows`); how many (the first one the sweep cannot vouch for goes to `_best_fit`)."""
    rows, level = state.rows, state.level
    others = min([(row[0][0] + cost) - level[k] for k, row in enumerate(rows) if row and k != m], default=None)
    row, start = rows[m], level[m]
    ceiling, top, taken, group, last, key_of_last = min(start + cost, 2.0 * start), start, 0, 0, None, None
    while taken < len(row):
        load = row[taken][0]
        key = load + cost
        if load != last:
            if key == key_of_last:  # rounding ties this load's sum with the last one's: their cells' order is moot
                taken = group
                break
            if taken == count or key >= ceiling:
                break
            group, last, key_of_last = taken, load, key
        elif taken == count:  # the next load's sum may tie it too
            after = bisect.bisect_right(row, (load, math.inf), taken)
            taken = group if after < len(row) and row[after][0] + cost == key else taken
            break
        excess = key - top
        if excess > 0.0 and ((others is not None and excess >= others) or (not state.fresh_won and excess > cost)):
            break
        top, taken = key, taken + 1
    if taken:
        _lift(state, m, row, taken, cost, length)
    return taken


def descend(state, fits: list, cost: float, length: int, count: int) -> int:
    """Up to `count` items of `cost` (> 0) and `length` to the fits, the first `fits[m]` pairs of each micro-batch m's
    row (`state`: a `greedy._Rows`), best first, each while it fits; how many (the rest to the search).  Each pass
    takes one micro-batch's cells down to the next best of the others' (a heap of their heads)."""
    rows, level = state.rows, state.level
    heads = [_head(rows[m], fit, level[m], cost, m) for m, fit in enumerate(fits) if fit]
    heapq.heapify(heads)
    groups, taken = {}, 0  # a micro-batch's `_Group` once it is first taken from (most only give the floor)
    while taken < count and heads:
        m = heads[0][2]
        if heads[0][1] < 0:  # its excess tied by rounding with the next load's: their cells in turn, to the search
            break
        group = groups.get(m)
        if group is None:
            group = groups[m] = _Group(rows[m], fits[m], level[m], heads[0])
        placed = group.take(state, cost, length, count - taken, min(heads[1:3]) if len(heads) > 1 else None)
        if not placed:  # none fits (an excess of -inf): to the search
            break
        taken += placed
        if taken == count:
            break
        if group.end:
            heapq.heapreplace(heads, group.head(m))
        else:
            heapq.heappop(heads)
    for group in groups.values():
        group.close()
    return taken


def _head(row: list, fit: int, top: float, cost: float, m: int) -> tuple:
    """`_Group.head` of micro-batch m's fits, the first `fit` pairs of its `row`, before it takes any, then where
    its first load's cells start and that load."""
    load = row[fit - 1][0]
    cut = fit - 1 if fit == 1 or row[fit - 2][0] != load else bisect.bisect_left(row, (load, -1), 0, fit)
    excess = (load + cost) - top
    return -excess, -1 if cut and (row[cut - 1][0] + cost) - top == excess else row[cut][1], m, cut, load


class _Group:
    """A micro-batch's fits as `descend` takes them: row[cut:end] the cells of one load, `done` of them taken (the
    lowest first), row[end:fit] taken; their sums back into the row when it closes."""

    def __init__(self, row: list, fit: int, top: float, head: tuple):
        """At the first load's cells (`head`: `_head`'s)."""
        self.row, self.fit, self.top, self.end, self.done, self.back = row, fit, top, fit, 0, []
        self.excess, self.tied, self.cut, self.load = -head[0], head[1] < 0, head[3], head[4]

    def head(self, m: int) -> tuple:
        """The heap's key of its next cell: the greatest excess first, then the lowest cell (a tied load first)."""
        return -self.excess, -1 if self.tied else self.row[self.cut + self.done][1], m

    def take(self, state, cost: float, length: int, left: int, floor: tuple | None) -> int:
        """Up to `left` items to its cells in turn, each while it fits, while they come before `floor` (the others'
        next best head); how many.  A load tied by rounding with the next one below (`tied`) stops it."""
        row, top, tokens, loads, cap, chosen, back = (self.row, self.top, state.tokens, state.loads, state.cap,
                                                      state.chosen, self.back)
        bound, first = (-math.inf, 0) if floor is None else (-floor[0], floor[1])
        cut, end, done, taken = self.cut, self.end, self.done, 0
        load, excess, tied = (self.load, self.excess, self.tied) if cut < end else (0.0, 0.0, False)
        if left >= WHOLE and done == 0 and 0 < end - cut <= left and not tied and bound < excess <= 0.0 and (
                (load + cost) + cost) - top > 0.0:
            start = _whole(row, cut, end, top, cost, bound, left)  # whole loads of one item a cell at once
            if end - start >= WHOLE:
                taken = _take_whole(state, row, start, end, top, cost, length, back)
                cut, end = (start, start) if taken else (cut, end)
        below = (row[cut - 1][0] + cost) - top if cut else 0.0  # the excess of the next load below
        while True:
            if cut + done == end:  # on to the next load's cells below
                end, done = cut, 0
                if not end:
                    break
                load, excess = row[end - 1][0], below
                cut = end - 1 if end == 1 or row[end - 2][0] != load else bisect.bisect_left(row, (load, -1), 0, end)
                below = (row[cut - 1][0] + cost) - top if cut else 0.0
                tied = cut > 0 and below == excess
            if taken == left or tied or not excess <= 0.0 or excess < bound or excess == bound and row[
                    cut + done][1] > first:
                break
            cell = row[cut + done][1]  # in the row: room for one (it fits: excess <= 0)
            sum_, held, taken = load + cost, tokens[cell] + length, taken + 1
            chosen.append(cell)
            while taken < left and cap - held >= length and (sum_ + cost) - top <= 0.0:
                sum_, held, taken = sum_ + cost, held + length, taken + 1
                chosen.append(cell)
            loads[cell], tokens[cell] = sum_, held
            if cap - held >= length:
                back.append((sum_, cell))
            else:
                heapq.heappush(state.waiting, (held - cap) * CELLS + cell)
            done += 1
        self.cut, self.end, self.done, self.load, self.excess, self.tied = cut, end, done, load, excess, tied
        return taken

    def close(self) -> None:
        """The cells taken out of the row (row[cut:cut + done] and row[end:fit], in one move of its tail), their sums
        in."""
        row = self.row
        row[self.cut:self.fit] = row[self.cut + self.done:self.end]
        merge(row, sorted(self.back))


def _lift(state, m: int, row: list, taken: int, cost: float, length: int) -> None:
    """The first `taken` pairs of micro-batch m's `row`, one item of `cost` and `length` fuller: back into the row
    (in order: their sums grow with their loads, equal ones from one load) or to the waiting heap."""
    loads, tokens, cap, room, back = state.loads, state.tokens, state.cap, state.cap - length, []
    pairs = row[:taken]
    del row[:taken]
    for load, cell in pairs:
        sum_, held = load + cost, tokens[cell] + length
        loads[cell], tokens[cell] = sum_, held
        if held <= room:
            back.append((sum_, cell))
        else:
            heapq.heappush(state.waiting, (held - cap) * CELLS + cell)
    state.chosen += map(_CELL, pairs)
    state.level[m] = max(state.level[m], pairs[-1][0] + cost)
    merge(row, back)


def merge(row: list, back: list) -> None:
    """`back` (sorted pairs) into `row`: the span of the row between its first and last one found by two binary
    searches and merged with them in one sort (most often the span is empty: they go in between two pairs); where
    the span is long, each one's place by a binary search and the span rebuilt once from its slices."""
    if len(back) < 3:
        for pair in back:
            bisect.insort(row, pair)
        return
    low = bisect.bisect_left(row, back[0])
    high = bisect.bisect_left(row, back[-1], low)
    if high - low <= SPAN * len(back):
        row[low:high] = sorted(row[low:high] + back) if high > low else back
        return
    places = [bisect.bisect_left(row, pair, low, high) for pair in back]
    merged, start = [], places[0]
    for pair, place in zip(back, places):
        merged += row[start:place]
        merged.append(pair)
        start = place
    row[places[0]:start] = merged


def _whole(row: list, cut: int, end: int, top: float, cost: float, bound: float, left: int) -> int:
    """Where the loads of row[:end] that `_Group.take` gives one item a cell, in turn, start (row[cut:end], the
    first, does): at most `left` cells, each above `bound` (the others' best excess) and taking no second (((load +
    c) + c) - top > 0), from a load's first cell."""
    start = end - left
    if start <= 0:
        start = 0
    elif row[start - 1][0] == row[start][0]:
        start = bisect.bisect_right(row, (row[start][0], math.inf), start, cut)
    load = row[start][0]
    if (load + cost) - top > bound and ((load + cost) + cost) - top > 0.0:
        return start
    return bisect.bisect_left(row, True, start, cut, key=lambda pair: (pair[0] + cost) - top > bound and (
        (pair[0] + cost) + cost) - top > 0.0)


def _take_whole(state, row: list, start: int, end: int, top: float, cost: float, length: int, back: list) -> int:
    """One item of `cost` and `length` to each cell of row[start:end] (whole loads), highest load first, the lowest
    cell of a load first; how many: none where rounding ties two of their loads' excesses (load + c) - top, or the
    last's with the next load below (the loop stops there).  The sums are checked: at least top / 2 (Sterbenz: the
    excess exact), unequal for unequal loads."""
    pairs = row[start - 1 if start else 0:end]
    sums = [pair[0] + cost for pair in pairs]
    if sums[0] < 0.5 * top:
        return 0
    ulp = math.ulp(pairs[0][0])
    # loads and sums in one binade and the cost not half-way between two of its floats: each sum is its load shifted
    # by one amount (unequal loads, unequal sums); else the sums are counted
    if (ulp != math.ulp(sums[-1]) or math.fmod(cost, ulp) == 0.5 * ulp) and len(set(sums)) != len(
            set(map(_LOAD, pairs))):
        return 0
    # highest load first is the row reversed where no load is tied (no lowest cell to keep first): the sums, in
    # order, rise at every pair (a pass of compares, not a set: sets were ~3 % of the greedy's instructions)
    in_order = all(map(lt, sums, islice(sums, 1, None)))
    if start:
        pairs, sums = pairs[1:], sums[1:]
    cell_loads, tokens, cap, room, waiting = state.loads, state.tokens, state.cap, state.cap - length, state.waiting
    for (_, cell), sum_ in zip(pairs, sums):
        held = tokens[cell] + length
        cell_loads[cell], tokens[cell] = sum_, held
        if held <= room:
            back.append((sum_, cell))
        else:
            heapq.heappush(waiting, (held - cap) * CELLS + cell)
    state.chosen += map(_CELL, reversed(pairs) if in_order else sorted(pairs, key=_LOAD, reverse=True))
    return len(pairs)

"""The sorted rows of the joint greedy's search (`greedy._Rows`, `greedy._PaddedRows`): per micro-batch its cells'
(load, cell) pairs, sorted, the excess (load + cost) - level growing with the load, so the fits of an item are a
binary search away.  Ties in floats (unequal loads of equal excess) are searched a run of one load at a time.
Original to orchmllm.
"""

from __future__ import annotations

import bisect
import math


def tied(row: list, at: int, step: int, cost: float, top: float, best: float) -> int:
    """The lowest cell among the runs of equal loads from position `at` of `row` (a micro-batch's (load, cell) pairs,
    sorted) on, towards `step`, whose excess (load + cost) - top is `best` (float rounding can tie unequal loads)."""
    load = row[at][0]
    first = at if at == 0 or row[at - 1][0] != load else bisect.bisect_left(row, (load, -1))  # a run of one: no search
    cell = row[first][1]
    if step < 0:
        while first > 0 and (row[first - 1][0] + cost) - top == best:
            first = bisect.bisect_left(row, (row[first - 1][0], -1))
            cell = min(cell, row[first][1])
        return cell
    end = at + 1 if at + 1 == len(row) or row[at + 1][0] != load else bisect.bisect_right(row, (load, math.inf))
    while end < len(row) and (row[end][0] + cost) - top == best:
        cell = min(cell, row[end][1])
        end = bisect.bisect_right(row, (row[end][0], math.inf))
    return cell


def first_above(row: list, hi: int, top: float, add: float, floor: float) -> int:
    """The first position below `hi` from which every pair of `row` has (load + add) - top > `floor` in floats (it
    grows with the load): `floor` 0, the end of the fits of an item of cost `add`; -`add`, those taking no second."""
    at = bisect.bisect_right(row, (floor + top - add, math.inf), 0, hi)
    while at > 0 and (row[at - 1][0] + add) - top > floor:  # float rounding: a run of one load at a time
        at = bisect.bisect_left(row, (row[at - 1][0], -1), 0, at)
    while at < hi and (row[at][0] + add) - top <= floor:
        at = bisect.bisect_right(row, (row[at][0], math.inf), at, hi)
    return at


def best_of(row: list, fit: int, need: int, top: float, add: float) -> tuple[list, list | None]:
    """The `need` best pairs of row[:fit] by (excess desc, cell asc) and the spans they fill, highest first (None:
    a run of equal excess straddling the cut has unequal loads, by float rounding; its lowest cells are taken)."""
    if fit <= need:
        return row[:fit], [(0, fit)]
    cut = fit - need
    excess = (row[cut][0] + add) - top
    if (row[cut - 1][0] + add) - top != excess:
        return row[cut:fit], [(cut, fit)]
    high = first_above(row, fit, top, add, excess)
    low = bisect.bisect_left(row, (row[cut - 1][0], -1), 0, cut)
    while low > 0 and (row[low - 1][0] + add) - top == excess:  # rounding: equal excess of unequal loads
        low = bisect.bisect_left(row, (row[low - 1][0], -1), 0, low)
    if row[low][0] == row[high - 1][0]:  # one load: its lowest cells first
        return row[high:fit] + row[low:low + high - cut], [(high, fit), (low, low + high - cut)]
    return row[high:fit] + sorted(row[low:high], key=lambda pair: pair[1])[:high - cut], None


def gathered(rows: list, level: list, fits: list, needs: list, add: float) -> tuple[list, list]:
    """The `needs[m]` best of row m's fits (`best_of`) as (excess, -cell, load), best first; (m, pairs, spans)."""
    taken, parts = [], []
    for m, need in enumerate(needs):
        if need > 0:
            pairs, spans = best_of(rows[m], fits[m], need, level[m], add)
            parts.append((m, pairs, spans))
            taken += [((load + add) - level[m], -cell, load) for load, cell in pairs]
    taken.sort(reverse=True)
    return taken, parts


def cut(row: list, pairs: list, spans: list | None, taken: set | None) -> list:
    """`pairs` of `row` (filling `spans`, or where they are), those of `taken` cells where given, out of it."""
    if taken is not None:
        kept = [pair for pair in pairs if pair[1] in taken]
        pairs, spans = kept, spans if len(kept) == len(pairs) else None
    if spans is None:
        for pair in pairs:
            del row[bisect.bisect_left(row, pair)]
    else:
        for lo, hi in spans:
            del row[lo:hi]
    return pairs

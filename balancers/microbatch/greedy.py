"""Joint greedy over the cells (rank, micro-batch), then move/swap local search and regrouping.

minimise Σ_m max_r load(r, m) s.t. tokens(r, m) <= T, for a given M (see `microbatch`):

    cells = M × D empty cells; level[m] = max_r load(r, m)
    for i in items by cost, largest first (ties by index):
        among the cells with room for i, take the one whose micro-batch level rises least
        (ties: the cell i fills closest to its level, then the lowest cell index)
    repeat while it helps (a work budget counts the operations):
        regroup: sort the M·D cells by load and cut into micro-batches of D (for fixed
            cells, the grouping that minimises the sum of group maxima)
        local search: for the most loaded cell of each micro-batch, the move of one of its
            items, or its swap with an item of another cell, that lowers Σ_m level most
Where lengths do not grow along the order (costs rising with the lengths: every cost model's) an item's cell is
found in O(M log D): per micro-batch the cells with room for it as sorted (load, cell) pairs (the excess over the
level rises with the load: the best fit below the level is a binary search, the least rise the least load), cells
without room waiting in a max-room heap until the lengths fit them (`_sorted_greedy`; padded, the pairs hold each
cell's load with one more item, `_sorted_padded_greedy`); else every cell is weighed for every item
(`_scan_greedy`, O(n·M·D): at 2560 × 32, 10.4 CPU s where the search takes 1.1 s, and padded `auto` 21.7 s where
it takes 1.3 s; probe20 P20-15).  Both make the same choices, float for float, ties alike.  One run answers the
other M tried where no empty micro-batch would have won an item (`greedy_cells`: 0.3 s for M free at 2560 × 32).
Original to orchmllm.  Heuristic: `microbatch_exact` proves small instances.
"""

from __future__ import annotations

import bisect
import heapq
import math
from typing import NamedTuple

import numpy as np

from ..kernels.auto import in_given_order
from .plan import MicroBatchProblem, MicroBatchResult
from .search import improve


class Cells:
    """Loads, tokens, counts and (padded) largest cost and length of M·D cells, flat by m·D + r."""

    def __init__(self, problem: MicroBatchProblem, num_microbatches: int):
        self.problem = problem
        self.num_microbatches = num_microbatches
        size = num_microbatches * problem.num_ranks
        self.loads = np.zeros(size)
        self.tokens = np.zeros(size, dtype=np.int64)
        self.counts = np.zeros(size, dtype=np.int64)
        self.top_cost = np.zeros(size)
        self.top_length = np.zeros(size, dtype=np.int64)

    def offer(self, cost: float, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(load, tokens) of every cell if the item were added to it."""
        if self.problem.padded:
            grown = self.counts + 1
            return grown * np.maximum(self.top_cost, cost), grown * np.maximum(self.top_length, length)
        return self.loads + cost, self.tokens + length

    def add(self, cell: int, cost: float, length: int) -> None:
        self.counts[cell] += 1
        self.top_cost[cell] = max(self.top_cost[cell], cost)
        self.top_length[cell] = max(self.top_length[cell], length)
        if self.problem.padded:
            self.loads[cell] = self.counts[cell] * self.top_cost[cell]
            self.tokens[cell] = self.counts[cell] * self.top_length[cell]
        else:
            self.loads[cell] += cost
            self.tokens[cell] += length


class _Run(NamedTuple):
    """A run of the joint greedy, kept on the problem (`packings`) for the next M: its cells answer every M from
    the micro-batches it used up to its own, and beyond while no empty micro-batch would have won an item."""

    lengths: np.ndarray  # the items it placed (the arrays themselves)
    item_costs: np.ndarray
    used: int  # micro-batches holding an item
    num_microbatches: int
    fresh_won: bool  # some item would have taken a cell of an empty micro-batch at level 0 over the cell it took
    cell_of: np.ndarray

    def answers(self, problem: MicroBatchProblem, num_microbatches: int) -> bool:
        return (self.lengths is problem.lengths and self.item_costs is problem.item_costs
                and self.used <= num_microbatches and (num_microbatches <= self.num_microbatches or not self.fresh_won))


def greedy_cells(problem: MicroBatchProblem, num_microbatches: int) -> np.ndarray | None:
    """The joint greedy's cell (m·D + r) per item, or None when some item finds no room: `_sorted_greedy` where it
    applies (lengths not growing along the order: every cost model's; padded, costs not negative), else
    `_scan_greedy`.

    Each item's cell is the least of a total order whose key is the cell's own (rise, distance to the level, cell
    index), so one run answers other M (`_Run`, kept on the problem as `cells.tight_cells`' packing): with fewer
    micro-batches, down to those it used, the cell it took is still a candidate and still the least; with more,
    the extra cells are empty at level 0, and lose to it while no such cell would have won an item (probe20 P20-15:
    `_solve` tries the fewest M and two more; at 2560 × 32 on capped Pareto lengths the runs for the last two are
    the first's)."""
    key = ("greedy", problem.num_ranks, problem.max_tokens_per_microbatch, problem.padded)
    kept = problem.packings.get(key)
    if kept is not None and kept.answers(problem, num_microbatches):
        return kept.cell_of
    order = problem.cost_order
    if _searchable(problem, order):
        found = _sorted_greedy(problem, num_microbatches, order)
    else:
        found = _scan_greedy(problem, num_microbatches, order)
    if found is None:
        return None
    cell_of, fresh_won = found
    cell_of.flags.writeable = False  # shared by the runs it answers
    used = int(cell_of.max(initial=-1)) // problem.num_ranks + 1
    problem.packings[key] = _Run(problem.lengths, problem.item_costs, used, num_microbatches, fresh_won, cell_of)
    return cell_of


def _searchable(problem: MicroBatchProblem, order: np.ndarray) -> bool:
    """Whether lengths do not grow along the cost `order` (and padded costs are non-negative): the sorted search
    finds each item's cell, else every cell is weighed (`_scan_greedy`)."""
    lengths = problem.lengths[order]
    padded_ok = not problem.padded or float(problem.item_costs.min(initial=0.0)) >= 0
    return padded_ok and bool(np.all(lengths[1:] <= lengths[:-1]))


def scans(problem: MicroBatchProblem) -> bool:
    """Whether `greedy_cells` weighs every cell for every item (O(n·M·D)) rather than searching (O(n·M log D))."""
    return not _searchable(problem, problem.cost_order)


def _fresh_wins(excess: float, alone: float) -> bool:
    """Whether a cell of an empty micro-batch at level 0 (excess `alone`: the item's load alone there) would beat
    the cell of excess `excess` that the item took: a lesser rise, or as little and nearer the level (it is the
    higher cell, so it loses ties).  For `alone` > 0, `excess > alone`: the sorted searches test that inline."""
    return excess > max(alone, 0.0) or excess < alone <= 0.0


def _scan_greedy(problem: MicroBatchProblem, num_microbatches: int, order: np.ndarray) -> tuple | None:
    """The joint greedy as written above, every cell weighed for every item (O(n·M·D)), items in `order`:
    (cells, whether an empty micro-batch would have won an item: `_fresh_wins`)."""
    d = problem.num_ranks
    cells = Cells(problem, num_microbatches)
    level = np.zeros(num_microbatches)
    cell_of = np.empty(problem.num_items, dtype=np.int64)
    costs, lengths = problem.item_costs, problem.lengths
    fresh_won = False
    for item in order.tolist():
        cost, length = float(costs[item]), int(lengths[item])
        loads, tokens = cells.offer(cost, length)
        excess = loads - np.repeat(level, d)
        excess[tokens > problem.max_tokens_per_microbatch] = np.inf
        rise = np.maximum(excess, 0.0)
        best = rise.min()
        if best == np.inf:
            return None
        candidates = np.flatnonzero(rise == best)
        cell = int(candidates[np.argmin(np.abs(excess[candidates]))])
        fresh_won = fresh_won or _fresh_wins(float(excess[cell]), max(cost, 0.0) if problem.padded else cost)
        cell_of[item] = cell
        cells.add(cell, cost, length)
        m = cell // d
        level[m] = max(level[m], cells.loads[cell])
    return cell_of, fresh_won


def _tied(row: list, at: int, step: int, cost: float, top: float, best: float) -> int:
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


def _best_fit(rows: list, level: list, add: float, empty: list | None = None,
              cost: float = 0.0) -> tuple[int, float] | None:
    """The greedy's cell for an item (`rows`: per micro-batch the sorted (load, cell) pairs of the cells with room
    for it, each to load + `add` with it; padded: `empty[m]` the micro-batch's first empty cell or -1, to `cost`):
    the largest excess over the level <= 0, else the least; ties to the lowest cell, which is in the first
    micro-batch reaching that excess (cells are numbered micro-batch by micro-batch).  (cell, its excess)."""
    best, where, at = None, -1, -1
    for m, row in enumerate(rows):
        top, fit, value = level[m], 0, None
        if row:
            fit = bisect.bisect_right(row, (top - add, math.inf))
            while fit < len(row) and row[fit][0] + add <= top:  # float rounding: a run of one load at a time
                fit = bisect.bisect_right(row, (row[fit][0], math.inf))
            while fit > 0 and row[fit - 1][0] + add > top:
                fit = bisect.bisect_left(row, (row[fit - 1][0], -1))
            value = (row[fit - 1][0] + add) - top if fit else None
        if empty is not None and empty[m] >= 0 and cost <= top and (value is None or cost - top > value):
            value = cost - top
        if value is not None and (best is None or value > best):
            best, where, at = value, m, fit - 1
    if where < 0:
        for m, row in enumerate(rows):
            value = (row[0][0] + add) - level[m] if row else None
            if empty is not None and empty[m] >= 0 and (value is None or cost - level[m] < value):
                value = cost - level[m]
            if value is not None and (best is None or value < best):
                best, where, at = value, m, 0
        if where < 0:
            return None
        at = 0 if rows[where] and (rows[where][0][0] + add) - level[where] == best else -1
        step = 1
    else:
        step = -1 if at >= 0 and (rows[where][at][0] + add) - level[where] == best else 0
        at = at if step else -1
    cell = _tied(rows[where], at, step, add, level[where], best) if at >= 0 else math.inf
    if empty is not None and empty[where] >= 0 and cost - level[where] == best:
        cell = min(cell, empty[where])
    return int(cell), best


def _sorted_greedy(problem: MicroBatchProblem, num_microbatches: int, order: np.ndarray) -> tuple | None:
    """`greedy_cells`' choices, each in O(M log D): per micro-batch its cells with room for the item as sorted
    (load, cell) pairs, where an item's excess over the level rises with the load, so its best fit below the level
    (the largest load whose excess is <= 0) is a binary search away and its least rise is the first pair; cells
    without room wait in a max-room heap until the lengths (not growing) fit them again (padded:
    `_sorted_padded_greedy`).  Same floats, same ties; returns as `_scan_greedy`."""
    d, cap = problem.num_ranks, problem.max_tokens_per_microbatch
    if problem.num_items and int(problem.lengths[order[0]]) > cap:
        return None  # the first item fits no cell
    if problem.padded:
        return _sorted_padded_greedy(problem, num_microbatches, order)
    rows = [[(0.0, m * d + r) for r in range(d)] for m in range(num_microbatches)]
    loads, tokens, level = [0.0] * (num_microbatches * d), [0] * (num_microbatches * d), [0.0] * num_microbatches
    waiting: list[tuple[int, int]] = []  # (-room, cell)
    chosen = []  # cells in `order`
    fresh_won = False
    for cost, length in zip(problem.item_costs[order].tolist(), problem.lengths[order].tolist()):
        while waiting and -waiting[0][0] >= length:
            cell = heapq.heappop(waiting)[1]
            bisect.insort(rows[cell // d], (loads[cell], cell))
        found = _best_fit(rows, level, cost)
        if found is None:
            return None
        cell, excess = found
        # `_fresh_wins`, inline for positive costs: a call per item costs 9 %
        fresh_won = fresh_won or (excess > cost if cost > 0.0 else _fresh_wins(excess, cost))
        m = cell // d
        row = rows[m]
        del row[bisect.bisect_left(row, (loads[cell], cell))]
        load = loads[cell] = loads[cell] + cost
        tokens[cell] += length
        if load > level[m]:
            level[m] = load
        if cap - tokens[cell] >= length:
            bisect.insort(row, (load, cell))
        else:
            heapq.heappush(waiting, (tokens[cell] - cap, cell))
        chosen.append(cell)
    return in_given_order(np.array(chosen, dtype=np.int64), order), fresh_won  # a list: numpy writes per item cost 3 %


def _sorted_padded_greedy(problem: MicroBatchProblem, num_microbatches: int, order: np.ndarray) -> tuple | None:
    """`_sorted_greedy` for padded cells (cost count · max cost, tokens count · max length).  Costs and lengths do
    not grow along the order, so a cell's first item sets its maxima: with one more item a filled cell costs
    (count + 1) · top cost and holds (count + 1) · top length, whatever the item; the sorted pairs hold that next
    load (a cell that the next count overfills never takes another item), and an empty cell takes the item's cost:
    the micro-batch's first empty cell stands for them all (equal excess, the lowest cell wins)."""
    d, cap = problem.num_ranks, problem.max_tokens_per_microbatch
    rows: list[list] = [[] for _ in range(num_microbatches)]
    empty = [m * d for m in range(num_microbatches)]
    size = num_microbatches * d
    counts, top_cost, top_length, level = [0] * size, [0.0] * size, [0] * size, [0.0] * num_microbatches
    chosen = []  # cells in `order`
    fresh_won = False
    for cost, length in zip(problem.item_costs[order].tolist(), problem.lengths[order].tolist()):
        found = _best_fit(rows, level, 0.0, empty, cost)
        if found is None:
            return None
        cell, excess = found
        # `_fresh_wins`, inline for positive costs: a call per item costs 9 %
        fresh_won = fresh_won or (excess > cost if cost > 0.0 else _fresh_wins(excess, cost))
        m = cell // d
        if counts[cell]:
            del rows[m][bisect.bisect_left(rows[m], ((counts[cell] + 1) * top_cost[cell], cell))]
        else:
            empty[m] = cell + 1 if cell + 1 < (m + 1) * d else -1
            top_cost[cell], top_length[cell] = max(0.0, cost), max(0, length)
        counts[cell] += 1
        load = counts[cell] * top_cost[cell]
        if load > level[m]:
            level[m] = load
        if (counts[cell] + 1) * top_length[cell] <= cap:
            bisect.insort(rows[m], ((counts[cell] + 1) * top_cost[cell], cell))
        chosen.append(cell)
    return in_given_order(np.array(chosen, dtype=np.int64), order), fresh_won


def split(cell_of: np.ndarray, num_ranks: int) -> MicroBatchResult:
    return MicroBatchResult(rank=cell_of % num_ranks, microbatch=cell_of // num_ranks)


def solve(problem: MicroBatchProblem, num_microbatches: int, above: float | None = None) -> MicroBatchResult | None:
    """Joint greedy, then local search and regrouping within the problem's work budget (`above`: as
    `improve`'s)."""
    cell_of = greedy_cells(problem, num_microbatches)
    if cell_of is None:
        return None
    return split(improve(problem, cell_of, num_microbatches, above), problem.num_ranks)

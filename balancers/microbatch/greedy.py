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
Where lengths do not grow along the order (every cost model's) a binary search per micro-batch finds an item's
cell (`_sorted_greedy`, `_sorted_padded_greedy`), and a run of equal items takes its fits, and the least loaded
cells after a rise, in a pass down or up a sorted row (`_Rows.run`, `greedy_sweep`; padded `_take_fits`,
`_take_empties`, and once no filled cell fits, the rises and their fits a run of equal loads at a time:
`greedy_filled.take_runs`); unpadded items to empty cells and to the fullest cell that fits skip the search
(`greedy_direct`); else every cell is weighed for every item (`greedy_scan`, O(n·M·D): at 2560 × 32 10.4 CPU s,
padded `auto` 21.7 s; probe20 P20-15).  Both make the same choices, float for
float.  A run answers other M, or starts the run for more micro-batches (`greedy_cells`).
Original to orchmllm.  Heuristic: `microbatch_exact` proves small instances.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import math
from typing import NamedTuple

import numpy as np

from ..kernels.auto import in_given_order
from .greedy_direct import take_empties, take_tops
from .greedy_filled import take_runs
from .greedy_rows import cut as _cut, first_above as _first_above, gathered as _gathered, tied as _tied
from .greedy_scan import Cells, fresh_wins as _fresh_wins, scan_greedy as _scan_greedy  # noqa: F401 (Cells: the tests')
from .greedy_sweep import CELLS, climb, descend, merge
from .plan import MicroBatchProblem, MicroBatchResult
from .search import improve

EMPTY_RUN = 32  # empty cells a micro-batch holds for `_PaddedRows._take_empties` to weigh the fits once for them
RELEASED = 8  # cells `_Rows.release` frees at once from which it merges them into their rows a row at a time
RUNS_BACKOFF = 64  # items placed one by one after `take_runs` placed fewer (each call reads every micro-batch's row:
# with hundreds of micro-batches a call per item cost 5-60x the plan, review rev46; the plan is the same either way)


class _Run(NamedTuple):
    """A run of the joint greedy, kept on the problem (`packings`) for the next M (`greedy_cells`): its cells, or
    its `snapshot` for a run for more micro-batches."""

    lengths: np.ndarray  # the items it placed (the arrays themselves)
    item_costs: np.ndarray
    used: int  # micro-batches holding an item
    num_microbatches: int
    fresh_won: bool  # some item would have taken a cell of an empty micro-batch at level 0 over the cell it took
    cell_of: np.ndarray | None  # None: an item found no room
    snapshot: object  # the search's state before the first such item (or one without room); None: none, or a scan

    def answers(self, problem: MicroBatchProblem, num_microbatches: int) -> bool:
        return (self.cell_of is not None and self.lengths is problem.lengths and self.item_costs is problem.item_costs
                and self.used <= num_microbatches and (num_microbatches <= self.num_microbatches or not self.fresh_won))

    def start(self, problem: MicroBatchProblem, num_microbatches: int):
        """The state a run for more micro-batches starts from (the extra ones, empty, lose every item before it)."""
        same = self.lengths is problem.lengths and self.item_costs is problem.item_costs
        return self.snapshot if same and num_microbatches > self.num_microbatches else None


def greedy_cells(problem: MicroBatchProblem, num_microbatches: int) -> np.ndarray | None:
    """The joint greedy's cell (m·D + r) per item, or None when some item finds no room: `_sorted_greedy` where it
    applies (lengths not growing along the order; padded, costs not negative), else `_scan_greedy`.

    Each item's cell is the least of a total order keyed on the cell's own (rise, distance to the level, cell), so
    one run (`_Run`, kept on the problem) answers fewer M, down to those it used (the cell it took is still the
    least), and more while no empty micro-batch (level 0) would have won an item (probe20 P20-15: `_solve` tries
    three M); where one would have, the run for more starts there (`_Run.start`: padded `auto` at 2560 × 32, T 16k,
    M 4, 5 and 6 start at items 29k, 68k and 78k of 82k)."""
    key = ("greedy", problem.num_ranks, problem.max_tokens_per_microbatch, problem.padded)
    kept = problem.packings.get(key)
    if kept is not None and kept.answers(problem, num_microbatches):
        return kept.cell_of
    order = problem.cost_order
    if _searchable(problem, order):
        start = None if kept is None else kept.start(problem, num_microbatches)
        cell_of, fresh_won, snapshot = _sorted_greedy(problem, num_microbatches, order, start)
    else:
        found = _scan_greedy(problem, num_microbatches, order)
        (cell_of, fresh_won), snapshot = found or (None, False), None
    used = 0
    if cell_of is not None:
        cell_of.flags.writeable = False  # shared by the runs it answers
        used = int(cell_of.max(initial=-1)) // problem.num_ranks + 1
    problem.packings[key] = _Run(problem.lengths, problem.item_costs, used, num_microbatches, fresh_won, cell_of,
                                 snapshot)
    return cell_of


def _searchable(problem: MicroBatchProblem, order: np.ndarray) -> bool:
    """Whether lengths do not grow along the cost `order` (padded: costs not negative): `_sorted_greedy` applies."""
    lengths = problem.lengths[order]
    padded_ok = not problem.padded or float(problem.item_costs.min(initial=0.0)) >= 0
    return padded_ok and bool(np.all(lengths[1:] <= lengths[:-1]))


def scans(problem: MicroBatchProblem) -> bool:
    """Whether `greedy_cells` weighs every cell for every item (O(n·M·D)) rather than searching (O(n·M log D))."""
    return not _searchable(problem, problem.cost_order)


def _best_fit(rows: list, level: list, add: float, empty: list | None = None, cost: float = 0.0,
              fitless: bool = False, fits: list | None = None) -> tuple[int, float] | None:
    """The greedy's (cell, excess) for an item (`rows`: per micro-batch the sorted (load, cell) pairs of the cells
    with room, each to load + `add` with it; padded: `empty[m]` its first empty cell or -1, to `cost`): the largest
    excess over the level <= 0, else the least; ties to the lowest cell (in the first micro-batch reaching it).
    `fitless`: known that no cell fits (excess <= 0), the search for the least only; `fits`: known how many of each
    row's pairs fit (`_fits`)."""
    best, where, at = None, -1, -1
    for m, row in enumerate([] if fitless else rows):
        top, fit, value = level[m], 0, None
        if row:
            fit = fits[m] if fits is not None else _first_above(row, len(row), top, add, 0.0) if (
                row[0][0] + add) - top <= 0.0 else 0
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


def _copied(state):
    """A copy of a search state (`_Rows`, `_PaddedRows`) to go on from: its lists copied (rows row by row)."""
    new = copy.copy(state)
    for name, value in vars(state).items():
        if isinstance(value, list):
            setattr(new, name, [row[:] for row in value] if name == "rows" else value[:])
    new.fresh_won, new.snapshot = False, None
    return new


class _Rows:
    """`_sorted_greedy`'s state: per micro-batch its cells with room for the item as sorted (load, cell) pairs (the
    excess rises with the load: the best fit is a binary search away, the least rise the first pair), those without
    in a max-room heap (keys (tokens - T) · CELLS + cell, `greedy_sweep.CELLS`); loads, tokens, levels, the cells
    taken, `fresh_won` and its `snapshot` (`_Run`)."""

    def __init__(self, num_ranks: int, cap: int):
        self.d, self.cap, self.fresh_won, self.snapshot = num_ranks, int(cap), False, None
        self.rows, self.loads, self.tokens, self.level, self.waiting, self.chosen = [], [], [], [], [], []

    def grow(self, num_microbatches: int) -> "_Rows":
        d, added = self.d, num_microbatches - len(self.level)
        self.rows += [list(zip([0.0] * d, range(m * d, m * d + d))) for m in range(len(self.level), num_microbatches)]
        self.loads, self.tokens = self.loads + [0.0] * added * d, self.tokens + [0] * added * d
        self.level = self.level + [0.0] * added
        return self

    def release(self, length: int) -> None:
        """Back to their rows the waiting cells with room for `length` (a row's many at once: `merge`; the last runs
        at 2560 x 32 free hundreds of cells a run)."""
        waiting, loads, d, rows, back, bar = self.waiting, self.loads, self.d, self.rows, [], (1 - length) * CELLS
        while waiting and waiting[0] < bar:
            cell = heapq.heappop(waiting) % CELLS
            back.append((loads[cell], cell))
        if len(back) < RELEASED:
            for pair in back:
                bisect.insort(rows[pair[1] // d], pair)
            return
        by_row = {}
        for pair in back:
            by_row.setdefault(pair[1] // d, []).append(pair)
        for m, pairs in by_row.items():
            pairs.sort()
            merge(rows[m], pairs)

    def place(self, found: tuple[int, float], cost: float, length: int, most: int = 1) -> int:
        """Items into `found`'s cell (`_best_fit`'s (cell, excess)): one, or up to `most` where it fits (cost > 0: it
        stays the best, its excess growing, the others' not, an equal one's cell higher); how many."""
        cell, excess = found
        # `_fresh_wins`, inline for positive costs: a call per item costs 9 %
        if not self.fresh_won and (excess > cost if cost > 0.0 else _fresh_wins(excess, cost)):
            self.fresh_won, self.snapshot = True, _copied(self)
        m, cap = cell // self.d, self.cap
        row, top = self.rows[m], self.level[m]
        del row[bisect.bisect_left(row, (self.loads[cell], cell))]
        load, tokens, taken = self.loads[cell] + cost, self.tokens[cell] + length, 1
        while taken < most and excess <= 0.0 and (load + cost) - top <= 0.0 and cap - tokens >= length:
            load, tokens, taken = load + cost, tokens + length, taken + 1
        self.loads[cell], self.tokens[cell] = load, tokens
        if load > top:
            self.level[m] = load
        if cap - tokens >= length:
            bisect.insort(row, (load, cell))
        else:
            heapq.heappush(self.waiting, (tokens - cap) * CELLS + cell)
        self.chosen += [cell] * taken
        return taken

    def run(self, cost: float, length: int, count: int) -> bool:
        """`count` items of `cost` and `length`; False when one finds no room.  With cost > 0 the best fit stays the
        best while it takes more, so the fits take the items best first in one pass (`descend`), and after a rise
        the next ones climb its micro-batch's least loaded cells (`climb`); the rest one `_best_fit` an item."""
        rows, level, positive = self.rows, self.level, cost > 0.0
        fits = _fits(rows, level, cost) if positive and count > 1 else None  # one item: `_best_fit` finds them
        while count:
            if fits is not None and count > 1 and any(fits):
                placed = descend(self, fits, cost, length, count)
                count -= placed
                if placed:
                    fits = _fits(rows, level, cost) if count else fits
                    continue
            found = _best_fit(rows, level, cost, None, 0.0, fits is not None and not any(fits), fits)
            if found is None:
                return False
            count -= self.place(found, cost, length, count if positive else 1)
            if fits is not None and count:
                m = found[0] // self.d
                if found[1] > 0.0:  # a rise: the next ones to m's least loaded cells while they beat all
                    count -= climb(self, m, cost, length, count)
                fits[m] = _first_above(rows[m], len(rows[m]), level[m], cost, 0.0)
        return True


def _fits(rows: list, level: list, cost: float) -> list:
    """Per micro-batch how many of its row's pairs fit an item of `cost` (excess <= 0): the least load fits, or none
    does."""
    return [_first_above(row, len(row), top, cost, 0.0) if row and (row[0][0] + cost) - top <= 0.0 else 0
            for row, top in zip(rows, level)]


def _sorted_greedy(problem: MicroBatchProblem, num_microbatches: int, order: np.ndarray,
                   start: tuple | None = None) -> tuple:
    """`greedy_cells`' choices in O(M log D) an item (`_Rows`; padded: `_sorted_padded_greedy`): (cells, or None
    where an item finds no room; `_fresh_wins` for some item; the state before the first such) from `start` (a
    snapshot of a run for fewer micro-batches) or empty cells."""
    d, cap = problem.num_ranks, problem.max_tokens_per_microbatch
    if problem.num_items and int(problem.lengths[order[0]]) > cap:
        return None, False, None  # the first item fits no cell
    if problem.padded:
        return _sorted_padded_greedy(problem, num_microbatches, order, start)
    state = (_Rows(d, cap) if start is None else _copied(start)).grow(num_microbatches)
    costs, lengths = problem.item_costs[order], problem.lengths[order]
    done = len(state.chosen)
    ends = np.flatnonzero((costs[done + 1:] != costs[done:-1]) | (lengths[done + 1:] != lengths[done:-1])) + done + 1
    firsts = ([done] if done < problem.num_items else []) + ends.tolist()  # where each run of equal items starts
    bounds, cost_array, length_array = np.array(firsts + [problem.num_items]), costs[firsts], lengths[firsts]
    waiting, items, run_costs, run_lengths = state.waiting, bounds.tolist(), cost_array.tolist(), length_array.tolist()
    at, empty = 0, True  # empty: the last run's last item took an empty cell (its load its cost), or none yet
    while at < len(firsts):
        cost, length = run_costs[at], run_lengths[at]
        if waiting and waiting[0] < (1 - length) * CELLS:  # a waiting cell has room for it
            state.release(length)
        taken = take_empties(state, cost_array, length_array, bounds, at) if empty and cost > 0.0 else 0
        if taken:  # runs to one micro-batch's empty cells, many at once
            at, empty = at + taken, False
            continue
        count = items[at + 1] - items[at]
        count -= take_tops(state, cost, length, count) if cost > 0.0 else 0
        if count and not state.run(cost, length, count):
            return None, state.fresh_won, state.snapshot if state.fresh_won else state  # the state it failed in
        empty, at = state.loads[state.chosen[-1]] == cost, at + 1
    cells = in_given_order(_cells(state.chosen), order)  # a list: numpy writes per item cost 3 %
    return cells, state.fresh_won, state.snapshot


class _PaddedRows:
    """`_sorted_padded_greedy`'s state: per micro-batch the sorted (load with one more item, cell) pairs of its cells
    with room for one more, its first empty cell (-1: none); counts, top cost and length, levels; as `_Rows`'."""

    def __init__(self, num_ranks: int, cap: int):
        self.d, self.cap, self.chosen, self.fresh_won, self.snapshot = num_ranks, cap, [], False, None
        self.rows, self.empty, self.counts, self.top_cost, self.top_length, self.level = [], [], [], [], [], []

    def grow(self, num_microbatches: int) -> "_PaddedRows":
        d, added = self.d, num_microbatches - len(self.level)
        self.rows += [[] for _ in range(added)]
        self.empty += [m * d for m in range(len(self.level), num_microbatches)]
        self.counts, self.top_cost = self.counts + [0] * added * d, self.top_cost + [0.0] * added * d
        self.top_length, self.level = self.top_length + [0] * added * d, self.level + [0.0] * added
        return self

    def run(self, costs: np.ndarray, lengths: np.ndarray, positive: int) -> bool:
        """The items (the first `positive` of cost > 0) in turn; False when one finds no room.  A filled cell's load
        with one more item is its own, whatever the item, so while every empty cell's level is below the item's cost
        (an empty cell is a rise, a fit beats it) the fits take the items a sort at a time (`_take_fits`); else a
        micro-batch's empty cells may take a run (`_take_empties`).  Once no cell fits, only a rise's own micro-batch
        can make one fit: the rises skip the search for fits (`fits_gone`).  Once no cell is empty, the room left is
        known (`_short`): a run that will find none stops once it has its snapshot, all that it answers (`_Run`)."""
        d, cap, rows, empty, level, chosen = self.d, self.cap, self.rows, self.empty, self.level, self.chosen
        counts, top_cost, top_length = self.counts, self.top_cost, self.top_length
        cost_array, length_array, costs = costs, lengths, costs.tolist()  # the lengths read item by item are few
        at, below, fits_gone, opened, runs, short = 0, -cost_array[:positive], False, None, True, None
        stalled, retry = -1, 0  # where `take_runs` last stopped, and the item before which it is not tried again
        while at < len(costs):
            if at < positive:
                if opened is None:  # the levels of the micro-batches with an empty cell, highest last (None: to find)
                    opened = sorted([level[m] for m, cell in enumerate(empty) if cell >= 0]) or [-math.inf]
                    if short is None and opened[0] == -math.inf and self.fresh_won:  # no cell empty: room known
                        short = self._short(len(costs) - at)
                if short:  # it will find no room, and its snapshot is taken: no need to get there
                    return False
                if fits_gone and at >= retry and at != stalled and costs[at] > opened[-1]:  # none fits, empty cells
                    stalled = take_runs(self, costs, at, positive)  # rises: the runs
                    retry = stalled + RUNS_BACKOFF if stalled - at < RUNS_BACKOFF else 0
                    opened, runs, at = (None, True, stalled) if stalled > at else (opened, runs, at)
                    continue
                left = int(np.searchsorted(below[at:], -opened[-1]))  # the items of cost above them all
                placed = self._take_fits(left) if left > 0 and not fits_gone else 0
                fits_gone = fits_gone or 0 < left > placed  # fewer: no fit is left
                if not placed and left <= 0 and runs:  # runs: a run of empty cells may pay (till a rise)
                    placed = self._take_empties(cost_array, length_array, at, positive, opened)
                    opened, fits_gone, runs = None if placed else opened, fits_gone and not placed, placed >= EMPTY_RUN
                if placed:
                    at += placed
                    continue
            cost, length = costs[at], int(length_array[at])
            found = _best_fit(rows, level, 0.0, empty, cost, fits_gone and at < positive and left > 0)
            if found is None:
                return False
            cell, excess = found
            if not self.fresh_won and (excess > cost if cost > 0.0 else _fresh_wins(excess, cost)):
                self.fresh_won, self.snapshot = True, _copied(self)
                short = self._short(len(costs) - at) if max(empty) < 0 else None
            m = cell // d
            if counts[cell]:
                del rows[m][bisect.bisect_left(rows[m], ((counts[cell] + 1) * top_cost[cell], cell))]
            else:
                empty[m] = cell + 1 if cell + 1 < (m + 1) * d else -1
                top_cost[cell], top_length[cell] = max(0.0, cost), max(0, length)
                opened = None if empty[m] < 0 else opened
            counts[cell] += 1
            load = counts[cell] * top_cost[cell]
            if load > level[m]:
                level[m], opened, runs = load, None, True
            if (counts[cell] + 1) * top_length[cell] <= cap:
                bisect.insort(rows[m], ((counts[cell] + 1) * top_cost[cell], cell))
            fits_gone = fits_gone and not (rows[m] and rows[m][0][0] <= level[m])  # only micro-batch m changed
            chosen.append(cell)
            at += 1
        return True

    def _short(self, left: int) -> bool:
        """Whether, no cell empty, the cells have room for fewer than `left` more items: each takes items while their
        count × its first (longest) length fits T, whatever the items, so the run will find no room for one."""
        size = len(self.counts)
        lengths, counts = (np.fromiter(values, dtype=np.int64, count=size) for values in (self.top_length, self.counts))
        return bool(lengths.all()) and int((self.cap // lengths - counts).sum()) < left

    def _take_empties(self, costs: np.ndarray, lengths: np.ndarray, at: int, stop: int, opened: list) -> int:
        """Items `at`.. (before `stop`) to the empty cells of the one micro-batch of the highest level holding them, in
        turn, while that is each item's best fit: its cost at most that level, above every other (an empty cell there
        is a rise), nearer it than the best filled fit; a cell that fits a second item ends it (it beats the next).
        The stop is found in numpy over the items that could take the cells."""
        level, empty, rows, cap, d = self.level, self.empty, self.rows, self.cap, self.d
        top, other = opened[-1], opened[-2] if len(opened) > 1 else -math.inf
        m = [k for k, cell in enumerate(empty) if cell >= 0 and level[k] == top][0]
        if empty[m] + EMPTY_RUN > (m + 1) * d or not other < costs[at] <= top:
            return 0  # few cells to take: the search is as quick
        fits = [(k, _first_above(row, len(row), level[k], 0.0, 0.0)) for k, row in enumerate(rows)]
        best = max([rows[k][fit - 1][0] - level[k] for k, fit in fits if fit], default=-math.inf)
        first = empty[m]
        cost, length = costs[at:at + min((m + 1) * d - first, stop - at)], lengths[at:at + min((m + 1) * d - first,
                                                                                                stop - at)]
        second = 2 * length <= cap  # those cells fit a second item: where its cost is within the level, it ends
        ends = np.flatnonzero(~((cost > other) & (cost - top > best)) | np.concatenate(([False], (second & (
            2 * cost <= top))[:-1])))
        taken = int(ends[0]) if ends.size else cost.size
        self.counts[first:first + taken] = [1] * taken
        self.chosen.extend(range(first, first + taken))
        self.top_cost[first:first + taken], self.top_length[first:first + taken] = (cost[:taken].tolist(),
                                                                                   length[:taken].tolist())
        empty[m] = first + taken if first + taken < (m + 1) * d else -1
        rows[m] += zip((2 * cost[:taken][second[:taken]]).tolist(), (np.flatnonzero(second[:taken]) + first).tolist())
        rows[m].sort()
        return taken

    def _take_fits(self, left: int) -> int:
        """Up to `left` items to the fits by (excess desc, cell asc), each while it fits (it stays the best: its excess
        grows, the others' stay), as `_best_fit` item by item."""
        rows, level, counts, top_cost, top_length = self.rows, self.level, self.counts, self.top_cost, self.top_length
        fits = [_first_above(row, len(row), level[m], 0.0, 0.0) if row and row[0][0] <= level[m] else 0
                for m, row in enumerate(rows)]
        taken, parts = _gathered(rows, level, fits, [min(fit, left) for fit in fits], 0.0)
        placed, moved, chosen, cap, d = 0, 0, self.chosen, self.cap, self.d
        for _, cell, _ in taken:
            cell = -cell
            top = level[cell // d]
            while True:
                counts[cell] += 1
                chosen.append(cell)
                placed += 1
                if placed == left or (counts[cell] + 1) * top_cost[cell] > top or (counts[cell] + 1) * top_length[
                        cell] > cap:
                    break
            moved += 1
            if placed == left:
                break
        cells = None if moved == len(taken) else {-cell for _, cell, _ in taken[:moved]}
        for m, pairs, spans in parts:
            back = [((counts[cell] + 1) * top_cost[cell], cell) for _, cell in _cut(rows[m], pairs, spans, cells)
                    if (counts[cell] + 1) * top_length[cell] <= cap]
            row, above = rows[m], bisect.bisect_left(rows[m], min(back)) if back else 0
            if len(row) - above < 16 * len(back):  # one merge where the part of the row above them is short
                row[above:] = sorted(back + row[above:])
            else:
                for pair in back:
                    bisect.insort(row, pair)
        return placed


def _sorted_padded_greedy(problem: MicroBatchProblem, num_microbatches: int, order: np.ndarray,
                          start: _PaddedRows | None = None) -> tuple:
    """`_sorted_greedy` for padded cells (cost count · max cost, tokens count · max length): a cell's first item sets
    its maxima (they do not grow along the order), so the sorted pairs hold a filled cell's load with one more item,
    whatever the item, and the micro-batch's first empty cell stands for all its empty ones (the lowest wins)."""
    state = (_PaddedRows(problem.num_ranks, problem.max_tokens_per_microbatch) if start is None
             else _copied(start)).grow(num_microbatches)
    done = len(state.chosen)
    costs = problem.item_costs[order[done:]]
    if not state.run(costs, problem.lengths[order[done:]], int(np.count_nonzero(costs > 0.0))):
        return None, state.fresh_won, state.snapshot if state.fresh_won else state
    return in_given_order(_cells(state.chosen), order), state.fresh_won, state.snapshot


def _cells(chosen: list) -> np.ndarray:
    """The cells taken, in the order taken, as int64 (`np.fromiter`: ~0.8x `np.array`'s time on a list of ints)."""
    return np.fromiter(chosen, dtype=np.int64, count=len(chosen))


def split(cell_of: np.ndarray, num_ranks: int) -> MicroBatchResult:
    microbatch, rank = np.divmod(cell_of, num_ranks)
    return MicroBatchResult(rank=rank, microbatch=microbatch)


def solve(problem: MicroBatchProblem, num_microbatches: int, above: float | None = None) -> MicroBatchResult | None:
    """Joint greedy, then local search and regrouping within the problem's work budget (`above`: `improve`'s)."""
    cell_of = greedy_cells(problem, num_microbatches)
    if cell_of is None:
        return None
    return split(improve(problem, cell_of, num_microbatches, above), problem.num_ranks)

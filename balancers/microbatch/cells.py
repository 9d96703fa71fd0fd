"""All M·D cells balanced as one P||Cmax, then regrouped into micro-batches and searched.

minimise Σ_m max_r load(r, m) s.t. tokens(r, m) <= T, for a given M (see `microbatch`):

    cells = lpt(items, M·D ranks, cap T)     # every cell near Σ c / (M·D), largest first
    (every cell starting at L_0 - L_m, L the water-filling levels of the micro-batches,
        each at least its largest item, so the largest items share one level)
    (LPT finds no room under T: cells = best-fit decreasing on the tokens, the densest
        packing, from which the search rebalances the costs)
    regroup: sort the cells by load, cut into micro-batches of D
    local search (`microbatch_search.improve`) within the work budget

If every cell of a micro-batch sat at the same load, the step would cost Σ c / D, the
bound; LPT's rounds (numpy, `lpt.solve`) get every cell within about one small item of
the mean in O(n log n), and regrouping puts the few cells a large item lifts above the
mean into the same micro-batch, so they cost one maximum instead of one each.  The fast
kernel for large instances (2560 ranks × 32 samples in tens of milliseconds).  Original
to orchmllm; LPT is Graham's (1969).
"""

from __future__ import annotations

import bisect

import numpy as np

from ..kernels import lpt
from ..orders import sealed
from ..problem import InfeasibleError, sorted_order
from .greedy import solve as greedy_solve, split
from .plan import MicroBatchProblem, MicroBatchResult, balancing_problem, cells_problem
from .search import improve


def levels(problem: MicroBatchProblem, num_microbatches: int) -> np.ndarray:
    """Target load of each micro-batch's cells, most loaded first: water-filling of Σ c over
    the micro-batches, each at least the largest item it must hold (the (j·D)-th largest)."""
    d = problem.num_ranks
    costs = problem.sorted_costs
    remaining = float(costs.sum())
    targets = np.zeros(num_microbatches)
    for m in range(num_microbatches):
        mean = max(remaining, 0.0) / ((num_microbatches - m) * d)
        top = float(costs[m * d]) if m * d < costs.size else 0.0
        targets[m] = max(mean, top)
        remaining -= d * targets[m]
    return np.maximum.accumulate(targets[::-1])[::-1]  # never below a later micro-batch's


def lpt_cells(problem: MicroBatchProblem, num_microbatches: int, offsets: np.ndarray | None = None,
              base: float | None = None):
    """LPT's cell (m·D + r) per unpadded item over all M·D cells under the budget, or None without room.

    With `offsets` (per micro-batch, >= 0) the cells start at those loads: one pinned
    placeholder per cell, all larger than every item (so LPT's first round places one
    each), ahead of the items, dropped afterwards; cell k·D + r holds the k-th micro-batch's
    by (-placeholder, index).  A placeholder costs `base` + its offset (default base 2 Σ c + 1;
    one above every item in the costs' units keeps LPT on integer keys, `lpt`).
    """
    d = problem.num_ranks
    size = num_microbatches * d
    if offsets is None:
        cells, pinned = cells_problem(problem, size), 0
    else:
        base = 2.0 * float(problem.item_costs.sum()) + 1.0 if base is None else base
        placeholder = base + offsets  # one per micro-batch, for each of its D cells
        # Their order as `sorted_order` gives it (largest first, ties by index): the micro-batches
        # by (-placeholder, m), each one's cells in index order; ahead of every item.
        by_placeholder = np.lexsort((np.arange(num_microbatches), -placeholder))
        order = np.concatenate(((by_placeholder[:, None] * d + np.arange(d)).ravel(), size + problem.cost_order))
        cells = balancing_problem(np.concatenate((np.zeros(size, dtype=np.int64), problem.lengths)),
                                  np.concatenate((np.repeat(placeholder, d), problem.item_costs)), size,
                                  problem.max_tokens_per_microbatch, order,
                                  np.concatenate((np.repeat(placeholder[by_placeholder], d), problem.sorted_costs)))
        pinned = size
    try:
        return lpt.solve(cells, quick_refusal=True).assignment[pinned:]
    except InfeasibleError:
        return None


def tight_cells(problem: MicroBatchProblem, num_microbatches: int) -> np.ndarray | None:
    """Best-fit decreasing on the tokens over the M·D cells (cell m·D + r per item), or None
    when even that leaves an item without room: every item, longest first (ties by index),
    goes to the cell with the least room that still takes it (ties by cell).

    Best fit takes an untouched cell (room T, the lowest first) only where no other has room,
    so with more cells it makes the same choices: one packing (`best_fit`, kept on the problem
    for the next M) answers every M, the cells it opens deciding which M it fits in.

    >>> from orchmllm.balancers.microbatch.api import make_microbatch_problem
    >>> problem = make_microbatch_problem([6, 5, 4, 3, 2], 1, max_tokens_per_microbatch=10)
    >>> tight_cells(problem, 2).tolist(), tight_cells(problem, 1)
    ([0, 1, 0, 1, 1], None)
    """
    budget = problem.max_tokens_per_microbatch
    kept = problem.packings.get(budget)
    if kept is None or kept[0] is not problem.lengths:
        kept = problem.packings[budget] = (problem.lengths, *best_fit(problem.lengths, problem.length_order, budget))
    _, cell_of, opened = kept
    return cell_of if opened <= num_microbatches * problem.num_ranks else None


def best_fit(lengths: np.ndarray, order: np.ndarray, cap: int) -> tuple[np.ndarray, int]:
    """(cell per item, cells opened) of best-fit decreasing into as many cells of room `cap` as it
    opens (each item at most `cap`; `order`: longest first, ties by index).

    Items longer than cap / 2 each open a cell, in turn (no room left beside one takes another);
    those longer than cap / 3 are matched to rooms at once (`_middle`).  After them, a run of k
    items of one length l is placed at once: the cells with room >= l, by (room, cell), each take
    room // l items before the next, since a cell's room left stays the least >= l (none lay
    between); so it costs one step per room it uses up, not one per item (`reference.best_fit_cells`
    is the item-by-item loop, for the tests).
    """
    ordered = lengths[order]
    big = int(np.count_nonzero(ordered > cap // 2))  # 2 l > cap
    middle = int(np.count_nonzero(ordered > cap // 3)) - big  # 3 l > cap
    first, rooms = _middle(ordered[big:big + middle], cap - ordered[:big], cap)
    held, cells_of, unsorted = _opened(rooms)
    taken, times = [], []  # after those: cells in turn, and how many items in `order` each takes
    opened, tail = rooms.size, ordered[big + middle:]
    bounds = np.flatnonzero(np.diff(tail, prepend=-1, append=-1))  # where runs start, and their end
    for length, count in zip(tail[bounds[:-1]].tolist(), np.diff(bounds).tolist()):
        if length == 0:  # to the least room (unchanged), the lowest cell of it; an untouched cell if none
            cells = cells_of[held[0]] if held else None
            if cells is not None and held[0] in unsorted:
                cells.sort(reverse=True)
                unsorted.discard(held[0])
            times.append(count)
            taken.append(cells[-1] if cells else 0)
            opened = max(opened, 1)
            continue
        while count:
            where = bisect.bisect_left(held, length)
            if where == len(held):  # untouched cells, the lowest first
                per = cap // length
                full = count // per
                if full:
                    taken += range(opened, opened + full)
                    times += [per] * full
                    _put(held, cells_of, unsorted, cap - per * length, list(range(opened + full - 1, opened - 1, -1)))
                    opened += full
                    count -= full * per
                if count:
                    taken.append(opened)
                    times.append(count)
                    _put(held, cells_of, unsorted, cap - count * length, [opened])
                    opened += 1
                    count = 0
                continue
            room = held[where]
            cells = cells_of[room]
            if room in unsorted:
                cells.sort(reverse=True)
                unsorted.discard(room)
            per = room // length
            full = min(len(cells), count // per)
            if full:
                filled = cells[-full:]
                del cells[-full:]
                taken += filled[::-1]
                times += [per] * full
                count -= full * per
                _put(held, cells_of, unsorted, room - per * length, filled)
            if count and cells:
                cell = cells.pop()
                taken.append(cell)
                times.append(count)
                _put(held, cells_of, unsorted, room - count * length, [cell])
                count = 0
            if not cells:
                del cells_of[room]
                del held[bisect.bisect_left(held, room)]
    cell_of = np.empty(lengths.size, dtype=np.int64)
    cell_of[order] = np.concatenate((np.arange(big), first, np.repeat(np.array(taken, dtype=np.int64), times)))
    return sealed(cell_of), opened


def _middle(lengths: np.ndarray, rooms: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Best fit of items cap/3 < l <= cap/2 (`lengths`, longest first) once the longer ones left cells
    0, 1, ... with `rooms` (ascending): (cell per item, room left in every cell opened by then).

    A cell takes one such item (what it leaves is below cap / 6), an untouched cell two (below cap / 3
    after them), so the rooms form a stack: rooms >= l come in as l falls (the least on top, ties: the
    lowest cell), each item takes the top, and one that finds none opens a cell, whose room left is the
    stack's one entry.  Counting +1 per room in, -1 per item, the walk's new lows at odd depths are the
    items that open a cell (a new low at an even depth empties such a cell); with those counted +1, every
    other item closes the last room opened at its level (parentheses matched by depth).
    """
    entering = np.arange(rooms.size - 1, int(np.searchsorted(rooms, lengths[-1])) - 1, -1) if lengths.size else \
        np.arange(0)  # cells by (room, cell) descending: the order they come in
    events = entering.size + lengths.size
    item_at = np.arange(lengths.size) + np.searchsorted(-rooms[entering], -lengths, side="right")
    step = np.ones(events, dtype=np.int64)
    step[item_at] = -1
    walk = np.cumsum(step)
    low = np.minimum.accumulate(np.minimum(walk, 0))
    opens = (walk[item_at] < np.concatenate(([0], low[:-1]))[item_at]) & (walk[item_at] % 2 == 1)
    depth = walk + (1 - low) // 2 * 2  # the stack's size after each event
    closing = item_at[~opens]
    level = depth.copy()
    level[closing] += 1  # an item closes the level it leaves
    by_level = np.argsort(level * events + np.arange(events))
    position = np.empty(events, dtype=np.int64)
    position[by_level] = np.arange(events)
    cell_at = np.full(events, -1, dtype=np.int64)
    cell_at[np.setdiff1d(np.arange(events), item_at, assume_unique=True)] = entering
    cell_at[item_at[opens]] = rooms.size + np.arange(int(np.count_nonzero(opens)))
    cell_at[closing] = cell_at[by_level[position[closing] - 1]]
    cells = cell_at[item_at]
    left = np.concatenate((rooms, np.full(int(np.count_nonzero(opens)), cap, dtype=np.int64)))
    np.subtract.at(left, cells, lengths)
    return cells, left


def _opened(rooms: np.ndarray) -> tuple[list, dict, set]:
    """The rooms held (ascending), their cells (descending, the least popped first) and the rooms
    whose cells need sorting, of cells 0, 1, ... left with `rooms`."""
    cells = np.lexsort((np.arange(rooms.size), rooms))[::-1]  # by (room, cell) descending
    cells_of = {}
    for room, cell in zip(rooms[cells].tolist(), cells.tolist()):
        cells_of.setdefault(room, []).append(cell)
    return sorted(cells_of), cells_of, set()


def _put(held: list, cells_of: dict, unsorted: set, room: int, cells: list) -> None:
    """Cells `cells` (descending) now at `room`: a new room held, or more cells of one (to sort)."""
    known = cells_of.get(room)
    if known is None:
        cells_of[room] = cells
        bisect.insort(held, room)
    else:
        known.extend(cells)
        unsorted.add(room)


def solve(problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
    """LPT over all cells from the water-filling levels (plain LPT when they are flat; the
    tight token packing when LPT finds no room), regrouped and improved within the work
    budget.  Padded cells (count · max c, not a sum) are the joint greedy's
    (`microbatch_greedy.solve`)."""
    if problem.padded:
        return greedy_solve(problem, num_microbatches)
    targets = levels(problem, num_microbatches)
    offsets = targets[0] - targets if targets[0] > targets[-1] else None
    start = lpt_cells(problem, num_microbatches, offsets)
    if start is None and offsets is not None:
        start = lpt_cells(problem, num_microbatches)
    if start is None:
        start = tight_cells(problem, num_microbatches)
    if start is None:
        return None
    return split(improve(problem, start, num_microbatches), problem.num_ranks)

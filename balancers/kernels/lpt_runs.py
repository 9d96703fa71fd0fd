"""LPT's runs of equal items placed at once: each of `count` items of one cost c > 0 goes to the least-loaded rank
(ties by rank) that may still take one, as the heap loop places them item by item.

A rank of load l takes such items at the loads l, l + c, (l + c) + c, ... (its slots: float sums in that order), so
the loop's choices are the `count` least slots by (load, rank), merged over the ranks, each rank's a prefix; a rank
may take at most its limit (`lpt_capped`: the items of one length its room holds).  The slots below the water level
of the run's cost over the sorted loads are made by one sequential sum (numpy's accumulate adds in order, as the
loop does) per block of ranks of similar counts, and the choice is checked: the last slot taken lies at or below
every slot not made (at it only on its own rank); where not (float rounding, limits reached), the level rises.

O((count + m) log m) numpy work over the m least-loaded ranks, in place of `count` heap steps or of the rounds of a
run whose loads spread over more than c (a round stops at the first rank above the least load + c): power-of-two
lengths at D = 2560 x 32 (18 costs, runs of thousands of items).
"""

from __future__ import annotations

import numpy as np

# LPT places a run at once where it fills 1/8 of a round (of D items or those left) or more and a round would place
# under 1/8 of it (or where a heap round would hold it alone); rounds placing more are cheaper (D = 2560 x 32, T 64k,
# M 4, power-of-two lengths: rounds of 1-5k of ~4.8k-item runs 8.8 ms, every run at once 20 ms)
RUN_SHARE = 8
_TRIES = 8  # water levels tried before the caller places the run its own way
_LEVELS = 64  # levels raised over the ranks below their limits before trying one (too few: `_merged` says so)
_ROWS_ADDED = 16  # a grid of slots up to this tall is summed a row at a time (accumulate along rows is slower)


class EqualRuns:
    """Runs of equal items among `costs` in placement order (and `lengths`, where given) over `num_ranks` ranks: those
    LPT places at once (of a cost > 0, each 1/`RUN_SHARE` of a round or more) and where they start."""

    def __init__(self, costs: np.ndarray, num_ranks: int, lengths: np.ndarray | None = None):
        differs = costs[1:] != costs[:-1]
        if lengths is not None:
            differs |= lengths[1:] != lengths[:-1]
        self.size, self.num_ranks, self.costs = costs.size, num_ranks, costs
        starts = np.flatnonzero(np.concatenate(([True], differs)))[:costs.size]  # none without items
        self.ends = np.append(starts[1:], self.size)
        long = (RUN_SHARE * (self.ends - starts) >= np.minimum(self.size - starts, num_ranks)) & (costs[starts] > 0)
        self.long_starts = np.append(starts[long], self.size)

    def end(self, position: int) -> int:
        """Where the run holding `position` ends."""
        return int(self.ends[np.searchsorted(self.ends, position, side="right")])

    def at(self, position: int) -> int:
        """The items from `position` on that its run still holds, where to place them at once; else 0."""
        left = self.end(position) - position
        return left if RUN_SHARE * left >= min(self.size - position, self.num_ranks) and self.costs[position] > 0 else 0

    def next_start(self, position: int) -> int:
        """Where the first run placed at once after `position` starts (the number of items if none does): a heap
        step per item stops there (and where it would place one run alone, that is placed at once)."""
        return int(self.long_starts[np.searchsorted(self.long_starts, position, side="right")])


def place_run(loads: np.ndarray, ranks: np.ndarray, cost: float, count: int, limits: np.ndarray | None = None,
              after: tuple[float, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The heap loop's ranks for `count` items of `cost` (> 0), in item order, and how many each of `ranks` took
    and its load after them (both aligned with `ranks`), or None where the level was not found in `_TRIES`.

    `ranks` are the ranks that may take the run, by (load, rank) ascending with their `loads`: all of them, or at
    least the `count` least, `after` then the (load, rank) of the least one left out.  `limits`: the items each
    may take (>= 1; None: any number); fewer ranks than items come back only where every rank reached its limit.
    """
    relative = loads - loads[0]  # the level's estimate only: the slots are summed from `loads`
    level = _level(relative, count, cost)
    for _ in range(_TRIES):
        slots = _slots(relative, level, cost, count, limits)
        placed = _merged(loads, ranks, cost, count, slots, limits, after)
        if placed is not None:
            return placed
        level += 0.5 * cost  # a slot not made came first (float rounding): make more
    return None


def _level(relative: np.ndarray, count: int, cost: float) -> float:
    """The water level of `count` items of `cost` over ranks of loads `relative` (ascending): their loads up to it
    hold the items' cost."""
    shares = (count * cost + np.cumsum(relative)) / np.arange(1, relative.size + 1)  # the level over the first j
    under = relative < shares
    return float(shares[relative.size - 1 if under.all() else max(int(under.argmin()) - 1, 0)])


def _slots(relative: np.ndarray, level: float, cost: float, count: int, limits: np.ndarray | None) -> np.ndarray:
    """How many slots each rank offers: those below the water `level`, at most its limit; where limits leave fewer
    than `count`, the level over the ranks below their limits, again (each time one rank more at its limit)."""
    for _ in range(_LEVELS):
        with np.errstate(over="ignore"):  # a tiny cost's quotient overflows to inf, then capped at count (probe57 L1)
            slots = np.minimum(np.ceil(np.maximum(level - relative, 0.0) / cost), count)
        if limits is None:
            return slots.astype(np.int64)
        slots = np.minimum(slots, limits).astype(np.int64)
        full = slots == limits
        left = count - int(limits[full].sum())
        if int(slots.sum()) >= count or full.all() or left <= 0:
            break
        level = max(_level(relative[~full], left, cost), level + 0.5 * cost)
    return slots


def _merged(loads: np.ndarray, ranks: np.ndarray, cost: float, count: int, slots: np.ndarray,
            limits: np.ndarray | None, after: tuple[float, int] | None
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """`place_run` from the first `slots` of each rank, or None where the least `count` of them are not the loop's
    (a slot not offered may come first)."""
    used = int(np.count_nonzero(slots))  # the ranks offering slots come first: the rest offer their loads next
    if used < slots.size:
        after = (loads[used], int(ranks[used]))
    grids = _slot_grids(loads[:used], cost, slots[:used])
    values, column, following = [], [], np.empty(used)  # the slots offered; each rank's first slot not offered
    for members, grid in grids:
        made = np.flatnonzero(np.arange(grid.shape[0])[:, None] < slots[members])  # by slot, then by load
        values.append(grid.ravel()[made])
        column.append(members[made % members.size])
        following[members] = grid.ravel()[slots[members] * members.size + np.arange(members.size)]
    values, column = np.concatenate(values), np.concatenate(column)
    chosen = _by_load_and_rank(values, ranks[column])[:count]
    open_ = slice(None) if limits is None else slots[:used] < limits[:used]  # full ranks take no more
    if chosen.size < count and (after is not None or following[open_].size):
        return None
    if chosen.size and not _first(values[chosen[-1]], ranks[column[chosen[-1]]], following[open_], ranks[:used][open_],
                                  after):
        return None
    taken = np.bincount(column[chosen], minlength=slots.size)
    after_run = loads.copy()  # the ranks offering no slot keep theirs
    for members, grid in grids:
        after_run[members] = grid.ravel()[taken[members] * members.size + np.arange(members.size)]
    return ranks[column[chosen]], taken, after_run


def _first(load: float, rank: int, loads: np.ndarray, ranks: np.ndarray, after: tuple[float, int] | None) -> bool:
    """Whether (load, rank) is at most every (loads, ranks) and `after` (where given)."""
    if loads.size:
        least = loads.min()
        if (load, rank) > (least, ranks[loads == least].min()):
            return False
    return after is None or (load, rank) < after


def merged_order(loads: np.ndarray, rest: np.ndarray, moved: np.ndarray) -> np.ndarray:
    """The ranks `rest` (by (load, rank) ascending) with `moved` (in any order) merged in by (load, rank), as one
    sort of all by `loads` would give them: within equal loads, by rank."""
    moved = moved[_by_load_and_rank(loads[moved], moved)]
    rest_loads, moved_loads = loads[rest], loads[moved]
    at = np.searchsorted(rest_loads, moved_loads, side="left")
    tied = np.flatnonzero(at < np.searchsorted(rest_loads, moved_loads, side="right"))
    if tied.size:  # among the rest of equal load (by rank), after those of a lower rank
        distinct = np.concatenate(([0], np.cumsum(rest_loads[1:] != rest_loads[:-1])))
        scale = int(max(rest.max(), moved.max())) + 1
        at[tied] = np.searchsorted(distinct * scale + rest, distinct[at[tied]] * scale + moved[tied])
    return np.insert(rest, at, moved)


def _by_load_and_rank(values: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """The order of slots by (load, rank): stable sorts (timsort) of the loads, which hold a sorted run per slot
    index, then of keys (a slot's place among the distinct loads, its rank), sorted but within equal loads."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    ties = ordered[1:] == ordered[:-1]
    if not ties.any():
        return order
    distinct = np.concatenate(([0], np.cumsum(~ties)))
    return order[np.argsort(distinct * (int(ranks.max()) + 1) + ranks[order], kind="stable")]


def _slot_grids(loads: np.ndarray, cost: float, slots: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Slots 0..slots[k] of each rank k (its load, then each plus `cost` in turn, summed in that order), as grids
    (slot, member) over blocks of ranks: one block, or where a few ranks hold most slots, blocks of similar counts
    (in [2**(b-1), 2**b)), so that no grid is over twice its slots."""
    if not slots.size:
        return []
    height = int(slots.max()) + 1
    if height * slots.size <= 2 * (int(slots.sum()) + slots.size):
        blocks = [np.arange(slots.size)]
    else:
        sizes = np.frexp(slots.astype(np.float64))[1]
        blocks = [np.flatnonzero(sizes == size) for size in np.unique(sizes).tolist()]
    grids = []
    for members in blocks:
        grid = np.empty((int(slots[members].max()) + 1, members.size))
        grid[0] = loads[members]
        if grid.shape[0] <= _ROWS_ADDED:
            for row in range(1, grid.shape[0]):
                np.add(grid[row - 1], cost, out=grid[row])
        else:
            grid[1:] = cost
            np.add.accumulate(grid, axis=0, out=grid)
        grids.append((members, grid))
    return grids

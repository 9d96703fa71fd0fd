"""GPipe's start by heights (`planner`): cells filled to the height each replica's largest item sets.

With uniform stages a GPipe replica of cells x (x = load + o) runs (Σ x + (P - 1)·max x) / P
(`schedules.gpipe_time`), in any order.  Within a step T the cells' loads of a replica whose largest
cell's load is h sum to at most

    cap(h) = S - (P - 1)·h,   S = P·T - (M + P - 1)·o   (and at most M·h: M cells of at most h)

The two meet at h* = S / (M + P - 1): a replica of height h* holds M·h* (its cells flat, the best
shape), and a replica holding an item above h* ("heavy") holds less the heavier that item.  So the
heavy items, largest first, are dealt to replicas of their own in runs (next fit: a replica takes the
next items while they fit cap of its first), each item a cell of its own (a run never holds M items:
its items are above h* and cap(h) < M·h* there), and the light items fill what is left: each run's
room (cap of its first item - its items) in its empty cells, each at the level of the other replicas'
cells (one partial cell; where more, all its empty cells alike up to its height, then its items' cells
raised in order), the other replicas' cells flat at that level, (light cost - the runs' room) / ((D - runs)·M).
T is the least step at which that fits on D replicas (heavy runs + (light cost - the runs' room) / (M·h*)
<= D), tried first at the certified bound (`bounds.step_bound`), then raised (RAISES) and narrowed
(SECANTS, regula falsi).  In plain code:

    S = P*T - (M + P - 1)*o;  hs = S / (M + P - 1);  heavy = [c for c in costs if c > hs]  # descending
    runs: while heavy items: r = next replica; h = its first; take items while their sum <= S - (P - 1)*h
    level = (light cost - Σ rooms) / ((D - runs)·M); a run's empty cells: room // level cells at level, one partial
    light items: LPT over the cells given a level (others none), from loads max(level) - level: each ends near it

Making the empty cells of a run alike (the other replicas' level, not its height) keeps LPT's start loads on a few
values, so its rounds place many items at once (from loads spread over every height it fell to a heap, ~20x
slower).  The light items' LPT is `lpt.greedy_from` (exact integer keys); the start is made only there and where
every cell fits the token budget (else None: the other starts stand).  D = 2560 × 32, M = 16, P = 8 (the default
mix, seeds 7, 11, 23, 41): its step is 1.007-1.011x the bound, ~0.68x the plain cells', where the shaped starts
(`shaped.lpt_shaped`) started 1.5-1.65x above the bound and their search ended at 1.32-1.36x; M = 8 1.015x (their
search 1.046-1.049x), M = 32 at the bound (1.36-1.42x); ~0.25x a plain plan's time.  Where the bound is loose its
step is too (D = 512 x 32, M = 16: 1.12x, and no step below 1.11x fits its runs).
"""

from __future__ import annotations

import numpy as np

from ..kernels.lpt import greedy_from
from ..microbatch.plan import MicroBatchProblem, cell_loads, cell_token_sums
from ..sums import rounding_unit
from .spec import Pipeline

RAISES, SECANTS = 8, 3  # the step tried above the bound: doubled from 1/256 of it, then that bracket narrowed
ROOM_SHARE = 0.5  # of the room the other replicas leave at h*, the share the runs' rooms take too (`_filled`)


def heights_start(problem: MicroBatchProblem, num_microbatches: int, pipeline: Pipeline, bound: float
                  ) -> tuple | None:
    """(replica, slot, their `cell_accounts`) per item of the heights start (module docstring), or None where no
    item is heavy at the bound, no step up to 2x the bound fits, its LPT is not on integer keys or a cell is over
    the budget."""
    m, p, d = num_microbatches, pipeline.stages, problem.num_ranks
    costs = problem.sorted_costs
    if m < 2 or not costs.size or not bound > 0:
        return None
    items = (costs, -costs, np.concatenate(([0.0], np.cumsum(costs))))
    overhead = (m + p - 1) * problem.microbatch_overhead

    def runs_at(step: float) -> tuple:  # (step, its runs, the replicas they need: inf where none fit)
        runs = _runs(items, p * step - overhead, m, p)
        return step, runs, np.inf if runs is None else runs[1]
    low = runs_at(bound)
    if low[1] is None or low[1][0].size == 0:
        return None  # no heavy item at the bound: the best shape (flat) is the other starts'
    high = low if low[2] <= d else None
    for raise_ in range(RAISES if high is None else 0):
        found = runs_at(bound * (1 + 2.0 ** (raise_ - 8)))
        low, high = (low, found) if found[2] <= d else (found, None)
        if high is not None:
            break
    if high is None:
        return None
    for _ in range(SECANTS if high is not low else 0):  # regula falsi, kept within the middle 7/8 of the bracket
        share = (low[2] - d) / (low[2] - high[2]) if np.isfinite(low[2]) else 0.5
        found = runs_at(low[0] + min(max(share, 1 / 16), 15 / 16) * (high[0] - low[0]))
        low, high = (low, found) if found[2] <= d else (found, high)
    return _filled(problem, m, p, high[1])


def _runs(items: tuple, budget: float, m: int, p: int) -> tuple | None:
    """(each run's first item, the replicas needed (fractional), S, the heavy count) of load budget S (module
    docstring; `items`: the costs largest first, negated, and their running sums from 0), or None where S leaves
    the largest item no room."""
    costs, negated, prefix = items
    if budget < p * costs[0]:
        return None
    level = budget / (m + p - 1)  # h*
    heavy = int(np.searchsorted(negated, -level, side="left"))  # the items above h*
    caps = budget - (p - 1) * costs[:heavy]
    after = np.searchsorted(prefix[:heavy + 1], prefix[:heavy] + caps, side="right") - 1
    firsts = _run_firsts(np.maximum(after, np.arange(1, heavy + 1)))  # a run from item i ends before after[i]
    room = float(caps[firsts].sum()) - float(prefix[heavy])
    light = float(prefix[-1] - prefix[heavy])
    return firsts, firsts.size + max(light - room, 0.0) / (m * level), budget, heavy


def _run_firsts(after: np.ndarray) -> np.ndarray:
    """The items that start a run, 0, after[0], after[after[0]], ... below after.size (i < after[i] <= after.size:
    each run ends before after of its first), by doubling: the first 2**k of them and the jump of 2**k runs from every
    item give the next 2**k, so ~log2(runs) gathers, where the walk took one Python step a run (D = 2560 x 32,
    M = 16: ~1360 runs of ~10 300 heavy items, `_runs` 0.66 -> 0.50 ms a call, five a plan).

    >>> _run_firsts(np.array([2, 3, 3, 5, 5])).tolist()
    [0, 2, 3]
    """
    size = after.size
    jump, firsts = np.append(after, size), np.zeros(min(size, 1), dtype=np.int64)  # size: past the last, fixed
    while firsts.size and firsts[-1] < size:
        firsts = np.concatenate([firsts, jump[firsts]])
        jump = jump[jump]
    return firsts[firsts < size]


def _filled(problem: MicroBatchProblem, m: int, p: int, runs: tuple) -> tuple | None:
    """The heights start's (replica, slot, None) of these runs (`_runs`)."""
    firsts, _, budget, heavy = runs
    d, costs, order = problem.num_ranks, problem.sorted_costs, problem.cost_order
    count = firsts.size
    sizes = np.diff(np.append(firsts, heavy))
    if not sizes.size or sizes.max() > m:
        return None  # no heavy item at the step found, or more than cells in a run (only by rounding: module)
    run_of = np.repeat(np.arange(count), sizes)  # heavy item j (largest first) in replica run_of[j]
    slot_of = np.arange(heavy) - np.repeat(firsts, sizes)  # in a cell of its own
    held = np.zeros((count, m))
    held[run_of, slot_of] = costs[:heavy]
    height = costs[firsts]
    room = budget - (p - 1) * height - held.sum(axis=1)
    light = float(costs[heavy:].sum())
    # the runs' rooms take what the other replicas' cells leave at h*, and ROOM_SHARE of what more they could (a light
    # item above a room's level lands there whole, a run at its cap has no margin: D = 512, the long mix, M 8: 1.013x
    # the bound, at it with none; D = 2560 x 32, M 16: 1.007-1.011x, 1.003-1.011x with all, seed 7 with 11, 23, 41)
    level, total = budget / (m + p - 1), float(room.sum())
    needed = min(max(light - (d - count) * m * level, 0.0), total)
    room *= (needed + ROOM_SHARE * (min(total, light) - needed)) / total if total > 0 else 0.0
    if count < d and light > float(room.sum()):
        level = (light - float(room.sum())) / ((d - count) * m)
    # a run's empty cells take its room in cells of that level (one partial), or all alike up to its height, the
    # rest raising its items' cells in order
    empty = m - sizes
    index = np.arange(m)[None, :] - sizes[:, None]  # among the run's empty cells, -1.. on its items'
    full = np.minimum(room // level, empty)
    fill = np.where((index >= 0) & (index < full[:, None]), level,
                    np.where(index == full[:, None], (room - full * level)[:, None], 0.0))
    spread = room > empty * level
    alike = np.minimum(height, room / np.maximum(empty, 1))
    fill[spread] = np.where(index[spread] >= 0, alike[spread, None], 0.0)
    left = np.where(spread, room - empty * alike, 0.0)
    free = np.where(index < 0, height[:, None] - held, 0.0)
    fill += np.clip(left[:, None] - np.cumsum(free, axis=1) + free, 0.0, free)
    fill = np.concatenate([fill, np.full((d - count, m), level)]).T.ravel()  # cell k·D + r
    open_ = np.flatnonzero(fill > 0)  # the others take no light item
    unit = rounding_unit(costs)
    start = np.round((float(fill.max()) - fill[open_]) / unit) * unit
    greedy = greedy_from(costs[heavy:], open_.size, np.arange(costs.size - heavy), start, problem.lengths)
    if greedy is None:
        return None
    cell = np.empty(costs.size, dtype=np.int64)  # k·D + r of each item
    cell[order] = np.concatenate([slot_of * d + run_of, open_[greedy[0]]])
    tokens = cell_token_sums(problem, cell, m * d)
    if tokens.max() > problem.max_tokens_per_microbatch:
        return None
    return cell % d, cell // d, (cell_loads(problem, cell, m * d).reshape(m, d), tokens.reshape(m, d))

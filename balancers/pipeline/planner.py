"""The pipeline-aware cell planner: a micro-batch plan's cells re-cut, reordered and searched
for the schedule's step time (max over replicas of the pipeline time, `schedules`).

    start     the plain plan's cells (`balance_microbatches`, Σ_m max_r load) as planned and (unpadded) the items
              cut afresh into cells of the schedule's best shape by one LPT over all M·D cells
              (`shaped.lpt_shaped`; the replicas that take the items overflowing a cell alone start their other
              cells higher, `_starts`, two such starts where more than D items overflow, the first (1F1B,
              interleaved) or the second (GPipe) not made where its LPT's first choices show it the slower,
              `shaped.first_from_below`, or (1F1B, interleaved) where the D largest are light, `shaped.second_alone`);
              the faster ends the planning when it is within STOP_GAP of τ·X̄ or at the certified bound (the
              search's stop rule: no plan is faster; the largest item's chain meets it at D = 2560, M = 8,
              interleaved), else the plain cells reordered in each replica (`order.mountain`; GPipe, order-free: as
              planned) are a third start, and (padded, where no item moves reshape a cell) the plain cells dealt
              afresh over the replicas and reordered (`order.deal`) a fourth, searched too.  GPipe (uniform stages,
              unpadded): its start by heights (`heights`: the heavy items in runs on replicas of their own, the light
              ones filling what each run's first item leaves) where made is its one shaped start, and the plain cells
              are not searched (D = 2560 x 32, M = 16: 1.007-1.011x the bound, where the old starts' search ended
              1.32-1.36x)
              First (1F1B, interleaved, where the largest item's chain holds the bound), the start on fewer
              micro-batches (`fewer`), returned at once where it meets the bound (D = 2560 x 32, M = 32: 1.274x -> 1x)
    search    `search.CellSearch` from the shaped and from the reordered cells, the faster kept (none after one that
              meets the bound; each stops where its rate cannot reach the fastest step found before it): rounds of
              item moves off many slow replicas at once, then slot swaps and item moves off the slowest replica.  The
              shaped cells are near the best shape on almost every replica (D = 2560 × 32, M = 8: the median replica
              within 1 % of the bound), a few slow ones holding the largest items, which the rounds repair; the
              reordered plain cells are near-tied on every replica at large D (the search stalls at once there) and the
              better start at small D with a few giant items.  A search ending above the fastest step found before it
              is dropped unsummed, and one that must end so is not made (`behind`)
    certify   the step time of the final cells, their costs summed in item order as a fresh account would (a start's
              cells are; the replicas the search moved items between are summed again) and timed by `replica_times`;
              the bound of `bounds.step_bound`, status optimal only when they meet

The plan given is one of the starts, and the searches' cells are kept only when faster than every start, so the
result is never slower than it (the cells planned for M, `microbatch.auto.solve_each`, run in their own order: the
plan `balance_microbatches` makes without `pipeline=`, but for the fewest micro-batches' plan and the joint greedy
that call may keep where their Σ_m max is lower).  Items of cost 0 are left out and dealt after, where their tokens
fit (`free`: they change no cell's cost).  Deterministic: no clock, ties by index.  M is the plain plan's (a free M is
not raised to shrink the bubble); with M free the bound covers every M, so its gap also shows what more
micro-batches could gain.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np

from ..microbatch.plan import MicroBatchProblem, cell_accounts, cell_token_sums
from .behind import behind_after_a_round, lowered_at_most, stalls_at_once
from .fewer import fewer_met
from .free import without_free_items
from .heights import heights_start
from .order import deal, mountain, places
from .profile import best_profile
from .schedules import replica_times, step_rows
from .search import STOP_GAP, SUMS_DRIFT, CellSearch
from .shaped import first_from_below, lpt_shaped, overflowing, pinned_heavy, second_alone
from .spec import Pipeline
from .step import PipelineStep, cell_costs, certified_bound, first_stage_sums, pipeline_step, start_cells

WORK_PER_SECOND = 20_000_000  # schedule operations `time_limit` buys (a budget, never a clock)
DEFAULT_WORK = 20_000_000
PROBE_ROWS = 16  # replicas of a shaped start timed to show it slower than the other (`_start_times`)
STALL_ROWS, PROVEN_FROM = 64, 512  # a start's replicas timed to show its step and its search's stall (`_proving_rows`)
AHEAD_FROM = 4  # micro-batches per stage from which `_behind_for_good`'s rows of the reordered cells join the starts'


def arrange(problem: MicroBatchProblem, rank: np.ndarray, microbatch: np.ndarray, num_microbatches: int,
            pipeline: Pipeline, work: int, first_stage: np.ndarray | None = None, accounts: tuple | None = None
            ) -> tuple:
    """(replica, slot) per item for the pipeline step, the step time of the cells as given, the final
    cells' (costs, first-stage parts, replica times) (`_final_cells`), and their `cell_accounts` where a start
    summed them (else None); `first_stage`: the part of each item's cost the first stage runs alone
    (`Pipeline.stage_times`), or None; `accounts` as in `cell_costs`."""
    accounts = cell_accounts(problem, rank, microbatch, num_microbatches) if accounts is None else accounts
    cost, tokens = cell_costs(problem, rank, microbatch, num_microbatches, accounts)
    d = problem.num_ranks
    firsts = first_stage_sums(first_stage, rank, microbatch, d, num_microbatches)
    mean = float(problem.item_costs.sum()) / d + num_microbatches * problem.microbatch_overhead  # X̄
    # where the search stops: within STOP_GAP of τ·X̄, which bounds every plan's step at this M (uniform stages,
    # else nowhere), or at the certified bound (`bounds`: no plan is faster; the giants' chains can meet it)
    tau = 0.0 if firsts is not None else best_profile(pipeline, num_microbatches)[0]
    bound = certified_bound(problem, pipeline, np.array([num_microbatches]), first_stage)
    floor = max(tau * mean * (1 + STOP_GAP), bound)
    cells, placed, summed = [(cost, tokens, firsts)], {0: (rank, microbatch)}, {0: accounts}
    if met := fewer_met(problem, pipeline, cells[0], lambda: _proving_rows(cells[0], 1), bound):
        return met  # the start on fewer micro-batches meets the bound (`fewer`): no plan is faster
    early = _reordered_rows(problem, pipeline, cells[0], rank, work)  # timed with the starts
    heights = heights_start(problem, num_microbatches, pipeline, bound) if pipeline.schedule == "gpipe" and \
        firsts is None and not problem.padded else None
    if heights is not None:  # GPipe's start by heights: its one shaped start, the plain cells not searched (module)
        _add_start(problem, (placed, cells, summed), heights, first_stage)
        times, partial = _start_times(pipeline, cells, False)
    else:
        times, partial = _shaped_starts(problem, pipeline, num_microbatches, mean, (placed, cells, summed),
                                        first_stage, early)
    early, ahead = (None, None) if early is None else _split(early, times.pop())
    shaped = range(1, len(cells))
    best = _fastest(times)
    if float(times[best].max()) <= floor:  # the search would stop at once (`search`)
        return _start(pipeline, (placed, cells, summed), times, partial, best)
    reordered, shown = _add_reordered(problem, pipeline, (placed, cells), rank, microbatch, early)
    reordered = [] if heights is not None else reordered
    added = range(len(times), len(cells))
    pending = [index for index in added if index not in shown]
    rows = {index: _proving_rows(cells[index], STALL_ROWS) for index in pending}
    partial.update(index for index in added if index in shown or rows[index] is not None)
    shown.update(zip(pending, _timed(pipeline, [cells[index] for index in pending], list(rows.values()))) if pending
                 else [])
    times += [shown[index] for index in added]
    best = _fastest(times)
    found = None  # (time, the search's answer): the fastest of the searches from the reordered and shaped cells
    faster = min(shaped, key=lambda index: (float(times[index].max()), index), default=None)
    for begin in [*shaped, *reordered]:
        if found is not None and found[0] <= bound:
            break  # a search met the bound: no later one is faster
        if begin in shaped and pipeline.schedule != "gpipe" and begin != faster:
            continue  # of two shaped starts, the faster is searched; GPipe searches both where made (R12-02, 04)
        rival = min(float(times[best].max()), math.inf if found is None else found[0])
        if begin in partial and stalls_at_once(times[begin], d, problem.padded) and \
                float(times[begin].max()) > rival * (1 + SUMS_DRIFT):
            continue  # its search would end where it starts, above the rival (below): its other replicas never timed
        if float(times[begin].max()) > rival * (1 + SUMS_DRIFT) and \
                _behind_for_good(problem, pipeline, (placed, cells, partial), times, begin, (rival, work), ahead):
            continue  # more of its replicas run above the rival than its search can lower: it would end behind (below)
        _whole(pipeline, cells, times, partial, begin)
        replica, slot = _places(placed, begin)
        cost, tokens, firsts = _cells(cells, begin)
        if tokens is None:
            tokens = cell_token_sums(problem, slot * d + replica, d * num_microbatches).reshape(-1, d).T
        search = CellSearch(pipeline, problem.item_costs, problem.lengths, problem.padded, cost, tokens, replica,
                            slot, problem.max_tokens_per_microbatch, work, times[begin],
                            None if firsts is None else (firsts, first_stage), floor, rival)
        if behind_after_a_round(search):
            continue  # its first round its last, then it ends behind the rival (`behind`): dropped, so not made
        search.rounds()
        search.run()
        if search.behind():
            continue  # its cells summed afresh stay above the rival: neither kept nor a rival to later searches
        final = _final_cells(problem, search, first_stage)
        if found is None or float(final[2].max()) < found[0]:
            found = (float(final[2].max()), (search.replica, search.slot, float(times[0].max()), final,
                                             _loads_kept(problem, final[0], search.tokens)))
    if found is None or found[0] >= float(times[best].max()):  # no faster than the best start: that one
        return _start(pipeline, (placed, cells, summed), times, partial, best)
    return found[1]


def _shaped_starts(problem: MicroBatchProblem, pipeline: Pipeline, m: int, mean: float, starts: tuple,
                   first_stage: np.ndarray | None, extra: tuple | None = None) -> tuple[list, set]:
    """The items cut afresh into the best shape (`lpt_shaped`; two ways where more than D items overflow) added to
    `starts` (placed, cells, summed: the plain cells alone), and every start's times (`_start_times`).  Of two, 1F1B
    and interleaved search only the faster: the second alone is made where `shaped.second_alone`, else where the
    first's cells from below (`first_from_below`, uniform stages) run longer than the second's step on some replica
    (the first, never the faster, is neither searched nor kept: the same plan), else the first after all, ahead of
    it.  GPipe searches both, but where the second's cells from below run longer than the first's step on some
    replica and the D largest items hold less than `shaped.PINNED_SHARE` of the work (`shaped.pinned_heavy`), the
    first alone is made (issue 28: the second's LPT over every item and its search, dropped, were ~0.4 of the
    planning at D = 2560 x 32, M = 16).  `extra`: as in `_start_times`, its cells' times last."""
    placed, cells, summed = starts
    two = not problem.padded and overflowing(problem, pipeline, m, mean) > problem.num_ranks
    gpipe = pipeline.schedule == "gpipe"  # bounded from below: its second start (most), else the first
    bounded = two and cells[0][2] is None and problem.num_ranks > 2 * PROBE_ROWS  # uniform stages, many replicas
    if bounded and not gpipe and second_alone(problem, m, pipeline):
        for most in (True, False):  # the first only where the second finds no room
            if len(cells) == 1:
                _add_start(problem, starts, lpt_shaped(problem, m, pipeline, mean, most), first_stage)
        return _start_times(pipeline, cells, False, extra=extra)
    below = first_from_below(problem, m, pipeline, mean, gpipe) if bounded and not (gpipe and pinned_heavy(problem)) \
        else None
    for most in (False, True)[:(not problem.padded) + two]:
        if below is None or most != gpipe:
            _add_start(problem, starts, lpt_shaped(problem, m, pipeline, mean, most), first_stage)
    if below is None or len(cells) == 1:
        if below is not None:  # the start not bounded not made: the bounded one as without the bound
            _add_start(problem, starts, lpt_shaped(problem, m, pipeline, mean, gpipe), first_stage)
        return _start_times(pipeline, cells, two and not gpipe and len(cells) == 3, extra=extra)
    times, partial = _start_times(pipeline, cells, False, below, extra)
    last = [] if extra is None else [times.pop()]
    if float(times.pop().max()) > float(times[1].max()):
        return times + last, partial
    _add_start(problem, starts, lpt_shaped(problem, m, pipeline, mean, gpipe), first_stage)
    if len(cells) == 3:
        times.append(_timed(pipeline, [cells[2]])[0])
        if not gpipe:  # the first ahead of the second
            for listed in (cells, times):
                listed[1], listed[2] = listed[2], listed[1]
            for book in (placed, summed):
                first, second = book.pop(2, None), book.pop(1, None)
                book.update((index, value) for index, value in ((1, first), (2, second)) if value is not None)
    return times + last, partial


def _add_reordered(problem: MicroBatchProblem, pipeline: Pipeline, starts: tuple, rank: np.ndarray,
                   microbatch: np.ndarray, early: np.ndarray | None) -> tuple[list[int], dict]:
    """The plain cells (`starts` = (placed, cells), the plain ones first) reordered in each replica (`order.mountain`)
    and (padded) dealt afresh over the replicas, then reordered (`order.deal`; review11 R11-01), added to `starts`;
    the indices of the starts searched for them.  GPipe's step does not depend on the order (uniform stages:
    `schedules.gpipe_time`), so there the plain cells as planned stand for their reordering (the same step, up to
    the float sums' order; one walk of every replica fewer).  Where the plain cells' STALL_ROWS rows of largest sums
    hold their step (`_proving_rows`) they hold the reordering's too (a row at most another in every cell stays so,
    both sorted alike): the reordered cells of those rows alone are timed (`early`: their times, `_reordered_rows`)
    and returned ({start: its times there}), the whole made where it is searched or kept (`_cells`; at D = 2560 it
    mostly stalls at once above the step found)."""
    placed, cells = starts
    cost, tokens, firsts = cells[0]
    (d, m), searched, shown = cost.shape, [], {}
    if pipeline.schedule == "gpipe" and firsts is None:
        searched.append(0)
    else:
        order = functools.cache(lambda: mountain(cost))  # the plain cells reordered in each replica

        def made():
            return tuple(None if grid is None else np.take_along_axis(grid, order(), axis=1)
                         for grid in (cost, tokens, firsts))
        cells.append(made if early is not None else made())
        if early is not None:
            shown[len(cells) - 1] = early
        # slot j runs where order holds j; found where the start is searched or kept (`_places`)
        placed[len(cells) - 1] = lambda: (rank, np.argsort(order(), axis=1)[rank, microbatch])
        searched.append(len(cells) - 1)
    if problem.padded:
        flat = [None if grid is None else grid.T.ravel() for grid in (cost, tokens, firsts)]  # cell m·D + r
        dealt = deal(flat[0], d)
        grid = np.take_along_axis(dealt, mountain(flat[0][dealt]), axis=1)
        cells.append(tuple(None if values is None else values[grid] for values in flat))
        placed[len(cells) - 1] = places(grid, microbatch * d + rank, m)
        searched.append(len(cells) - 1)
    return searched, shown


def _start(pipeline: Pipeline, starts: tuple, times: list, partial: set, index: int) -> tuple:
    """`arrange`'s answer for a start as it is (`starts`: placed, cells, summed), every replica timed."""
    placed, cells, summed = starts
    _whole(pipeline, cells, times, partial, index)
    cost, _, firsts = _cells(cells, index)
    return (*_places(placed, index), float(times[0].max()), (cost, firsts, times[index]), summed.get(index))


def _reordered_rows(problem: MicroBatchProblem, pipeline: Pipeline, plain: tuple, rank: np.ndarray, work: int
                    ) -> tuple | None:
    """(The plain cells' STALL_ROWS rows holding their step and their reordering's (`_add_reordered`), where those are
    few (`_proving_rows`), the plain cells reordered in each replica (`order.mountain`) on them, as cells (costs
    alone), then (interleaved, M >= AHEAD_FROM·P) on the rows `_behind_for_good` times that reordering on
    (`_largest_sums`), and how many those are (else None)); None for GPipe (order-free).  `rank`: the plain cells'
    replica per item; `work`: the search's budget.  D = 2560 x 32, M = 32 (seeds 5, 7, 13, 29, 41) reaches it on ~440
    rows, their own walk ~2.5 ms, ~0.4 ms in the starts'; M = 16 timed ~800 rows for nothing there (the reordered cells
    stall at once, `behind.stalls_at_once`), and D = 512, M = 32 reached it on 24 of 60 rows (seeds 390-392)."""
    rows = None if pipeline.schedule == "gpipe" else _proving_rows(plain, STALL_ROWS)
    if rows is None:
        return None
    ahead = pipeline.schedule == "interleaved" and plain[0].shape[1] >= AHEAD_FROM * pipeline.stages
    lowered = _lowered(problem, pipeline, plain[0], rank, work) if ahead else None
    ahead = None if lowered is None or lowered >= plain[0].shape[0] else _largest_sums(plain[0], lowered)
    return rows, _mountain_rows(plain[0], rows if ahead is None else np.concatenate([rows, ahead])), \
        None if ahead is None else ahead.size


def _split(early: tuple, times: np.ndarray) -> tuple:
    """(The reordered plain cells' times on their rows holding the step, on `_behind_for_good`'s rows or None) of
    their times on the rows of `_reordered_rows` (`early`)."""
    return times[:early[0].size], None if early[2] is None else times[early[0].size:]


def _lowered(problem: MicroBatchProblem, pipeline: Pipeline, cost: np.ndarray, replica: np.ndarray, work: int) -> int:
    """`behind.lowered_at_most` of a start's cells `cost` (D, M), `replica` per item, and the search's budget `work`."""
    size = cost.shape[0]
    return lowered_at_most(pipeline, cost.shape[1], np.bincount(replica, minlength=size), work, problem.padded)


def _largest_sums(cost: np.ndarray, lowered: int) -> np.ndarray:
    """The `lowered` + 1 rows of cells `cost` (D, M) of largest sums, ascending (`_behind_for_good`)."""
    size = cost.shape[0]
    return np.sort(np.argpartition(cost.sum(axis=1), size - lowered - 1)[size - lowered - 1:])


def _mountain_rows(cost: np.ndarray, rows: np.ndarray) -> tuple:
    """The cells (costs alone) of `rows` of the plain cells `cost` reordered in each replica (`order.mountain`, row by
    row: the rows of the whole reordering, `_add_reordered`)."""
    return np.take_along_axis(cost[rows], mountain(cost[rows]), axis=1), None, None


def _cells(cells: list, index: int) -> tuple:
    """A start's cells (costs, tokens, first-stage parts), made on first use where deferred (`_add_reordered`)."""
    if callable(cells[index]):
        cells[index] = cells[index]()
    return cells[index]


def _places(placed: dict, index: int) -> tuple:
    """(replica, slot) per item of a start, found on first use where that is deferred (`_add_reordered`)."""
    if callable(placed[index]):
        placed[index] = placed[index]()
    return placed[index]


def _proving_rows(cell: tuple, count: int) -> np.ndarray | None:
    """`schedules.step_rows` of a start's cells (D, M) where they are at most D / 4, D >= PROVEN_FROM (below, a walk's
    own cost is most of it) and the stages uniform (a first-stage part may fall as its cell's cost rises); else None."""
    rows = None if cell[2] is not None or cell[0].shape[0] < PROVEN_FROM else step_rows(cell[0], count)
    return rows if rows is not None and 4 * rows.size <= cell[0].shape[0] else None


def _behind_for_good(problem: MicroBatchProblem, pipeline: Pipeline, starts: tuple, times: list, index: int,
                     reach: tuple, ahead: np.ndarray | None = None) -> bool:
    """Whether the search from start `index` (`starts`: placed, cells, partial; uniform stages) must end above the
    rival step (`reach`: it and the search's budget): more of its replicas run longer than the rival than the search
    can lower (`behind.lowered_at_most`); where the start is timed on some rows alone (`_proving_rows`), shown on its
    rows of largest sums (the reordered plain cells at D = 2560 x 32, M = 32, interleaved: every replica ~24 % above
    the rival, their rounds ~6 ms, then dropped, their other replicas' times ~4 ms).  The reordered plain cells, made
    on first use (`_add_reordered`), are not made whole here: their replicas are the plain cells' and those rows alone
    are reordered (any rows show it: D = 2560 x 32, M = 32, interleaved, ~5 ms of ~50 where it is not searched), and
    timed with the starts where given (`ahead`: their times on these rows, `_reordered_rows`)."""
    (placed, cells, partial), (rival, work) = starts, reach
    deferred = callable(cells[index])  # the plain cells reordered in each replica, not made yet
    cost, _, firsts = cells[0] if deferred else cells[index]
    size = cost.shape[0]
    if firsts is not None:
        return False
    lowered = _lowered(problem, pipeline, cost, placed[0][0] if deferred else _places(placed, index)[0], work)
    if lowered >= size:
        return False
    level = rival * (1 + SUMS_DRIFT)
    if index not in partial:
        return float(np.partition(times[index], size - lowered - 1)[size - lowered - 1]) > level
    if deferred and ahead is not None:
        return float(ahead.min()) > level
    rows = _largest_sums(cost, lowered)
    shown = _timed(pipeline, [_mountain_rows(cost, rows)]) if deferred else _timed(pipeline, [cells[index]], [rows])
    return float(shown[0].min()) > level


def _whole(pipeline: Pipeline, cells: list, times: list, partial: set, index: int) -> None:
    """Start `index` timed on every replica where only the rows holding its step were (in `partial`)."""
    if index in partial:
        times[index] = _timed(pipeline, [_cells(cells, index)])[0]
        partial.discard(index)


def _add_start(problem: MicroBatchProblem, starts: tuple, start: tuple | None, first_stage: np.ndarray | None
               ) -> None:
    """A start (replica, slot per item, and its cells' `cell_accounts` or None) added to `starts` (placed, cells,
    summed) with its cells' costs (without accounts summed in item order), tokens (without accounts None: the
    search alone needs them) and first-stage parts; none when `start` is None."""
    if start is None:
        return
    (placed, cells, summed), (replica, slot, accounts) = starts, start
    (d, m), index = cells[0][0].shape, len(cells)
    placed[index] = (replica, slot)
    cost, tokens = start_cells(problem, replica, slot, m, accounts)
    if accounts is not None:
        summed[index] = accounts
    cells.append((cost, tokens, first_stage_sums(first_stage, replica, slot, d, m)))


def _final_cells(problem: MicroBatchProblem, search: CellSearch, first_stage: np.ndarray | None) -> tuple:
    """(costs, first-stage parts or None, replica times) of the search's cells, as `pipeline_step` would
    compute them: the rows of replicas it moved items between summed again in item order, and timed where they
    changed (the search walked every row it timed, `replica_times`, so a row summed to the same floats keeps its
    time; GPipe's closed form is timed again)."""
    cost, firsts, times = search.cost, search.first_stage, search.times
    moved = np.array(sorted(search.moved), dtype=np.int64)
    if moved.size:
        d, m = cost.shape
        position, is_moved = np.full(d, -1), np.zeros(d, dtype=bool)
        position[moved], is_moved[moved] = np.arange(moved.size), True
        mine = np.flatnonzero(is_moved[search.replica])  # their items, ascending: each cell summed in item order
        cell = position[search.replica[mine]] * m + search.slot[mine]  # (moved, M) cells only, not all D·M
        same = np.full(moved.size, search.pipeline.schedule != "gpipe" or firsts is not None)
        for grid, values, extra in ((cost, problem.item_costs, problem.microbatch_overhead),
                                    (firsts, first_stage, 0.0)):
            if grid is not None:
                kept = grid[moved].view(np.int64)  # a copy: compared bit for bit
                grid[moved] = np.bincount(cell, weights=values[mine], minlength=moved.size * m).reshape(-1, m) + extra
                same &= (grid[moved].view(np.int64) == kept).all(axis=1)
        moved = moved[~same]
        if moved.size:
            times[moved] = replica_times(search.pipeline, *search.pipeline.stage_times(
                cost[moved], None if firsts is None else firsts[moved]))
    return cost, firsts, times


def _loads_kept(problem: MicroBatchProblem, cost: np.ndarray, tokens: np.ndarray) -> tuple | None:
    """The `cell_accounts` (loads, tokens), (M, D), of a search's final cells (`_final_cells`: costs (D, M), the
    moved replicas' summed afresh in item order; tokens exact integers) where a cell's cost is its load + 0.0 (no
    micro-batch overhead), else None (summed afresh by the caller)."""
    if problem.microbatch_overhead != 0:
        return None
    return np.ascontiguousarray(cost.T), np.ascontiguousarray(tokens.T)


def _timed(pipeline: Pipeline, cells: list, rows: list | None = None) -> list:
    """Every start's replica times (those of its `rows` alone where given and not None), in one `replica_times` call."""
    if rows is not None:
        cells = [cell if row is None else (cell[0][row], None, None if cell[2] is None else cell[2][row])
                 for cell, row in zip(cells, rows)]
    firsts = [None if cells[0][2] is None else np.concatenate([cell[2] for cell in cells])]
    rows = replica_times(pipeline, *pipeline.stage_times(np.concatenate([cell[0] for cell in cells]), *firsts))
    return np.split(rows, np.cumsum([cell[0].shape[0] for cell in cells])[:-1])


def _start_times(pipeline: Pipeline, cells: list, one_searched: bool, below: np.ndarray | None = None,
                 extra: tuple | None = None) -> tuple[list, set]:
    """Every start's replica times (`_timed`), the plain cells first, and the starts timed on some replicas alone:
    the plain cells where their reordering is searched instead (not GPipe), on the rows holding their step
    (`_proving_rows`: only it is read unless they are kept); where two shaped starts follow of which only the faster
    is searched (`one_searched`), the first (the offsets alone, slower where more than D items overflow at large D:
    `_starts`) on its PROBE_ROWS replicas of largest cells and of largest sums, and where one of them runs longer
    than the second's step, its times are those replicas' (above the other's step, which is all it is compared
    by: never the fastest, never searched); else on every replica too.  `below`: the first's cells from below, the
    second alone in `cells` (`_shaped_starts`): its probe replicas' times (at most the first's) follow the starts'.
    `extra`: (rows of the plain cells holding their step, cells timed in the same walk, their times last): the plain
    cells are timed on those rows (`_reordered_rows`: one `step_rows` for both)."""
    plain = None if pipeline.schedule == "gpipe" else extra[0] if extra is not None else _proving_rows(cells[0], 1)
    partial, size, extras = set() if plain is None else {0}, cells[0][0].shape[0], [] if extra is None else [extra[1]]

    def walk(starts, rows):
        return _timed(pipeline, starts + extras, rows + [None] * len(extras))
    if below is not None:
        return walk(cells + [(below, None, None)], [plain, None, _probe_rows(below)]), partial
    if not one_searched or size <= 2 * PROBE_ROWS:
        return walk(cells, [plain] + [None] * (len(cells) - 1)), partial
    plain, second, probed, *tail = walk([cells[0], cells[2], cells[1]], [plain, None, _probe_rows(cells[1][0])])
    if float(probed.max()) > float(second.max()):
        return [plain, probed, second] + tail, partial
    return [plain, _timed(pipeline, [cells[1]])[0], second] + tail, partial


def _probe_rows(cost: np.ndarray) -> np.ndarray:
    """The PROBE_ROWS replicas of largest cells and of largest sums of cells (D, M), ascending."""
    size = cost.shape[0]
    return np.unique(np.concatenate([np.argpartition(score, size - PROBE_ROWS)[size - PROBE_ROWS:] for score in
                                     (np.maximum.reduce(np.ascontiguousarray(cost.T)), cost.sum(axis=1))]))


def _fastest(times: list) -> int:
    """The start of least step (max replica time), the first on ties."""
    return min(range(len(times)), key=lambda i: (float(times[i].max()), i))


def work_budget(time_limit: float | None) -> int:
    return DEFAULT_WORK if time_limit is None else int(time_limit * WORK_PER_SECOND)


def plan_for_pipeline(problem: MicroBatchProblem, rank: np.ndarray, microbatch: np.ndarray, num_microbatches: int,
                      pipeline: Pipeline, *, free_microbatches: bool = False, first_stage=None, accounts=None
                      ) -> tuple[np.ndarray, np.ndarray, PipelineStep, tuple]:
    """(replica, slot, PipelineStep, their cells' `cell_accounts`) of a plain plan's cells re-planned for
    `pipeline` (module docstring).

    `first_stage`: per item, the part of its cost that the first stage runs alone (the encoders of a
    multimodal model, which sit before the LLM's layers), 0 <= it <= the item's cost; the rest is spread
    evenly over the stages (`Pipeline.stage_times`).  None: every item spread evenly.  `accounts`: the
    plain cells' `cell_accounts` (loads, tokens), (M, D) each, when the caller has them.
    """
    pipeline.check_microbatches(num_microbatches)  # a free M too: planning grows with M² (MAX_PIPELINE_SLOTS)
    start = time.perf_counter()
    first_stage = as_first_stage(first_stage, problem)
    work = work_budget(problem.time_limit)
    plan = lambda *args: arrange(*args[:3], num_microbatches, pipeline, work, *args[3:])  # noqa: E731
    # the items of cost 0 are dealt after the others are planned (`free`: they change no cell's cost)
    found = without_free_items(problem, rank, microbatch, num_microbatches, first_stage, accounts, plan)
    replica, slot, unaware, cells, summed = found or plan(problem, rank, microbatch, first_stage, accounts)
    step = pipeline_step(problem, replica, slot, num_microbatches, pipeline, unaware,
                         free_microbatches=free_microbatches, solve_seconds=time.perf_counter() - start,
                         first_stage=first_stage, cells=cells)
    return replica, slot, step, cell_accounts(problem, replica, slot, num_microbatches) if summed is None else summed


def as_first_stage(first_stage, problem: MicroBatchProblem) -> np.ndarray | None:
    """`first_stage` as float64 (n,), or ValueError naming it: one finite value per item in [0, its cost]."""
    if first_stage is None:
        return None
    if problem.padded:
        raise ValueError("`first_stage` costs need unpadded cells (a padded cell's cost is not a sum of its items')")
    values = np.asarray(first_stage, dtype=np.float64)
    if values.shape != problem.item_costs.shape:
        raise ValueError(f"`first_stage` must hold one cost per item ({problem.num_items}); got shape {values.shape}")
    if not np.all((values >= 0) & (values <= problem.item_costs)):
        item = int(np.flatnonzero(~((values >= 0) & (values <= problem.item_costs)))[0])
        raise ValueError(f"`first_stage`[{item}]={float(values[item])!r} must be in [0, the item's cost "
                         f"{float(problem.item_costs[item])!r}]: the part of its cost the first stage runs alone")
    return values

"""The pipeline-aware cell planner: a micro-batch plan's cells re-dealt, reordered and searched
for the schedule's step time (max over replicas of the pipeline time, `schedules`).

    start     the plain plan's cells (`balance_microbatches`, Σ_m max_r load) as planned, and
              (unpadded) the items cut afresh into cells of the schedule's best shape by one LPT
              over all M·D cells (`lpt_shaped`); unless one is within STOP_GAP of τ·X̄ (the
              search's stop rule), also the plain cells reordered in each replica
              (`order.mountain`) and dealt afresh over the replicas (`order.deal`) and reordered,
              and then, again unless within STOP_GAP, the dealt replicas' items re-cut into the
              best shape (`shaped_slots`, unpadded); the fastest wins
    search    `search.CellSearch`: slot swaps and item moves off the slowest replica
    certify   the step time of the final cells, their costs summed in item order as a fresh
              account would (a start's cells are; the replicas the search moved items between are
              summed again) and timed by `replica_times`; the bound of `bounds.step_bound`, status
              optimal only when they meet

The plan given is one of the starts, so the result is never slower than it (the
pipeline-unaware plan run in its own order).  Deterministic: no clock, ties by index.  M is the
plain plan's (a free M is not raised to shrink the bubble); with M free the bound covers every
M, so its gap also shows what more micro-batches could gain.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from ..kernels.lpt import greedy_from
from ..microbatch.cells import lpt_cells
from ..microbatch.plan import MicroBatchProblem, cell_accounts, cell_loads, cell_token_sums
from ..problem import Status, integer_values
from .bounds import step_bound
from .order import deal, mountain, reshape
from .profile import best_profile, path_bound
from .schedules import replica_times
from .search import STOP_GAP, CellSearch
from .spec import Pipeline

WORK_PER_SECOND = 20_000_000  # schedule operations `time_limit` buys (a budget, never a clock)
DEFAULT_WORK = 20_000_000
PATH_MARGIN = 1e-9  # a start is skipped when a path bound passes the best start's time by more than this


@dataclass(frozen=True, eq=False)
class PipelineStep:
    """A plan's pipeline step: every replica's schedule time, the step (their max), a bound, a status.

    Micro-batch m of the plan runs in slot m of every replica.  `unaware_step_time` is the
    step of the plain plan it started from, in that plan's order.  Every field is computed by the planner
    (a user reads them all: `to_json`), the replica times read-only.
    """

    pipeline: Pipeline
    replica_times: np.ndarray
    step_time: float
    lower_bound: float
    status: Status
    unaware_step_time: float
    busy_fraction: float
    solve_seconds: float = field(default=0.0, compare=False)

    @property
    def gap(self) -> float:
        """step_time / lower_bound - 1 (0 when both are 0)."""
        if self.lower_bound == 0:
            return 0.0 if self.step_time == 0 else math.inf
        return self.step_time / self.lower_bound - 1.0

    @property
    def bubble_fraction(self) -> float:
        """The share of every stage's step time spent idle (fill, drain, waits, slower replicas)."""
        return 1.0 - self.busy_fraction

    def to_json(self) -> dict:
        return {"pipeline": self.pipeline.to_json(), "step_time": self.step_time, "lower_bound": self.lower_bound,
                "gap": self.gap, "status": str(self.status), "unaware_step_time": self.unaware_step_time,
                "bubble_fraction": self.bubble_fraction, "solve_seconds": self.solve_seconds,
                "replica_times": self.replica_times.tolist()}


def cell_costs(problem: MicroBatchProblem, replica: np.ndarray, slot: np.ndarray, num_microbatches: int,
               accounts: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(cost, tokens) of every cell (replica, slot), shape (D, M); cost = load + micro-batch overhead.
    `accounts`: the cells' `cell_accounts` (loads, tokens), when the caller has them."""
    loads, tokens = cell_accounts(problem, replica, slot, num_microbatches) if accounts is None else accounts
    return loads.T + problem.microbatch_overhead, np.ascontiguousarray(tokens.T)


def _arrangements(cost: np.ndarray) -> list[np.ndarray]:
    """(D, M) grids of flat cell indices (slot-major, m·D + r): reordered, and dealt and reordered."""
    d, m = cost.shape
    planned = (np.arange(m)[None, :] * d + np.arange(d)[:, None])
    flat = cost.T.ravel()
    dealt = deal(flat, d)
    return [np.take_along_axis(planned, mountain(cost), axis=1), np.take_along_axis(dealt, mountain(flat[dealt]),
                                                                                      axis=1)]


def lpt_shaped(problem: MicroBatchProblem, num_microbatches: int, pipeline: Pipeline, mean: float) -> tuple | None:
    """(replica, slot) per item of cells cut afresh into the schedule's best shape x (`profile.best_profile`),
    and their `cell_accounts` (loads, tokens), (M, D) each, where the integer LPT below summed them (else None):
    LPT over all M·D cells within the budget (`microbatch.cells.lpt_cells`), the D cells of slot k starting
    X̄·(max x - x_k) up so that they end near X̄·x_k (X̄ = `mean` = Σ c / D + M·o), replica r running cell
    k·D + r in slot k; None where LPT finds no room.  The placeholders cost 2·max c + the offsets rounded to
    2**-30 of max c (to whole units below 2**30 where the costs are integers), so integer costs stay on LPT's
    integer keys (`lpt`: loads below 2**53 units); there, and where the cells fit the budget uncapped, the
    same LPT runs from the offsets as start loads (`lpt.greedy_from`), without the placeholders, its exact
    sums the cells' costs."""
    m, d = num_microbatches, problem.num_ranks
    shape = best_profile(pipeline, m)[1]
    offsets = mean * (shape.max() - shape)
    top = float(problem.sorted_costs[0]) if problem.num_items else 0.0
    unit = 2.0 ** (np.frexp(top)[1] - 30)
    if unit < 1 and integer_values(problem.sorted_costs) is not None:
        unit = 1.0
    offsets = np.round(offsets / unit) * unit
    base = 2.0 * top if top > 0 else 1.0
    slot_of = np.lexsort((np.arange(m), -(base + offsets)))  # cell k·D + r holds the k-th placeholder's slot
    replica_of, slot_of_cell = np.tile(np.arange(d), m), np.repeat(slot_of, d)
    greedy = greedy_from(problem.sorted_costs, m * d, problem.cost_order, np.repeat(offsets[slot_of], d))
    if greedy is not None:
        cell, sums = greedy
        tokens = cell_token_sums(problem, cell, m * d)
        if tokens.max() <= problem.max_tokens_per_microbatch:
            in_slots = np.argsort(slot_of)  # row k: the cells run in slot k
            return (np.take(replica_of, cell), np.take(slot_of_cell, cell),
                    (sums.reshape(m, d)[in_slots], tokens.reshape(m, d)[in_slots]))
    cell = lpt_cells(problem, m, offsets, base)  # capped where the budget needs it
    return None if cell is None else (np.take(replica_of, cell), np.take(slot_of_cell, cell), None)


def shaped_slots(problem: MicroBatchProblem, replica: np.ndarray, slot: np.ndarray, num_microbatches: int,
                 pipeline: Pipeline) -> np.ndarray:
    """Each replica's items re-cut into the schedule's best shape (`order.reshape`, `profile.best_profile`),
    the replica's cost spread as the shape spreads 1; a replica where that finds no room keeps `slot`."""
    _, shape = best_profile(pipeline, num_microbatches)
    d, o = problem.num_ranks, problem.microbatch_overhead
    totals = np.bincount(replica, weights=problem.item_costs, minlength=d) + num_microbatches * o
    new, failed = reshape(problem.item_costs, problem.lengths, replica, totals[:, None] * shape[None, :] - o,
                          problem.max_tokens_per_microbatch, problem.cost_order)
    return np.where(failed[replica], slot, new)


def first_stage_sums(first_stage: np.ndarray | None, replica: np.ndarray, slot: np.ndarray, num_ranks: int,
                     num_microbatches: int) -> np.ndarray | None:
    """The cells' first-stage parts (D, M), summed in item order like `cell_costs`; None without them."""
    if first_stage is None:
        return None
    size = num_ranks * num_microbatches
    return np.bincount(slot * num_ranks + replica, weights=first_stage, minlength=size).reshape(-1, num_ranks).T


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
    # the search's floor: τ·X̄ bounds every plan's step at this M (`bounds`; uniform stages, else none)
    floor = 0.0 if firsts is not None else best_profile(pipeline, num_microbatches)[0] * mean
    cells, placed, grids, summed = [(cost, tokens, firsts)], {0: (rank, microbatch)}, {}, {0: accounts}
    if not problem.padded:  # the items cut afresh into the best shape
        _add_start(problem, (placed, cells, summed), lpt_shaped(problem, num_microbatches, pipeline, mean),
                   first_stage)
    times = _timed(pipeline, cells, {}, range(len(cells)))
    if _short(times, floor):  # whole cells arranged (costs, tokens and first-stage parts with them)
        flat, flat_tokens = cost.T.ravel(), tokens.T.ravel()
        flat_firsts = None if firsts is None else firsts.T.ravel()
        for grid in _arrangements(cost):
            grids[len(cells)] = grid
            cells.append((flat[grid], flat_tokens[grid], None if firsts is None else flat_firsts[grid]))
        times = _timed(pipeline, cells, times, _promising(pipeline, cells, times, grids))
        if not problem.padded and _short(times, floor):  # the dealt replicas' items re-cut into the best shape
            dealt = len(cells) - 1
            placed[dealt] = _placed(grids.pop(dealt), microbatch * d + rank, num_microbatches)
            _add_start(problem, (placed, cells, summed), (placed[dealt][0], shaped_slots(
                problem, *placed[dealt], num_microbatches, pipeline), None), first_stage)
            times = _timed(pipeline, cells, times, [len(cells) - 1])
    best = min(times, key=lambda i: (float(times[i].max()), i))
    replica, slot = placed[best] if best in placed else _placed(grids[best], microbatch * d + rank,
                                                                num_microbatches)
    cost, tokens, firsts = cells[best]
    if not _short({best: times[best]}, floor):  # the search would stop at once (`search`)
        return replica, slot, float(times[0].max()), (cost, firsts, times[best]), summed.get(best)
    if tokens is None:
        tokens = cell_token_sums(problem, slot * d + replica, d * num_microbatches).reshape(-1, d).T
    search = CellSearch(pipeline, problem.item_costs, problem.lengths, problem.padded, cost, tokens, replica, slot,
                        problem.max_tokens_per_microbatch, work, times[best],
                        None if firsts is None else (firsts, first_stage), floor)
    search.run()
    return search.replica, search.slot, float(times[0].max()), _final_cells(problem, search, first_stage), None


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
    if accounts is None:
        cost = cell_loads(problem, slot * d + replica, d * m).reshape(m, d).T + problem.microbatch_overhead
        tokens = None
    else:
        cost, tokens = cell_costs(problem, replica, slot, m, accounts)
        summed[index] = accounts
    cells.append((cost, tokens, first_stage_sums(first_stage, replica, slot, d, m)))


def _final_cells(problem: MicroBatchProblem, search: CellSearch, first_stage: np.ndarray | None) -> tuple:
    """(costs, first-stage parts or None, replica times) of the search's cells, as `pipeline_step` would
    compute them: the rows of replicas it moved items between summed again in item order, and timed."""
    cost, firsts, times = search.cost, search.first_stage, search.times
    moved = np.array(sorted(search.moved), dtype=np.int64)
    if moved.size:
        d, m = cost.shape
        mine = np.zeros(d, dtype=bool)
        mine[moved] = True
        mine = mine[search.replica]
        cell = search.slot[mine] * d + search.replica[mine]
        for grid, values, extra in ((cost, problem.item_costs, problem.microbatch_overhead),
                                    (firsts, first_stage, 0.0)):
            if grid is not None:
                grid[moved] = np.bincount(cell, weights=values[mine], minlength=d * m).reshape(m, d).T[moved] + extra
        times[moved] = replica_times(search.pipeline, *search.pipeline.stage_times(
            cost[moved], None if firsts is None else firsts[moved]))
    return cost, firsts, times


def _timed(pipeline: Pipeline, cells: list, times: dict, chosen) -> dict:
    """`times` (start -> its replica times) with the starts `chosen` timed too, in one `replica_times` call."""
    return {**times, **dict(zip(*_evaluated(pipeline, cells, [i for i in chosen if i not in times])))}


def _short(times: dict, floor: float) -> bool:
    """Whether no start timed is within STOP_GAP of `floor` (the search's stop rule, `search`)."""
    return min(float(row.max()) for row in times.values()) > floor * (1 + STOP_GAP)


def _promising(pipeline: Pipeline, cells: list, times: dict, candidates) -> list:
    """The `candidates` no path of `profile.path_bound` already makes slower than the best start timed
    (uniform stages; all of them otherwise)."""
    if cells[0][2] is not None:
        return list(candidates)
    best = min(float(row.max()) for row in times.values())
    return [i for i in candidates if path_bound(pipeline, cells[i][0]).max() <= best * (1 + PATH_MARGIN)]


def _evaluated(pipeline: Pipeline, cells: list, chosen) -> tuple[list, list]:
    """(chosen, their replica times), in one `replica_times` call."""
    chosen = list(dict.fromkeys(chosen))
    if not chosen:
        return [], []
    firsts = [None if cells[0][2] is None else np.concatenate([cells[i][2] for i in chosen])]
    rows = replica_times(pipeline, *pipeline.stage_times(np.concatenate([cells[i][0] for i in chosen]), *firsts))
    return chosen, np.split(rows, len(chosen))


def _placed(grid: np.ndarray, cell: np.ndarray, num_microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """(replica, slot) per item when replica r runs flat cell grid[r, k] in slot k (item i in flat cell cell[i])."""
    replica_of, slot_of = np.empty(grid.size, dtype=np.int64), np.empty(grid.size, dtype=np.int64)
    replica_of[grid.ravel()] = np.repeat(np.arange(grid.shape[0]), num_microbatches)
    slot_of[grid.ravel()] = np.tile(np.arange(num_microbatches), grid.shape[0])
    return replica_of[cell], slot_of[cell]


def pipeline_step(problem: MicroBatchProblem, replica: np.ndarray, slot: np.ndarray, num_microbatches: int,
                  pipeline: Pipeline, unaware_step_time: float, *,
                  free_microbatches: bool = False, solve_seconds: float = 0.0, first_stage: np.ndarray | None = None,
                  cells=None) -> PipelineStep:
    """The certified `PipelineStep` of these cells (see the module): the bound holds for every plan
    with this M, or with any M from the fewest that fit when `free_microbatches`.  `unaware_step_time`: the
    plain plan's step.  `cells`: their (costs, first-stage parts, replica times) as computed here, when the
    caller has them (`arrange`)."""
    if cells is None:
        cost = cell_costs(problem, replica, slot, num_microbatches)[0]
        cells = (cost, first_stage_sums(first_stage, replica, slot, problem.num_ranks, num_microbatches), None)
    forward, backward = pipeline.stage_times(*cells[:2])
    times = replica_times(pipeline, forward, backward) if cells[2] is None else cells[2]
    step = float(times.max()) if times.size else 0.0
    if free_microbatches:  # any M the plan could have taken, up to the cells a plan may hold
        counts = np.arange(problem.min_microbatches, 2**22 // problem.num_ranks + 1)
        if pipeline.schedule == "interleaved":
            counts = counts[counts % pipeline.stages == 0]
    else:
        counts = np.array([num_microbatches])
    bound = min(step, step_bound(pipeline, problem.item_costs, problem.num_ranks, counts,
                                 problem.microbatch_overhead, first_stage,
                                 *((None, None) if first_stage is not None else (problem.total_cost,
                                                                                 problem.sorted_costs))))
    stages = pipeline.stages if forward.ndim == 3 else 1  # uniform stages: one stage's times stand for all
    work = np.ascontiguousarray(forward).sum() + np.ascontiguousarray(backward).sum()  # one order, whatever the layout
    busy = float(work) / (problem.num_ranks * stages * step) if step > 0 else 1.0
    times.setflags(write=False)
    return PipelineStep(pipeline=pipeline, replica_times=times, step_time=step, lower_bound=bound,
                        status=Status.OPTIMAL if step == bound else Status.FEASIBLE,
                        unaware_step_time=unaware_step_time, busy_fraction=busy, solve_seconds=solve_seconds)


def work_budget(time_limit: float | None) -> int:
    return DEFAULT_WORK if time_limit is None else int(time_limit * WORK_PER_SECOND)


def plan_for_pipeline(problem: MicroBatchProblem, rank: np.ndarray, microbatch: np.ndarray, num_microbatches: int,
                      pipeline: Pipeline, *, free_microbatches: bool = False, first_stage=None, accounts=None):
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
    replica, slot, unaware, cells, summed = arrange(problem, rank, microbatch, num_microbatches, pipeline,
                                                    work_budget(problem.time_limit), first_stage, accounts)
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

"""A micro-batched step run through a pipeline: the encoders on the first stage, in the cells' plan and in the step.

With `Orchestrator(..., pipeline=Pipeline(P, schedule))` every rank r is a data-parallel replica of P pipeline
stages, and its first stage also runs the encoders of its micro-batches (they sit before the LLM's layers).
Micro-batch m costs replica r

    c(r, m) = llm(r, m) + o + e(r, m),    e(r, m) = Σ_s load_s(r, m) over the encoder stages s

of which e(r, m) runs on the first stage alone (`Pipeline.stage_times`): llm(r, m) the cell's LLM load
(`cells.cell_loads`), o the micro-batch overhead, load_s(r, m) what the plan gave rank r of encoder s in
micro-batch m (balanced across the ranks again in every micro-batch with `balance_encoders`, and maybe dealt
over the replicas for the step, see below; else its samples').
The step is the slowest replica's schedule time over these (`balancers.pipeline.schedules`):

    step = max_r replica_time(pipeline, forward and backward of c(r, ·) with e(r, ·) on stage 0)

Its bound holds for every plan of the step's items, wherever the encoders run: the samples' LLM costs spread
over the stages, each encoder item's cost on some replica's first stage (`balancers.pipeline.bounds`).

Where a sample's encoders run in its own cell (`balance_encoders=False`: each segment on its sample's LLM rank)
the cells are planned seeing them (`cell_costs`): each sample's LLM plus encoder costs, the latter its
first-stage part (`balance_microbatches(..., first_stage_costs=)`), which is then e(r, m) itself for unpadded
encoders.  With `balance_encoders` every micro-batch's encoder work is spread over the ranks again after the
cells are chosen, e(r, m) that micro-batch's balanced loads (see below): a sample's encoders are not its
cell's, and planning as if they were did not pay on held-out batches (measured 2026-12-05: 1F1B
better, GPipe and interleaved worse), so there the cells see the LLM's costs alone; the step reported is the
one the plan runs either way.

What the cells planner cannot see it can still order: a micro-batch's encoders are balanced whatever its
place in the step, so the plan's micro-batches are run in the order that times fastest with their encoder
loads on the first stage (`microbatch_order`: swaps of two micro-batches, each kept only when the step falls;
never slower than the planner's order).  With `balance_encoders`, on held-out batches: median 0.988× the step
in the planner's order, 1F1B 0.976× (measured 2026-12-05).

Nor does balancing each micro-batch's encoder stages alone look at the step: every stage's heaviest groups
landed on the same low ranks in every micro-batch and stage, one replica's first stage working
~2.4× the mean, and the default ran up to 1.81× the step of `balance_encoders=False` (probe20 P20-20).  So
the groups are also dealt over the replicas for the step (`spread_encoders`: each stage's plan with its ranks
relabelled, the same makespan and caps), and that step is run where it is at least SPREAD_GAIN faster (ordered
too): relabelling undoes the encoders' locality placement (2.1-2.5× the bytes moved on the 10b model's vision
and default mixes, for a 0.3 % faster step there).  Held out (probe20's c90 family at seeds 9001-9002, 24
batches, D 4-16, P 2-4): default / `balance_encoders=False` median 1.356 (max 1.735) before, 0.977 (max 1.058)
after; the 10b model's default, vision (also 40× heavier vision) and speech mixes at D 8 and 32, 64 instances:
unchanged (measured 2026-12-06).

And the cells planner sees the LLM's costs alone where the encoders are balanced per micro-batch, so the plan made
without the pipeline can run faster (vision, D = 4, P = 2, 1F1B: 1.8 %).  The orchestrator plans that plan anyway
(on the step's own basis, for `unaware_step_time`) and returns it, run through the pipeline in its best order, where
it is strictly faster (`faster_run`): the step is never slower than the PP-unaware plan's.  Such a plan's cells are
the plain planner's (`cells.pipeline` None, no "+pipeline" in their algorithm), not placed near their sources.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from ..balancers.locality.lap import assign_groups
from ..balancers.microbatch.api import make_microbatch_problem, rounding_checked
from ..balancers.microbatch.plan import MicroBatchPlan, MicroBatchResult, make_microbatch_plan
from ..balancers.pipeline.step import PipelineStep, pipeline_step
from ..balancers.pipeline.schedules import replica_times
from ..balancers.pipeline.spec import Pipeline
from ..balancers.problem import exact_sum
from .frames import stage_costs
from .plan import StagePlan, _frozen, compose
from .samples import Batch

CRITICAL_REPLICAS = 8  # the slowest replicas `microbatch_order` times every candidate order on
SPREAD_GAIN = 0.05  # the step `spread_encoders` must save to be run: it undoes the encoders' locality placement


def sample_encoder_costs(batch: Batch, stages) -> np.ndarray:
    """Every sample's encoder costs: its segments' costs under their modality's encoder stage (`stage_costs`),
    float64 (n,).  `stages`: encoder stages, then the LLM stage (which adds nothing)."""
    costs = np.zeros(batch.num_samples)
    for stage in stages[:-1]:
        segments = batch.segments_of(stage.modality)
        if segments.size:
            costs += np.bincount(batch.segment_sample[segments], minlength=batch.num_samples,
                                 weights=stage_costs(batch, stage))
    return costs


def cell_costs(batch: Batch, stages, options) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(each sample's cost, its first-stage part) for the cells' pipeline plan under the orchestrator's `options`
    (a `PlanOptions`): its LLM cost plus its encoder costs, and the latter, where those run in its cell (a
    `pipeline`, `balance_encoders` off, an unpadded LLM stage) and the batch holds an encoder item; else
    (None, None): the cells are planned on the LLM's costs alone."""
    if options.pipeline is None or options.balance_encoders or stages[-1].padded or batch.num_segments == 0:
        return None, None
    encoders = sample_encoder_costs(batch, stages)
    return stages[-1].cost.item_costs(batch.sample_llm_length) + encoders, encoders


def under_llm_costs(batch: Batch, found: MicroBatchPlan, llm_stage, fixed: bool,
                    pipeline: PipelineStep | None = None) -> MicroBatchPlan:
    """`found`'s cells (planned on other lengths or costs) accounted under the LLM stage: the samples' LLM
    tokens and costs, the LLM problem's own bound (with the fewest micro-batches that fit unless M is `fixed`);
    `pipeline`: the step to carry (default: `found`'s)."""
    tokens = batch.sample_llm_length
    problem = make_microbatch_problem(tokens, batch.num_ranks, costs=llm_stage.cost.item_costs(tokens),
                                      max_tokens_per_microbatch=found.max_tokens_per_microbatch,
                                      microbatch_overhead=found.microbatch_overhead)
    return make_microbatch_plan(problem, MicroBatchResult(found.rank, found.microbatch), found.num_microbatches,
                                found.algorithm, floor_microbatches=None if fixed else problem.min_microbatches,
                                solve_seconds=found.solve_seconds,
                                pipeline=found.pipeline if pipeline is None else pipeline)


def first_stage_loads(microbatches, num_ranks: int, rank_of: dict | None = None) -> np.ndarray:
    """e(r, m) of the module docstring, (D, M): every encoder stage's load on rank r in micro-batch m, summed in
    stage order; with `rank_of` ({(micro-batch, stage): rank of each group}, `spread_ranks`), of the plans as
    `spread_encoders` relabels them, without relabelling them (the same float additions, so the same times)."""
    rank_of = {} if rank_of is None else rank_of
    loads = np.zeros((num_ranks, len(microbatches)))
    for index, micro in enumerate(microbatches):
        for stage, plan in enumerate(micro.stage_plans[:-1]):
            ranks = rank_of.get((index, stage))
            loads[:, index] += plan.loads if ranks is None else plan.loads[np.argsort(ranks)]
    return loads


def planned_step(batch: Batch, stages, cells: MicroBatchPlan, microbatches, pipeline: Pipeline,
                 free_microbatches: bool, times: np.ndarray | None = None) -> PipelineStep:
    """The `PipelineStep` of a micro-batched plan (its `cells`, micro-batch m run m-th, and the `microbatches`'
    `PassPlan`s) through `pipeline` with its encoders on the first stage (module docstring); `cells.pipeline`
    itself where no encoder works.  Its `unaware_step_time` is the cells planner's (`cells.pipeline`): the
    step of the plain cells it started from (`PipelineStep`) as that planner saw them, with each sample's encoder
    costs in its own cell where it planned with them (`cell_costs`), else without encoders; `Orchestrator` puts
    it on this step's basis (`faster_run`: the plan made without the pipeline, its encoders on the first stage;
    probe32 P32-03); for cells not planned for the pipeline, their own step.  The bound holds for plans with this
    M, or with any M from the fewest that fit when `free_microbatches`.
    `times`: the replicas' times of these cells with their encoders, where the caller has them (`microbatch_order`)."""
    pipeline.check_microbatches(cells.num_microbatches, "cells.num_microbatches")
    first = first_stage_loads(microbatches, batch.num_ranks)
    encoders = bool(first.any())
    if cells.pipeline is not None and not encoders:
        return cells.pipeline
    cost = cells.cell_loads.T + cells.microbatch_overhead + first
    # one more item, of no tokens: all the encoders' work, the first stage's alone (its spread part is 0), all the
    # bound reads of the encoder items (`step_bound`: the first stage's mean work); 0 without encoders
    work = exact_sum(np.concatenate([stage_costs(batch, stage) for stage in stages[:-1]])) if encoders else 0.0
    lengths = np.append(batch.sample_llm_length, 0)
    item_costs = np.append(stages[-1].cost.item_costs(batch.sample_llm_length), work)
    parts = None
    if encoders:
        parts = np.zeros(item_costs.size)
        parts[-1] = work
    problem = make_microbatch_problem(lengths, batch.num_ranks, costs=item_costs,
                                      max_tokens_per_microbatch=cells.max_tokens_per_microbatch,
                                      microbatch_overhead=cells.microbatch_overhead)
    step = pipeline_step(problem, None, None, cells.num_microbatches, pipeline,
                         math.nan if cells.pipeline is None else cells.pipeline.unaware_step_time,
                         free_microbatches=free_microbatches, first_stage=parts,
                         cells=(cost, first if encoders else None, times if encoders else None))
    step = rounding_checked(step, problem, cells.num_microbatches)
    return step if cells.pipeline is not None else replace(step, unaware_step_time=step.step_time)


def unaware_time(pipeline: Pipeline, cells: MicroBatchPlan, microbatches) -> float:
    """The step of a plan made without the pipeline (its `cells` and the `microbatches`' `PassPlan`s), run through
    `pipeline` in its own order with its encoders on the first stage."""
    first = first_stage_loads(microbatches, cells.num_ranks)
    return float(_times(pipeline, cells.cell_loads.T + cells.microbatch_overhead + first, first).max())


def _times(pipeline: Pipeline, cost: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Every row's schedule time: cells costing `cost` with `first` on the first stage, (rows, M) each."""
    return replica_times(pipeline, *pipeline.stage_times(cost, first))


def microbatch_order(pipeline: Pipeline, cost: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A run order of the micro-batches (slot k runs micro-batch order[k] on every replica) of cells costing `cost`
    with first-stage parts `first`, (D, M) each, and the replicas' times in it, whose step is never slower than
    theirs in the order given:
    best-improvement swaps of two micro-batches, ranked on the CRITICAL_REPLICAS slowest replicas and kept only
    when the step over every replica falls, at most M rounds.  A micro-batch's encoders are balanced whatever its
    place, so the first-stage times move with it exactly."""
    m = cost.shape[1]
    order, times = np.arange(m), _times(pipeline, cost, first)
    pairs = np.array(list(itertools.combinations(range(m), 2)), dtype=np.int64).reshape(-1, 2)
    for _ in range(m if pairs.size else 0):
        critical = np.argsort(-times, kind="stable")[:CRITICAL_REPLICAS]
        orders = np.tile(order, (len(pairs), 1))
        rows = np.arange(len(pairs))
        orders[rows, pairs[:, 0]], orders[rows, pairs[:, 1]] = order[pairs[:, 1]], order[pairs[:, 0]]
        grids = [np.moveaxis(grid[critical][:, orders], 1, 0).reshape(-1, m) for grid in (cost, first)]
        best = orders[int(np.argmin(_times(pipeline, *grids).reshape(len(pairs), -1).max(axis=1)))]
        swapped = _times(pipeline, cost[:, best], first[:, best])
        if not swapped.max() < times.max():
            break
        order, times = best, swapped
    return order, times


def relabelled(plan: StagePlan, rank_of: np.ndarray) -> StagePlan:
    """`plan` with rank r's items run on rank `rank_of[r]` (a permutation of the ranks): the same groups, loads,
    tokens and layout within each rank, so the same makespan and caps."""
    counts = np.diff(plan.rank_offsets)
    held = np.argsort(rank_of)  # held[q]: the rank whose items rank q runs
    moved = np.argsort(np.repeat(rank_of, counts), kind="stable")
    frozen = {name: _frozen(value, value.dtype) for name, value in (
        ("destination", rank_of[plan.destination]), ("rank_items", plan.rank_items[moved]),
        ("rank_offsets", np.concatenate(([0], np.cumsum(counts[held])))), ("loads", plan.loads[held]),
        ("tokens", plan.tokens[held]))}
    return replace(plan, **frozen)


def spread_ranks(microbatches, cells: MicroBatchPlan, pipeline: Pipeline) -> tuple[dict, np.ndarray]:
    """How `spread_encoders` relabels `microbatches`' balanced encoder stages across the ranks, so that every
    replica's first stage works about as long over the step, and the first-stage loads (D, M) it gives them (those
    of its plans, `first_stage_loads`, without composing them): every replica starts at its cells' share
    Σ_m (llm(r, m) + o) / P plus the encoders left where they are (algorithm "none": on their samples' ranks),
    then, the (micro-batch, stage) blocks taken heaviest group first, a block's groups heaviest first go to the
    replicas least loaded so far (ties by index).  A micro-batch's encoders are balanced per stage without a look
    at the other stages and micro-batches, so its heavy groups land on the same low ranks in every one.
    Returns ({(micro-batch, stage): rank_of}, loads); ({}, None) where no block moves."""
    num_ranks = cells.cell_loads.shape[1]
    total = (cells.cell_loads.sum(axis=0) + cells.num_microbatches * cells.microbatch_overhead) / pipeline.stages
    blocks = []
    for index, micro in enumerate(microbatches):
        for stage, plan in enumerate(micro.stage_plans[:-1]):
            if plan.algorithm == "none" or not plan.loads.any():
                total = total + plan.loads
            else:
                blocks.append((index, stage, plan.loads))
    if not blocks:
        return {}, None
    rank_of = {}
    for index, stage, loads in sorted(blocks, key=lambda block: -float(block[2].max())):
        groups = np.argsort(-loads, kind="stable")
        replicas = np.argsort(total, kind="stable")
        ranks = np.empty(num_ranks, dtype=np.int64)
        ranks[groups] = replicas
        total = total + loads[np.argsort(ranks)]
        rank_of[index, stage] = ranks
    return rank_of, first_stage_loads(microbatches, num_ranks, rank_of)


def spread_encoders(microbatches, rank_of: dict) -> tuple:
    """`microbatches` with each balanced encoder stage's groups relabelled across the ranks (`relabelled`) as
    `spread_ranks` chose (`rank_of`)."""
    spread = []
    for index, micro in enumerate(microbatches):
        plans = tuple(plan if (index, stage) not in rank_of else relabelled(plan, rank_of[index, stage])
                      for stage, plan in enumerate(micro.stage_plans[:-1]))
        spread.append(compose(micro.batch, micro.stages, (*plans, micro.stage_plans[-1])))
    return tuple(spread)


def _ordered(pipeline: Pipeline, cells: MicroBatchPlan, first: np.ndarray, reorder: bool
             ) -> tuple[np.ndarray, np.ndarray]:
    """(run order, replicas' times in it) of `cells` with first-stage loads `first`: `microbatch_order` for cells
    planned for the pipeline or where `reorder`, else their own order."""
    cost = cells.cell_loads.T + cells.microbatch_overhead + first
    if cells.pipeline is None and not reorder:
        return np.arange(cells.num_microbatches), _times(pipeline, cost, first)
    return microbatch_order(pipeline, cost, first)


def arranged(cells: MicroBatchPlan, microbatches: tuple, options, reorder: bool = False) -> tuple | None:
    """How `planned_run` runs a plan through `options.pipeline`: (run order, the replicas' times in it, the
    `spread_ranks` relabelling or None), None where no encoder works.  With `balance_encoders` the encoders as
    balanced, or spread where that step (ordered) is at least SPREAD_GAIN faster; cells planned for the pipeline
    (or any, where `reorder`) in `microbatch_order`, else in their own order."""
    pipeline = options.pipeline
    first = first_stage_loads(microbatches, cells.num_ranks)
    if not first.any():
        return None
    order, times = _ordered(pipeline, cells, first, reorder)
    rank_of, moved = spread_ranks(microbatches, cells, pipeline) if options.balance_encoders else ({}, None)
    if rank_of:
        timed = _ordered(pipeline, cells, moved, reorder)
        if timed[1].max() < (1.0 - SPREAD_GAIN) * times.max():
            return (*timed, rank_of)
    return order, times, None


def planned_run(batch: Batch, stages, *, cells: MicroBatchPlan, microbatches: tuple, microbatch_samples: tuple,
                options, reorder: bool = False, arrangement: tuple | None = None) -> dict:
    """`StepPlan`'s fields of a plan through `options.pipeline` (a `PlanOptions`) as `arranged` (or `arrangement`,
    its result where the caller has it): the encoders spread where it says (`spread_encoders`), the micro-batches of
    cells planned for the pipeline (or any, where `reorder`) run in its order (cells, pass plans and samples
    relabelled; `cells.pipeline` timed again in that order, without the encoders), and `pipeline`: the step as it
    runs (`planned_step`)."""
    pipeline, free, times = options.pipeline, options.num_microbatches is None, None
    pipeline.check_microbatches(cells.num_microbatches, "cells.num_microbatches")
    arrangement = arranged(cells, microbatches, options, reorder) if arrangement is None else arrangement
    if arrangement is not None:
        order, times, rank_of = arrangement
        if rank_of is not None:
            microbatches = spread_encoders(microbatches, rank_of)
        if cells.pipeline is None and not reorder:
            times = None
        elif np.any(order != np.arange(order.size)):
            cells = _reordered(batch, stages, cells, order, free)
            microbatches, microbatch_samples = (tuple(run[k] for k in order)
                                                for run in (microbatches, microbatch_samples))
    return dict(cells=cells, microbatches=microbatches, microbatch_samples=microbatch_samples,
                pipeline=planned_step(batch, stages, cells, microbatches, pipeline, free, times))


def faster_run(batch: Batch, stages, options, run: dict, unaware, placed, gpus_per_node: int) -> dict:
    """`run` (`planned_run`'s fields of cells planned for the pipeline, whose encoders work), its step's
    `unaware_step_time` the step of `unaware` (the `StepPlan` planned without the pipeline and without placements
    for the same M, or None where that found no plan: NaN) in its own order (`unaware_time`); or, where `unaware`
    run through the pipeline in its best order (`arranged(..., reorder=True)`) is strictly faster, that run with
    the same figure, so the step returned is never slower than the PP-unaware plan's.  With a placement, its cells'
    micro-batches with their encoders planned under it (`placed(batch, M, cells)`, a `StepPlan` or None) are run
    instead where they too are faster and within that figure, and either's replicas are `placed_run`.  The cells
    planner sees the LLM's costs alone where the encoders are balanced per micro-batch (`cell_costs`), so the
    PP-unaware cells can run faster (vision, D = 4, P = 2: 1.8 %).  Deterministic (ties keep `run`); a candidate is
    built (composed, timed) only where its replicas' times show it faster."""
    if unaware is None:
        return {**run, "pipeline": replace(run["pipeline"], unaware_step_time=math.nan)}
    figure = unaware_time(options.pipeline, unaware.cells, unaware.microbatches)
    step = run["pipeline"].step_time
    if step > run["pipeline"].lower_bound:  # the bound holds for every plan: at it no plan is faster
        other = _faster(batch, stages, options, unaware, step, math.inf)
        if other is not None and (options.placement, options.padded_placement) != (None, None):
            local = placed(batch, unaware.num_microbatches, unaware.cells)
            local = None if local is None else _faster(batch, stages, options, local, step, figure)
            other = placed_run(other if local is None else local, gpus_per_node)
        if other is not None:
            run = other
    return {**run, "pipeline": replace(run["pipeline"], unaware_step_time=figure)}


def _faster(batch: Batch, stages, options, plan, below: float, at_most: float) -> dict | None:
    """`planned_run`'s fields of `plan` (a `StepPlan` not planned for the pipeline) in its best order where its step
    is below `below` and at most `at_most`, else None (not built where its arrangement's times show it)."""
    arrangement = arranged(plan.cells, plan.microbatches, options, reorder=True)
    if arrangement is not None and not (arrangement[1].max() < below and arrangement[1].max() <= at_most):
        return None
    run = planned_run(batch, stages, cells=plan.cells, microbatches=plan.microbatches,
                      microbatch_samples=plan.microbatch_samples, options=options, reorder=True,
                      arrangement=arrangement)
    return run if run["pipeline"].step_time < below and run["pipeline"].step_time <= at_most else None


def placed_run(run: dict, gpus_per_node: int) -> dict:
    """`run` (`planned_run`'s fields) with its replicas put on the ranks that keep the most input bytes in place,
    node bytes first (`assign_groups` over every micro-batch's input exchange): one permutation of the replicas for
    every stage of every micro-batch, so every time is the same (the replica times permuted alike) and so is every
    embedding exchange's traffic (both of its ends move together)."""
    cells, microbatches = run["cells"], run["microbatches"]
    parts = [micro.input_exchange() for micro in microbatches]
    rank_of = assign_groups(*(np.concatenate([getattr(part, name) for part in parts])
                              for name in ("destination", "source", "item_bytes")), cells.num_ranks, gpus_per_node)
    held = np.argsort(rank_of)  # held[q]: the replica rank q runs
    fields = dict(rank=rank_of[cells.rank], cell_loads=cells.cell_loads[:, held],
                  cell_tokens=cells.cell_tokens[:, held])
    for array in fields.values():
        array.setflags(write=False)
    times = run["pipeline"].replica_times[held]
    times.setflags(write=False)
    moved = tuple(compose(micro.batch, micro.stages, tuple(relabelled(plan, rank_of) for plan in micro.stage_plans))
                  for micro in microbatches)
    return {**run, "cells": replace(cells, **fields), "microbatches": moved,
            "pipeline": replace(run["pipeline"], replica_times=times)}


def _reordered(batch: Batch, stages, cells: MicroBatchPlan, order: np.ndarray, free: bool) -> MicroBatchPlan:
    """`cells` run in `order`: slot k holds micro-batch order[k], `cells.pipeline` (cells planned for the pipeline)
    timed again in that order without the encoders (M free when `free`)."""
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    microbatch = position[cells.microbatch]
    fields = dict(microbatch=microbatch, cell_loads=cells.cell_loads[order], cell_tokens=cells.cell_tokens[order])
    for array in fields.values():
        array.setflags(write=False)
    if cells.pipeline is None:
        return replace(cells, **fields)
    tokens = batch.sample_llm_length
    problem = make_microbatch_problem(
        tokens, batch.num_ranks, costs=stages[-1].cost.item_costs(tokens), padded=cells.padded,
        max_tokens_per_microbatch=cells.max_tokens_per_microbatch, microbatch_overhead=cells.microbatch_overhead)
    step = rounding_checked(pipeline_step(problem, cells.rank, microbatch, order.size, cells.pipeline.pipeline,
                                          cells.pipeline.unaware_step_time, free_microbatches=free,
                                          solve_seconds=cells.pipeline.solve_seconds), problem, order.size)
    return replace(cells, **fields, pipeline=step)

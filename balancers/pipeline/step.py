"""A plan's certified pipeline step (`PipelineStep`): every replica's schedule time over its cells' costs, the step
(their max), the bound of `bounds.step_bound` and the status, as the planner (`planner`) reports it and as any plan of
the same cells is timed (`pipeline_step`: the PP-unaware plan and the peers in `benchmarks/bench_pipeline.py`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..microbatch.plan import MicroBatchProblem, cell_accounts, cell_loads
from ..problem import Status
from .bounds import step_bound
from .schedules import replica_times
from .spec import Pipeline


@dataclass(frozen=True, eq=False)
class PipelineStep:
    """A plan's pipeline step: every replica's schedule time, the step (their max), a bound, a status.

    Micro-batch m of the plan runs in slot m of every replica.  `unaware_step_time` is the
    step of the plain plan it started from, in that plan's order: the cells planned for M
    (`microbatch.auto.solve_each`), not always the plan `balance_microbatches` returns without `pipeline=`,
    which may keep the fewest micro-batches' plan or the joint greedy's where their Σ_m max is lower (probe25
    P25-01: up to 4.8 % apart on small instances; issue 28's figures time that call's plan by the event
    model, `benchmarks/bench_pipeline.py`).  Every field is computed by the planner (a user reads them all:
    `to_json`), the replica times read-only.
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


def start_cells(problem: MicroBatchProblem, replica: np.ndarray, slot: np.ndarray, num_microbatches: int,
                accounts: tuple | None) -> tuple[np.ndarray, np.ndarray | None]:
    """A planner's start's cells (cost, tokens), (D, M): `cell_costs` of its `cell_accounts` where given, else the
    costs summed in item order and tokens None (the search alone needs them)."""
    if accounts is not None:
        return cell_costs(problem, replica, slot, num_microbatches, accounts)
    d = problem.num_ranks
    loads = cell_loads(problem, slot * d + replica, d * num_microbatches).reshape(num_microbatches, d)
    return loads.T + problem.microbatch_overhead, None


def first_stage_sums(first_stage: np.ndarray | None, replica: np.ndarray, slot: np.ndarray, num_ranks: int,
                     num_microbatches: int) -> np.ndarray | None:
    """The cells' first-stage parts (D, M), summed in item order like `cell_costs`; None without them."""
    if first_stage is None:
        return None
    size = num_ranks * num_microbatches
    return np.bincount(slot * num_ranks + replica, weights=first_stage, minlength=size).reshape(-1, num_ranks).T


def pipeline_step(problem: MicroBatchProblem, replica: np.ndarray, slot: np.ndarray, num_microbatches: int,
                  pipeline: Pipeline, unaware_step_time: float, *,
                  free_microbatches: bool = False, solve_seconds: float = 0.0, first_stage: np.ndarray | None = None,
                  cells=None) -> PipelineStep:
    """The certified `PipelineStep` of these cells (`planner`: its step, bound and status): the bound holds for every
    plan with this M, or with any M from the fewest that fit when `free_microbatches`.  `unaware_step_time`: the plain
    plan's step.  `cells`: their (costs, first-stage parts, replica times) as computed here, when the caller has them
    (`arrange`)."""
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
    bound = min(step, certified_bound(problem, pipeline, counts, first_stage))
    stages = pipeline.stages if forward.ndim == 3 else 1  # uniform stages: one stage's times stand for all
    work = np.ascontiguousarray(forward).sum() + np.ascontiguousarray(backward).sum()  # one order, whatever the layout
    busy = min(1.0, float(work) / (problem.num_ranks * stages * step)) if step > 0 else 1.0  # sums may round up
    times.setflags(write=False)
    return PipelineStep(pipeline=pipeline, replica_times=times, step_time=step, lower_bound=bound,
                        status=Status.OPTIMAL if step == bound else Status.FEASIBLE,
                        unaware_step_time=unaware_step_time, busy_fraction=busy, solve_seconds=solve_seconds)


def certified_bound(problem: MicroBatchProblem, pipeline: Pipeline, counts: np.ndarray, first_stage: np.ndarray | None
           ) -> float:
    """`bounds.step_bound` of the problem's items over these micro-batch counts."""
    return step_bound(pipeline, problem.item_costs, problem.num_ranks, counts, problem.microbatch_overhead,
                      first_stage, *((None, None) if first_stage is not None else (problem.total_cost,
                                                                                   problem.sorted_costs)))

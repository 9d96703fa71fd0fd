"""Pipeline schedules as the oracle: a discrete-event simulation of each schedule, and brute force.

Written from the schedules' published rules, independently of the planner's recurrence
(`balancers.pipeline.schedules`): every stage follows a rule, not a precomputed list.  A
stage holding nf forwards and nb backwards done runs a forward next while forwards remain
and nf - nb <= W, else a backward, W its warm-up count:

    gpipe        W = M (every forward first)
    1f1b         W = P - 1 - s (at most P - s micro-batches in flight on stage s)
    interleaved  W = 2·(P - s - 1) + (v - 1)·P, or M·v when M == P (Megatron-LM), with the
                 n-th forward on model chunk (n mod P·v) // P of micro-batch (n // (P·v))·P + n mod P
                 (backwards: chunk v - 1 - that)

Time advances from event to event (an operation ending); at each event every idle stage
starts its next operation when that operation's input has arrived.

    simulate_pipeline       one replica's step time and each stage's busy time
    brute_force_pipeline    the least step time over every assignment of items to the cells
                            (replica, slot) within the token budget, slot = run order
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import numpy as np

from ..balancers.pipeline import Pipeline
from ..balancers.problem import as_lengths
from ..balancers.validation import as_int, as_real

BRUTE_FORCE_MAX_PIPELINE_PLANS = 200_000


@dataclass(frozen=True)
class PipelineRun:
    """One replica's simulated step: its time and each stage's busy seconds."""

    step_time: float
    busy: tuple[float, ...]


def _warmup(pipeline: Pipeline, num_microbatches: int, stage: int) -> int:
    p, v = pipeline.stages, pipeline.virtual_stages
    if pipeline.schedule == "gpipe":
        return num_microbatches
    if pipeline.schedule == "1f1b":
        return p - 1 - stage
    return num_microbatches * v if num_microbatches == p else 2 * (p - stage - 1) + (v - 1) * p


def _operation(pipeline: Pipeline, stage: int, n: int, backward: bool) -> tuple[int, int]:
    """(micro-batch slot, model stage) of a stage's n-th forward or backward."""
    p, v = pipeline.stages, pipeline.virtual_stages
    if v == 1:
        return n, stage
    chunk = (n % (p * v)) // p
    return (n // (p * v)) * p + n % p, ((v - 1 - chunk) if backward else chunk) * p + stage


def _numbers(values, name: str, shape: str, ndim: int) -> np.ndarray:
    """`values` as a float64 array of `ndim` dimensions (`shape` says which) of finite non-negative numbers;
    ValueError naming `name` otherwise (a NaN duration never ends the event loop)."""
    try:
        array = np.asarray(values)
        if array.dtype.kind not in "biuf":  # numpy would read "1.5" as a number
            raise TypeError
        array = array.astype(np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be {shape}; got a ragged or non-numeric {type(values).__name__}") from None
    if array.ndim != ndim:
        raise ValueError(f"`{name}` must be {shape}; got shape {array.shape}")
    bad = np.argwhere(~(np.isfinite(array) & (array >= 0)))
    if bad.size:
        where = [int(index) for index in bad[0]]
        raise ValueError(f"`{name}` must hold finite non-negative numbers; got {array[tuple(where)]} at {where}")
    return array


def _check_pipeline(pipeline) -> None:
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"`pipeline` must be a Pipeline (orchmllm.balancers.pipeline); got {type(pipeline).__name__}")


def _durations(pipeline: Pipeline, forward, backward) -> tuple[np.ndarray, np.ndarray]:
    """`simulate_pipeline`'s seconds checked: (P, M) arrays, the same shape, M a count the schedule runs."""
    _check_pipeline(pipeline)
    shape = f"a (P={pipeline.stages}, M) array of seconds, one row per stage"
    forward = _numbers(forward, "forward", shape, 2)
    if forward.shape[0] != pipeline.stages:
        raise ValueError(f"`forward` must be {shape}; got shape {forward.shape}")
    backward = _numbers(backward, "backward", f"`forward`'s shape {forward.shape}", 2)
    if backward.shape != forward.shape:
        raise ValueError(f"`backward` must have `forward`'s shape {forward.shape}; got {backward.shape}")
    if forward.shape[1]:
        pipeline.check_microbatches(forward.shape[1], "M (the columns of `forward`)")
    with np.errstate(over="ignore"):
        total = forward.sum() + backward.sum()
    if not np.isfinite(total):  # a step is at most every duration end to end
        raise ValueError("`forward` and `backward` must sum to a finite number of seconds (a step time could "
                         "overflow to inf)")
    return forward, backward


def simulate_pipeline(pipeline: Pipeline, forward, backward) -> PipelineRun:
    """Event simulation of one replica: forward, backward of shape (P, M) (seconds of slot k on stage s).

    >>> from orchmllm.balancers.pipeline import Pipeline
    >>> simulate_pipeline(Pipeline(stages=2), [[1, 1], [1, 1]], [[2, 2], [2, 2]]).step_time
    9.0
    """
    seconds = dict(zip((False, True), _durations(pipeline, forward, backward)))
    p, m = seconds[False].shape
    v, last = pipeline.virtual_stages, pipeline.stages * pipeline.virtual_stages - 1
    total = m * v
    done: dict[tuple[bool, int, int], float] = {}
    started = [{False: 0, True: 0} for _ in range(p)]
    running: list[tuple[float, int, tuple[bool, int, int]]] = []  # (end, stage, operation), a heap
    idle, busy, now = set(range(p)), [0.0] * p, 0.0
    while len(done) < 2 * total * p:
        for stage in sorted(idle):
            count = started[stage]
            backward = not (count[False] < total and count[False] - count[True] <= _warmup(pipeline, m, stage))
            if count[backward] >= total:
                continue
            slot, g = _operation(pipeline, stage, count[backward], backward)
            if backward:
                need = (True, slot, g + 1) if g < last else (False, slot, g)
            else:
                need = (False, slot, g - 1) if g > 0 else None
            if need is not None and done.get(need, np.inf) > now:
                continue
            duration = seconds[backward][stage, slot]
            if v > 1:
                duration = duration / v
            heapq.heappush(running, (now + duration, stage, (backward, slot, g)))
            busy[stage] += float(duration)
            count[backward] += 1
            idle.discard(stage)
        if not running:
            raise RuntimeError(f"the {pipeline.schedule} schedule deadlocked at time {now} (a bug of the oracle)")
        now = running[0][0]
        while running and running[0][0] == now:
            _, stage, operation = heapq.heappop(running)
            done[operation] = now
            idle.add(stage)
    return PipelineRun(step_time=float(max(done.values())) if done else 0.0, busy=tuple(busy))


@dataclass(frozen=True, eq=False)
class PipelineOptimum:
    """The least step time over every plan with `num_microbatches` slots per replica, and one
    plan reaching it (replica and slot per item); step_time None when nothing fits the budget."""

    step_time: float | None
    replica: np.ndarray | None
    slot: np.ndarray | None
    num_microbatches: int


def replica_step(pipeline: Pipeline, cell_costs, first_stage=None) -> float:
    """One replica's simulated time for cells costing `cell_costs` in run order: every stage runs
    c / (P·(1 + k)) forward and k times that backward, or with `first_stage` parts e of the cells,
    (c - e) / (P·(1 + k)) on every stage and e / (1 + k) more on the first (`Pipeline.stage_times`)."""
    _check_pipeline(pipeline)
    costs = _numbers(cell_costs, "cell_costs", "a 1-D sequence of the cells' costs in run order", 1)
    first = np.zeros_like(costs) if first_stage is None else \
        _numbers(first_stage, "first_stage", f"`cell_costs`' shape {costs.shape}", 1)
    if first.shape != costs.shape:
        raise ValueError(f"`first_stage` must have `cell_costs`' shape {costs.shape}; got {first.shape}")
    above = np.flatnonzero(first > costs)
    if above.size:  # a part of the cell's cost: the rest is spread over the stages
        i = int(above[0])
        raise ValueError(f"`first_stage` must be at most `cell_costs` (the first stage's part of each cell's cost); "
                         f"got {first[i]} > {costs[i]} at [{i}]")
    share = 1.0 / (pipeline.stages * (1.0 + pipeline.backward_factor))  # the same float products as the planner's
    forward = np.tile((costs - first) * share, (pipeline.stages, 1))
    forward[0] += first * (pipeline.stages * share)
    return simulate_pipeline(pipeline, forward, forward * pipeline.backward_factor).step_time


def brute_force_pipeline(pipeline: Pipeline, item_costs, lengths, num_ranks: int, num_microbatches: int,
                         max_tokens_per_microbatch: int, overhead: float = 0.0, first_stage=None) -> PipelineOptimum:
    """Every assignment of the items to the cells (replica, slot), each within `max_tokens_per_microbatch`
    tokens, each replica simulated (`replica_step`, with the items' `first_stage` parts when given); the
    least max over replicas (ties: the first found).

    >>> from orchmllm.balancers.pipeline import Pipeline
    >>> brute_force_pipeline(Pipeline(stages=2), [3.0, 3.0], [3, 3], 1, 2, 3).step_time
    4.5
    """
    _check_pipeline(pipeline)
    lengths = as_lengths(lengths)
    shape = f"a 1-D sequence of one cost per item, as `lengths` ({lengths.size})"
    item_costs = _numbers(item_costs, "item_costs", shape, 1)
    first = np.zeros_like(item_costs) if first_stage is None else _numbers(first_stage, "first_stage", shape, 1)
    for name, array in (("item_costs", item_costs), ("first_stage", first)):
        if array.shape != lengths.shape:
            raise ValueError(f"`{name}` must be {shape}; got shape {array.shape}")
    num_ranks = as_int(num_ranks, "num_ranks", minimum=1)
    num_microbatches = pipeline.check_microbatches(num_microbatches)
    max_tokens_per_microbatch = as_int(max_tokens_per_microbatch, "max_tokens_per_microbatch", minimum=1)
    overhead = as_real(overhead, "overhead")
    cells = num_ranks * num_microbatches
    if cells ** item_costs.size > BRUTE_FORCE_MAX_PIPELINE_PLANS:
        raise ValueError(f"{cells}^{item_costs.size} plans is beyond BRUTE_FORCE_MAX_PIPELINE_PLANS = "
                         f"{BRUTE_FORCE_MAX_PIPELINE_PLANS}; use fewer items or cells")
    times: dict[tuple, float] = {}
    best, best_cells = None, None
    for cell_of in itertools.product(range(cells), repeat=item_costs.size):
        cell_of = np.array(cell_of, dtype=np.int64)
        if np.bincount(cell_of, weights=lengths, minlength=cells).max(initial=0) > max_tokens_per_microbatch:
            continue
        costs = np.bincount(cell_of, weights=item_costs, minlength=cells).reshape(num_ranks, -1) + overhead
        firsts = np.bincount(cell_of, weights=first, minlength=cells).reshape(num_ranks, -1)
        step = 0.0
        for row in zip(map(tuple, costs.tolist()), map(tuple, firsts.tolist())):
            if row not in times:
                times[row] = replica_step(pipeline, *row)
            step = max(step, times[row])
        if best is None or step < best:
            best, best_cells = step, cell_of
    if best is None:
        return PipelineOptimum(None, None, None, num_microbatches)
    return PipelineOptimum(best, best_cells // num_microbatches, best_cells % num_microbatches, num_microbatches)

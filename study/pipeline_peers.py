"""Peers of the pipeline-aware cell planner, reimplemented from their public descriptions.

    dynapipe_style  DynaPipe (Jiang et al., "DynaPipe: Optimizing Multi-task Training through
                    Dynamic Pipelines", EuroSys 2024): dynamic micro-batching per pipeline
                    replica.  Every replica keeps the samples it drew (`sources`), sorts them
                    by length and cuts them, contiguously, into M micro-batches by dynamic
                    programming on its pipeline-time estimate Σ t + (P - 1)·max t, which for a
                    fixed M and a fixed Σ is the largest micro-batch's cost: the least limit L
                    at which greedy contiguous groups (each within L and the token budget T)
                    number at most M (bisection); the micro-batches run shortest first.  M is
                    the caller's, or the most a replica's own tokens need under T when more
                    (every replica runs the same M).  Its
                    memory-aware padding model and its adaptive schedule are left out (the cost
                    here is unpadded and the schedule the caller's).
    unaware         `balance_microbatches` without `pipeline=`: Σ_m max_r load, run in its own order.

Each returns a `MicroBatchPlan` (micro-batch m runs m-th on every replica), judged on one
footing by `balancers.pipeline.planner.pipeline_step`.
"""

from __future__ import annotations

import numpy as np

from ..balancers import MicroBatchPlan, balance_microbatches
from ..balancers.microbatch.api import make_microbatch_problem
from ..balancers.microbatch.plan import MicroBatchProblem, MicroBatchResult, make_microbatch_plan

BISECTIONS = 60


def _groups(costs: np.ndarray, lengths: np.ndarray, limit: float, budget: int) -> np.ndarray | None:
    """Greedy contiguous groups within `limit` (cost) and `budget` (tokens): each group's start, or
    None when one item alone passes either."""
    cost_sum, token_sum = np.concatenate(([0.0], np.cumsum(costs))), np.concatenate(([0], np.cumsum(lengths)))
    starts, start = [], 0
    while start < costs.size:
        by_cost = np.searchsorted(cost_sum, cost_sum[start] + limit, side="right") - 1
        by_tokens = np.searchsorted(token_sum, token_sum[start] + budget, side="right") - 1
        end = min(by_cost, by_tokens)
        if end <= start:
            return None
        starts.append(start)
        start = end
    return np.array(starts, dtype=np.int64)


def _split(costs: np.ndarray, lengths: np.ndarray, num_microbatches: int, budget: int) -> np.ndarray:
    """Micro-batch of each item (already sorted) of one replica: the least limit of M groups (see the module)."""
    low, high = (float(costs.max()) if costs.size else 0.0), float(costs.sum()) + 1.0
    for _ in range(BISECTIONS):
        middle = (low + high) / 2
        starts = _groups(costs, lengths, middle, budget)
        if starts is not None and starts.size <= num_microbatches:
            high = middle
        else:
            low = middle
    starts = _groups(costs, lengths, high, budget)
    return np.searchsorted(starts, np.arange(costs.size), side="right") - 1


def dynapipe_style(problem: MicroBatchProblem, sources: np.ndarray, num_microbatches: int) -> MicroBatchPlan:
    """DynaPipe-style cells (module docstring): every replica's own samples, sorted and cut contiguously
    into `num_microbatches`, or the most any replica's tokens need under T when that is more."""
    mine = [np.flatnonzero(sources == replica) for replica in range(problem.num_ranks)]
    mine = [ids[np.lexsort((ids, problem.lengths[ids]))] for ids in mine]  # shortest first, ties by index
    unlimited = float(problem.item_costs.sum()) + 1.0
    m = max([num_microbatches, *(_groups(problem.item_costs[ids], problem.lengths[ids], unlimited,
                                         problem.max_tokens_per_microbatch).size for ids in mine)])
    microbatch = np.empty(problem.num_items, dtype=np.int64)
    for ids in mine:
        microbatch[ids] = _split(problem.item_costs[ids], problem.lengths[ids], m, problem.max_tokens_per_microbatch)
    result = MicroBatchResult(rank=np.asarray(sources, dtype=np.int64).copy(), microbatch=microbatch)
    return make_microbatch_plan(problem, result, m, "dynapipe_style")


def pipeline_peers(lengths, num_ranks: int, *, sources, cost, max_tokens_per_microbatch: int,
                   num_microbatches: int) -> tuple[MicroBatchProblem, dict[str, MicroBatchPlan]]:
    """The canonical problem and each peer's plan of it (`unaware`, `dynapipe_style`)."""
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=max_tokens_per_microbatch,
                                      cost=cost)
    unaware = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=max_tokens_per_microbatch,
                                   cost=cost, num_microbatches=num_microbatches)
    return problem, {"unaware": unaware,
                     "dynapipe_style": dynapipe_style(problem, np.asarray(sources), num_microbatches)}

"""Micro-batched plans: the brute-force oracle and the invariant check of `balance_microbatches`.

A step of M micro-batches on D ranks has M · D cells (rank, micro-batch); it costs
Σ_m max_r load(r, m) + M · overhead, where load = Σ c_i of the cell's items (unpadded) or
count · max c_i (padded), and every cell holds at most T tokens (Σ l_i, or count · max l_i).

    brute_force_microbatches   every assignment of the items to the M · D cells
    fewest_microbatches        the smallest M at which some assignment fits T
    check_microbatch_plan      every invariant of a `MicroBatchPlan`, recomputed from the input
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..balancers import MicroBatchPlan, Status
from ..balancers.pipeline.spec import simulated_exactly
from ..balancers.problem import as_lengths, as_num_ranks
from ..balancers.validation import as_bool, as_int, as_real
from .checks import (check_optimum_type, check_plan_type, items_of, rounding_apart, step_complaint,
                     wrong_field, wrong_status)
from .oracles import _all_plans, _item_costs, _per_rank
from .pipeline import replica_step


@dataclass(frozen=True, eq=False)
class MicroBatchOptimum:
    """The optimal step cost at `num_microbatches` micro-batches and one plan reaching it.

    `step_cost`, `rank` and `microbatch` are None when no assignment fits the budget.
    """

    step_cost: float | None
    rank: np.ndarray | None
    microbatch: np.ndarray | None
    num_microbatches: int
    method: str = "brute_force_microbatches"

    @property
    def feasible(self) -> bool:
        return self.step_cost is not None

    def to_json(self) -> dict:
        return {"step_cost": self.step_cost, "num_microbatches": self.num_microbatches, "method": self.method,
                "rank": None if self.rank is None else self.rank.tolist(),
                "microbatch": None if self.microbatch is None else self.microbatch.tolist()}


def _cell_accounts(plans: np.ndarray, cells: int, lengths: np.ndarray, item_costs: np.ndarray, padded: bool):
    """(loads, tokens) of every cell of every plan, (P, cells), accumulated in item order."""
    if not padded:
        return _per_rank(plans, cells, item_costs, np.add), _per_rank(plans, cells, lengths, np.add)
    counts = _per_rank(plans, cells, np.ones(lengths.size, dtype=np.int64), np.add)
    return (counts * _per_rank(plans, cells, item_costs, np.maximum),
            counts * _per_rank(plans, cells, lengths, np.maximum))


def brute_force_microbatches(lengths, num_ranks, max_tokens_per_microbatch, num_microbatches, *, cost=None,
                             costs=None, padded=False, microbatch_overhead=0.0) -> MicroBatchOptimum:
    """The optimum over all (M · D)**n assignments of the items to cells, within the budget.

    Item i goes to rank `rank[i]`, micro-batch `microbatch[i]`; the step cost is summed as
    `MicroBatchPlan.step_cost` is (cells in item order, then a correctly rounded Σ_m), so
    optima compare with `==`; the first optimal assignment in enumeration order is returned.
    `cost` / `costs` as in `balance_microbatches` (padded cells cost count · max item cost).

    >>> optimum = brute_force_microbatches([6, 5, 4, 3, 2, 2], 2, 8, 2)
    >>> optimum.step_cost, optimum.rank.tolist(), optimum.microbatch.tolist()
    (11.0, [1, 1, 0, 0, 0, 0], [1, 0, 1, 0, 1, 0])
    >>> brute_force_microbatches([6, 5, 4, 3, 2, 2], 2, 8, 1).feasible
    False
    """
    lengths = as_lengths(lengths)
    num_ranks = as_int(num_ranks, "num_ranks", minimum=1)
    budget = as_int(max_tokens_per_microbatch, "max_tokens_per_microbatch", minimum=1)
    m = as_int(num_microbatches, "num_microbatches", minimum=1)
    padded, overhead = as_bool(padded, "padded"), as_real(microbatch_overhead, "microbatch_overhead")
    item_costs = _item_costs(lengths, cost, costs)
    cells = m * num_ranks
    best, best_plan = math.inf, None
    for plans in _all_plans(lengths.size, cells):
        loads, tokens = _cell_accounts(plans, cells, lengths, item_costs, padded)
        fits = tokens.max(axis=1) <= budget
        if not fits.any():
            continue
        maxima = loads.reshape(-1, m, num_ranks).max(axis=2)
        rough = np.where(fits, maxima.sum(axis=1), math.inf)
        # np.sum may round differently from fsum: settle the near-minimal rows exactly.
        for row in np.flatnonzero(rough <= rough.min() * (1 + 1e-9)):
            value = math.fsum(maxima[row].tolist() + [m * overhead])
            if value < best:
                best, best_plan = value, plans[row].copy()
    if best_plan is None:
        return MicroBatchOptimum(None, None, None, m)
    rank, microbatch = best_plan % num_ranks, best_plan // num_ranks
    for array in (rank, microbatch):
        array.setflags(write=False)
    return MicroBatchOptimum(best, rank, microbatch, m)


def fewest_microbatches(lengths, num_ranks, max_tokens_per_microbatch, *, padded=False) -> int:
    """The smallest M at which some assignment of the items to M · D cells fits the budget.

    >>> fewest_microbatches([6, 5, 4, 3, 2, 2], 2, 8)
    2
    """
    lengths = as_lengths(lengths)
    budget = as_int(max_tokens_per_microbatch, "max_tokens_per_microbatch", minimum=1)
    if int(lengths.max()) > budget:
        raise ValueError(f"no number of micro-batches fits: an item holds {int(lengths.max())} tokens > "
                         f"max_tokens_per_microbatch={budget}")
    for m in range(1, lengths.size + 1):  # one item per cell always fits
        if brute_force_microbatches(lengths, num_ranks, budget, m, padded=padded).feasible:
            return m
    raise AssertionError("unreachable: one item per micro-batch fits the budget")


def _fail(plan: MicroBatchPlan, message: str) -> None:
    raise AssertionError(f"micro-batch plan of {plan.algorithm!r} ({items_of(plan)} items, {plan.num_ranks} ranks, "
                         f"{plan.num_microbatches} micro-batches): {message}")


def _check_pipeline_step(plan: MicroBatchPlan, loads: np.ndarray, item_costs: np.ndarray, first_stage_costs) -> None:
    """`plan.pipeline` against the event simulation (`replica_step`) of every replica's cells (load + overhead, in
    micro-batch order; with `first_stage_costs`, the items' first-stage parts summed per cell)."""
    step = plan.pipeline
    m, num_ranks = loads.shape
    first = np.zeros(loads.shape)
    if first_stage_costs is not None:
        parts = np.asarray(first_stage_costs, dtype=np.float64)
        if parts.shape != (plan.num_items,):
            raise ValueError(f"`first_stage_costs` must hold one cost per item ({plan.num_items}); got shape "
                             f"{parts.shape}")
        first = np.bincount(plan.microbatch * num_ranks + plan.rank, weights=parts,
                            minlength=m * num_ranks).reshape(m, num_ranks)
    simulated = np.array([replica_step(step.pipeline, loads[:, r] + plan.microbatch_overhead, first[:, r])
                          for r in range(num_ranks)])
    reported = np.asarray(step.replica_times, dtype=np.float64)
    terms = plan.num_items + 4 * m * step.pipeline.stages * step.pipeline.virtual_stages
    if reported.shape != simulated.shape or any(rounding_apart(a, b, terms) for a, b in zip(reported, simulated)):
        _fail(plan, f"pipeline replica times {reported.tolist()} differ from the event simulation's "
                    f"{simulated.tolist()}")
    if step.step_time != (float(reported.max()) if reported.size else 0.0):
        _fail(plan, f"pipeline step time {step.step_time} is not the slowest replica's {reported.max(initial=0.0)}")
    if not 0 <= step.lower_bound <= step.step_time:
        _fail(plan, f"pipeline lower bound {step.lower_bound} is not in [0, step time {step.step_time}]")
    meet = step.step_time == step.lower_bound
    if wrong_status(step.status) or (step.status is Status.OPTIMAL and not meet) or (
            meet and step.status is not Status.OPTIMAL and simulated_exactly(
                step.pipeline, step.step_time, np.append(item_costs, plan.microbatch_overhead), m)):
        _fail(plan, f"pipeline status {step.status!r} with step time {step.step_time} and bound {step.lower_bound}")


def check_microbatch_plan(plan: MicroBatchPlan, lengths, num_ranks: int, max_tokens_per_microbatch: int, *,
                          cost=None, costs=None, padded=False, optimum: MicroBatchOptimum | None = None,
                          first_stage_costs=None) -> None:
    """Raise AssertionError unless `plan` is a certified micro-batch plan of this input.

    Checked from the input alone: one cell (rank in [0, D), micro-batch in [0, M)) per item;
    cell loads (in item order) and tokens exact; every cell within the budget; step cost =
    Σ_m max_r load + M · overhead; 0 <= bound <= step cost; `optimal` iff they are equal.
    With `plan.pipeline`: every replica's time is the event simulation of its cells (`replica_step`; pass the
    items' `first_stage_costs` when the plan was made with them), the step their max, 0 <= bound <= step,
    `optimal` only if they are equal, and wherever they are unless float rounding at the step's scale could make
    them meet (the planners' rule).
    Against `optimum` (at the plan's M): step cost >= optimum >= bound, equal when optimal.

    >>> from orchmllm import balance_microbatches
    >>> plan = balance_microbatches([6, 5, 4, 3, 2, 2], 2, max_tokens_per_microbatch=8)
    >>> check_microbatch_plan(plan, [6, 5, 4, 3, 2, 2], 2, 8,
    ...                       optimum=brute_force_microbatches([6, 5, 4, 3, 2, 2], 2, 8, plan.num_microbatches))
    """
    check_plan_type(plan, MicroBatchPlan)
    lengths, num_ranks = as_lengths(lengths), as_num_ranks(num_ranks)
    n, m = lengths.size, plan.num_microbatches
    expected = (num_ranks, max_tokens_per_microbatch, padded)
    if (plan.num_ranks, plan.max_tokens_per_microbatch, plan.padded) != expected:
        _fail(plan, f"was made for (num_ranks, max_tokens_per_microbatch, padded) = "
                    f"{(plan.num_ranks, plan.max_tokens_per_microbatch, plan.padded)}; expected {expected}")
    check_optimum_type(optimum, MicroBatchOptimum, "brute_force_microbatches")
    for name, values, limit in (("rank", plan.rank, num_ranks), ("microbatch", plan.microbatch, m)):
        if why := wrong_field(plan, name, n):
            _fail(plan, why)
        outside = np.flatnonzero((values < 0) | (values >= limit))
        if outside.size:
            _fail(plan, f"item {outside[0]} has {name} {values[outside[0]]}, outside [0, {limit})")
    cell = plan.microbatch * num_ranks + plan.rank
    item_costs = _item_costs(lengths, cost, costs)
    loads, tokens = (a.reshape(m, num_ranks) for a in _cell_accounts(cell[None, :], m * num_ranks, lengths,
                                                                      item_costs, padded))
    for name, recomputed, reported in (("cell loads", loads, plan.cell_loads), ("cell tokens", tokens,
                                                                                plan.cell_tokens)):
        if np.shape(reported) != (m, num_ranks) or np.any(np.asarray(reported) != recomputed):
            _fail(plan, f"{name} {np.asarray(reported).tolist()} differ from the items' {recomputed.tolist()}")
    if tokens.max() > max_tokens_per_microbatch:
        r_m = np.unravel_index(int(tokens.argmax()), tokens.shape)
        _fail(plan, f"cell (rank {r_m[1]}, micro-batch {r_m[0]}) holds {int(tokens.max())} tokens > "
                    f"max_tokens_per_microbatch={max_tokens_per_microbatch}")
    step = math.fsum(loads.max(axis=1).tolist() + [m * plan.microbatch_overhead])
    if plan.step_cost != step:
        _fail(plan, f"step cost {plan.step_cost} != Σ_m max_r load + M · overhead = {step}")
    if not 0 <= plan.lower_bound <= step:
        _fail(plan, f"lower bound {plan.lower_bound} is not in [0, step cost {step}]")
    if why := wrong_status(plan.status):
        _fail(plan, why)
    if (plan.status is Status.OPTIMAL) != (step == plan.lower_bound):
        _fail(plan, f"status {plan.status} with step cost {step} and bound {plan.lower_bound}")
    if plan.pipeline is not None:
        _check_pipeline_step(plan, loads, item_costs, first_stage_costs)
    elif first_stage_costs is not None:  # as balance_microbatches refuses them without a pipeline (probe56 F10)
        raise ValueError("`first_stage_costs` apply to a plan with a pipeline (`plan.pipeline`); this plan has none")
    if optimum is None:
        return
    if optimum.num_microbatches != m:
        raise ValueError(f"`optimum` is for {optimum.num_microbatches} micro-batches; the plan has {m}")
    if not optimum.feasible:
        _fail(plan, f"{optimum.method} finds no assignment within the budget at M = {m}, yet this plan exists")
    complaint = step_complaint(plan, step, optimum.step_cost, m)
    if complaint:
        _fail(plan, complaint)

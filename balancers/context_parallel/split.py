"""`balance(..., context_parallel=spec)`: validate once, plan with splitting where it pays, certify.

    if C = {1}: return today's plan (the named algorithm), bit for bit
    T* = canonical bound over every plan that may split
    S = the split planner's plan if some item is longer than T* unsplit (a giant), or more unsplit items cost
        over T* / 2 than there are ranks (two share a rank above T* in every plan that does not split one)
    P = today's plan (when every item fits the budget unsplit), unless S · (1 + min_gain) is
        below today's lower bound (then no unsplit plan can compete)
    if no S and P > T* · (1 + min_gain): S = the local search from P (which may split)
    on tiny instances (<= EXACT_MAX_ITEMS items, <= EXACT_MAX_RANKS ranks): the exact search
        too, for plans below the best of S and P only (it prunes at that peak from the start), which
        replaces S when better and proves the optimum (its plan's, or else that best's) when it finishes
    return S if it splits an item and S · (1 + min_gain) < P (or there is no P), else P

So a plan splits only when that pays by more than min_gain, and without a giant it is today's
plan unless today's is more than min_gain above the bound and splitting beats it.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from ..plan import make_plan, run_kernel
from ..bounds import lower_bound
from ..problem import (COST_LIMIT, InfeasibleError, Problem, Status, check_cap_lower_bound, exact_sum,
                       make_problem)
from ..registry import Kind, built_in, certifies, get_algorithm
from ..validation import as_int, as_sources
from .bound import Allotment
from .plan import ContextParallelPlan, certify
from .exact import exact_split
from .pairing import crowded
from .planner import laid_out
from .search import improve
from .spec import DEFAULT_DEGREES, ContextParallel

SPLIT_ALGORITHM = "context_parallel"
"""The `algorithm` of a plan made by the split planner (today's plans keep their kernel's name)."""

EXACT_MAX_ITEMS, EXACT_MAX_RANKS = 8, 8
"""Instances this small also get the exact search (`exact.py`), which proves optima."""


def allowed_degrees(spec: ContextParallel, num_ranks: int, gpus_per_node: int) -> np.ndarray:
    """The spec's degrees as an array, after checking them against the ranks and the node size: groups are
    aligned blocks of ranks, and unless they may cross nodes only the blocks inside a node are used
    (`blocks.free_blocks`), so a degree fits where one is, [0, c) for any c <= the node size; on nodes of
    a size it does not divide (6 gpus, degree 4) the blocks straddling two nodes are left out (probe20 P20-14).
    A refusal names the degrees that do fit, and says where the refused ones are the default (1, 2, 4, 8),
    which the user may never have set (probe18 P18-11)."""
    reasons = {degree: _misfit(degree, num_ranks, gpus_per_node, spec.allow_inter_node) for degree in spec.degrees}
    refused = [degree for degree in spec.degrees if reasons[degree]]
    if refused:
        fitting = tuple(degree for degree in spec.degrees if not reasons[degree])
        default = f" {spec.degrees}, the default," if spec.degrees == DEFAULT_DEGREES else ""
        remedy = f"; pass degrees={fitting} for this job, keeping the spec's other settings" if fitting else ""
        raise ValueError(f"`context_parallel.degrees`{default} holds {refused[0]}{reasons[refused[0]]}{remedy}")
    return np.array(spec.degrees, dtype=np.int64)


def _misfit(degree: int, num_ranks: int, gpus_per_node: int, allow_inter_node: bool) -> str:
    """Why a group of `degree` ranks cannot be laid out ("" where it can): no aligned block of it lies in the
    ranks, or (groups kept inside nodes) none lies inside a node."""
    if degree > num_ranks:
        return f" > num_ranks {num_ranks}: a group cannot be larger than the ranks"
    if degree > gpus_per_node and not allow_inter_node:
        return f" > {gpus_per_node} gpus per node; groups stay inside a node unless `allow_inter_node=True`"
    return ""


def allot(problem: Problem, spec: ContextParallel, degrees: np.ndarray, gpus_per_node: int, cap: int | None,
          one_pass: bool = True, rows=None) -> Allotment:
    """The bound's input: every item that may split (longer than Σ f / D, or over the budget
    unsplit, or all when degree 1 is not allowed) with its best-case time at every degree.
    `cap` limits a rank's tokens in one pass (`one_pass`: the whole step, so the items' total
    must fit D · cap; else a micro-batch's, which only limits each shard).  `rows(items)`: those times where the
    caller made them already (`step_times.StepTimes`: `spec.degrees`; None where they raise a float error)."""
    lengths, costs, d = problem.lengths, problem.item_costs, problem.num_ranks
    if one_pass and cap is not None and (total := int(lengths.sum())) > cap * d:
        needed = -(-total // d)
        raise InfeasibleError(f"`max_tokens_per_rank`={cap} × {d} ranks = {cap * d} tokens < {total} tokens in "
                              f"total; a cap of at least {needed} is needed", min_cap=needed)
    may_split = costs > exact_sum(costs) / d
    if cap is not None:
        may_split |= lengths > cap
    if degrees[0] > 1:
        may_split[:] = True
    candidates = np.flatnonzero(may_split)
    times = None if rows is None else rows(candidates)
    try:  # an intermediate overflow (seconds_per_cost · q · l², ...) too: the planner recomputes these times
        with np.errstate(over="raise", invalid="raise"):
            times = spec.item_times(problem.cost, lengths[candidates][:, None], degrees[None, :],
                                    (degrees <= gpus_per_node)[None, :]) if times is None else times
    except FloatingPointError:
        times = np.full(1, np.inf)
    # the planner sums the work c · t(c) of up to every item on a rank, as ranks' costs (`check_cost_range`)
    if not (np.isfinite(times).all() and float(times.max(initial=0.0)) * float(degrees[-1]) * lengths.size
            < COST_LIMIT):
        raise ValueError("`context_parallel`'s split times overflow float64 (scale the cost model or the "
                         "`context_parallel` parameters down)")
    allowed = np.ones(times.shape, dtype=bool)
    if cap is not None:
        allowed = -(-lengths[candidates][:, None] // degrees[None, :]) <= cap
        _check_budget(lengths, candidates, allowed, degrees, cap,
                      "max_tokens_per_rank" if one_pass else "max_tokens_per_microbatch",
                      d if spec.allow_inter_node else min(d, gpus_per_node))
    return Allotment(costs, degrees, candidates, times, allowed, d)


def _check_budget(lengths: np.ndarray, candidates: np.ndarray, allowed: np.ndarray, degrees: np.ndarray,
                  cap: int, cap_name: str, widest_group: int) -> None:
    """InfeasibleError naming the longest item no allowed degree fits under the budget, and the degree
    that would fit where a group may be that wide (`widest_group` ranks)."""
    stuck = candidates[~allowed.any(axis=1)]
    if not stuck.size:
        return
    item = int(stuck[np.argmax(lengths[stuck])])
    length, widest = int(lengths[item]), int(degrees[-1])
    needed = 1 << (-(-length // cap) - 1).bit_length()
    wider = (f"it needs degree {needed} or" if needed <= widest_group else
             f"degree {needed} would span more than the {widest_group} ranks a group may: it needs")
    raise InfeasibleError(f"item {item} ({length} tokens) fits {cap_name}={cap} at no allowed degree "
                          f"{tuple(degrees.tolist())}: degree {widest} puts {-(-length // widest)} tokens on a rank; "
                          f"{wider} a budget of at least {-(-length // widest)}",
                          min_cap=-(-int(lengths[stuck].max()) // widest))


def _plain(problem: Problem, record, algorithm: str):
    """Today's plan of the named kernel, as `balance` makes it without `context_parallel`."""
    check_cap_lower_bound(problem)
    start = time.perf_counter()
    result, bound = run_kernel(record.kernel, problem, algorithm, built_in(record))
    return make_plan(problem, result.assignment, result.status, algorithm, kernel_bound=result.lower_bound,
                     solve_seconds=time.perf_counter() - start, certified=certifies(record), bound=bound)


def _wrap(plan, problem: Problem, spec: ContextParallel, gpus_per_node: int,
          bound: float | None) -> ContextParallelPlan:
    """A plain plan as a split plan of degree 1 everywhere; `bound` replaces its own when given."""
    start = plan.assignment
    if bound is None:
        return certify(problem, spec, gpus_per_node, start, np.ones_like(start), plan.status, plan.algorithm,
                       plan.lower_bound, plan.solve_seconds, exact_bound=True)
    status = Status.FEASIBLE if plan.status is Status.OPTIMAL else plan.status
    return certify(problem, spec, gpus_per_node, start, np.ones_like(start), status, plan.algorithm, bound,
                   plan.solve_seconds)


def balance_split(lengths, num_ranks, context_parallel, *, cost, algorithm, max_tokens_per_rank, time_limit,
                  topology, unsupported, warn: bool = True, allotment: Allotment | None = None) -> ContextParallelPlan:
    """`balance` with `context_parallel` (see `balancers.api.balance`): `topology` (validated
    against num_ranks, or None) gives the node size and links; `unsupported` names the options
    that cannot be combined with splitting; `warn`: of a unit cost (`warn_unit_cost`; the micro-batch
    planner, which warned already, passes False); `allotment`: `allot`'s of these items, made already (the
    micro-batch planner's, `pass_allotment`)."""
    if not isinstance(context_parallel, ContextParallel):
        raise TypeError(f"`context_parallel` must be a ContextParallel; got {type(context_parallel).__name__}")
    for name, value in unsupported.items():
        if value is not None and value is not False:
            raise ValueError(f"`{name}` cannot be combined with `context_parallel` (split items need a `cost` model "
                             f"of their lengths, unpadded, without item groups, equal counts or sources)")
    spec = context_parallel if topology is None else context_parallel.on(topology)
    record = get_algorithm(algorithm)
    if not record.solves(False):
        raise ValueError(record.why_not(False))
    problem = make_problem(lengths, num_ranks, cost=cost, time_limit=time_limit)
    cap = as_int(max_tokens_per_rank, "max_tokens_per_rank", minimum=1, optional=True)
    capped = replace(problem, max_tokens_per_rank=cap)
    gpus = spec.gpus_per_node
    degrees = allowed_degrees(spec, problem.num_ranks, gpus)
    if not spec.splits:
        return _wrap(_plain(capped, record, algorithm), capped, spec, gpus, None)
    if record.kind is Kind.BASELINE:  # probe53 F2: the split planner balanced where the baseline was asked for
        raise ValueError(f"algorithm {algorithm!r} is the unbalanced baseline, and with degrees "
                         f"{spec.degrees} the split planner balances wherever splitting pays: plan the "
                         f"baseline without `context_parallel` (or with degrees=(1,))")
    if warn:  # the input checked: a plan follows
        spec.warn_unit_cost(cost)
    if allotment is None:
        allotment = allot(problem, spec, degrees, gpus, cap)
    return plan_split(capped, spec, allotment, lambda: _plain(capped, record, algorithm))


def pass_allotment(lengths: np.ndarray, num_ranks: int, spec: ContextParallel, cost, budget: int,
                   rows=None) -> Allotment | None:
    """`allot` of a micro-batch's items (int64 `lengths`, `spec` on its topology) within `budget` tokens a rank, as
    `balance_split` makes it (`rows`: `allot`'s); None where it raises InfeasibleError (their tokens exceed the
    ranks', or an item fits no degree)."""
    try:
        return allot(make_problem(lengths, num_ranks, cost=cost), spec,
                     allowed_degrees(spec, num_ranks, spec.gpus_per_node), spec.gpus_per_node, budget, rows=rows)
    except InfeasibleError:
        return None


def split_stage(lengths, num_ranks, spec: ContextParallel, cost, max_tokens_per_rank, plain) -> ContextParallelPlan:
    """A stage's plan that may split (the orchestrator's LLM stage): `plain()` is today's plan of
    these items (a `BalancePlan`, however placed), kept bit for bit unless splitting pays (see
    the module docstring); `spec` already carries the topology's node size."""
    problem = replace(make_problem(lengths, num_ranks, cost=cost), max_tokens_per_rank=max_tokens_per_rank)
    degrees = allowed_degrees(spec, problem.num_ranks, spec.gpus_per_node)
    if not spec.splits:
        return _wrap(plain(), problem, spec, spec.gpus_per_node, None)
    return plan_split(problem, spec, allot(problem, spec, degrees, spec.gpus_per_node, max_tokens_per_rank), plain)


def plan_split(problem: Problem, spec: ContextParallel, allotment: Allotment, make_plain) -> ContextParallelPlan:
    """The best of today's plan (`make_plain()`, which may raise InfeasibleError), the split
    planner's and (on small instances) the exact search's, today's unless another is min_gain
    better (see the module docstring)."""
    clock = time.perf_counter()
    gpus, cap, gain = spec.gpus_per_node, problem.max_tokens_per_rank, 1 + spec.min_gain
    bound = allotment.bound()
    unsplit_fits = spec.degrees[0] == 1 and (cap is None or int(problem.lengths.max()) <= cap)
    split, plain, refusal = None, None, None
    canonical = allotment.degrees_at(bound)
    if (canonical > 1).any() or (2 in spec.degrees
                                 and crowded(problem.item_costs, canonical, bound, problem.num_ranks)):
        split, refusal = _planned(problem, spec, allotment, bound, clock)
    if unsplit_fits and (split is None or (split.makespan * gain >= float(problem.item_costs.max())  # >= max f
                                           and split.makespan * gain >= lower_bound(problem))):
        try:
            plain = _wrap(make_plain(), problem, spec, gpus, bound)
        except InfeasibleError as error:  # the kernel found no room; splitting may make some
            refusal = error
            split, refusal = (split, refusal) if split is not None else _planned(problem, spec, allotment, bound, clock)
        if plain is not None and split is None and plain.makespan > gain * bound:  # the search may split
            split = _certified(problem, spec, improve(problem, spec, gpus, plain.assignment, plain.degree, bound),
                               bound, clock)
    optimum = None
    if problem.num_items <= EXACT_MAX_ITEMS and problem.num_ranks <= EXACT_MAX_RANKS:
        incumbent = min((plan.makespan for plan in (split, plain) if plan is not None), default=math.inf)
        start, degree, finished = exact_split(problem, spec, gpus, incumbent)
        if start is not None:
            found = _certified(problem, spec, (start, degree), bound, clock)
            split = found if split is None or found.makespan < split.makespan else split
            incumbent = found.makespan
        elif finished and incumbent == math.inf:
            raise refusal
        optimum = incumbent if finished else None
    splits = split is not None and split.split_items.size > 0
    best = split if plain is None or (splits and split.makespan * gain < plain.makespan) else plain
    if best is None:
        raise refusal
    if optimum is not None and best.makespan == optimum:  # proven optimal: the optimum bounds every plan
        return certify(problem, spec, gpus, best.assignment, best.degree, best.status, best.algorithm, best.makespan,
                       best.solve_seconds)
    return best


def _planned(problem: Problem, spec: ContextParallel, allotment: Allotment, bound: float,
             clock: float) -> tuple[ContextParallelPlan | None, InfeasibleError | None]:
    """(the split planner's plan after the local search, None; or None, its refusal)."""
    try:
        start, degree, item_time = laid_out(problem, spec, spec.gpus_per_node, allotment, bound)
    except InfeasibleError as error:
        return None, error
    blocks = improve(problem, spec, spec.gpus_per_node, start, degree, bound, item_time)
    return _certified(problem, spec, blocks, bound, clock), None


def _certified(problem: Problem, spec: ContextParallel, blocks: tuple, bound: float,
               clock: float) -> ContextParallelPlan:
    """A split plan (block starts, degrees[, their `rank_accounts`]) certified with `bound`, timed from `clock`."""
    start, degree, *accounts = blocks
    return certify(problem, spec, spec.gpus_per_node, start, degree, Status.FEASIBLE, SPLIT_ALGORITHM, bound,
                   time.perf_counter() - clock, accounts=accounts[0] if accounts else None)


def certify_split(lengths, num_ranks, spec: ContextParallel, start, degree, *, cost=None, max_tokens_per_rank=None,
                  algorithm: str = "given") -> ContextParallelPlan:
    """Any split plan (block start and degree per item) certified like the planner's: times from
    `spec`, loads, tokens, the canonical bound; ValueError when a block is not one the spec allows.

    >>> spec = ContextParallel(degrees=(1, 2), latency_s=0.0, kv_bytes_per_token=0.0, half_efficiency_tokens=0.0)
    >>> plan = certify_split([40, 5, 5], 2, spec, [0, 0, 1], [2, 1, 1])
    >>> plan.loads.tolist(), plan.degree.tolist()
    ([25.0, 25.0], [2, 1, 1])
    """
    problem = make_problem(lengths, num_ranks, cost=cost)
    cap = as_int(max_tokens_per_rank, "max_tokens_per_rank", minimum=1, optional=True)
    problem = replace(problem, max_tokens_per_rank=cap)
    start = as_sources(start, problem.num_items, problem.num_ranks, "start")
    degree = as_sources(degree, problem.num_items, problem.num_ranks + 1, "degree")
    degrees = allowed_degrees(spec, problem.num_ranks, spec.gpus_per_node)
    bad = np.flatnonzero(~np.isin(degree, degrees) | (start % np.maximum(degree, 1) != 0)
                         | (start + degree > problem.num_ranks))
    if bad.size:
        item = int(bad[0])
        raise ValueError(f"item {item} at degree {int(degree[item])} from rank {int(start[item])} is not on an aligned "
                         f"block of {problem.num_ranks} ranks at a degree of {spec.degrees}")
    bound = allot(problem, spec, degrees, spec.gpus_per_node, cap).bound()
    try:
        return certify(problem, spec, spec.gpus_per_node, start, degree, Status.FEASIBLE, algorithm, bound)
    except RuntimeError as error:
        raise ValueError(f"the split plan is not realisable: {error}") from None

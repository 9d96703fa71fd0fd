"""`balance(..., context_parallel=spec)`: validate once, plan with splitting where it pays, certify.

    T* = canonical bound over every plan that may split
    if C = {1}:                      today's plan (the named algorithm), bit for bit
    elif some item is longer than T* at degree 1 (a giant):
        S = split plan (planner + search); P = today's plan, unless S beats its lower bound
        the split plan when S · (1 + min_gain) < P, else today's
    else:                            today's plan, unless it is more than min_gain above T*
                                     and the local search (which may split) beats it so
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ..plan import make_plan
from ..problem import InfeasibleError, Problem, Status, check_cap_lower_bound, exact_sum, lower_bound, make_problem
from ..registry import get_algorithm
from ..validation import as_int
from .bound import Allotment
from .plan import ContextParallelPlan, certify
from .planner import fill, layout
from .search import improve
from .spec import ContextParallel

SPLIT_ALGORITHM = "context_parallel"
"""The `algorithm` of a plan that splits items (a plan that does not names the kernel that made it)."""


def allowed_degrees(spec: ContextParallel, num_ranks: int, gpus_per_node: int) -> np.ndarray:
    """The spec's degrees as an array, after checking them against the ranks and the node size."""
    for degree in spec.degrees:
        if degree > num_ranks:
            raise ValueError(f"`context_parallel.degrees` holds {degree} > num_ranks {num_ranks}: a group cannot "
                             f"be larger than the ranks")
        if degree > gpus_per_node and not spec.allow_inter_node:
            raise ValueError(f"`context_parallel.degrees` holds {degree} > {gpus_per_node} gpus per node; groups "
                             f"stay inside a node unless `allow_inter_node=True`")
    return np.array(spec.degrees, dtype=np.int64)


def allot(problem: Problem, spec: ContextParallel, degrees: np.ndarray, gpus_per_node: int, cap: int | None) -> Allotment:
    """The bound's input: every item that may split (longer than Σ f / D, or over the budget
    unsplit, or all when degree 1 is not allowed) with its best-case time at every degree."""
    lengths, costs, d = problem.lengths, problem.item_costs, problem.num_ranks
    if cap is not None and (total := int(lengths.sum())) > cap * d:
        needed = -(-total // d)
        raise InfeasibleError(f"`max_tokens_per_rank`={cap} × {d} ranks = {cap * d} tokens < {total} tokens in "
                              f"total; a cap of at least {needed} is needed", min_cap=needed)
    may_split = costs > exact_sum(costs) / d
    if cap is not None:
        may_split |= lengths > cap
    if degrees[0] > 1:
        may_split[:] = True
    candidates = np.flatnonzero(may_split)
    times = spec.item_times(problem.cost, lengths[candidates][:, None], degrees[None, :],
                            (degrees <= gpus_per_node)[None, :])
    if not np.isfinite(times).all():
        raise ValueError("`context_parallel`'s split times overflow float64 (scale the cost model down)")
    allowed = np.ones(times.shape, dtype=bool)
    if cap is not None:
        allowed = -(-lengths[candidates][:, None] // degrees[None, :]) <= cap
        _check_budget(lengths, candidates, allowed, degrees, cap)
    return Allotment(costs, degrees, candidates, times, allowed, d)


def _check_budget(lengths: np.ndarray, candidates: np.ndarray, allowed: np.ndarray, degrees: np.ndarray,
                  cap: int) -> None:
    """InfeasibleError naming the longest item no allowed degree fits under the budget."""
    stuck = candidates[~allowed.any(axis=1)]
    if not stuck.size:
        return
    item = int(stuck[np.argmax(lengths[stuck])])
    length, widest = int(lengths[item]), int(degrees[-1])
    needed = 1 << (-(-length // cap) - 1).bit_length()
    raise InfeasibleError(f"item {item} ({length} tokens) fits max_tokens_per_rank={cap} at no allowed degree "
                          f"{tuple(degrees.tolist())}: degree {widest} puts {-(-length // widest)} tokens on a rank; "
                          f"it needs degree {needed} or a budget of at least {-(-length // widest)}",
                          min_cap=-(-int(lengths[stuck].max()) // widest))


def _plain(problem: Problem, record, algorithm: str):
    """Today's plan of the named kernel, as `balance` makes it without `context_parallel`."""
    check_cap_lower_bound(problem)
    start = time.perf_counter()
    result = record.kernel(problem)
    return make_plan(problem, result.assignment, result.status, algorithm, kernel_bound=result.lower_bound,
                     solve_seconds=time.perf_counter() - start)


def _wrap(plan, problem: Problem, spec: ContextParallel, gpus_per_node: int, bound: float | None) -> ContextParallelPlan:
    """A plain plan as a split plan of degree 1 everywhere; `bound` replaces its own when given."""
    start = plan.assignment
    if bound is None:
        return certify(problem, spec, gpus_per_node, start, np.ones_like(start), plan.status, plan.algorithm,
                       plan.lower_bound, plan.solve_seconds)
    status = Status.FEASIBLE if plan.status is Status.OPTIMAL else plan.status
    return certify(problem, spec, gpus_per_node, start, np.ones_like(start), status, plan.algorithm, bound,
                   plan.solve_seconds)


def balance_split(lengths, num_ranks, context_parallel, *, cost, algorithm, max_tokens_per_rank, time_limit,
                  topology, unsupported) -> ContextParallelPlan:
    """`balance` with `context_parallel` (see `balancers.api.balance`): `topology` (validated
    against num_ranks, or None) gives the node size and links; `unsupported` names the options
    that cannot be combined with splitting."""
    if not isinstance(context_parallel, ContextParallel):
        raise TypeError(f"`context_parallel` must be a ContextParallel; got {type(context_parallel).__name__}")
    for name, value in unsupported.items():
        if value not in (None, False):
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
    start_clock = time.perf_counter()
    allotment = allot(problem, spec, degrees, gpus, cap)
    bound = allotment.bound()
    giants = bool((allotment.degrees_at(bound) > 1).any())
    if giants:
        split = _split_plan(capped, spec, gpus, allotment, bound, start_clock)
        unsplit_fits = degrees[0] == 1 and (cap is None or int(problem.lengths.max()) <= cap)
        if not unsplit_fits or split.makespan * (1 + spec.min_gain) < lower_bound(capped):
            return split
        plain = _plain(capped, record, algorithm)
        return split if split.makespan * (1 + spec.min_gain) < plain.makespan else _wrap(plain, capped, spec, gpus, bound)
    plain = _wrap(_plain(capped, record, algorithm), capped, spec, gpus, bound)
    if plain.makespan <= (1 + spec.min_gain) * bound:
        return plain
    start, degree = improve(capped, spec, gpus, plain.assignment, plain.degree, bound)
    split = certify(capped, spec, gpus, start, degree, Status.FEASIBLE, SPLIT_ALGORITHM, bound,
                    plain.solve_seconds + time.perf_counter() - start_clock)
    return split if split.split_items.size and split.makespan * (1 + spec.min_gain) < plain.makespan else plain


def _split_plan(problem: Problem, spec: ContextParallel, gpus: int, allotment: Allotment, bound: float,
                start_clock: float) -> ContextParallelPlan:
    """The planner's plan: layout on the ladder, the unsplit items dealt, then the local search."""
    start, degree, target = layout(problem, spec, gpus, allotment, bound)
    start = fill(problem, spec, gpus, start, degree, target)
    start, degree = improve(problem, spec, gpus, start, degree, bound)
    return certify(problem, spec, gpus, start, degree, Status.FEASIBLE, SPLIT_ALGORITHM, bound,
                   time.perf_counter() - start_clock)

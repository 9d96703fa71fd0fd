"""The best plan found within a small, deterministic budget.

minimise max(loads) where loads[r] = sum(cost[i] for i on r) (or count · f(max) padded):

    if padded: return padded.solve(problem)                    # exact
    starts = [lpt(problem), karmarkar_karp(problem)]             # those that fit the cap;
    if few items per rank: starts.append(multifit(problem))      # one at the bound is returned
    (or else KK + local search on the tokens themselves, if that meets the cap)
    plans = starts + [local_search.improve(problem, s) for s in starts]
    plan = min(plans, key=makespan)                            # ties: the earlier one
    if problem.time_limit and the instance is small: plan = ilp.improve(problem, plan)

MULTIFIT packs to a target makespan and is far better than LPT and KK with two or three
items per rank (where both put the D largest items on separate ranks first).

Guarantee: makespan <= min(LPT, Karmarkar–Karp) on every instance, by construction, so
also <= (4/3 - 1/(3D)) · OPT without a cap; padded plans are optimal.  Only the best start is
improved when the instance is large (more than `ALL_STARTS_MAX_ITEMS` items).  Local
search is bounded by a work count, not a clock, so the plan is bit-identical on every
machine.  The ILP step runs only when the caller grants a `time_limit`; CBC stopped by
that (wall-clock) limit may return a machine-dependent plan, never a worse one.
"""

from __future__ import annotations

import numpy as np

from . import ilp, karmarkar_karp, local_search, lpt, multifit, padded
from .problem import InfeasibleError, KernelResult, Problem, lower_bound, make_problem, rank_loads, rank_tokens

ALL_STARTS_MAX_ITEMS = 2048
"""Improve every start up to this many items; above, only the best one."""

MULTIFIT_MAX_PER_RANK = 8
MULTIFIT_MAX_ITEMS = 16384
"""Add the MULTIFIT start (pure-Python packing probes) up to this many items per rank and in all."""

ILP_MAX_ITEMS = 200
"""Warm-start the ILP (when a time limit is given) only up to this many items."""


def solve(problem: Problem) -> KernelResult:
    """Best of LPT and KK, improved by local search (and ILP when a time limit is granted)."""
    if problem.padded:
        return padded.solve(problem)
    bound = lower_bound(problem)
    starts, refusal = [], None
    kernels = [lpt.solve, karmarkar_karp.solve]
    if problem.num_items <= MULTIFIT_MAX_ITEMS and problem.num_items <= MULTIFIT_MAX_PER_RANK * problem.num_ranks:
        kernels.append(multifit.solve)
    for kernel in kernels:
        try:
            start = kernel(problem).assignment
        except InfeasibleError as error:  # the greedy found no room; another start may
            refusal = error
            continue
        if rank_loads(problem, start).max() <= bound:  # proven optimal: nothing to improve
            return KernelResult(start)
        starts.append(start)
    if not starts:
        # Balance the tokens themselves; if that meets the cap it is a start.
        tokens_problem = make_problem(problem.lengths, problem.num_ranks)
        repaired = local_search.improve(tokens_problem, karmarkar_karp.differencing(
            tokens_problem.item_costs, problem.num_ranks))
        if rank_tokens(problem, repaired).max() <= problem.max_tokens_per_rank:
            starts.append(repaired)
        elif problem.time_limit is not None:
            return ilp.solve(problem)
        else:
            raise refusal
    makespans = [float(rank_loads(problem, start).max()) for start in starts]
    if problem.num_items > ALL_STARTS_MAX_ITEMS:
        starts = [starts[int(np.argmin(makespans))]]
    plans = starts + [local_search.improve(problem, start) for start in starts]
    makespans = [float(rank_loads(problem, plan).max()) for plan in plans]
    best = plans[int(np.argmin(makespans))]
    if problem.time_limit is not None and problem.num_items <= ILP_MAX_ITEMS and min(makespans) > bound:
        return ilp.improve(problem, best, problem.time_limit)
    return KernelResult(best)

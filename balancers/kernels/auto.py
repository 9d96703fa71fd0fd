"""The best plan found within a small, deterministic budget.

minimise max(loads) where loads[r] = sum(cost[i] for i on r) (or count · f(max) padded):

    if padded: return padded.solve(problem)                    # exact
    starts = [lpt(problem), karmarkar_karp(problem)]             # those that fit the cap;
    if <= 8 items per rank: starts.append(multifit(problem))     # one at the bound is returned
    if <= 4 items per rank: starts.append(slack(problem))
    (or else KK + local search on the tokens themselves, if that meets the cap)
    if <= 4 items per rank:                                      # and n <= GROUP_MAX_ITEMS
        target = bound (for integer costs: ceil of it, lifted by Martello & Toth's L2)
        starts = by makespan, with min_slack packings at target and at target + 1 %
                 second and third for integer costs
        plan = best of group_search.improve(s) for s in starts, one shared budget,
               until one reaches the target
    else:
        plans = starts + [local_search.improve(problem, s) for s in starts]
        plan = min(plans, key=makespan)                        # ties: the earlier one
    if problem.time_limit and the instance is small: plan = ilp.search(problem, plan)

all of it on the items by cost, least first (`in_canonical_order`), the plan mapped back: its quality
does not depend on the order the items come in (the searches' tie-breaks follow the item indices).

MULTIFIT packs to a target makespan and is far better than LPT and KK with two or three
items per rank (where both put the D largest items on separate ranks first); SLACK
(Della Croce & Scatamacchia 2020) is LPT on tuples ordered by spread.  There the exact
pair and triple re-splits of `group_search` (after Schwerdfeger & Walter) beat the
exchange descent of `local_search` (one- and two-item moves and swaps).  The minimum-slack
packings fill ranks exactly to the target and leave the awkward items to the last ones:
poor plans themselves, but the search reaches optima from them that it misses from the
LPT-like starts (on the hard families 110 of 137 proven optima with them, 103 without).

Guarantee: makespan <= min(LPT, Karmarkar–Karp) on every instance, by construction, so
also <= (4/3 - 1/(3D)) · OPT without a cap; padded plans are optimal.  Only the best start is
improved when the instance is large (more than `ALL_STARTS_MAX_ITEMS` items).  Local
search is bounded by a work count, not a clock, so the plan is bit-identical on every
machine.  The ILP step runs only when the caller grants a `time_limit`; HiGHS stopped by
that (wall-clock) limit may return a machine-dependent plan, never a worse one.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ..bounds import lower_bound, uncapped_fit
from ..exact.bounds import l2_bins
from ..exact.ilp import search
from ..orders import sealed
from ..plan import cost_unit, rounded_up
from ..problem import (InfeasibleError, KernelResult, Problem, make_problem, rank_loads, rank_tokens, read_only,
                       tokens_problem)
from ..search import group_search, local_search
from . import ilp, karmarkar_karp, lpt, min_slack, multifit, padded, slack

ALL_STARTS_MAX_ITEMS = 2048
"""Improve every start up to this many items; above, only the best one."""

MULTIFIT_MAX_PER_RANK = 8
MULTIFIT_MAX_ITEMS = 16384
"""Add the MULTIFIT start (pure-Python packing probes) up to this many items per rank and in all."""

GROUP_MAX_PER_RANK = 4
GROUP_MAX_ITEMS = 2048
"""With at most this many items per rank (and in all), the starts (SLACK added) go to the
exact pair and triple search instead of the exchange descent."""



FILL_STEP = 100
"""The second minimum-slack packing aims at target + target // FILL_STEP (1 % of room)."""

ILP_MAX_ITEMS = 200
"""Warm-start the ILP (when a time limit is given) only up to this many items."""


def solve(problem: Problem, lpt_plan: np.ndarray | None = None) -> KernelResult:
    """Best of LPT, KK (MULTIFIT, SLACK), improved by local search (and ILP when a time limit is granted),
    found on the items in `in_canonical_order`, so that its quality does not depend on the order they come in.
    `lpt_plan`: `lpt.solve(problem)`'s assignment where the caller has it (not computed again; used only
    where the items come in that order already)."""
    if problem.padded:
        return padded.solve(problem)
    costly = _costly_items(problem)
    if costly is not None:
        return _with_free_items_dealt(problem, costly)
    if problem.max_tokens_per_rank is None:
        return _in_canonical_order(problem, lpt_plan)
    return _under_the_cap(problem, lpt_plan)


def _under_the_cap(problem: Problem, lpt_plan: np.ndarray | None) -> KernelResult:
    """`solve` under a cap: the plan `solve` makes without the cap wherever that meets the cap, else the capped
    search's.  A cap the plan made without it meets changes nothing, neither the plan nor its cost: one solve
    (probe26 P26-04: solving under the cap first and then again without it took 2x the CPU for the same plan),
    never worse than that plan (probe25 P25-02: the capped search planned up to 1.60x slower in 25-40 % of small
    instances at the cap of their own uncapped plans' tokens), and a cap no start fits is answered by that plan
    where it fits (probe22 P22-17).  What it gives up: where the capped search would have found a cheaper plan
    (review R18-01: 7 of 919 held-out rows, up to 0.31 % here and 0.79 % under equal counts), or proven its plan
    optimal faster than the plan without the cap is made (512 x 32, seeds 6 and 7: 1.16-1.45x the parent's CPU)."""
    free = uncapped_fit(problem, solve)
    return free if free is not None else _in_canonical_order(problem, lpt_plan)


def _costly_items(problem: Problem) -> np.ndarray | None:
    """The items of positive cost, where the others may be left out of the search: some cost 0 and none of those
    holds tokens under a cap (None elsewhere).  Free items change no load, but the searches' size rules counted them
    (probe23 P23-07: 90 % empty items at 2560 x 32 planned 7.7 % above the same costly items alone)."""
    costs = problem.item_costs
    if problem.equal_counts or costs.size == 0 or costs.min() > 0:
        return None
    costly = costs > 0
    if not costly.any() or (problem.max_tokens_per_rank is not None and problem.lengths[~costly].any()):
        return None
    return costly


def _with_free_items_dealt(problem: Problem, costly: np.ndarray) -> KernelResult:
    """`solve` on the costly items, then the free ones placed by their tokens: LPT from the tokens the costly plan
    left on each rank (one placeholder per rank, longer than every free item, holding them), so that tokens spread
    as evenly as LPT spreads them (rev16 R16-02: dealt by count, the token peak sat 24-30 % above the mean where
    free items hold tokens); free items without tokens one a rank in turn from the ranks holding the fewest items."""
    items, free, d = np.flatnonzero(costly), np.flatnonzero(~costly), problem.num_ranks
    result = solve(dataclasses.replace(problem, lengths=read_only(problem.lengths[items]),
                                       item_costs=read_only(problem.item_costs[items]), orders={}))
    assignment = np.empty(problem.num_items, dtype=np.int64)
    assignment[items] = result.assignment
    free_lengths = problem.lengths[free]
    if free_lengths.any():
        held = np.bincount(result.assignment, weights=problem.lengths[items], minlength=d)
        keys = np.concatenate((free_lengths.max() + held, free_lengths)).astype(np.float64)  # as costs: token sums
        placed = lpt.solve(make_problem(np.zeros(keys.size, dtype=np.int64), d, costs=keys)).assignment  # may
        # pass int64 where the placeholders add D longest free items (probe24 P24-05)
        rank_of = np.empty(d, dtype=np.int64)
        rank_of[placed[:d]] = np.arange(d)  # the placeholders, placed first, one on each rank
        assignment[free] = rank_of[placed[d:]]
    else:
        turn = np.lexsort((np.arange(d), np.bincount(result.assignment, minlength=d)))
        assignment[free] = turn[np.arange(free.size) % d]
    return result._replace(assignment=assignment)


def _in_canonical_order(problem: Problem, lpt_plan: np.ndarray | None) -> KernelResult:
    canonical = in_canonical_order(problem)
    if canonical is None:
        return _solve(problem, lpt_plan)
    reordered, order = canonical
    result = _solve(reordered, None)
    return result._replace(assignment=in_given_order(result.assignment, order))


def in_canonical_order(problem, **fields) -> tuple | None:
    """(`problem`, a `Problem` or `MicroBatchProblem`, over its items by cost, least first, then by length,
    shortest first, with `fields` replaced; the order) or None where the items come in that order already.

    The searches' tie-breaks and neighbourhoods follow the item indices, so a plan found on the items as
    given depends on their order; on this one it depends on the items alone (equal items, interchangeable,
    in any order).  Least first: the searches then try small items first (on tuning instances of the
    micro-batch search closer to the bound than largest first, and than the items in random order).  The
    problem's cost order is given, not sorted again.

    >>> from orchmllm.balancers.problem import make_problem
    >>> in_canonical_order(make_problem([2, 9, 4], 2))[1].tolist(), in_canonical_order(make_problem([2, 4, 4, 9], 2))
    ([0, 2, 1], None)
    >>> in_canonical_order(make_problem([3, 5, 4], 2, costs=[1.0, 1.0, 0.5]))[0].lengths.tolist()
    [4, 3, 5]
    """
    costs, lengths = problem.item_costs, problem.lengths
    if bool(np.all(costs[1:] >= costs[:-1])) and not _unsorted_ties(_run_starts(costs), lengths):
        return None
    order = np.ascontiguousarray(problem.cost_order[::-1])  # by cost, least first (equal costs by index, last first)
    costs, lengths = np.ascontiguousarray(problem.sorted_costs[::-1]), lengths[order]
    runs = _run_starts(costs)
    if _unsorted_ties(runs, lengths):
        order = np.lexsort((np.arange(order.size), problem.lengths, problem.item_costs))
        lengths = problem.lengths[order]
    orders = {"cost_order": _largest_first(runs), "sorted_costs": problem.sorted_costs}
    return dataclasses.replace(problem, lengths=sealed(lengths), item_costs=sealed(costs), orders=orders,
                               **fields), order


def _run_starts(values: np.ndarray) -> np.ndarray:
    """Where a run of equal `values` starts (the first always)."""
    return np.concatenate(([True], values[1:] != values[:-1]))


def _unsorted_ties(run_starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether some two neighbours in a run of equal costs (`_run_starts`) have their `lengths` descending."""
    return bool(np.any(~run_starts[1:] & (lengths[1:] < lengths[:-1])))


def _largest_first(run_starts: np.ndarray) -> np.ndarray:
    """`problem.sorted_order(values)` (largest first, ties by index) of ascending values whose runs of equal
    ones start at `run_starts` (`_run_starts`): the runs last first, each in index order.

    >>> _largest_first(_run_starts(np.array([1, 2, 2, 3]))).tolist()
    [3, 1, 2, 0]
    """
    starts = np.flatnonzero(run_starts)
    starts, sizes = starts[::-1], np.diff(np.append(starts, run_starts.size))[::-1]  # the runs, last first
    placed = np.cumsum(sizes) - sizes  # where each run starts in the order
    order = np.repeat(starts - placed, sizes)
    order += np.arange(run_starts.size)
    return read_only(order)


def in_given_order(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Per-item `values` of the items in `order` (`in_canonical_order`), back in the items' own order."""
    given = np.empty_like(values)
    given[order] = values
    return given


def _solve(problem: Problem, lpt_plan: np.ndarray | None) -> KernelResult:
    """`solve` on the items in the order given."""
    bound = lower_bound(problem)
    starts, refusal = [], None
    kernels = [lpt.solve if lpt_plan is None else lambda _: KernelResult(lpt_plan),
               functools.partial(karmarkar_karp.solve, lpt_plan=lpt_plan)]
    if problem.num_items <= MULTIFIT_MAX_ITEMS and problem.num_items <= MULTIFIT_MAX_PER_RANK * problem.num_ranks:
        kernels.append(multifit.solve)
    few_per_rank = (problem.num_items <= GROUP_MAX_ITEMS
                    and problem.num_items <= GROUP_MAX_PER_RANK * problem.num_ranks)
    if few_per_rank:
        kernels.append(slack.solve)
    makespans = []  # of the starts, each computed once
    unit = cost_unit(problem.item_costs)  # of the costs, so that a rescale by a power of two plans alike
    for kernel in kernels:
        try:
            start = kernel(problem).assignment
        except InfeasibleError as error:  # the greedy found no room; another start may
            refusal = error
            continue
        makespans.append(float(rank_loads(problem, start).max()))
        # proven optimal (the bound rounded up as `make_plan` rounds it: costs of a unit): nothing to improve
        if makespans[-1] <= rounded_up(bound, makespans[-1], problem.num_ranks, lambda: unit):
            return KernelResult(start)
        starts.append(start)
    if not starts:
        # Balance the tokens themselves; if that meets the cap it is a start.
        tokens = tokens_problem(problem)
        repaired = local_search.improve(tokens,
                                        karmarkar_karp.differencing(tokens.item_costs, problem.num_ranks)).assignment
        if rank_tokens(problem, repaired).max() <= problem.max_tokens_per_rank:
            starts.append(repaired)
            makespans.append(float(rank_loads(problem, repaired).max()))
        elif problem.time_limit is not None:
            return ilp.solve(problem)
        else:
            raise refusal
    if few_per_rank:
        best = _group_search(problem, starts, makespans, bound, unit)
    else:
        if problem.num_items > ALL_STARTS_MAX_ITEMS:
            first = int(np.argmin(makespans))
            starts, makespans = [starts[first]], [makespans[first]]
        improved = [local_search.improve(problem, start).assignment for start in starts]
        plans, makespans = starts + improved, makespans + [float(rank_loads(problem, plan).max()) for plan in improved]
        best = plans[int(np.argmin(makespans))]
    if (problem.time_limit is not None and problem.num_items <= ILP_MAX_ITEMS
            and float(rank_loads(problem, best).max()) > bound):
        return search(problem, best, problem.time_limit)  # a kernel's plan: clean, no `improve` checks
    return KernelResult(best)


def lifted_bound(costs: np.ndarray, num_ranks: int, lower: int, upper: int) -> int:
    """A lower bound on the makespan of integer `costs` in [lower, upper]: `lower` (a bound),
    raised past every capacity C that Martello & Toth's L2 proves needs more than
    `num_ranks` bins, found by bisection up to `upper` (a makespan some plan reaches).

    The search stops there: with two or three items per rank the optimum often lies above
    ceil(total / D) where L2 proves it, so a plan reaching it needs no further search.

    >>> lifted_bound(np.array([6, 6, 6, 5, 5]), 3, 10, 12)   # at 10 no 5 fits beside a 6: 4 bins
    11
    """
    if float(costs.sum()) >= 2.0**62:  # L2's prefix sums stay within int64
        return lower
    descending = np.sort(costs)[::-1]
    while lower < upper:
        middle = (lower + upper) // 2
        if l2_bins(descending, middle) > num_ranks:  # C = middle is infeasible, so is every C below it
            lower = middle + 1
        else:
            upper = middle
    return lower


def _group_search(problem: Problem, starts: list, makespans: list, bound: float, unit: float | None) -> np.ndarray:
    """The best plan of the pair and triple search from the starts, the best start first
    (ties: in order), the minimum-slack packings second and third, the other starts after
    them, under one shared work budget, until one reaches the (lifted) bound; `unit` the costs' (`cost_unit`)."""
    target = bound
    if unit is not None:  # loads in whole units: the optimum is at least ceil(bound), and L2 may lift it
        units = (problem.item_costs / unit).astype(np.int64)
        target = unit * lifted_bound(units, problem.num_ranks, math.ceil(bound / unit), int(min(makespans) / unit))
        if min(makespans) <= target:
            return starts[int(np.argmin(makespans))]
    ordered = [starts[k] for k in sorted(range(len(starts)), key=lambda k: (makespans[k], k))]
    if unit is not None:
        cap, capacity = problem.max_tokens_per_rank, int(target / unit)
        for position, room in ((1, capacity), (2, capacity + capacity // FILL_STEP)):
            filled = min_slack.pack(units, problem.num_ranks, room)
            if filled is not None and (cap is None or rank_tokens(problem, filled).max() <= cap):
                ordered.insert(position, filled)
    budget = group_search.default_work(problem.num_items)  # shared by all starts
    best, best_makespan = None, math.inf
    for start in ordered:
        plan, spent = group_search.improve(problem, start, budget, target)
        budget -= spent
        makespan = float(rank_loads(problem, plan).max())
        if makespan < best_makespan:
            best, best_makespan = plan, makespan
        if best_makespan <= target or budget <= 0:
            break
    return best

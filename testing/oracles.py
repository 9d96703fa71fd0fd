"""Reference optima to test balancers against: brute force, the padded DP, and `exact`.

Each oracle answers the balancing problem of `orchmllm.balance` independently of the
balancers: minimise max(loads) where loads[r] = sum(f(l_i) for i on r) (unpadded) or
count(r) · f(max l_i on r) (padded), subject to tokens(r) <= max_tokens_per_rank.  Loads
are summed in item order, as `BalancePlan.loads` is, so optima compare with `==`.

    brute_force      all D**n assignments; also explicit `costs`, `equal_counts`, `groups`
    brute_force_of   the same for a kernel's `Problem`
    padded_optimum   O(n² D) DP over runs of the length-sorted items (padded cost)
    exact            the dependable exact answer: the padded DP, brute force when tiny,
                     else the registry's exact solver, which must prove optimality
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..balancers import CostModel, InfeasibleError, Status, balance
from ..balancers.constraints.groups import as_groups
from ..balancers.problem import Problem, as_lengths, as_time_limit
from ..balancers.validation import as_bool, as_int

BRUTE_FORCE_MAX_PLANS = 2**20
"""Largest D**n `brute_force` enumerates; larger instances raise ValueError."""

_CHUNK = 2**15


@dataclass(frozen=True, eq=False)
class Optimum:
    """The optimal makespan of an instance and one plan reaching it.

    `makespan` and `assignment` are None when no plan meets the cap and constraints.
    `min_cap` is the smallest `max_tokens_per_rank` at which some plan meets the
    constraints (None when none does at any cap, or when `method` does not compute it).
    """

    makespan: float | None
    assignment: np.ndarray | None
    min_cap: int | None
    method: str

    @property
    def feasible(self) -> bool:
        return self.makespan is not None

    def to_json(self) -> dict:
        return {"makespan": self.makespan, "min_cap": self.min_cap, "method": self.method,
                "assignment": None if self.assignment is None else self.assignment.tolist()}


def _item_costs(lengths: np.ndarray, cost, costs) -> np.ndarray:
    if costs is not None:
        values = np.asarray(costs, dtype=np.float64)
        if values.shape != lengths.shape or not np.all(np.isfinite(values)) or np.any(values < 0):
            raise ValueError(f"`costs` must be {lengths.size} finite non-negative numbers; got {costs!r}")
        return values
    return (CostModel() if _checked(cost) is None else cost).item_costs(lengths)


def _checked(cost):
    """`cost` unless it is neither a CostModel nor None: a TypeError naming it (probe58 U1's kind: an
    AttributeError)."""
    if cost is not None and not isinstance(cost, CostModel):
        raise TypeError(f"`cost` must be a CostModel or None; got {type(cost).__name__}")
    return cost


def _options(cost, max_tokens_per_rank) -> tuple:
    """(cost, cap) checked as `balance` checks them: TypeError / ValueError naming the argument (a cap of -5 read as
    "no plan fits", 'x' raised numpy's error, a cost model 'x' an AttributeError: probe58 U1's kind)."""
    return _checked(cost), as_int(max_tokens_per_rank, "max_tokens_per_rank", minimum=1, optional=True)


def _all_plans(num_items: int, num_ranks: int):
    """Every assignment, in chunks of rows; item 0 is the fastest-changing digit."""
    num_items = as_int(num_items, "num_items", minimum=0)
    num_ranks = as_int(num_ranks, "num_ranks", minimum=1)
    total = num_ranks**num_items
    if total > BRUTE_FORCE_MAX_PLANS:
        raise ValueError(f"brute force over {num_ranks}**{num_items} = {total} plans exceeds "
                         f"BRUTE_FORCE_MAX_PLANS = {BRUTE_FORCE_MAX_PLANS}; use fewer items or ranks")
    powers = num_ranks ** np.arange(num_items, dtype=np.int64)
    for start in range(0, total, _CHUNK):
        codes = np.arange(start, min(start + _CHUNK, total), dtype=np.int64)
        yield (codes[:, None] // powers) % num_ranks


def all_assignments(num_items: int, num_ranks: int) -> np.ndarray:
    """Every assignment of `num_items` items to `num_ranks` ranks: a (D**n, n) int64 array.

    Row k is k written in base D, item 0 the fastest-changing digit (the order `brute_force`
    enumerates in); beyond `BRUTE_FORCE_MAX_PLANS` rows this raises ValueError.

    >>> all_assignments(2, 2).tolist()
    [[0, 0], [1, 0], [0, 1], [1, 1]]
    """
    return np.concatenate(list(_all_plans(num_items, num_ranks)))


def _per_rank(plans: np.ndarray, num_ranks: int, values: np.ndarray, reduce) -> np.ndarray:
    """(plans, D) array of `reduce` (np.add or np.maximum) over each rank's items, in item order."""
    out = np.zeros((plans.shape[0], num_ranks), dtype=values.dtype)
    rows = np.arange(plans.shape[0])
    for item in range(plans.shape[1]):
        ranks = plans[:, item]
        out[rows, ranks] = reduce(out[rows, ranks], values[item])
    return out


def brute_force(lengths, num_ranks, *, cost=None, padded=False, max_tokens_per_rank=None,
                costs=None, equal_counts=False, groups=None) -> Optimum:
    """The optimum over all D**n assignments, with the cap and the constraints.

    `costs` replaces f(l_i) by explicit per-item costs (unpadded only; `lengths` stay the
    memory); `equal_counts` allows only floor(n/D) or ceil(n/D) items per rank; `groups[i]`
    equal ids must share a rank.  The first optimal plan in enumeration order is returned.

    >>> optimum = brute_force([5, 4, 3, 3, 3], 2)
    >>> optimum.makespan, optimum.assignment.tolist(), optimum.min_cap
    (9.0, [1, 1, 0, 0, 0], 9)
    >>> brute_force([5, 4, 3, 3, 3], 2, max_tokens_per_rank=8).feasible
    False
    >>> [brute_force([6, 1, 1, 1], 2, **constraint).makespan
    ...  for constraint in ({}, {"equal_counts": True}, {"groups": [0, 1, 1, 0]})]
    [6.0, 7.0, 7.0]
    """
    lengths, num_ranks = as_lengths(lengths), as_int(num_ranks, "num_ranks", minimum=1)
    cost, max_tokens_per_rank = _options(cost, max_tokens_per_rank)
    padded, equal_counts = as_bool(padded, "padded"), as_bool(equal_counts, "equal_counts")
    if padded and costs is not None:
        raise ValueError("`costs` (explicit per-item costs) apply to the unpadded cost only")
    item_costs = _item_costs(lengths, cost, costs)
    n = lengths.size
    group_ids = None if groups is None else as_groups(groups, n)  # one id per item (probe58: [0] on 5 items passed)
    best, best_plan, fewest_tokens = math.inf, None, None
    for plans in _all_plans(n, num_ranks):
        allowed = np.ones(plans.shape[0], dtype=bool)
        counts = _per_rank(plans, num_ranks, np.ones(n, dtype=np.int64), np.add)
        if equal_counts:
            allowed &= np.all((counts == n // num_ranks) | (counts == -(-n // num_ranks)), axis=1)
        if groups is not None:
            for group in np.unique(group_ids):
                members = np.flatnonzero(group_ids == group)
                allowed &= np.all(plans[:, members] == plans[:, members[:1]], axis=1)
        if padded:
            longest = _per_rank(plans, num_ranks, lengths, np.maximum)
            tokens = counts * longest
            loads = np.where(counts > 0, counts * (CostModel() if cost is None else cost).item_costs(longest), 0.0)
        else:
            tokens = _per_rank(plans, num_ranks, lengths, np.add)
            loads = _per_rank(plans, num_ranks, item_costs, np.add)
        peak_tokens = tokens.max(axis=1)
        if allowed.any():
            chunk_fewest = int(peak_tokens[allowed].min())
            fewest_tokens = chunk_fewest if fewest_tokens is None else min(fewest_tokens, chunk_fewest)
        if max_tokens_per_rank is not None:
            allowed &= peak_tokens <= max_tokens_per_rank
        if not allowed.any():
            continue
        makespans = np.where(allowed, loads.max(axis=1), math.inf)
        index = int(np.argmin(makespans))
        if makespans[index] < best:
            best, best_plan = float(makespans[index]), plans[index].copy()
    if best_plan is None:
        return Optimum(None, None, fewest_tokens, "brute_force")
    best_plan.setflags(write=False)
    return Optimum(best, best_plan, fewest_tokens, "brute_force")


def brute_force_of(problem) -> Optimum:
    """`brute_force` of a kernel's `Problem`: its lengths, ranks, costs, padding, cap and equal counts.

    >>> from orchmllm.balancers import make_problem
    >>> brute_force_of(make_problem([5, 4, 3, 3, 3], 2, costs=[1, 1, 1, 1, 9])).makespan
    9.0
    """
    if not isinstance(problem, Problem):
        raise TypeError(f"`problem` must be a Problem (what make_problem returns); got {type(problem).__name__}")
    explicit = problem.cost is None
    return brute_force(problem.lengths, problem.num_ranks, cost=problem.cost, padded=problem.padded,
                       max_tokens_per_rank=problem.max_tokens_per_rank, equal_counts=problem.equal_counts,
                       costs=problem.item_costs if explicit else None)


def _sorted_runs_dp(run_costs, num_ranks: int):
    """min over splits of the sorted items into <= D runs of max(run cost); (value, run starts)."""
    n = len(run_costs)
    best = [0.0] + [math.inf] * n  # best[end]: the first `end` items on the ranks so far
    starts: list[list[int]] = [[]] + [[] for _ in range(n)]
    for _ in range(num_ranks):
        nxt, nxt_starts = best[:], [list(s) for s in starts]
        for end in range(1, n + 1):
            for first in range(end):
                value = run_costs[first][end - first]
                if value is None or best[first] == math.inf:
                    continue
                value = max(best[first], value)
                if value < nxt[end]:
                    nxt[end], nxt_starts[end] = value, starts[first] + [first]
        best, starts = nxt, nxt_starts
    return best[n], starts[n]


def padded_optimum(lengths, num_ranks, *, cost=None, max_tokens_per_rank=None) -> Optimum:
    """The padded optimum by a DP over runs of the length-sorted items.

    Some optimal padded plan gives every rank a contiguous run of the items sorted by
    length (exchange argument; `brute_force` checks it), so the DP over run boundaries is
    exact in O(n² D).  `min_cap` is the same DP on tokens (count · max length).

    >>> optimum = padded_optimum([4, 1, 2, 7], 2, max_tokens_per_rank=12)
    >>> optimum.makespan, optimum.assignment.tolist(), optimum.min_cap
    (12.0, [1, 1, 1, 0], 12)
    """
    lengths, num_ranks = as_lengths(lengths), as_int(num_ranks, "num_ranks", minimum=1)
    cost, max_tokens_per_rank = _options(cost, max_tokens_per_rank)
    order = sorted(range(lengths.size), key=lambda i: (-int(lengths[i]), i))
    sorted_lengths = [int(lengths[i]) for i in order]
    item_costs = (CostModel() if cost is None else cost).item_costs(np.array(sorted_lengths)).tolist()
    n = len(order)
    runs = [[None] + [size * item_costs[first] if max_tokens_per_rank is None
                      or size * sorted_lengths[first] <= max_tokens_per_rank else None
                      for size in range(1, n - first + 1)] for first in range(n)]
    token_runs = [[None] + [float(size * sorted_lengths[first]) for size in range(1, n - first + 1)]
                  for first in range(n)]
    min_cap = int(_sorted_runs_dp(token_runs, num_ranks)[0])
    makespan, starts = _sorted_runs_dp(runs, num_ranks)
    if makespan == math.inf:
        return Optimum(None, None, min_cap, "padded_optimum")
    assignment = np.empty(n, dtype=np.int64)
    bounds = starts + [n]
    for rank, (first, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        assignment[order[first:end]] = rank
    assignment.setflags(write=False)
    return Optimum(float(makespan), assignment, min_cap, "padded_optimum")


EXACT_ALGORITHM = "ilp"
"""The registered solver `exact` asks beyond brute-force sizes; it must prove optimality."""


def exact(lengths, num_ranks, *, cost=None, padded=False, max_tokens_per_rank=None,
          time_limit=60.0) -> Optimum:
    """The dependable exact optimum: padded DP, brute force when tiny, else the exact solver.

    Beyond brute-force sizes the registry's exact solver runs with `time_limit`; when it
    cannot prove its plan optimal this raises RuntimeError (TimeoutError when it found no
    plan at all) rather than hand back an unproven answer; `min_cap` is then None.

    >>> exact([5, 4, 3, 3, 3], 2).makespan, exact([9, 2, 2], 2, padded=True).makespan
    (9.0, 9.0)
    """
    lengths, num_ranks = as_lengths(lengths), as_int(num_ranks, "num_ranks", minimum=1)
    as_time_limit(time_limit)  # refused at every size, not only where the solver runs (probe53 N8)
    _options(cost, max_tokens_per_rank)
    if as_bool(padded, "padded"):
        return padded_optimum(lengths, num_ranks, cost=cost, max_tokens_per_rank=max_tokens_per_rank)
    if num_ranks**lengths.size <= BRUTE_FORCE_MAX_PLANS // 16:
        return brute_force(lengths, num_ranks, cost=cost, max_tokens_per_rank=max_tokens_per_rank)
    try:
        plan = balance(lengths, num_ranks, cost=cost, algorithm=EXACT_ALGORITHM,
                       max_tokens_per_rank=max_tokens_per_rank, time_limit=time_limit)
    except InfeasibleError:  # a necessary bound or the solver's proof: no plan fits the cap
        return Optimum(None, None, None, EXACT_ALGORITHM)
    if plan.status is not Status.OPTIMAL:
        raise RuntimeError(f"`{EXACT_ALGORITHM}` stopped at {time_limit} s with gap {plan.gap:.3g}; "
                           f"no proven optimum for {lengths.size} items on {num_ranks} ranks")
    return Optimum(plan.makespan, plan.assignment, None, EXACT_ALGORITHM)

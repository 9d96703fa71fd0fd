"""`check_plan`: every invariant of a `BalancePlan`, recomputed from the input alone."""

from __future__ import annotations

import math

import numpy as np

from ..balancers import BalancePlan, ContextParallelPlan, CostModel, MicroBatchPlan, Status
from ..balancers.constraints.groups import as_groups
from ..balancers.context_parallel.microbatch_plan import SplitMicroBatchPlan
from ..balancers.problem import as_costs, as_lengths, as_num_ranks
from ..balancers.validation import as_int
from .oracles import BRUTE_FORCE_MAX_PLANS, Optimum, brute_force, exact

_AUTO = object()
_CHECK_OF = {SplitMicroBatchPlan: "check_split_microbatch_plan", ContextParallelPlan: "check_split_plan",
             MicroBatchPlan: "check_microbatch_plan", BalancePlan: "check_plan"}  # which check takes which plan
_MADE_BY = {SplitMicroBatchPlan: "balance_microbatches(..., context_parallel=)",
            ContextParallelPlan: "balance(..., context_parallel=)", MicroBatchPlan: "balance_microbatches()",
            BalancePlan: "balance()"}
_SPLIT_CHECK = {ContextParallelPlan: "check_split_plan(plan, lengths, num_ranks, spec) checks it",
                SplitMicroBatchPlan: "check_split_microbatch_plan(plan, lengths, num_ranks, spec, "
                                     "max_tokens_per_microbatch) checks it against brute_force_split_microbatches"}


def wrong_status(status) -> str | None:
    """Why `status` is not a plan's status (a `Status` member, not its text: 'optimal' is no `Status.OPTIMAL`), or
    None."""
    if isinstance(status, Status):
        return None
    return f"status {status!r} must be a Status (orchmllm.balancers.Status); got {type(status).__name__}"


def items_of(plan) -> int:
    """`plan.num_items`, or where the plan's per-item array (`assignment`, or `rank`) is no array the length of what
    it holds: a message about a malformed plan must not fail on it."""
    values = plan.assignment if isinstance(plan, BalancePlan) else plan.rank
    if isinstance(values, np.ndarray):
        return int(values.size)
    return len(values) if hasattr(values, "__len__") else 1


def wrong_field(plan, name: str, n: int, dtype=np.int64) -> str | None:
    """Why the plan's per-item array `name` is not an (n,) numpy array of `dtype`, or None (probe58 U1: a list passed
    numpy's reading of it, though `plan.rank == r` of a list is one bool, and a list `degree` raised numpy's error)."""
    values = getattr(plan, name)
    if not isinstance(values, np.ndarray):
        return f"`{name}` is a {type(values).__name__}; expected a ({n},) {np.dtype(dtype)} array"
    if values.shape != (n,) or values.dtype != dtype:
        return f"`{name}` has shape {values.shape} and dtype {values.dtype}; expected ({n},) {np.dtype(dtype)}"
    return None


def check_optimum_type(optimum, expected: type, oracle: str) -> None:
    """TypeError unless `optimum` is None, the default or an `expected` (what `oracle` returns): probe58 U1, an int
    was an AttributeError."""
    if optimum is not None and optimum is not _AUTO and not isinstance(optimum, expected):
        raise TypeError(f"`optimum` must be of type {expected.__name__} (what {oracle} returns) or None; got "
                        f"{type(optimum).__name__}")


def check_plan_type(plan, expected: type) -> None:
    """TypeError unless `plan` is an `expected` plan (one of `_CHECK_OF`'s kinds), naming the check that takes the
    plan it is.

    >>> check_plan_type("x", BalancePlan)
    Traceback (most recent call last):
    ...
    TypeError: check_plan takes a BalancePlan as `plan` (what balance() returns); got str
    """
    kind = next((kind for kind in _CHECK_OF if isinstance(plan, kind)), None)  # the most derived first
    if kind is expected:
        return
    if kind in _SPLIT_CHECK and expected not in _SPLIT_CHECK:  # loads in seconds on every rank of a group
        raise TypeError(f"{_CHECK_OF[expected]} takes a plan of unsplit items; got a {type(plan).__name__} "
                        f"(context parallelism): orchmllm.testing.{_SPLIT_CHECK[kind]}")
    other = "" if kind is None else f"; {_CHECK_OF[kind]} checks a {kind.__name__}"
    raise TypeError(f"{_CHECK_OF[expected]} takes a {expected.__name__} as `plan` (what {_MADE_BY[expected]} "
                    f"returns); got {type(plan).__name__}{other}")


def _fail(plan: BalancePlan, message: str) -> None:
    raise AssertionError(f"plan of {plan.algorithm!r} ({items_of(plan)} items, {plan.num_ranks} ranks): {message}")


def _oracle(lengths, num_ranks, cost, padded, cap, costs, equal_counts, groups) -> Optimum | None:
    """The optimum when it is cheap: the padded DP, or brute force on tiny instances."""
    constrained = costs is not None or equal_counts or groups is not None
    if padded and not constrained:
        return exact(lengths, num_ranks, cost=cost, padded=True, max_tokens_per_rank=cap)
    if num_ranks ** len(lengths) > BRUTE_FORCE_MAX_PLANS // 16:
        return None
    return brute_force(lengths, num_ranks, cost=cost, padded=padded, max_tokens_per_rank=cap,
                       costs=costs, equal_counts=equal_counts, groups=groups)


def _necessary_bound(item_costs: np.ndarray, num_ranks: int) -> float:
    """max(total / D, for every k the k+1 smallest of the k·D+1 largest costs): some rank holds them."""
    ordered = sorted(item_costs.tolist(), reverse=True)
    held = [math.fsum(ordered[k * num_ranks - k:k * num_ranks + 1]) for k in range((len(ordered) - 1) // num_ranks + 1)]
    return max([math.fsum(ordered) / num_ranks] + held)


def check_plan(plan: BalancePlan, lengths, num_ranks: int, *, cost=None, padded=False, max_tokens_per_rank=None,
               costs=None, equal_counts=False, groups=None, optimum=_AUTO) -> None:
    """Raise AssertionError unless `plan` is a certified plan of this input.

    Checked from the input alone: one rank in [0, D) per item; loads (summed in item
    order) and tokens exact; makespan = max load; 0 <= lower bound <= makespan and, without
    constraints, at least max(total / D, the k+1 smallest of the k·D+1 largest costs); the
    cap, equal counts and groups held; `optimal` iff makespan == bound.  Against `optimum`
    (default: the padded DP, or brute force when D**n is small; None skips it): makespan >=
    optimum >= bound, equal when the status is optimal.  The options are `balance()`'s.

    >>> from orchmllm import balance
    >>> check_plan(balance([5, 4, 3, 3, 3], 2, algorithm="lpt"), [5, 4, 3, 3, 3], 2)
    """
    check_plan_type(plan, BalancePlan)
    lengths = as_lengths(lengths)  # balance()'s own reading of its input, as check_microbatch_plan's
    num_ranks = as_num_ranks(num_ranks)
    cost = CostModel() if cost is None and costs is None else cost  # explicit costs: the plan has no model
    n = lengths.size
    check_optimum_type(optimum, Optimum, "brute_force or exact")
    cap = as_int(max_tokens_per_rank, "max_tokens_per_rank", minimum=1, optional=True)
    assignment = plan.assignment
    if plan.num_ranks != num_ranks or plan.padded != padded or plan.cost != cost:
        _fail(plan, f"was made for {plan.num_ranks} ranks, padded={plan.padded}, cost={plan.cost}; "
                    f"expected {num_ranks}, padded={padded}, cost={cost}")
    if why := wrong_field(plan, "assignment", n):
        _fail(plan, why)
    outside = np.flatnonzero((assignment < 0) | (assignment >= num_ranks))
    if outside.size:
        _fail(plan, f"item {outside[0]} goes to rank {assignment[outside[0]]}, outside [0, {num_ranks})")
    item_costs = cost.item_costs(lengths) if costs is None else as_costs(costs, lengths)
    counts, tokens, loads = _rank_totals(plan, assignment, lengths, item_costs, cost, padded, num_ranks)
    makespan = float(loads.max())
    bound = plan.lower_bound
    if plan.makespan != makespan:
        _fail(plan, f"makespan {plan.makespan} != the largest load {makespan}")
    if not 0 <= bound <= makespan:
        _fail(plan, f"lower bound {bound} is not in [0, makespan {makespan}]")
    if costs is None and not equal_counts and groups is None:
        necessary = _necessary_bound(item_costs, num_ranks)
        if bound < min(necessary, makespan) * (1 - 1e-12):
            _fail(plan, f"lower bound {bound} is below max(total / D, the k+1 smallest of the k·D+1 largest "
                        f"costs) = {necessary}")
    if why := wrong_status(plan.status):
        _fail(plan, why)
    if (plan.status is Status.OPTIMAL) != (makespan == bound):
        _fail(plan, f"status {plan.status} with makespan {makespan} and bound {bound}")
    if cap is not None and tokens.max() > cap:
        _fail(plan, f"rank {int(tokens.argmax())} holds {int(tokens.max())} tokens > max_tokens_per_rank={cap}")
    if equal_counts and (counts.min() < n // num_ranks or counts.max() > -(-n // num_ranks)):
        _fail(plan, f"item counts per rank {counts.tolist()} are not all floor or ceil of {n}/{num_ranks}")
    if groups is not None:
        labels = as_groups(groups, n)  # 0..G-1; the message names the caller's own id
        for label in np.unique(labels):
            ranks = np.unique(assignment[labels == label])
            if ranks.size > 1:
                group = np.asarray(groups)[np.argmax(labels == label)]
                _fail(plan, f"group {group} is split over ranks {ranks.tolist()}")
    if optimum is _AUTO:
        optimum = _oracle(lengths, num_ranks, cost, padded, cap, costs, equal_counts, groups)
    if optimum is not None:
        _check_against_optimum(plan, optimum, makespan, bound)


def _rank_totals(plan, assignment, lengths, item_costs, cost, padded: bool, num_ranks: int):
    """(counts, tokens, loads) per rank recomputed item by item (loads summed in item order);
    AssertionError naming the first rank where the plan's loads or tokens differ."""
    counts = np.zeros(num_ranks, dtype=np.int64)
    longest = np.zeros(num_ranks, dtype=np.int64)
    sums = np.zeros(num_ranks, dtype=np.int64)
    loads = np.zeros(num_ranks, dtype=np.float64)
    for item, rank in enumerate(assignment.tolist()):
        counts[rank] += 1
        longest[rank] = max(longest[rank], lengths[item])
        sums[rank] += lengths[item]
        loads[rank] += item_costs[item]
    if padded:
        tokens = counts * longest
        loads = np.array([c * cost(int(m)) if c else 0.0 for c, m in zip(counts, longest)])
    else:
        tokens = sums
    for name, expected, reported in (("loads", loads, plan.loads), ("tokens", tokens, plan.tokens)):
        wrong = np.flatnonzero(np.asarray(reported) != expected)
        if np.shape(reported) != (num_ranks,) or wrong.size:
            rank = int(wrong[0]) if wrong.size else 0
            _fail(plan, f"{name} {np.asarray(reported).tolist()} differ from the items' {expected.tolist()} "
                        f"(first at rank {rank})")
    return counts, tokens, loads


def rounding_apart(value: float, reference: float, terms: int) -> bool:
    """Whether `value` and `reference` differ by more than float rounding of sums of `terms` terms explains: a
    rank's load is its items' costs summed in item order, so equal partitions can differ by an ulp or so
    (22.600000000000005 against the optimum's 22.6), and plans are proven optimal in exact arithmetic.

    >>> rounding_apart(22.600000000000005, 22.6, 3), rounding_apart(22.7, 22.6, 3)
    (False, True)
    """
    return abs(value - reference) > terms * 2.0**-52 * max(abs(value), abs(reference))


def step_complaint(plan, step: float, optimum: float, num_microbatches: int) -> str | None:
    """What is wrong (None: nothing) with a micro-batch plan's `step` cost, bound and status against the proven
    `optimum` at its `num_microbatches` M: step >= optimum >= bound, equal when it claims optimality, up to the
    float rounding of the cells' sums and of the step's (`rounding_apart`)."""
    terms, bound = plan.num_items + 2 * num_microbatches, plan.lower_bound
    if (step < optimum and rounding_apart(step, optimum, terms)) or (
            bound > optimum and rounding_apart(bound, optimum, terms)):
        return f"step cost {step} and bound {bound} do not bracket the optimum {optimum}"
    if plan.status is Status.OPTIMAL and rounding_apart(step, optimum, terms):
        return f"claims optimality at step cost {step} but the optimum at M = {num_microbatches} is {optimum}"
    return None


def _check_against_optimum(plan, optimum, makespan: float, bound: float) -> None:
    """makespan >= optimum >= bound, equal when the plan claims optimality (up to the float rounding of the
    loads' sums: `rounding_apart`)."""
    terms = plan.num_items + 1
    if not optimum.feasible:
        _fail(plan, f"{optimum.method} finds no plan within the cap and constraints, yet this plan exists")
    if makespan < optimum.makespan and rounding_apart(makespan, optimum.makespan, terms):
        _fail(plan, f"makespan {makespan} beats the optimum {optimum.makespan} of {optimum.method}")
    if plan.status is Status.OPTIMAL and rounding_apart(makespan, optimum.makespan, terms):
        _fail(plan, f"claims optimality at makespan {makespan} but the optimum ({optimum.method}) is "
                    f"{optimum.makespan}")
    if bound > optimum.makespan and rounding_apart(bound, optimum.makespan, terms):
        _fail(plan, f"lower bound {bound} exceeds the optimum {optimum.makespan} of {optimum.method}")

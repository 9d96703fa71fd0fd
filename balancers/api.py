"""`balance()`: validate once into a `BalanceRequest`, run a registered kernel, certify the plan."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from .constraints.groups import as_groups, group_problem
from .context_parallel.split import balance_split
from .kernels import auto
from .locality.balance import FILLS, balance_locally
from .origins import Origins, as_origins, fit_in_turn, gpus_per_node
from .plan import BalancePlan, make_plan, run_kernel
from .orders import sealed
from .problem import (InfeasibleError, Kernel, Problem, Status, check_cap_lower_bound, check_cost_range,
                      check_token_range, item_costs_of, make_problem, rank_loads, rank_tokens)
from .registry import Algorithm, algorithms, built_in, certifies, get_algorithm
from .validation import as_real, is_real


@dataclass(frozen=True, eq=False)
class BalanceRequest:
    """One `balance` call, every argument checked (`balance_request`, the one place): the problem, the
    kernel that solves it (the record's, or its equal-counts one), and how the plan is shaped: a group
    label per item (`groups`) or the items' `origins` with the slack and fill of the communication-aware
    pass (`makespan_slack` None without origins).  Kernels and passes read it as it is."""

    problem: Problem
    kernel: Kernel
    algorithm: str
    groups: np.ndarray | None = None
    origins: Origins | None = None
    makespan_slack: float | None = None
    fill: str | None = None
    certified: bool = True  # whether the kernel's own bound and `optimal` count (`registry.certifies`)
    built_in: bool = False  # the kernel is orchmllm's own (`registry.built_in`): its bound is taken after it


def balance(lengths, num_ranks, *, cost=None, costs=None, padded=False, equal_counts=False, groups=None,
            algorithm="auto", max_tokens_per_rank=None, time_limit=None, sources=None, item_bytes=None,
            topology=None, makespan_slack=0.002, fill=None, context_parallel=None) -> BalancePlan:
    """Assign items of the given lengths to `num_ranks` ranks, minimising the makespan.

    Args:
        lengths: 1-D non-negative integer lengths below 2**53, one per item (tokens, patches, frames).
        num_ranks: number of data-parallel ranks D >= 1.
        cost: per-item cost model f(l); default f(l) = l.
        costs: per-item costs instead of a model (unpadded only; not with `cost`): a packed
            document's sum of f over its documents, a loss-masked sample's effective
            tokens.  `lengths` stay what the memory cap counts.
        padded: rank cost is count · f(max l) (fixed-shape batches) instead of sum f(l).
        equal_counts: every rank holds floor(n / D) or ceil(n / D) items (verl's equal-size
            dispatch, LLaVA's sampler); algorithms "auto", "lpt", "karmarkar_karp" (their
            equal-count variants; padded problems exactly), "padded" and "identity"; not with `sources`
            or `groups`.
        groups: a group id per item (ints or strs); items of one group land on one rank.
            Any unpadded algorithm balances one super-item per group; not with
            `padded`, `equal_counts` or `sources`.
        algorithm: a registered name (`orchmllm.balancers.algorithms()`), peers' and plugins' included;
            its record says whether it supports `equal_counts`.
        max_tokens_per_rank: memory cap on tokens per rank (count · max l when padded).
        time_limit: seconds an exact or anytime solver may spend.
        sources: rank that holds each item now.  When given, the plan is
            communication-aware: within (1 + makespan_slack) of the plain plan's makespan,
            items stay on their rank, else on their node, as far as possible.  With
            algorithm="identity" every item simply stays on its source rank.
        item_bytes: bytes each item costs to move (default: its length).
        topology: any object with `gpus_per_node` and `world_size` (e.g.
            `orchmllm.topology.Topology`) whose world size is num_ranks; rank r is on node
            r // gpus_per_node.  Without it every rank counts as its own node.
        makespan_slack: relative makespan the communication-aware plan may add, >= 0.
        fill: with `sources`, unpadded only: how the communication-aware deal meets its target
            where its first phases do not (`balancers.locality.balance`): None repairs; "on_miss" deals
            again keeping the smallest items as filler (`balancers.locality.fill`: a few more
            bytes moved, no repair's searches), at once where the target leaves less room above
            the mean load than the smallest item; "only" always deals with the filler.
        context_parallel: an `orchmllm.ContextParallel`: items may be split over aligned groups of ranks where
            that pays (`balancers.context_parallel.split`).  `algorithm` is then the kernel of the unsplit
            candidate, today's plan, kept unless a plan that splits beats it by the spec's `min_gain`; it is
            not run where a split plan beats every unsplit plan's lower bound (the plan's `algorithm` then
            reads "context_parallel"); not the baseline ("identity") where a degree splits, and not with
            `costs`, `padded`, `equal_counts`, `groups`, `sources`, `item_bytes` or `fill`.

    Returns:
        A frozen `BalancePlan`; `InfeasibleError` (a ValueError) when the cap cannot be met; `TimeoutError` where
        an exact search ('ilp', 'exact') found no plan within its time limit (`exact.ilp.DEFAULT_TIME_LIMIT` when
        `time_limit` is None) and did not prove the cap infeasible.

    >>> plan = balance([5, 4, 3, 3, 3], 2, algorithm="lpt")
    >>> plan.assignment.tolist(), plan.loads.tolist(), plan.makespan, plan.lower_bound, str(plan.status)
    ([0, 1, 1, 0, 1], [8.0, 10.0], 10.0, 9.0, 'feasible')
    >>> str(balance([5, 4, 3, 3, 3], 2, algorithm="auto").status), balance([5, 4, 3, 3, 3], 2).makespan
    ('optimal', 9.0)

    Constraints: two items per rank (the rank with 10 must take a 1 too), a keep-together
    group, and explicit costs (here, tokens that carry loss) beside the lengths the cap counts:

    >>> plan = balance([10, 1, 1, 1], 2, equal_counts=True)
    >>> plan.assignment.tolist(), plan.makespan, plan.lower_bound
    ([0, 1, 1, 0], 11.0, 11.0)
    >>> balance([5, 5, 5, 1, 1, 1, 4, 4], 2, groups=["a", "a", "a", "b", "b", "b", "c", "c"]).assignment.tolist()
    [0, 0, 0, 1, 1, 1, 1, 1]
    >>> plan = balance([100, 100, 10], 2, costs=[30.0, 90.0, 10.0], max_tokens_per_rank=110)
    >>> plan.loads.tolist(), plan.tokens.tolist()
    ([90.0, 40.0], [100, 110])
    """
    as_real(makespan_slack, "makespan_slack")  # refused when bad, though only `sources` make a plan read it
    if context_parallel is not None:
        if topology is not None:
            gpus_per_node(topology, num_ranks)
        return balance_split(lengths, num_ranks, context_parallel, cost=cost, algorithm=algorithm,
                             max_tokens_per_rank=max_tokens_per_rank, time_limit=time_limit, topology=topology,
                             unsupported={"costs": costs, "padded": padded, "equal_counts": equal_counts,
                                          "groups": groups, "sources": sources, "item_bytes": item_bytes, "fill": fill})
    return solve(balance_request(lengths, num_ranks, cost=cost, costs=costs, padded=padded, equal_counts=equal_counts,
                                 groups=groups, algorithm=algorithm, max_tokens_per_rank=max_tokens_per_rank,
                                 time_limit=time_limit, sources=sources, item_bytes=item_bytes, topology=topology,
                                 makespan_slack=makespan_slack, fill=fill))


def balance_request(lengths, num_ranks, *, cost=None, costs=None, padded=False, equal_counts=False, groups=None,
                    algorithm="auto", max_tokens_per_rank=None, time_limit=None, sources=None, item_bytes=None,
                    topology=None, makespan_slack=0.002, fill=None) -> BalanceRequest:
    """`balance`'s arguments (see there) checked once, in `balance`'s order, into a `BalanceRequest`."""
    record = get_algorithm(algorithm)
    problem = make_problem(lengths, num_ranks, cost=cost, costs=costs, padded=padded, equal_counts=equal_counts,
                           max_tokens_per_rank=max_tokens_per_rank, time_limit=time_limit)
    kernel = _kernel_for(record, problem, sources is not None, groups is not None, fill)
    if groups is not None:
        return BalanceRequest(problem, kernel, algorithm, groups=as_groups(groups, problem.num_items),
                              certified=certifies(record), built_in=built_in(record))
    origins = as_origins(problem, sources, item_bytes, topology)
    return _request(record, algorithm, problem, kernel, origins, makespan_slack, fill)


def trusted_request(lengths: np.ndarray, num_ranks: int, *, cost=None, costs=None, padded: bool = False,
                    algorithm: str = "auto", max_tokens_per_rank: int | None = None, sources=None,
                    item_bytes=None, topology=None, makespan_slack=0.002, fill=None) -> BalanceRequest:
    """`balance_request` (no groups, equal counts or time limit) of data its caller built and checked where it
    was made: the orchestrator's (a `Batch` checks every column once, a `Stage` its cost model and cap, a
    `Topology` itself, and plans hold valid ranks).

    The caller vouches for the entries: `lengths` a non-empty 1-D int64 array of non-negative integers;
    `costs` (unpadded, without `cost`) one finite non-negative float64 per item; `sources` int64 ranks in
    [0, num_ranks); `item_bytes` finite and non-negative (made float64); `num_ranks` and the cap positive ints.
    They are not copied nor scanned again entry by entry (`balance_request` does, ~1 ms per 10^5 items, for
    users' input); `lengths` and `costs` are made read-only in place.  What the caller cannot know is checked,
    with `make_problem`'s errors: token and cost sums stay exact and finite, the cap holds the largest item;
    so are the algorithm, its options and the topology, as in `balance`.  A wrong dtype or shape is a
    TypeError, never a silent cast.

    >>> request = trusted_request(np.array([5, 4, 3, 3, 3]), 2, algorithm="lpt", sources=np.array([0, 0, 0, 1, 1]))
    >>> plan = balance([5, 4, 3, 3, 3], 2, algorithm="lpt", sources=[0, 0, 0, 1, 1])
    >>> solve(request).assignment.tolist(), plan.assignment.tolist(), request.makespan_slack
    ([0, 0, 1, 1, 1], [0, 0, 1, 1, 1], 0.002)
    >>> trusted_request(np.array([5.0, 4.0]), 2)
    Traceback (most recent call last):
    ...
    TypeError: `lengths` must be a non-empty 1-D int64 array (balance_request takes others); got float64, shape (2,)
    """
    _check_trusted("lengths", lengths, np.int64)
    record = get_algorithm(algorithm)
    check_token_range(lengths, padded)
    if costs is not None:
        _check_trusted("costs", costs, np.float64, lengths.size)
        if padded or cost is not None:
            raise ValueError("trusted_request takes `costs` of an unpadded problem and no `cost` beside them")
        check_cost_range(costs, lengths, padded, "`costs`")
    item_costs, cost = item_costs_of(lengths, cost, None, padded) if costs is None else (costs, None)
    problem = Problem(lengths=sealed(lengths), item_costs=sealed(item_costs), num_ranks=num_ranks, cost=cost,
                      padded=padded, max_tokens_per_rank=max_tokens_per_rank, time_limit=None)
    check_cap_lower_bound(problem)
    kernel = _kernel_for(record, problem, sources is not None, False, fill)
    origins = None
    if sources is not None:
        _check_trusted("sources", sources, np.int64, lengths.size)
        item_bytes = lengths if item_bytes is None else item_bytes
        _check_trusted("item_bytes", item_bytes, None, lengths.size)
        origins = Origins(sources, np.asarray(item_bytes, dtype=np.float64),
                          1 if topology is None else gpus_per_node(topology, num_ranks))
    return _request(record, algorithm, problem, kernel, origins, makespan_slack, fill)


def _check_trusted(name: str, array, dtype, size: int | None = None) -> None:
    """TypeError unless `array` is a non-empty 1-D numpy array of `dtype` (None: any) with `size` entries (None:
    any): the O(1) part of `trusted_request`'s contract."""
    if not (isinstance(array, np.ndarray) and array.ndim == 1 and array.size > 0 and size in (None, array.size)
            and dtype in (None, array.dtype)):
        got = f"{array.dtype}, shape {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
        want = (("" if dtype is None else f" {np.dtype(dtype).name}") + " array"
                + ("" if size is None else f" of {size}"))
        raise TypeError(f"`{name}` must be a non-empty 1-D{want} (balance_request takes others); got {got}")


def _request(record: Algorithm, algorithm: str, problem: Problem, kernel: Kernel, origins: Origins | None,
             makespan_slack, fill) -> BalanceRequest:
    """The request of a checked problem, kernel and origins (None: a plain plan, no slack read)."""
    slack = None if origins is None else as_real(makespan_slack, "makespan_slack")
    return BalanceRequest(problem, kernel, algorithm, origins=origins, makespan_slack=slack, fill=fill,
                          certified=certifies(record), built_in=built_in(record))


def solve(request: BalanceRequest) -> BalancePlan:
    """The certified plan of a checked request: its kernel run and, with origins, the items kept near
    them (communication-aware), timed together; groups balanced as super-items."""
    problem, algorithm, origins = request.problem, request.algorithm, request.origins
    if request.groups is not None:
        return _balance_groups(problem, request.groups, request.kernel, algorithm, request.certified,
                               request.built_in)
    if origins is not None and algorithm == "identity":
        return _keep_sources(problem, origins.sources)
    start = time.perf_counter()
    try:
        result, bound = run_kernel(request.kernel, problem, algorithm, request.built_in)
    except InfeasibleError as error:
        if origins is None or error.heuristic is None:
            raise
        result, bound, assignment = _near_sources_uncapped(request, error)
    else:
        assignment = result.assignment
        if origins is not None:
            assignment = balance_locally(problem, assignment, origins, request.makespan_slack, request.fill)
    if origins is not None:
        assignment = _free_items_home(problem, assignment, origins)
    if request.certified and not request.built_in:
        cross_examine(problem, result.lower_bound, bound, algorithm)
    seconds = time.perf_counter() - start
    return make_plan(problem, assignment, result.status if origins is None else Status.FEASIBLE, algorithm,
                     kernel_bound=result.lower_bound, solve_seconds=seconds, communication_aware=origins is not None,
                     certified=request.certified, bound=bound)


def _free_items_home(problem: Problem, assignment: np.ndarray, origins: Origins) -> np.ndarray:
    """`assignment` with the items of cost 0 back on their source ranks, as many as each source's room under the
    cap allows (shortest first): they change no load, so any bytes they move are wasted (probe24 P24-03/04: 42 % of
    the bytes moved on half-free instances).  Not padded, where an item adds a row to its rank's count (rev16
    R16-09: sent home, empty items doubled a padded plan's makespan)."""
    away = np.flatnonzero((problem.item_costs == 0) & (assignment != origins.sources))
    if problem.padded or not away.size:
        return assignment
    result = assignment.copy()
    cap = problem.max_tokens_per_rank
    if cap is None:
        result[away] = origins.sources[away]
        return result
    home = away[fit_in_turn(origins.sources[away], problem.lengths[away], cap - rank_tokens(problem, assignment))]
    result[home] = origins.sources[home]
    return result


def _near_sources_uncapped(request: BalanceRequest, refusal: InfeasibleError):
    """(result, bound, assignment) of the kernel's plan without the cap, kept near the sources, where it meets the
    cap that the kernel's capped greedy refused; else `refusal`.  The pass re-deals the plan, so the call without
    the cap can meet a cap its kernel alone overflows (probe23 P23-09: lpt refused its own sources plan's tokens on
    86 of 400 tiny instances)."""
    problem, origins = request.problem, request.origins
    free = dataclasses.replace(problem, max_tokens_per_rank=None)
    result, bound = run_kernel(request.kernel, free, request.algorithm, request.built_in)
    assignment = balance_locally(free, result.assignment, origins, request.makespan_slack, request.fill)
    if rank_tokens(problem, assignment).max() > problem.max_tokens_per_rank:
        raise refusal
    return result, bound, assignment


def _kernel_for(record: Algorithm, problem: Problem, with_sources: bool, with_groups: bool, fill) -> Kernel:
    """The kernel `balance` runs: the record's, or its equal-counts one; ValueError for options
    that do not go together."""
    if not record.solves(problem.padded):
        raise ValueError(record.why_not(problem.padded))
    if fill not in FILLS:
        raise ValueError(f"`fill` must be one of {FILLS}; got {fill!r}")
    if fill is not None and not with_sources:
        raise ValueError(f"`fill` needs `sources` (it shapes the communication-aware deal); got fill={fill!r}")
    if fill is not None and problem.padded:
        raise ValueError(f"`fill` applies to unpadded costs only (a padded plan's groups are placed by the exact "
                         f"LAP); got fill={fill!r} with padded=True")
    kernel = record.kernel
    if problem.equal_counts:
        if with_sources:
            raise ValueError("`equal_counts=True` cannot be combined with `sources`: the communication-aware pass "
                             "moves items without keeping the counts")
        if record.equal_counts is None:
            able = [other.name for other in algorithms(padded=problem.padded) if other.equal_counts is not None]
            raise ValueError(f"algorithm {record.name!r} does not support `equal_counts=True`; choose one of {able}")
        kernel = record.equal_counts
    if with_groups:
        for name, conflict in (("padded=True", problem.padded), ("equal_counts=True", problem.equal_counts),
                               ("sources", with_sources)):
            if conflict:
                raise ValueError(f"`groups` cannot be combined with `{name}`: groups are balanced as super-items "
                                 f"of summed costs, unpadded, counted as one item each, from no source rank")
    return kernel


def _balance_groups(problem, labels, kernel, algorithm: str, certified: bool = True,
                    built_in: bool = False) -> BalancePlan:
    """Balance one super-item per group, then send every item to its group's rank."""
    target = group_problem(problem, labels)
    start = time.perf_counter()
    result, bound = run_kernel(kernel, target, algorithm, built_in)
    if certified and not built_in:
        cross_examine(target, result.lower_bound, bound, algorithm)
    seconds = time.perf_counter() - start
    grouped = make_plan(target, result.assignment, result.status, algorithm, kernel_bound=result.lower_bound,
                        certified=certified, bound=bound)
    assignment = grouped.assignment[labels]
    status = grouped.status
    if status is Status.OPTIMAL and rank_loads(problem, assignment).max() > grouped.makespan:
        status = Status.FEASIBLE  # item loads summed in another order rounded above the proven optimum
    return make_plan(problem, assignment, status, algorithm, kernel_bound=grouped.lower_bound, solve_seconds=seconds)


def _keep_sources(problem, sources) -> BalancePlan:
    """The identity plan when sources are known: every item stays where it is."""
    cap = problem.max_tokens_per_rank
    tokens = rank_tokens(problem, sources)
    if cap is not None and tokens.max() > cap:
        rank = int(tokens.argmax())
        raise InfeasibleError(
            f"`identity` keeps every item on its source, and rank {rank} holds {int(tokens[rank])} tokens > "
            f"max_tokens_per_rank={cap}; a cap of at least {int(tokens.max())} is needed",
            min_cap=int(tokens.max()))
    return make_plan(problem, sources, Status.FEASIBLE, "identity")


def cross_examine(problem: Problem, claimed, proven: float, algorithm: str) -> None:
    """RuntimeError naming a certifying plugin (`registry.certifies`: registered `exact`) whose claimed bound
    a plan of orchmllm's own beats: no plan beats a lower bound, so a claim above a makespan reached is false.

    Run only where the claim goes beyond the bound orchmllm `proven` itself, with 'auto' as the witness (LPT,
    KK, MULTIFIT and SLACK improved by local search: milliseconds beside an exact plugin's solve; no ILP, so
    without the problem's time limit), and where the witness's plan is one of the problem's (not under
    `equal_counts`, which it ignores).  A claim above the plugin's own plan is refused where the plan is made
    (`plan.claimed_bound`); one between the witness's makespan and the optimum survives and is the kernel's
    word (`check_conformance` tests it against the exact optimum on small instances).
    """
    if claimed is None or problem.equal_counts or not is_real(claimed) or not claimed > proven:
        return
    try:
        witness = float(rank_loads(problem, auto.solve(dataclasses.replace(problem, time_limit=None)).assignment).max())
    except InfeasibleError:
        return  # no plan of its own under the cap: nothing to weigh the claim against
    if witness < float(claimed) * (1.0 - (problem.num_items + 1) * 2.0**-52):
        raise RuntimeError(f"algorithm {algorithm!r} returned lower_bound={claimed!r}, but orchmllm's 'auto' plan of "
                           f"the same problem reaches a makespan of {witness!r}: no plan beats a lower bound, so the "
                           f"kernel's certificate is false")

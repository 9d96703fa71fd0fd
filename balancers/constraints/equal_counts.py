"""Balancing with equal item counts: every rank holds floor(n / D) or ceil(n / D) items.

minimise max_r cost(r)  subject to  |r| in {q, q + 1}, q = n // D (so n - q·D ranks hold q + 1),
and the memory cap, i.e.

    minimise max(loads) where loads[r] = sum(cost[i] for i on r)
    and len(items[r]) in (n // D, n // D + 1) for every rank r

as verl's dispatch (equal-size partitions) and LLaVA's sampler require.  Kernels:
- `lpt`: longest processing time first, each item to the least-loaded rank that still
  has room for it (count and cap);
- `karmarkar_karp`: the balanced largest differencing method (BLDM; Yakir 1996,
  Michiels et al. 2003, and the equal-size mode of verl's `karmarkar_karp`): items sorted
  by cost are cut into tuples of D (the last padded with zero-cost dummies), a tuple is a
  partial plan with one item per rank, and the two partial plans of largest spread are
  merged, heaviest rank with lightest, until one is left;
- `improve`: count-preserving local search on the heaviest rank: swap one of its items
  for a lighter one of another rank, or move one to a rank of q items when it holds q + 1;
- `solve`: the better of both (ties: LPT's), improved;
- `padded`: exact for padded costs: the sorted-runs argument of `padded.py` keeps the
  counts, and a greedy feasibility check (a run of q + 1 wherever it fits) is exact.
Every step breaks ties by index and is bounded by a work count, so plans are
bit-identical on every machine.  No guarantee beyond LPT's and BLDM's own for the
unpadded kernels; `padded` is optimal.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from ..bounds import cap_refusal, uncapped_fit
from ..exact.ilp import DEFAULT_TIME_LIMIT, model_binaries, search, time_limit_of
from ..exact.verdict import CapInfeasible
from ..problem import (InfeasibleError, KernelResult, Problem, Status, count_limits, make_problem, rank_loads,
                       rank_tokens)

SEARCH_RANKS = 8
"""Partner ranks one local-search step considers: the lightest ones."""

WORK_PER_ITEM = 4
"""Local-search steps allowed per item (and at least 1000)."""

TINY_BINARIES = 64
"""A cap equal-count LPT gives up on is decided by the MILP up to this many binaries (`_decided`)."""

TINY_NODES = 500
"""Branch-and-bound nodes that MILP may take (`_decided`): a budget of work, not of seconds, so every rank ends it
alike.  The held-out tiny grids need at most 117 (900 instances, 256 MILP runs); random 16-20-bit lengths under a
cap of exactly the mean (a partition problem) need 5 000-32 000 (probe27 P27-01: 4-13 s, past the clock)."""


def _room(counts: list[int], rank: int, q: int, full_ranks: int, r: int) -> bool:
    """Whether `rank` may take one more item: below q, or at q while ranks of q + 1 remain."""
    return counts[rank] < q or (counts[rank] == q and full_ranks < r)


def lpt(problem: Problem, cap: int | None = None) -> np.ndarray:
    """Largest cost first to the least-loaded rank with room (count, then cap); ties by rank."""
    q, r = count_limits(problem.num_items, problem.num_ranks)
    heap = [(0.0, rank) for rank in range(problem.num_ranks)]
    counts, tokens = [0] * problem.num_ranks, [0] * problem.num_ranks
    full_ranks = 0  # ranks holding q + 1 items
    assignment = np.empty(problem.num_items, dtype=np.int64)
    lengths, costs = problem.lengths.tolist(), problem.item_costs.tolist()
    for item in problem.cost_order.tolist():
        length, skipped = lengths[item], []
        while heap:
            rank = heap[0][1]
            if not _room(counts, rank, q, full_ranks, r):
                heapq.heappop(heap)  # full for good: counts never fall
            elif cap is not None and tokens[rank] + length > cap:
                skipped.append(heapq.heappop(heap))
            else:
                break
        if not heap:
            proven = cap_refusal(problem.lengths, problem.num_ranks, cap)  # equal counts or not (rev15 R15-01)
            if proven is not None:
                raise proven
            enough = int(rank_tokens(problem, lpt(problem)).max())
            raise InfeasibleError(
                f"equal-count `lpt` found no rank with room for item {item} ({length} tokens) under "
                f"max_tokens_per_rank={cap} with {q} or {q + 1} items per rank; it fits under a cap of {enough}, "
                f"and a smaller cap may still be feasible: algorithm='exact' decides", min_cap=enough, heuristic="lpt")
        load, rank = heapq.heappop(heap)
        assignment[item] = rank
        counts[rank] += 1
        tokens[rank] += length
        full_ranks += counts[rank] == q + 1
        heapq.heappush(heap, (load + costs[item], rank))
        for entry in skipped:
            heapq.heappush(heap, entry)
    return assignment


def karmarkar_karp(problem: Problem) -> np.ndarray:
    """Balanced largest differencing: merge the partial plans of largest spread first."""
    d = problem.num_ranks
    order = problem.cost_order
    tuples = -(-problem.num_items // d)
    items = np.full(tuples * d, -1, dtype=np.int64)  # dummies (-1) pad the last, cheapest tuple
    items[:order.size] = order
    items = items.reshape(tuples, d)
    costs = np.where(items >= 0, problem.item_costs[np.maximum(items, 0)], 0.0)
    heap = []  # (-spread, age, sums (D,), members (D, k))
    for age in range(tuples):
        sums = costs[age]
        heap.append((-(float(sums.max()) - float(sums.min())), age, sums, items[age][:, None]))
    heapq.heapify(heap)
    age = tuples
    while len(heap) > 1:
        _, _, sums_a, members_a = heapq.heappop(heap)
        _, _, sums_b, members_b = heapq.heappop(heap)
        heavy = np.argsort(-sums_a, kind="stable")  # heaviest of one with the lightest of the other
        light = np.argsort(sums_b, kind="stable")
        sums = sums_a[heavy] + sums_b[light]
        members = np.concatenate([members_a[heavy], members_b[light]], axis=1)
        heapq.heappush(heap, (-(float(sums.max()) - float(sums.min())), age, sums, members))
        age += 1
    members = heap[0][3]
    assignment = np.empty(problem.num_items, dtype=np.int64)
    ranks = np.repeat(np.arange(d, dtype=np.int64), members.shape[1])
    flat = members.ravel()
    real = flat >= 0
    assignment[flat[real]] = ranks[real]
    return assignment


class _Search:
    """The mutable state of the count-preserving local search."""

    def __init__(self, problem: Problem, assignment: np.ndarray):
        self.problem = problem
        self.assignment = assignment.copy()
        self.loads = rank_loads(problem, self.assignment)
        self.tokens = rank_tokens(problem, self.assignment)
        self.counts = np.bincount(self.assignment, minlength=problem.num_ranks)
        self.q = count_limits(problem.num_items, problem.num_ranks)[0]
        self.cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
        self._members: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def members(self, rank: int) -> tuple[np.ndarray, np.ndarray]:
        """Items of `rank` sorted by cost (ties by index), and their costs."""
        if rank not in self._members:
            items = np.flatnonzero(self.assignment == rank)
            costs = self.problem.item_costs[items]
            order = np.argsort(costs, kind="stable")
            self._members[rank] = items[order], costs[order]
        return self._members[rank]

    def relocate(self, item: int, rank: int) -> None:
        old = int(self.assignment[item])
        cost, length = self.problem.item_costs[item], int(self.problem.lengths[item])
        self.assignment[item] = rank
        self.loads[old] -= cost
        self.loads[rank] += cost
        self.tokens[old] -= length
        self.tokens[rank] += length
        self.counts[old] -= 1
        self.counts[rank] += 1
        self._members.pop(old, None)
        self._members.pop(rank, None)

    def best_change(self, heavy: int, partners: np.ndarray) -> tuple[float, int, int, int] | None:
        """The change on `heavy` that lowers the pair's maximum most: (new max, item, rank, partner item or -1)."""
        items, costs = self.members(heavy)
        lengths = self.problem.lengths[items]
        top = self.loads[heavy]
        best = None
        for rank in partners.tolist():
            gap = top - self.loads[rank]
            if gap <= 0:
                continue
            if self.counts[heavy] > self.q and self.counts[rank] == self.q:  # a move keeps the counts' multiset
                fits = (costs > 0) & (costs < gap) & (self.tokens[rank] + lengths <= self.cap)
                if fits.any():
                    peak = np.maximum(top - costs, self.loads[rank] + costs)
                    peak = np.where(fits, peak, np.inf)
                    index = int(np.argmin(peak))
                    if best is None or peak[index] < best[0]:
                        best = (float(peak[index]), int(items[index]), rank, -1)
            others, other_costs = self.members(rank)
            if not others.size:
                continue
            targets = costs - gap / 2  # the ideal partner cost halves the gap
            position = np.searchsorted(other_costs, targets)
            for candidate in (np.minimum(position, others.size - 1), np.maximum(position - 1, 0)):
                delta = costs - other_costs[candidate]
                other_lengths = self.problem.lengths[others[candidate]]
                fits = ((delta > 0) & (delta < gap) & (self.tokens[heavy] - lengths + other_lengths <= self.cap)
                        & (self.tokens[rank] + lengths - other_lengths <= self.cap))
                if not fits.any():
                    continue
                peak = np.where(fits, np.maximum(top - delta, self.loads[rank] + delta), np.inf)
                index = int(np.argmin(peak))
                if best is None or peak[index] < best[0]:
                    best = (float(peak[index]), int(items[index]), rank, int(others[candidate[index]]))
        return best


def improve(problem: Problem, assignment: np.ndarray, work_limit: int | None = None) -> np.ndarray:
    """Count-preserving local search on the heaviest rank; never raises the makespan.

    Every accepted change lowers the heaviest rank and lifts its partner to below the old
    maximum, so the sum of squared loads falls and the search ends; `work_limit` steps
    (default max(1000, 4·n)) bound it.
    """
    state = _Search(problem, assignment)
    steps = max(1000, WORK_PER_ITEM * problem.num_items) if work_limit is None else work_limit
    for _ in range(steps):
        heavy = int(np.argmax(state.loads))
        lightest = np.argsort(state.loads, kind="stable")[:SEARCH_RANKS + 1]
        change = state.best_change(heavy, lightest[lightest != heavy][:SEARCH_RANKS])
        if change is None or not change[0] < state.loads[heavy]:
            break
        _, item, rank, partner = change
        state.relocate(item, rank)
        if partner >= 0:
            state.relocate(partner, heavy)
    # Loads were updated incrementally; the plan is scored afresh by `make_plan`.
    return state.assignment


def solve_lpt(problem: Problem) -> KernelResult:
    """Equal-count LPT (capped when the problem has a cap); padded problems get `solve_padded`."""
    if problem.padded:
        return solve_padded(problem)
    return KernelResult(lpt(problem, problem.max_tokens_per_rank))


def solve_karmarkar_karp(problem: Problem) -> KernelResult:
    """Balanced largest differencing; the capped equal-count LPT when it overflows the cap.

    Padded problems get `solve_padded`.
    """
    if problem.padded:
        return solve_padded(problem)
    assignment = karmarkar_karp(problem)
    cap = problem.max_tokens_per_rank
    if cap is not None and rank_tokens(problem, assignment).max() > cap:
        return solve_lpt(problem)
    return KernelResult(assignment)


def solve(problem: Problem) -> KernelResult:
    """The better of equal-count LPT and BLDM, improved by count-preserving local search; under a cap, the plan
    made without it wherever that meets the cap (a cap it meets changes nothing: `auto._under_the_cap`, which says
    what that gives up: up to 0.79 % here on the review's held-out rows).

    >>> from orchmllm.balancers import make_problem
    >>> solve(make_problem([5, 4, 3, 3, 3, 1, 1], 2, equal_counts=True)).assignment.tolist()
    [0, 1, 1, 0, 1, 0, 0]
    """
    if problem.padded:
        return solve_padded(problem)
    cap = problem.max_tokens_per_rank
    if cap is not None:
        free = uncapped_fit(problem, solve)
        if free is not None:
            return free
    try:
        starts = [solve_lpt(problem).assignment]
    except InfeasibleError as refusal:
        return _decided(problem, refusal)
    differenced = karmarkar_karp(problem)
    if cap is None or rank_tokens(problem, differenced).max() <= cap:
        starts.append(differenced)
    makespans = [float(rank_loads(problem, start).max()) for start in starts]
    best = starts[int(np.argmin(makespans))]
    improved = improve(problem, best)
    # The search tracks loads incrementally: keep its plan only if the exact loads agree it is no worse.
    return KernelResult(improved if rank_loads(problem, improved).max() <= min(makespans) else best)


def _decided(problem: Problem, refusal: InfeasibleError) -> KernelResult:
    """The MILP's plan (with its count rows; 19 ms median, 112 ms at most on review R18-08's held-out instances)
    where equal-count LPT gave up on a cap and the model has at most TINY_BINARIES binaries, else `refusal` raised
    (as where the MILP proves that no plan fits, or ends its TINY_NODES nodes with none): probe26 P26-05, auto
    refused 90 of 269 feasible tiny instances, e.g. [8, 35, 29] on 2 ranks under a cap of 38.  Its budget is nodes,
    not seconds (probe27 P27-01: under a clock the same call planned on one run and refused on another), and a plan
    it found under the cap without proving it optimal is kept, `feasible`.  The clock (the default time limit, or a
    user's longer one) only guards a machine too slow for the nodes: 0.2-0.8 s of them on a quiet one."""
    if refusal.heuristic is None or model_binaries(problem) > TINY_BINARIES:
        raise refusal
    try:
        result = search(problem, None, max(time_limit_of(problem), DEFAULT_TIME_LIMIT), TINY_NODES)
    except TimeoutError:  # no plan in the nodes, and none proven impossible
        raise refusal from None
    if isinstance(result, CapInfeasible):
        raise refusal
    if result.status is Status.TIME_LIMIT:
        return KernelResult(result.assignment, Status.FEASIBLE, lower_bound=result.lower_bound)
    return result


def _padded_runs(sorted_lengths: list[int], sorted_costs: list[float], num_ranks: int, q: int, r: int,
                 makespan: float, cap: float) -> list[int] | None:
    """Run sizes (q + 1 wherever it fits, while r of them remain) under `makespan`, or None."""
    sizes, position, big = [], 0, 0
    for _ in range(num_ranks):
        if position >= len(sorted_lengths):
            size = 0
        else:
            length, cost = sorted_lengths[position], sorted_costs[position]
            if big < r and (q + 1) * cost <= makespan and (q + 1) * length <= cap:
                size = q + 1
            elif q * cost <= makespan and q * length <= cap:
                size = q
            else:
                return None
        big += size == q + 1
        sizes.append(size)
        position += size
    return sizes if big == r else None


def solve_padded(problem: Problem) -> KernelResult:
    """Exact padded equal-count plan: bisect the makespan over the values run · f(length).

    >>> from orchmllm.balancers import make_problem
    >>> solve_padded(make_problem([5, 4, 3, 3, 3, 1, 1], 2, padded=True, equal_counts=True)).assignment.tolist()
    [0, 0, 0, 1, 1, 1, 1]

    An optimal plan holds contiguous runs of the sorted items (the exchange argument of
    `padded.py` keeps every rank's count), so a makespan is feasible iff the greedy that
    takes a run of q + 1 wherever it fits (a later start is never longer) succeeds.
    """
    q, r = count_limits(problem.num_items, problem.num_ranks)
    order = problem.length_order
    sorted_lengths = problem.lengths[order].tolist()
    sorted_costs = problem.cost.item_costs(problem.lengths[order]).tolist()
    cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
    values = sorted({size * cost for cost in sorted_costs for size in (q, q + 1) if size})
    runs = _padded_runs(sorted_lengths, sorted_costs, problem.num_ranks, q, r, values[-1], cap)
    if runs is None:  # the least cap is the optimum of the padded tokens themselves (probe23: the runs dealt
        tokens = solve_padded(make_problem(problem.lengths, problem.num_ranks, padded=True, equal_counts=True))
        raise InfeasibleError(  # longest first named 6 where a plan of 4 fits, [1, 2, 3] on 2 ranks)
            f"no padded plan with {q} or {q + 1} items per rank fits max_tokens_per_rank={cap} on "
            f"{problem.num_ranks} ranks; the smallest cap that works is {int(tokens.lower_bound)}",
            min_cap=int(tokens.lower_bound))
    low, high = 0, len(values) - 1  # values[high] is feasible
    while low < high:
        middle = (low + high) // 2
        attempt = _padded_runs(sorted_lengths, sorted_costs, problem.num_ranks, q, r, values[middle], cap)
        if attempt is None:
            low = middle + 1
        else:
            high, runs = middle, attempt
    assignment = _deal(order, runs, problem.num_ranks)
    return KernelResult(assignment, Status.OPTIMAL, float(rank_loads(problem, assignment).max()))


def _deal(order: np.ndarray, sizes: list[int], num_ranks: int) -> np.ndarray:
    """Rank j takes the j-th run of `sizes` items of `order`."""
    assignment = np.empty(order.size, dtype=np.int64)
    assignment[order] = np.repeat(np.arange(num_ranks, dtype=np.int64), sizes)
    return assignment


"""Exact P||Cmax for unpadded stages: bounds, then bin packing at the candidate makespans.

minimise max(loads) where loads[r] = sum(cost[i] for i on r), i.e. the smallest capacity C
such that the items fit D bins of capacity C (the reduction of Dell'Amico & Martello 1995,
also used by Dell'Amico, Iori, Martello & Monaci 2008; our own code from the papers'
descriptions):

    upper = a start plan (the `exact` kernel's: auto's plan, LPT, KK, MULTIFIT + local search)
    if n <= COMBINATORIAL_MAX_ITEMS: branch and bound on the makespan proves it (no LP;
                                     memory caps tracked, infeasibility proven too)
    lower = simple bound, lifted by scanning C while L2(C) > D or bin completion refutes C
    lower = raised by the pattern LP (Gilmore-Gomory): gallop up, then bisect
    while lower < upper:                         # is C = lower feasible?
        L2, bin completion or the pattern LP refutes C -> lower += 1
        a dive on the LP (`dive`, once per C), the integer master over the LP's
        patterns or bin completion packs C -> upper = C
        neither within the work budget -> budget x 4 (until the time limit)

Bin completion (`_Search.pack`) and the bounds are described where they are defined
(`bounds` holds L2 and the pattern LP, `dive` the LP dive).

Exactness: costs are made integers by the smallest power-of-two scale that does it (exact
in floats, so f(l) = l + l**2/1024 is exact); costs that no such scale makes integers
below 2**50, and (above `COMBINATORIAL_MAX_ITEMS` items) memory caps that can bind
(tokens per rank <= cap may cut a plan of makespan below the start's), are for
`ilp.improve` (HiGHS), whose status then applies (the `exact` kernel, kernels/exact.py,
chooses).  This room proves and never runs a heuristic: its searches start from the
caller's plan.  Status: `optimal` only when the bound meets the plan; `time_limit` with
the proven bound when the time runs out.  Determinism: every step has a work budget
(nodes, LP rounds, MILP nodes), so a plan proven optimal is the same on every machine;
the wall clock only stops the search, and a stopped search returns its incumbent (then
machine-dependent, never worse than the start).
"""

from __future__ import annotations

import bisect
import time

import numpy as np

from ..problem import KernelResult, Problem, Status, make_problem, rank_loads
from . import milp
from .bounds import PatternLP, item_types, l2_bins, simple_bound
from .dive import assign, dive
from .verdict import CapInfeasible

COMBINATORIAL_MAX_ITEMS = 16
"""Up to this many items the proof is branch and bound alone (no LP, no MILP)."""

SMALL_NODES = 1_000_000
"""Node budget of `branch_and_bound` on small instances (about a second of pure Python)."""

BASE_NODES = 20_000
"""Branch-and-bound nodes of the first attempt at a capacity; each retry has 4× more."""

FINISH_NODES = 20_000
"""Branch-and-bound nodes that may complete a dive's last items."""

_LP_ROUNDS = 400
_QUICK_NODES = 2_000
_MAX_SCALE_BITS = 40
_MAX_INTEGER = 2.0**50


def integer_costs(costs: np.ndarray) -> tuple[np.ndarray, float] | None:
    """(int64 costs · 2**k, 2**k) for the smallest k that makes them integers, else None.

    >>> integer_costs(np.array([1.5, 2.25]))
    (array([6, 9]), 4.0)
    """
    for bits in range(_MAX_SCALE_BITS + 1):
        scaled = costs * 2.0**bits
        if float(scaled.sum()) >= _MAX_INTEGER:
            return None
        if np.all(scaled == np.floor(scaled)):
            return scaled.astype(np.int64), 2.0**bits
    return None


def exact_integers(costs: np.ndarray) -> np.ndarray:
    """The finite non-negative float costs times their common power-of-two denominator, as
    exact Python integers (object array): the scale of `integer_costs`, without its bound.

    >>> exact_integers(np.array([1.5, 2.25])).tolist(), exact_integers(np.array([0.1, 0.2])).tolist()
    ([6, 9], [3602879701896397, 7205759403792794])
    """
    ratios = [value.as_integer_ratio() for value in costs.tolist()]
    denominator = max((den for _, den in ratios), default=1)
    return np.array([num * (denominator // den) for num, den in ratios], dtype=object)


def cap_can_bind(problem: Problem, below: float) -> bool:
    """Whether some rank of cost < `below` could hold more tokens than the cap.

    Fractional knapsack: the most tokens a rank of that cost can hold, taking items in
    order of tokens per unit of cost (zero-cost items with tokens make it unbounded)."""
    cap = problem.max_tokens_per_rank
    if cap is None or int(problem.lengths.sum()) <= cap:
        return False
    costs, lengths = problem.item_costs, problem.lengths.astype(float)
    if np.any((costs == 0) & (lengths > 0)):
        return True
    order = np.argsort(-lengths / np.where(costs > 0, costs, 1.0), kind="stable")
    spent = np.cumsum(costs[order])
    full = np.searchsorted(spent, below, side="right")
    tokens = float(lengths[order][:full].sum())
    if full < order.size:
        item = order[full]
        tokens += lengths[item] * (below - (spent[full - 1] if full else 0.0)) / costs[item]
    return tokens > cap


class _Stopped(Exception):
    """The wall-clock deadline passed inside a step."""


class _Search:
    """One exact solve on integer costs `w` (sorted descending) over `m` bins."""

    def __init__(self, w: np.ndarray, m: int, deadline: float):
        self.w, self.m, self.deadline = w, m, deadline
        self.suffix = np.concatenate((np.cumsum(w[::-1])[::-1], [0])).tolist()
        self.pool: dict[bytes, np.ndarray] = {}
        self.lps: dict[int, PatternLP] = {}
        self.dived: set[int] = set()

    # ---------------------------------------------------------------- bin completion
    def pack(self, capacity: int, node_limit: int) -> tuple[str, list[int] | None]:
        """("feasible", bin of each item) | ("infeasible", None) | ("unknown", None).

        Bin completion (Korf 2002): the largest item left opens a bin, which is closed at
        once with a maximal set of the items left (no item left fits its room), fullest
        sets first; the room closed bins leave may not exceed the slack m·C - sum.  Items
        of equal cost are one type, so no two equal sets are tried twice.
        """
        sizes, type_of, demand = item_types(self.w)
        sizes, counts = sizes.tolist(), demand.tolist()
        descending = [-size for size in sizes]
        num_types = len(sizes)
        slack = self.m * capacity - self.suffix[0]
        if slack < 0 or sizes[0] > capacity:
            return "infeasible", None
        closed: list[list[int]] = []
        nodes = [0]

        def smallest_left() -> int:
            return next((sizes[t] for t in range(num_types - 1, -1, -1) if counts[t]), capacity + 1)

        def subsets(first: int, low: int, high: int, chosen: list[int], found: list):
            """Maximal multisets of types >= `first` with sum in [low, high]: (room left, types).
            Every call is one unit of the node budget (the sets can number in the millions)."""
            nodes[0] += 1
            if nodes[0] > node_limit:
                raise _Budget
            if low <= 0 and smallest_left() > high:
                found.append((high, tuple(chosen)))
            for t in range(max(first, bisect.bisect_left(descending, -high)), num_types):
                size = sizes[t]
                if counts[t] == 0:
                    continue
                counts[t] -= 1
                chosen.append(t)
                subsets(t, low - size, high - size, chosen, found)
                chosen.pop()
                counts[t] += 1

        def complete(bins_left: int, wasted: int) -> bool:
            opener = next((t for t in range(num_types) if counts[t]), None)
            if opener is None:
                return True
            if bins_left == 0:
                return False
            nodes[0] += 1
            if nodes[0] > node_limit:
                raise _Budget
            if nodes[0] & 1023 == 0 and time.perf_counter() > self.deadline:
                raise _Stopped
            counts[opener] -= 1
            room = capacity - sizes[opener]
            candidates: list = []
            subsets(opener, room - (slack - wasted), room, [], candidates)
            candidates.sort(key=lambda candidate: candidate[0])
            for left, chosen in candidates:
                for t in chosen:
                    counts[t] -= 1
                closed.append([opener, *chosen])
                if complete(bins_left - 1, wasted + left):
                    return True
                closed.pop()
                for t in chosen:
                    counts[t] += 1
            counts[opener] += 1
            return False

        try:
            found = complete(self.m, 0)
        except _Budget:
            return "unknown", None
        if not found:
            return "infeasible", None
        items_of = [list(np.flatnonzero(type_of == t)) for t in range(num_types)]
        where = [0] * self.w.size
        for index, types in enumerate(closed):
            for t in types:
                where[items_of[t].pop()] = index
        return "feasible", where

    # ---------------------------------------------------------------- LP and integer master
    def lp_bound(self, capacity: int) -> PatternLP:
        if capacity not in self.lps:  # warm-started from the duals of the nearest capacity solved
            near = min(self.lps, key=lambda solved: (abs(solved - capacity), solved), default=None)
            self.lps[capacity] = PatternLP(self.w, capacity, self.pool, None if near is None else self.lps[near].center)
        return self.lps[capacity]

    def master(self, lp: PatternLP, node_limit: int) -> list[int] | None:
        """Bins of a packing into m bins built from the LP's patterns, or None."""
        columns = np.array(lp.columns, dtype=float).T
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise _Stopped
        result = milp.solve_milp(np.zeros(columns.shape[1]), integrality=np.ones(columns.shape[1]),
                                 bounds=(0, self.m),
                                 constraints=[(columns, lp.demand.astype(float), np.inf),
                                              (np.ones((1, columns.shape[1])), -np.inf, self.m)],
                                 node_limit=node_limit, time_limit=left)
        if result.status == 1 and time.perf_counter() >= self.deadline:
            raise _Stopped  # cut by the clock: whatever it found would be machine-dependent
        if result.x is None:
            return None
        counts = np.rint(result.x).astype(np.int64)
        where = [0] * self.w.size
        items_of = [list(np.flatnonzero(lp.type_of == t)) for t in range(lp.sizes.size)]
        bin_index = 0
        for j in np.flatnonzero(counts).tolist():
            for _ in range(int(counts[j])):
                for t in np.flatnonzero(lp.columns[j]).tolist():
                    for _ in range(int(lp.columns[j][t])):
                        if items_of[t]:
                            where[items_of[t].pop()] = bin_index
                bin_index += 1
        return where

    # ---------------------------------------------------------------- one capacity
    def decide(self, capacity: int, budget: int) -> tuple[str, list[int] | None]:
        """Is `capacity` feasible, within a work budget of `budget` nodes?"""
        if time.perf_counter() > self.deadline:
            raise _Stopped
        if l2_bins(self.w, capacity) > self.m:
            return "infeasible", None
        verdict, where = self.pack(capacity, _QUICK_NODES)
        if verdict != "unknown":
            return verdict, where
        lp = self.lp_bound(capacity)
        rounds = _LP_ROUNDS * budget // BASE_NODES
        if lp.bins(self.m, rounds, self.deadline) > self.m:
            return "infeasible", None
        if lp.bins(self.m, rounds, self.deadline, converge=True) > self.m:
            return "infeasible", None
        if capacity not in self.dived:  # the dives are deterministic: once per capacity
            self.dived.add(capacity)
            # the LP's columns, then one column per step, then the columns of this capacity alone
            for columns, rounding in ((lp.columns, True), (lp.columns, False), ([], True)):
                bins = dive(self.w, capacity, self.m, columns, self.deadline, self.finish(capacity), rounding)
                if bins is not None:
                    return "feasible", assign(bins, self.w)
        where = self.master(lp, node_limit=budget // 20)
        if where is not None:
            return "feasible", where
        return self.pack(capacity, budget)

    def finish(self, capacity: int):
        """The exact end of a dive: `branch_and_bound` packs the items left into the bins left."""
        def pack_rest(items: np.ndarray, num_bins: int) -> list[list[int]] | None:
            plan, _ = branch_and_bound(items.tolist(), num_bins, capacity, None, FINISH_NODES)
            if plan is None:
                return None
            bins = [[] for _ in range(num_bins)]
            for cost, where in zip(items.tolist(), plan):
                bins[where].append(cost)
            return bins if max(map(sum, bins)) <= capacity else None
        return pack_rest

    def raise_lower(self, lower: int, upper: int) -> int:
        """The smallest capacity not proven infeasible by L2 or quick packing (a scan up
        from `lower`) and then by the LP (bisection: infeasibility is monotone in the
        capacity, so every proof below stands)."""
        while lower < upper:
            if l2_bins(self.w, lower) <= self.m:
                verdict = self.pack(lower, _QUICK_NODES)[0]
                if verdict == "feasible":
                    return lower
                if verdict == "unknown":
                    break
            lower += 1
        step, proven = 1, lower - 1  # gallop up from `lower`, then bisect the last step
        while lower < upper and self.lp_bound(lower).bins(self.m, _LP_ROUNDS, self.deadline) > self.m:
            proven, lower, step = lower, min(lower + step, upper), step * 2
        low, high = proven + 1, lower - 1
        while low <= high:
            middle = (low + high) // 2
            if self.lp_bound(middle).bins(self.m, _LP_ROUNDS, self.deadline) > self.m:
                low = middle + 1
            else:
                high = middle - 1
        return low


class _Budget(Exception):
    """The branch and bound used up its node budget."""


def _bins_to_assignment(where: list[int], order: np.ndarray) -> np.ndarray:
    assignment = np.empty(order.size, dtype=np.int64)
    assignment[order] = where
    return assignment


def prove(problem: Problem, start: np.ndarray, time_limit: float) -> KernelResult:
    """The exact search from a feasible `start` on an integer-scalable, cap-free problem."""
    deadline = time.perf_counter() + time_limit
    scaled, scale = integer_costs(problem.item_costs)
    order = problem.cost_order
    w = scaled[order]
    m = problem.num_ranks
    best = start
    upper = int(round(float(rank_loads(problem, start).max()) * scale))
    search = _Search(w, m, deadline)
    lower = min(upper, simple_bound(w, m))
    type_of, num_types = item_types(w)[1], int(np.unique(w).size)
    for r in range(m):
        column = np.bincount(type_of[start[order] == r], minlength=num_types)
        search.pool[column.tobytes()] = column
    budget = BASE_NODES
    try:
        lower = search.raise_lower(lower, upper)
        while lower < upper:
            verdict, where = search.decide(lower, budget)
            if verdict == "feasible":
                best, upper = _bins_to_assignment(where, order), lower
            elif verdict == "infeasible":
                lower += 1
            else:
                budget *= 4
    except _Stopped:
        pass
    if lower >= upper:
        return KernelResult(best, Status.OPTIMAL, lower_bound=float(rank_loads(problem, best).max()))
    return KernelResult(best, Status.TIME_LIMIT, lower_bound=lower / scale)


def branch_and_bound(w: list[int], m: int, lower: int, start: list[int] | None, node_limit: int,
                     tokens: list[int] | None = None, cap: int | None = None) -> tuple[list[int] | None, bool]:
    """Minimise the makespan of integer costs `w` (sorted descending) on `m` machines from
    the plan `start` (a machine per item, or None): (best plan found, whether it is proven
    optimal).  With `tokens` and `cap`, a machine may hold at most `cap` tokens; a proven
    search that found no plan (None, True) proves the cap infeasible.

    Items go largest first to machines of distinct (load, tokens), least loaded first; a
    branch dies when it reaches the incumbent, when the room below it on all machines
    cannot hold the items left, or when the token room left cannot hold their tokens.
    Stops at `lower` or after `node_limit` nodes (not proven then).

    >>> branch_and_bound([3, 3, 2, 2, 2], 2, 6, [0, 1, 0, 1, 0], 1000)
    ([0, 0, 1, 1, 1], True)
    >>> branch_and_bound([7, 7, 6, 6, 4], 2, 15, None, 1000, tokens=[7, 7, 6, 6, 4], cap=15)
    (None, True)
    """
    n = len(w)
    suffix = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + w[i]
    token_suffix = [0] * (n + 1)
    if cap is not None:
        for i in range(n - 1, -1, -1):
            token_suffix[i] = token_suffix[i + 1] + tokens[i]
    if start is None:
        best, best_plan = suffix[0] + 1, None
    else:
        loads = [0] * m
        for item, machine in enumerate(start):
            loads[machine] += w[item]
        best, best_plan = max(loads), list(start)
    loads, held, where, nodes = [0] * m, [0] * m, [0] * n, [0]

    def place(i: int, makespan: int) -> bool:
        nonlocal best, best_plan
        if i == n:
            best, best_plan = makespan, list(where)
            return best <= lower
        nodes[0] += 1
        if nodes[0] > node_limit:
            raise _Budget
        target = best - 1
        if sum(target - load for load in loads if load < target) < suffix[i]:
            return False
        if cap is not None and cap * m - sum(held) < token_suffix[i]:
            return False
        seen = set()
        for machine in sorted(range(m), key=loads.__getitem__):
            load = loads[machine]
            if load + w[i] > target:
                break
            if cap is not None and held[machine] + tokens[i] > cap:
                continue
            if (load, held[machine]) in seen:
                continue
            seen.add((load, held[machine]))
            loads[machine] += w[i]
            if cap is not None:
                held[machine] += tokens[i]
            where[i] = machine
            if place(i + 1, max(makespan, load + w[i])):
                return True
            loads[machine] = load
            if cap is not None:
                held[machine] -= tokens[i]
            if best - 1 < target:
                target = best - 1
        return False

    if best <= lower:
        return best_plan, True
    try:
        place(0, 0)
    except _Budget:
        return best_plan, best_plan is not None and best <= lower
    return best_plan, True


def prove_small(problem: Problem, start: np.ndarray | None
                ) -> KernelResult | CapInfeasible | None:
    """The optimum of a small unpadded instance by branch and bound alone (no LP, no
    MILP), or None.  `start` is a plan within the cap, or None when none is known.

    Memory caps are honoured (tokens per rank are tracked whenever the cap could bind);
    a search that proves no plan fits the cap says so (`CapInfeasible`).  Any finite costs: a float is a dyadic
    rational, so `exact_integers` makes them Python integers exactly and the search compares exact sums (for costs such
    as 0.1·l the reported makespan is their float sum, within its rounding).  None when
    the instance has more than `COMBINATORIAL_MAX_ITEMS` items or needs more than
    `SMALL_NODES` nodes.  Deterministic: no clock is read.

    >>> problem = make_problem([495, 533, 44, 804, 927], 2)
    >>> result = prove_small(problem, np.array([0, 1, 1, 0, 1]))
    >>> str(result.status), result.lower_bound, result.assignment.tolist()
    ('optimal', 1422.0, [0, 1, 1, 1, 0])
    >>> prove_small(make_problem([7, 7, 6, 6, 4], 2, max_tokens_per_rank=15), None)
    CapInfeasible(prover='branch and bound')
    """
    if problem.padded or problem.num_items > COMBINATORIAL_MAX_ITEMS:
        return None
    order = problem.cost_order
    w = exact_integers(problem.item_costs[order])
    capped = start is None or cap_can_bind(problem, float(rank_loads(problem, start).max()))
    tokens = problem.lengths[order].tolist() if capped else None
    plan, proven = branch_and_bound(w.tolist(), problem.num_ranks, simple_bound(w, problem.num_ranks),
                                    None if start is None else start[order].tolist(), SMALL_NODES,
                                    tokens=tokens, cap=problem.max_tokens_per_rank if capped else None)
    if not proven:
        return None
    if plan is None:
        return CapInfeasible("branch and bound")
    assignment = _bins_to_assignment(plan, order)
    return KernelResult(assignment, Status.OPTIMAL, lower_bound=float(rank_loads(problem, assignment).max()))

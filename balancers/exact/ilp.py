"""Exact min-max balancing by integer programming (HiGHS through `scipy.optimize.milp`), up to a time limit.

minimise M  s.t.  sum_r x[i, r] = 1,  cost(r) <= M,  tokens(r) <= cap,  x binary
(and q <= sum_i x[i, r] <= q + 1 under equal counts, q = n // D), i.e.

    minimise max(loads) where loads[r] = sum(cost[i] for i on r)          (unpadded)
                           or loads[r] = len(items[r]) * f(max length on r) (padded)

Unpadded: the textbook assignment model of P||Cmax.  Padded: a direct big-M model that
does not rely on the sorted-runs structure `padded.py` exploits, so it can check it:
with count_r = sum_i x[i, r] and m_r the number of items allowed on r, every item i on r
forces f(l_i) · (count_r - m_r · (1 - x[i, r])) <= M and, under a cap, with
k_i = floor(cap / l_i), count_r <= k_i + (m_r - k_i) · (1 - x[i, r]).  Symmetry
breaking: ranks are labelled in order of their first item along the cost-sorted list, so
the j-th item may only use ranks 0..j, and items of equal length and cost take ascending
ranks along that list; M starts at the combinatorial `lower_bound`.  Integer costs stay as
they are and M is then an integer variable (HiGHS rounds its bound up); other costs are
scaled to a largest item cost of 1 for HiGHS's tolerances.  The model is built as sparse
arrays; plans are scored exactly by `rank_loads`.

A start plan (LPT, the padded optimum, or the caller's) is returned when HiGHS finds
nothing better; it enters the model as a cutoff, M <= makespan - 1 for integer makespans,
so that "infeasible" proves the start optimal (scipy's HiGHS takes no MIP start).

Why HiGHS: on the models that still reach a MILP solver (n > 16, padded, caps), HiGHS
proved more of them than PuLP's CBC 2.10.3 in the same run and never fewer, proved every
infeasible cap where CBC stalled on some, and keeps its time limit (BENCHMARKS.md, "The
MILP path: CBC against HiGHS"); CBC also segfaulted intermittently while loading a MIP
start and could report "infeasible" when its time limit cut preprocessing short.

Guarantee: `optimal` only when HiGHS proves it with gap 0 (up to its integrality and
feasibility tolerances, 1e-6 and 1e-7 on the scaled costs, which is exact for integer
costs); when the time limit stops it with an incumbent the status is `time_limit` and
HiGHS's dual bound (reduced by 1e-6 relative for its tolerances) is passed on.
Determinism: HiGHS runs in process with its fixed default seed (`milp.solve_milp`), so
a proven optimum is reproducible for a given scipy build; plans cut by a (wall-clock)
time limit depend on machine speed.
"""

from __future__ import annotations

import math
import time

import numpy as np
from scipy.sparse import csr_array

from ..bounds import lower_bound
from ..problem import KernelResult, Problem, Status, as_time_limit, count_limits, rank_loads, rank_tokens
from ..validation import SizeLimitError
from . import milp
from .verdict import CapInfeasible

DEFAULT_TIME_LIMIT = 10.0
"""Seconds an exact solver (HiGHS here, `exact`, the node-wise ILP) may search when given no time limit."""

MAX_BINARIES = 25_000
"""Largest model (assignment binaries) `ilp` builds; bigger problems raise SizeLimitError (a ValueError)."""

_MIN_SECONDS = 0.01
_BOUND_SLACK = 1e-6
_OBJECTIVE_SLACK = 1e-7


class _Model:
    """The MILP of one problem as arrays: column 0 is the makespan M, then x[item, rank] for the
    ranks each item may use (`ranks_of`), item by item."""

    def __init__(self, problem: Problem):
        self.problem = problem
        n, num_ranks = problem.num_items, problem.num_ranks
        self.order = np.lexsort((np.arange(n), -problem.lengths, -problem.item_costs))
        # Integer costs keep their scale and make the makespan integer, so HiGHS can round
        # its bound up; others are scaled to a largest cost of 1 for HiGHS's tolerances.
        integral = self.integral = _integral_costs(problem)
        self.scale = 1.0 if integral else float(problem.item_costs.max()) or 1.0
        costs = problem.item_costs / self.scale
        position = np.empty(n, dtype=np.int64)
        position[self.order] = np.arange(n)
        self.ranks_of = np.minimum(position + 1, num_ranks)  # item i may use ranks 0..ranks_of[i] - 1
        self.first = 1 + np.concatenate(([0], np.cumsum(self.ranks_of)[:-1]))  # column of x[i, 0]
        self.item = np.repeat(np.arange(n), self.ranks_of)  # item and rank of every x column
        self.rank = np.arange(self.item.size) - (self.first[self.item] - 1)
        rows = _Rows()
        for i in range(n):
            rows.add(self.columns(i), np.ones(self.ranks_of[i]), 1.0, 1.0)
        # Items of equal length and cost are interchangeable: along the sorted order their ranks ascend (equal
        # lengths alone are not: explicit costs may differ, and the row then cut off every optimum of some plans).
        sorted_lengths, sorted_costs = problem.lengths[self.order], problem.item_costs[self.order]
        same = (sorted_lengths[1:] == sorted_lengths[:-1]) & (sorted_costs[1:] == sorted_costs[:-1])
        for k in np.flatnonzero(same).tolist():
            earlier, later = int(self.order[k]), int(self.order[k + 1])
            rows.add(np.concatenate((self.columns(earlier), self.columns(later))),
                     np.concatenate((np.arange(self.ranks_of[earlier]), -np.arange(self.ranks_of[later]))),
                     -np.inf, 0.0)
        cap = problem.max_tokens_per_rank
        if problem.equal_counts:  # q or q + 1 items on every rank; their sum n leaves r ranks at q + 1
            q, extra = count_limits(n, num_ranks)
            for r in range(min(n, num_ranks)):
                members = np.flatnonzero(self.ranks_of > r)
                rows.add(self.first[members] + r, np.ones(members.size), float(q), float(q + (extra > 0)))
        for r in range(min(n, num_ranks)):
            members = np.flatnonzero(self.ranks_of > r)
            columns = self.first[members] + r
            if not problem.padded:
                rows.add(np.append(columns, 0), np.append(costs[members], -1.0), -np.inf, 0.0)
                if cap is not None:
                    rows.add(columns, problem.lengths[members].astype(float), -np.inf, float(cap))
                continue
            # every member i on r forces f(l_i) * (count_r - most * (1 - x[i, r])) <= M
            most = members.size
            block = np.repeat(costs[members][:, None], most, axis=1)
            block[np.diag_indices(most)] *= 1 + most
            for k in range(most):
                rows.add(np.append(columns, 0), np.append(block[k], -1.0), -np.inf, float(costs[members[k]] * most))
            # and, under a cap, count_r <= room_i + (most - room_i) * (1 - x[i, r]), room_i = cap // l_i
            if cap is None:
                continue
            lengths = problem.lengths[members]
            room = np.where(lengths == 0, most, np.minimum(most, cap // np.maximum(lengths, 1)))
            for k in np.flatnonzero(room < most).tolist():
                coefficients = np.ones(most)
                coefficients[k] += most - room[k]
                rows.add(columns, coefficients, -np.inf, float(most))
        self.matrix, self.row_lower, self.row_upper = rows.build(1 + self.item.size)
        self.objective = np.zeros(1 + self.item.size)
        self.objective[0] = 1.0
        self.lower = np.zeros(1 + self.item.size)
        self.upper = np.ones(1 + self.item.size)
        self.lower[0], self.upper[0] = lower_bound(problem) * (1.0 - 1e-9) / self.scale, np.inf
        self.integrality = np.ones(1 + self.item.size, dtype=np.int64)
        self.integrality[0] = 1 if integral else 0

    def columns(self, item: int) -> np.ndarray:
        return self.first[item] + np.arange(self.ranks_of[item])

    def cut_off(self, assignment: np.ndarray | None) -> bool:
        """Only plans better than `assignment` remain (M <= its makespan - 1 for integer
        makespans, so that "infeasible" proves it optimal: True then); None lifts the cut."""
        self.upper[0] = np.inf
        if assignment is None:
            return False
        makespan = float(rank_loads(self.problem, assignment).max()) / self.scale
        if self.integral:
            self.upper[0] = makespan - 1
            return True
        self.upper[0] = makespan * (1.0 + _OBJECTIVE_SLACK)
        return False

    def solve(self, time_limit: float, node_limit: int | None = None) -> tuple[str, np.ndarray | None, float | None]:
        """Run HiGHS (at most `node_limit` branch-and-bound nodes where given): ("optimal" | "stopped" |
        "infeasible", assignment or None, bound or None); the bound is the optimum when "optimal", else the
        proven lower bound (None if none)."""
        result = milp.solve_milp(self.objective, integrality=self.integrality,
                                  bounds=(self.lower, self.upper),
                                  constraints=(self.matrix, self.row_lower, self.row_upper),
                                  time_limit=max(time_limit, _MIN_SECONDS), node_limit=node_limit)
        if result.status == 2:  # HiGHS proved it: a time limit ends with status 1
            return "infeasible", None, None
        assignment = None if result.x is None else self._read_assignment(result.x)
        if result.status == 0 and assignment is not None:
            return "optimal", assignment, float(result.fun) * self.scale
        bound = getattr(result, "mip_dual_bound", None)
        if bound is None or not math.isfinite(bound):
            return "stopped", assignment, None
        bound = float(bound) * self.scale * (1.0 - _BOUND_SLACK)
        return "stopped", assignment, float(math.ceil(bound)) if self.integral else bound

    def _read_assignment(self, values: np.ndarray) -> np.ndarray | None:
        """Rounded x; None when HiGHS's values do not form a plan within the cap."""
        chosen = values[1:] > 0.5
        items, ranks = self.item[chosen], self.rank[chosen]
        if items.size != self.problem.num_items or np.unique(items).size != items.size:
            return None
        assignment = np.empty(self.problem.num_items, dtype=np.int64)
        assignment[items] = ranks
        cap = self.problem.max_tokens_per_rank
        if cap is not None and rank_tokens(self.problem, assignment).max() > cap:
            return None
        return assignment


class _Rows:
    """Sparse constraint rows, lower <= coefficients . x <= upper, collected one at a time."""

    def __init__(self):
        self.columns, self.values, self.lower, self.upper = [], [], [], []

    def add(self, columns: np.ndarray, values: np.ndarray, lower: float, upper: float) -> None:
        self.columns.append(np.asarray(columns, dtype=np.int64))
        self.values.append(np.asarray(values, dtype=float))
        self.lower.append(lower)
        self.upper.append(upper)

    def build(self, num_columns: int) -> tuple[csr_array, np.ndarray, np.ndarray]:
        sizes = [c.size for c in self.columns]
        rows = np.repeat(np.arange(len(sizes)), sizes)
        matrix = csr_array((np.concatenate(self.values), (rows, np.concatenate(self.columns))),
                           shape=(len(sizes), num_columns))
        return matrix, np.array(self.lower), np.array(self.upper)


def _makespan(problem: Problem, assignment: np.ndarray) -> float:
    return float(rank_loads(problem, assignment).max())


def _integral_costs(problem: Problem) -> bool:
    """Integer item costs of moderate size: every makespan is then an integer."""
    costs = problem.item_costs
    return bool(np.all(costs == np.round(costs))) and float(costs.sum()) * problem.num_items < 2.0**40


def _proven_floor(problem: Problem) -> float:
    """The combinatorial lower bound, rounded up when makespans are integers."""
    bound = lower_bound(problem)
    return float(math.ceil(bound * (1.0 - 1e-12))) if _integral_costs(problem) else bound


def model_binaries(problem: Problem) -> int:
    """The model's assignment binaries: the j-th item may use ranks 0..j only (symmetry breaking)."""
    used = min(problem.num_items, problem.num_ranks)
    return used * (used + 1) // 2 + (problem.num_items - used) * used


def _check_size(problem: Problem) -> None:
    """Refuse models too large to build and solve in reasonable time."""
    n, num_ranks = problem.num_items, problem.num_ranks
    binaries = model_binaries(problem)
    if binaries > MAX_BINARIES:
        raise SizeLimitError(
            f"algorithm 'ilp' needs {binaries} binaries for {n} items × {num_ranks} ranks, over "
            f"MAX_BINARIES={MAX_BINARIES}; use 'auto' (or 'padded' for padded batches)")


def search(problem: Problem, start: np.ndarray | None, time_limit: float,
           node_limit: int | None = None) -> KernelResult | CapInfeasible:
    """Build and solve within `time_limit` seconds in all (HiGHS gets what building left; and within
    `node_limit` branch-and-bound nodes where given), from the plan `start` (a cutoff) or None;
    CapInfeasible when HiGHS proves that no plan fits the cap and there is no start."""
    deadline = time.perf_counter() + time_limit
    _check_size(problem)
    if start is not None and _makespan(problem, start) <= _proven_floor(problem):
        return KernelResult(start, Status.OPTIMAL, lower_bound=_makespan(problem, start))
    model = _Model(problem)
    strictly_better = model.cut_off(start)
    outcome, found, bound = model.solve(deadline - time.perf_counter(), node_limit)
    return _verdict(problem, start, time_limit, outcome, found, bound, strictly_better)


def _verdict(problem: Problem, start: np.ndarray | None, time_limit: float, outcome: str, found: np.ndarray | None,
             bound: float | None, strictly_better: bool) -> KernelResult | CapInfeasible:
    """The result of one MILP run: its outcome, the plan it found, its bound, and the start."""
    if outcome == "infeasible":
        if strictly_better:  # no plan beats the start: it is optimal
            return KernelResult(start, Status.OPTIMAL, lower_bound=_makespan(problem, start))
        if start is not None:
            return KernelResult(start, Status.FEASIBLE)
        return CapInfeasible("HiGHS")
    candidates = [a for a in (found, start) if a is not None]
    if not candidates:
        raise TimeoutError(f"HiGHS found no plan within time_limit={time_limit} s and did not prove "
                           f"the cap infeasible; raise `time_limit`")
    best = min(candidates, key=lambda a: _makespan(problem, a))
    makespan = _makespan(problem, best)
    if outcome == "optimal" and makespan <= bound * (1.0 + _OBJECTIVE_SLACK):
        return KernelResult(best, Status.OPTIMAL, lower_bound=makespan)
    if outcome == "optimal":
        return KernelResult(best, Status.FEASIBLE, lower_bound=bound * (1.0 - _BOUND_SLACK))
    return KernelResult(best, Status.TIME_LIMIT, lower_bound=bound)


def time_limit_of(problem: Problem, time_limit: float | None = None) -> float:
    """`time_limit` if given, else the problem's, else `DEFAULT_TIME_LIMIT` (seconds)."""
    if time_limit is not None:
        return float(time_limit)
    return problem.time_limit if problem.time_limit is not None else DEFAULT_TIME_LIMIT


def improve(problem: Problem, start_assignment, time_limit: float | None = None) -> KernelResult:
    """Search for a better plan than a feasible start; never returns a worse makespan.

    `time_limit` defaults to the problem's (or `DEFAULT_TIME_LIMIT`).  The result is
    `optimal` when HiGHS proves the returned makespan optimal, else `time_limit`.
    """
    start = np.asarray(start_assignment)
    if start.shape != problem.lengths.shape or start.dtype.kind not in "iu":
        raise ValueError(f"`start_assignment` must be {problem.num_items} integer ranks; "
                         f"got shape {start.shape} and dtype {start.dtype}")
    start = start.astype(np.int64)
    if start.min() < 0 or start.max() >= problem.num_ranks:
        raise ValueError(f"`start_assignment` must hold ranks in [0, {problem.num_ranks})")
    cap = problem.max_tokens_per_rank
    if cap is not None and rank_tokens(problem, start).max() > cap:
        raise ValueError(f"`start_assignment` exceeds max_tokens_per_rank={cap}")
    return search(problem, start, time_limit_of(problem, as_time_limit(time_limit)))

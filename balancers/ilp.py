"""Exact min-max balancing by integer programming (PuLP model solved by CBC), up to a time limit.

minimise M  s.t.  sum_r x[i, r] = 1,  cost(r) <= M,  tokens(r) <= cap,  x binary, i.e.

    minimise max(loads) where loads[r] = sum(cost[i] for i on r)          (unpadded)
                           or loads[r] = len(items[r]) * f(max length on r) (padded)

Unpadded: the textbook assignment model of P||Cmax.  Padded: a direct big-M model that
does not rely on the sorted-runs structure `padded.py` exploits, so it can check it:
with count_r = sum_i x[i, r] and m_r the number of items allowed on r, every item i on r
forces f(l_i) · (count_r - m_r · (1 - x[i, r])) <= M and, under a cap, with
k_i = floor(cap / l_i), count_r <= k_i + (m_r - k_i) · (1 - x[i, r]).  Symmetry
breaking: ranks are labelled in order of their first item along the cost-sorted list, so
the j-th item may only use ranks 0..j, and items of equal length take ascending ranks
along that list; M starts at the combinatorial `lower_bound`.  Integer costs stay as
they are and M is then an integer variable (CBC rounds its bound up); other costs are
scaled to a largest item cost of 1 for CBC's tolerances.  Plans are scored exactly by
`rank_loads`.

A start plan (LPT, the padded optimum, or the caller's) is CBC's MIP start and is
returned when CBC finds nothing better.  CBC 2.10.3 intermittently segfaults when its
time limit expires while it loads a MIP start: the solve is then retried once, in the
time left, with the start as a strict cutoff only (M <= makespan - 1 for integer costs,
so that "infeasible" proves the start optimal).  CBC can also report "infeasible" when
its time limit cuts preprocessing short, so a verdict counts only from a CBC run that
ended within its limit.

Guarantee: `optimal` only when CBC proves it (up to CBC's integrality and feasibility
tolerances, 1e-6 and 1e-7 on the scaled costs, which is exact for integer costs); when
the time limit stops it with an incumbent the status is `time_limit` and the bound CBC
proved ("best possible", reduced by 1e-6 relative to cover its printing and tolerances)
is passed on.  Determinism: CBC runs single-threaded with fixed seeds, so a proven
optimum is reproducible for a given CBC build; plans cut by a (wall-clock) time limit
depend on machine speed.  CBC is the binary bundled with PuLP; its files live in a
private temporary directory that is removed afterwards.
"""

from __future__ import annotations

import math
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import pulp
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

from . import exact, lpt, padded
from .problem import (InfeasibleError, KernelResult, Problem, Status, as_time_limit, lower_bound,
                      make_problem, rank_loads, rank_tokens)

DEFAULT_TIME_LIMIT = 10.0
"""Seconds an exact solver (CBC here, `exact`, the node-wise ILP) may search when given no time limit."""

MAX_BINARIES = 25_000
"""Largest model (assignment binaries) `ilp` builds; bigger problems raise ValueError."""

_SEED = 1
_CBC_PATH = pulp.PULP_CBC_CMD.pulp_cbc_path
_BEST_POSSIBLE = re.compile(r"best possible (\S+)\)")
_WALLCLOCK = re.compile(r"Wallclock seconds\):\s*([0-9.]+)")
_MIN_CBC_SECONDS = 0.01
_BOUND_SLACK = 1e-6
_OBJECTIVE_SLACK = 1e-7


class _Model:
    """The PuLP model of one problem and its assignment variables x[(item, rank)]."""

    def __init__(self, problem: Problem):
        self.problem = problem
        n, num_ranks = problem.num_items, problem.num_ranks
        self.order = np.lexsort((np.arange(n), -problem.lengths, -problem.item_costs))
        # Integer costs keep their scale and make the makespan integer, so CBC can round
        # its bound up; others are scaled to a largest cost of 1 for CBC's tolerances.
        integral = self.integral = _integral_costs(problem)
        self.scale = 1.0 if integral else float(problem.item_costs.max()) or 1.0
        costs = (problem.item_costs / self.scale).tolist()
        lengths = problem.lengths.tolist()
        cap = problem.max_tokens_per_rank
        ranks_of = {int(item): range(min(position + 1, num_ranks)) for position, item in enumerate(self.order)}
        self.lp = pulp.LpProblem("orchmllm_balance", pulp.LpMinimize)
        bound = lower_bound(problem) * (1.0 - 1e-9) / self.scale
        self.makespan = self.lp.add_variable("makespan", lowBound=bound,
                                             cat=pulp.LpInteger if integral else pulp.LpContinuous)
        self.lp += self.makespan
        self.x = {(i, r): self.lp.add_variable(f"x_{i}_{r}", cat=pulp.LpBinary)
                  for i in range(n) for r in ranks_of[i]}
        for i in range(n):
            self.lp += pulp.lpSum(self.x[i, r] for r in ranks_of[i]) == 1
        # Equal lengths are interchangeable items: along the sorted order their ranks ascend.
        sorted_lengths = problem.lengths[self.order]
        self.segment = np.concatenate(([0], np.cumsum(sorted_lengths[1:] != sorted_lengths[:-1])))
        for position in np.flatnonzero(sorted_lengths[1:] == sorted_lengths[:-1]).tolist():
            earlier, later = int(self.order[position]), int(self.order[position + 1])
            self.lp += (pulp.lpSum(r * self.x[earlier, r] for r in ranks_of[earlier])
                        <= pulp.lpSum(r * self.x[later, r] for r in ranks_of[later]))
        for r in range(min(n, num_ranks)):
            members = [i for i in range(n) if (i, r) in self.x]
            if not problem.padded:
                self.lp += pulp.lpSum(costs[i] * self.x[i, r] for i in members) <= self.makespan
                if cap is not None:
                    self.lp += pulp.lpSum(lengths[i] * self.x[i, r] for i in members) <= cap
                continue
            count = pulp.lpSum(self.x[i, r] for i in members)
            most = len(members)
            for i in members:
                self.lp += costs[i] * (count - most * (1 - self.x[i, r])) <= self.makespan
                room = most if cap is None or lengths[i] == 0 else min(most, cap // lengths[i])
                if room < most:
                    self.lp += count <= room + (most - room) * (1 - self.x[i, r])

    def start_from(self, assignment: np.ndarray | None, mip_start: bool) -> bool:
        """Hand CBC a start plan; True when only strictly better plans remain.

        With `mip_start` CBC gets the plan as its incumbent (-mips) and M stays unbounded
        (a bound equal to the incumbent slowed CBC's search in our measurements).
        Without, the plan's makespan caps M, strictly for integer makespans
        (M <= makespan - 1), so that "infeasible" proves the start optimal.
        """
        self.makespan.upBound = None
        if assignment is None:
            return False
        makespan = float(rank_loads(self.problem, assignment).max()) / self.scale
        if mip_start:
            ranks = self._canonical(assignment)
            for (i, r), var in self.x.items():
                var.setInitialValue(1 if ranks[i] == r else 0)
            self.makespan.setInitialValue(makespan)
            return False
        if self.integral:
            self.makespan.upBound = makespan - 1
            return True
        self.makespan.upBound = makespan * (1.0 + _OBJECTIVE_SLACK)
        return False

    def _canonical(self, assignment: np.ndarray) -> np.ndarray:
        """The same plan relabelled to satisfy the symmetry breaking.

        Ranks are renumbered by first appearance along the sorted order; then, inside
        each run of equal lengths, the ranks are sorted (swapping equal items changes
        nothing, and new ranks keep appearing in increasing order).
        """
        label: dict[int, int] = {}
        for item in self.order.tolist():
            label.setdefault(int(assignment[item]), len(label))
        along = np.array([label[int(assignment[item])] for item in self.order.tolist()], dtype=np.int64)
        ranks = np.empty_like(along)
        ranks[self.order] = along[np.lexsort((along, self.segment))]
        return ranks

    def solve(self, time_limit: float, mip_start: bool) -> tuple[str, np.ndarray | None, float | None]:
        """Run CBC: ("optimal" | "stopped" | "infeasible", assignment or None, proven bound or None).

        Raises pulp.PulpSolverError when CBC dies without writing a solution.
        """
        log = run_cbc(self.lp, time_limit, warm_start=mip_start)
        # CBC 2.10.3 may report "Pre-processing says infeasible" when its time limit cuts
        # preprocessing short: believe a verdict only when CBC finished within its limit.
        seconds = _WALLCLOCK.findall(log)
        finished = bool(seconds) and float(seconds[-1]) < time_limit
        found = self.lp.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
        assignment = self._read_assignment() if found else None
        if finished and self.lp.status == pulp.LpStatusInfeasible:
            return "infeasible", None, None
        if finished and self.lp.sol_status == pulp.LpSolutionOptimal and assignment is not None:
            return "optimal", assignment, float(self.makespan.value()) * self.scale
        return "stopped", assignment, self._proven_bound(log) if finished or found else None

    def solve_highs(self, time_limit: float) -> tuple[str, np.ndarray | None, float | None]:
        """The same model by HiGHS (`scipy.optimize.milp`, in process, no MIP start: a start
        enters as the cutoff of `start_from(..., mip_start=False)`); same verdicts as `solve`."""
        variables = self.lp.variables()
        column = {var.name: k for k, var in enumerate(variables)}
        objective = np.zeros(len(variables))
        for var, coefficient in self.lp.objective.items():
            objective[column[var.name]] = coefficient
        rows, cols, values, lower, upper = [], [], [], [], []
        for row, constraint in enumerate(self.lp.constraints.values()):
            for var, coefficient in constraint.items():
                rows.append(row)
                cols.append(column[var.name])
                values.append(coefficient)
            rhs = -constraint.constant
            lower.append(-np.inf if constraint.sense == pulp.LpConstraintLE else rhs)
            upper.append(np.inf if constraint.sense == pulp.LpConstraintGE else rhs)
        matrix = csr_array((values, (rows, cols)), shape=(len(lower), len(variables)))
        bounds = Bounds([-np.inf if var.lowBound is None else var.lowBound for var in variables],
                        [np.inf if var.upBound is None else var.upBound for var in variables])
        integral = [var.cat in (pulp.LpInteger, pulp.LpBinary) for var in variables]
        started = time.perf_counter()
        result = milp(objective, integrality=integral, bounds=bounds,
                      constraints=LinearConstraint(matrix, lower, upper),
                      options={"time_limit": max(time_limit, _MIN_CBC_SECONDS), "mip_rel_gap": 0})
        finished = time.perf_counter() - started < time_limit
        if result.status == 2 and finished:
            return "infeasible", None, None
        assignment = None
        if result.x is not None:
            for var, value in zip(variables, result.x.tolist()):
                var.varValue = value
            assignment = self._read_assignment()
        bound = getattr(result, "mip_dual_bound", None)
        bound = None if bound is None or not math.isfinite(bound) else float(bound) * self.scale * (1.0 - _BOUND_SLACK)
        if bound is not None and self.integral:
            bound = float(math.ceil(bound))
        if result.status == 0 and assignment is not None:
            return "optimal", assignment, float(result.fun) * self.scale
        return "stopped", assignment, bound

    def _proven_bound(self, log: str) -> float | None:
        """CBC's last "best possible" objective, made safe for its printing and tolerances."""
        printed = _BEST_POSSIBLE.findall(log)
        try:
            bound = float(printed[-1]) * self.scale * (1.0 - _BOUND_SLACK) if printed else math.nan
        except ValueError:
            return None
        if not math.isfinite(bound):
            return None
        return float(math.ceil(bound)) if self.integral else bound

    def _read_assignment(self) -> np.ndarray | None:
        """Rounded x; None when CBC's values do not form a plan within the cap."""
        assignment = np.full(self.problem.num_items, -1, dtype=np.int64)
        for (i, r), var in self.x.items():
            if (var.value() or 0.0) > 0.5:
                if assignment[i] >= 0:
                    return None
                assignment[i] = r
        if assignment.min() < 0:
            return None
        cap = self.problem.max_tokens_per_rank
        if cap is not None and rank_tokens(self.problem, assignment).max() > cap:
            return None
        return assignment


def run_cbc(lp: pulp.LpProblem, time_limit: float, warm_start: bool) -> str:
    """Solve `lp` with PuLP's bundled CBC, the one place the package calls it: one thread,
    fixed seeds, no gap, at least 0.01 s, files in a private temporary directory that is
    removed afterwards.  Returns CBC's log (empty if CBC wrote none); raises
    pulp.PulpSolverError when CBC dies without writing a solution."""
    with tempfile.TemporaryDirectory(prefix="orchmllm_cbc_") as workdir:
        log_path = Path(workdir) / "cbc.log"
        solver = pulp.COIN_CMD(path=_CBC_PATH, msg=False, timeLimit=max(time_limit, _MIN_CBC_SECONDS), threads=1,
                               gapRel=0, warmStart=warm_start, logPath=str(log_path),
                               options=[f"randomSeed {_SEED}", f"randomCbcSeed {_SEED}"])
        solver.tmpDir = workdir
        lp.solve(solver)
        return log_path.read_text(errors="replace") if log_path.exists() else ""


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


def _smallest_cap(problem: Problem, time_limit: float) -> tuple[int, bool]:
    """(cap, exact): the smallest feasible cap, or a proven lower bound on it."""
    if problem.padded:
        return padded.min_cap(problem.lengths, problem.num_ranks), True
    tokens_problem = make_problem(problem.lengths, problem.num_ranks, time_limit=time_limit)
    result = solve(tokens_problem)
    floor = problem.max_tokens_per_rank + 1
    if result.status is Status.OPTIMAL:
        return max(floor, int(round(_makespan(tokens_problem, result.assignment)))), True
    return max(floor, math.ceil(result.lower_bound or 0)), False


def infeasible(problem: Problem, time_limit: float, prover: str) -> InfeasibleError:
    """The error for a cap `prover` proved infeasible, naming the smallest cap that works
    (or a proven lower bound on it when that solve is cut by `time_limit`)."""
    needed, exact = _smallest_cap(problem, time_limit)
    what = "the smallest cap that works is" if exact else "a cap of at least"
    return InfeasibleError(
        f"{prover} proved that no plan fits max_tokens_per_rank={problem.max_tokens_per_rank} on "
        f"{problem.num_ranks} ranks; {what} {needed}" + ("" if exact else " is needed"),
        min_cap=needed)


def _check_size(problem: Problem) -> None:
    """Refuse models too large to build and solve (PuLP alone would take minutes)."""
    n, num_ranks = problem.num_items, problem.num_ranks
    used = min(n, num_ranks)  # the j-th item may use ranks 0..j only (symmetry breaking)
    binaries = used * (used + 1) // 2 + (n - used) * used
    if binaries > MAX_BINARIES:
        raise ValueError(
            f"algorithm 'ilp' needs {binaries} binaries for {n} items × {num_ranks} ranks, over "
            f"MAX_BINARIES={MAX_BINARIES}; use 'auto' (or 'padded' for padded batches)")


def _search(problem: Problem, start: np.ndarray | None, time_limit: float, solver: str = "cbc") -> KernelResult:
    """Build and solve within `time_limit` seconds in all (the solver gets what building left)."""
    deadline = time.perf_counter() + time_limit
    _check_size(problem)
    if start is not None and _makespan(problem, start) <= _proven_floor(problem):
        return KernelResult(start, Status.OPTIMAL, lower_bound=_makespan(problem, start))
    model = _Model(problem)
    if solver == "highs":
        strictly_better = model.start_from(start, mip_start=False)
        outcome, found, bound = model.solve_highs(max(deadline - time.perf_counter(), _MIN_CBC_SECONDS))
        return _verdict(problem, start, time_limit, outcome, found, bound, strictly_better, "HiGHS")
    try:
        model.start_from(start, mip_start=start is not None)
        strictly_better = False
        outcome, found, bound = model.solve(max(deadline - time.perf_counter(), _MIN_CBC_SECONDS),
                                            mip_start=start is not None)
    except pulp.PulpSolverError as crash:
        if start is None:
            raise RuntimeError(f"CBC failed on a {problem.num_items}-item, {problem.num_ranks}-rank "
                               f"model: {crash}") from None
        # CBC 2.10.3 can segfault when its time limit expires while it loads a MIP start:
        # retry once with the start as a cutoff only, in the time that is left.
        strictly_better = model.start_from(start, mip_start=False)
        try:
            outcome, found, bound = model.solve(max(deadline - time.perf_counter(), _MIN_CBC_SECONDS),
                                                mip_start=False)
        except pulp.PulpSolverError as error:
            raise RuntimeError(f"CBC failed on a {problem.num_items}-item, {problem.num_ranks}-rank "
                               f"model: {error}") from None
    return _verdict(problem, start, time_limit, outcome, found, bound, strictly_better, "CBC")


def _verdict(problem: Problem, start: np.ndarray | None, time_limit: float, outcome: str, found: np.ndarray | None,
             bound: float | None, strictly_better: bool, prover: str) -> KernelResult:
    """The result of one MILP run: its outcome, the plan it found, its bound, and the start."""
    if outcome == "infeasible":
        if strictly_better:  # no plan beats the start: it is optimal
            return KernelResult(start, Status.OPTIMAL, lower_bound=_makespan(problem, start))
        if start is not None:
            return KernelResult(start, Status.FEASIBLE)
        raise infeasible(problem, time_limit, prover)
    candidates = [a for a in (found, start) if a is not None]
    if not candidates:
        raise TimeoutError(f"{prover} found no plan within time_limit={time_limit} s and did not prove "
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


def solve(problem: Problem) -> KernelResult:
    """Solve to proven optimality within the time limit.

    Start: LPT for the unpadded cost; for the padded cost the exact `padded` plan, so
    CBC's job is the proof (the model still decides by itself whether a better plan
    exists, and proves infeasibility without a start).  When CBC proves the cap
    infeasible, one more solve (same limit) names the smallest cap that works.  Up to
`exact.COMBINATORIAL_MAX_ITEMS` unpadded items, branch and bound decides first (caps
included) and CBC is not started.  Raises
    TimeoutError when no plan was found and infeasibility was not proven in time.
    """
    heuristic = padded.solve if problem.padded else lpt.solve
    try:
        start = heuristic(problem).assignment
    except InfeasibleError:
        start = None
    proven = exact.prove_small(problem, start)
    if proven is not None:
        return proven
    return _search(problem, start, time_limit_of(problem, None))


def improve(problem: Problem, start_assignment, time_limit: float | None = None) -> KernelResult:
    """Search for a better plan than a feasible start; never returns a worse makespan.

    `time_limit` defaults to the problem's (or `DEFAULT_TIME_LIMIT`).  The result is
    `optimal` when CBC proves the returned makespan optimal, else `time_limit`.
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
    return _search(problem, start, time_limit_of(problem, as_time_limit(time_limit)))

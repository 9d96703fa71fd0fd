"""The `exact` kernel: the proven optimum of P||Cmax within a time limit.

    padded: `padded` (exact)
    start = auto's plan (no time limit: no MILP inside); none under the cap -> the `ilp` kernel
    the start meets the lower bound: optimal, at any size
    up to 16 unpadded items: branch and bound decides (`exact.branch_and_bound.prove_small`)
    costs no power-of-two scale makes integers, or a cap that can bind: HiGHS from the start
    else: bounds and bin packing at the candidate makespans (`exact.branch_and_bound.prove`)

The proofs are described in `exact/branch_and_bound.py`; they never run a heuristic, so
the start comes from here.
"""

from __future__ import annotations

import dataclasses
import time

from ..bounds import lower_bound, uncapped_fit
from ..constraints import equal_counts
from ..exact import ilp as assignment_model
from ..exact.branch_and_bound import cap_can_bind, integer_costs, prove, prove_small
from ..exact.ilp import search, time_limit_of
from ..problem import InfeasibleError, KernelResult, Problem, Status, rank_loads
from ..validation import SizeLimitError
from . import auto, ilp, padded


def solve(problem: Problem) -> KernelResult:
    """Proven optimum within the time limit (`exact.ilp.DEFAULT_TIME_LIMIT` when None).

    >>> from orchmllm.balancers import balance
    >>> plan = balance([3, 3, 2, 2, 2], 2, algorithm="exact")
    >>> plan.makespan, str(plan.status), balance([3, 3, 2, 2, 2], 2, algorithm="lpt").makespan
    (6.0, 'optimal', 7.0)
    """
    if problem.padded:
        return padded.solve(problem)
    time_limit = time_limit_of(problem)
    started = time.perf_counter()
    try:
        start = auto.solve(dataclasses.replace(problem, time_limit=None)).assignment
    except InfeasibleError as error:  # auto found no plan under the cap: the uncapped optimum where it fits, else
        if error.heuristic is None:  # the MILP; auto's proof that none fits stands (rev15 R15-08)
            raise
        free = uncapped_fit(dataclasses.replace(problem, time_limit=time_limit / 2), solve)  # half the limit each
        if free is not None and free.status is Status.OPTIMAL:
            return free  # optimal without the cap and within it: optimal with it (probe22 P22-18)
        left = max(time_limit - (time.perf_counter() - started), time_limit / 2)  # (rev15 R15-07)
        try:
            return ilp.solve(dataclasses.replace(problem, time_limit=left))
        except SizeLimitError as size:  # exact gave up: say so as a heuristic would (probe23 P23-06: it named 'ilp'
            raise _gave_up(problem, error, "plan") from size  # and "use 'auto'", whose refusal pointed at 'ilp')
        except TimeoutError as timeout:
            raise TimeoutError(f"{timeout} (the MILP's share of exact's time_limit={time_limit} s, after the optimum "
                               f"without the cap did not fit it)") from timeout
    makespan = float(rank_loads(problem, start).max())
    if makespan <= lower_bound(problem):  # proven by the bound (one giant item, say): no search, no size limit
        return KernelResult(start, Status.OPTIMAL, makespan)
    small = prove_small(problem, start)
    if small is not None:
        return ilp.refuse_if_infeasible(problem, small)
    if integer_costs(problem.item_costs) is None or cap_can_bind(problem, makespan):
        try:
            return search(problem, start, time_limit)  # auto's plan: clean, no `improve` checks
        except SizeLimitError as error:
            raise SizeLimitError(f"algorithm 'exact' proves these costs with the MILP, and {error}") from error
    return prove(problem, start, max(time_limit - (time.perf_counter() - started), 1e-3))


def solve_equal_counts(problem: Problem) -> KernelResult:
    """'exact' under `equal_counts`: the `ilp` kernel's model with its count rows (branch and bound and the
    pattern bounds know no counts) where it is within `exact.ilp.MAX_BINARIES`.  Above, the equal-count plan
    (`constraints.equal_counts.solve`), optimal where it meets the bound, else feasible with its gap, and a cap it
    overflows refused as a heuristic that gave up, naming 'exact' (probe24 P24-07: SizeLimitError "... use 'auto'"
    on every instance of that size, while auto's refusal pointed at 'exact')."""
    if assignment_model.model_binaries(problem) <= assignment_model.MAX_BINARIES:
        return ilp.solve(problem)
    try:
        plan = equal_counts.solve(problem).assignment
    except InfeasibleError as error:
        if error.heuristic is None:
            raise
        raise _gave_up(problem, error, "equal-count plan") from error
    bound = lower_bound(problem)
    proven = float(rank_loads(problem, plan).max()) <= bound
    return KernelResult(plan, Status.OPTIMAL if proven else Status.FEASIBLE, bound)


def _gave_up(problem: Problem, refusal: InfeasibleError, what: str) -> InfeasibleError:
    """'exact''s refusal where auto's `refusal` (a heuristic's) stands and the MILP that would decide is over its
    size: a heuristic that gave up, naming itself and the cap auto meets."""
    return InfeasibleError(
        f"algorithm 'exact' found no {what} under max_tokens_per_rank={problem.max_tokens_per_rank}: auto's "
        f"{what}s overflow it, and the MILP that would decide is over its size "
        f"limit at {problem.num_items} items × {problem.num_ranks} ranks (`exact.ilp.MAX_BINARIES`); auto fits under "
        f"a cap of {refusal.min_cap}, and a smaller one may still be feasible", min_cap=refusal.min_cap,
        heuristic="exact")

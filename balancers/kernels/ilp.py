"""The `ilp` kernel: exact min-max balancing by integer programming, up to a time limit.

    start = padded's optimum (padded) or LPT's plan (unpadded), None when it finds no room
    up to 16 unpadded items: branch and bound decides (`exact.branch_and_bound.prove_small`)
    else: HiGHS on the assignment model from the start (`exact.ilp.search`)

The model, its guarantee and its determinism are described in `exact/ilp.py`.  A cap that
a prover shows no plan fits raises InfeasibleError naming the smallest cap that works,
found by one more solve (same time limit) on the tokens themselves; above the model's size
limit, the start heuristic's proof (the pigeonhole bound) is raised instead of SizeLimitError.
"""

from __future__ import annotations

import math

from ..constraints import equal_counts
from ..exact.branch_and_bound import prove_small
from ..exact.ilp import search, time_limit_of
from ..exact.verdict import CapInfeasible
from ..problem import InfeasibleError, KernelResult, Problem, Status, make_problem, rank_loads, tokens_problem
from ..validation import SizeLimitError
from . import lpt, padded


def solve(problem: Problem) -> KernelResult:
    """Solve to proven optimality within the time limit.

    Start: LPT for the unpadded cost; for the padded cost the exact `padded` plan, so
    HiGHS's job is the proof (the model still decides by itself whether a better plan
    exists, and proves infeasibility without a start).  When HiGHS proves the cap
    infeasible, one more solve (same limit) names the smallest cap that works.  Up to
    `exact.COMBINATORIAL_MAX_ITEMS` unpadded items, branch and bound decides first (caps
    included) and HiGHS is not started.  Under `equal_counts` the model holds the count rows and
    starts from the equal-count plan (`constraints.equal_counts.solve`; padded: the exact
    `solve_padded`); 'exact' runs this kernel then, within its size.  Raises TimeoutError when no plan
    was found and infeasibility was not proven in time.

    >>> solve(make_problem([7, 7, 6, 6, 4], 2, max_tokens_per_rank=15))
    Traceback (most recent call last):
    ...
    orchmllm.balancers.problem.InfeasibleError: branch and bound proved that no plan fits max_tokens_per_rank=15 on 2
    ranks; the smallest cap that works is 16
    """
    if problem.equal_counts and problem.padded:  # the sorted-runs search is exact
        return equal_counts.solve_padded(problem)
    if problem.equal_counts:  # the equal-count plan starts (branch and bound knows no counts)
        heuristic = equal_counts.solve
    else:
        heuristic = padded.solve if problem.padded else lpt.solve
    start = proof = None
    try:
        start = heuristic(problem).assignment
    except InfeasibleError as error:
        proof = error if error.heuristic is None else None  # the pigeonhole bound's (`bounds.cap_refusal`)
    verdict = None if problem.equal_counts else prove_small(problem, start)
    if verdict is None:
        try:
            verdict = search(problem, start, time_limit_of(problem))
        except SizeLimitError:
            if proof is None:
                raise
            raise proof from None  # too large to model, yet proven: no plan fits, not "use 'auto'" (rev15 R15-08)
    return refuse_if_infeasible(problem, verdict)


def refuse_if_infeasible(problem: Problem, verdict: KernelResult | CapInfeasible) -> KernelResult:
    """The plan of a proof's verdict; InfeasibleError naming the smallest cap that works when
    the verdict is that no plan fits the cap."""
    if not isinstance(verdict, CapInfeasible):
        return verdict
    needed, exact = _smallest_cap(problem, time_limit_of(problem))
    what = "the smallest cap that works is" if exact else "a cap of at least"
    raise InfeasibleError(
        f"{verdict.prover} proved that no plan fits max_tokens_per_rank={problem.max_tokens_per_rank} on "
        f"{problem.num_ranks} ranks; {what} {needed}" + ("" if exact else " is needed"),
        min_cap=needed)


def _smallest_cap(problem: Problem, time_limit: float) -> tuple[int, bool]:
    """(cap, exact): the smallest feasible cap, or a proven lower bound on it."""
    if problem.padded:
        return padded.min_cap(problem.lengths, problem.num_ranks), True
    tokens = tokens_problem(problem, time_limit)
    result = solve(tokens)
    floor = problem.max_tokens_per_rank + 1
    if result.status is Status.OPTIMAL:
        return max(floor, int(round(float(rank_loads(tokens, result.assignment).max())))), True
    return max(floor, math.ceil(result.lower_bound or 0)), False

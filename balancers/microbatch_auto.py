"""The `auto` micro-batch kernel: the best of the others for the instance's size.

    n <= microbatch_exact.MAX_ITEMS: the exact search
    padded: the joint greedy
    else: the cell LPT, and the joint greedy too up to GREEDY_MAX_WORK item × cell pairs,
          the plan of lower step cost (the first on ties)
"""

from __future__ import annotations

from . import microbatch_cells, microbatch_exact, microbatch_greedy
from .microbatch_plan import MicroBatchProblem, MicroBatchResult, cell_loads, step_cost

GREEDY_MAX_WORK = 300_000  # item × cell pairs up to which `auto` also runs the joint greedy


def plan_cost(problem: MicroBatchProblem, result: MicroBatchResult, num_microbatches: int) -> float:
    """Σ_m max_r load(r, m) + M · overhead of a kernel's result (the loads as `cell_accounts`
    sums them; the tokens are not needed)."""
    size = num_microbatches * problem.num_ranks
    loads = cell_loads(problem, result.microbatch * problem.num_ranks + result.rank, size)
    return step_cost(loads.reshape(num_microbatches, problem.num_ranks), problem.microbatch_overhead)


def solve(problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
    """Exact search for the smallest instances, the better of the joint greedy and the cell
    LPT (both searched) up to GREEDY_MAX_WORK item-cell pairs, the cell LPT alone above."""
    if problem.num_items <= microbatch_exact.MAX_ITEMS:
        return microbatch_exact.solve(problem, num_microbatches)
    if problem.padded:
        return microbatch_greedy.solve(problem, num_microbatches)
    kernels = [microbatch_cells.solve]
    if problem.num_items * num_microbatches * problem.num_ranks <= GREEDY_MAX_WORK:
        kernels.append(microbatch_greedy.solve)
    results = [result for result in (kernel(problem, num_microbatches) for kernel in kernels) if result is not None]
    if not results:
        # the cell LPT found no room under the budget; the joint greedy may still find some
        return None if microbatch_greedy.solve in kernels else microbatch_greedy.solve(problem, num_microbatches)
    if len(results) == 1:
        return results[0]  # nothing to compare it with
    return min(results, key=lambda result: plan_cost(problem, result, num_microbatches))  # the first on ties

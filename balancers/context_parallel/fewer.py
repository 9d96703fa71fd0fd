"""A fixed number of split micro-batches is never above the free count's plan padded with empty ones.

    with `num_microbatches` = M fixed, where the fixed plan is not proven optimal:
        F = the plan with M free (its unsplit plan M free too)
        if F has M' <= M micro-batches: F padded with M - M' empty ones (step + (M - M') · overhead)
        return the lower step of that and the fixed plan (the fixed one on a tie), or the padded F where the
            fixed M found no layout

The fills group a fixed M's items up to their share of the tokens, so they can spread a giant's
micro-batch over M where fewer, fuller micro-batches do better (probe25 P25-07: 30 % above at M = 3;
at D = 8, M = 4 the default mix 1.2-1.4 % above its free plan of 2-3 micro-batches; probe26 P26-02: up to
16 % at D = 16-32, where it ran on <= 8 ranks only, and P26-06: the M the free plan picks refused at
D = 16-128).  Any free plan of M' <= M micro-batches is a plan of M with the rest empty, so the free
count's bound bounds it too.  The second planning call costs 1.5-2x a fixed M's (the default mix,
D = 64-2560 x 32: 20 -> 44 ms at D 64, 25 -> 39 ms at D 2560).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..microbatch.plan import step_cost
from ..problem import InfeasibleError, Status


def within_tokens(lengths: np.ndarray, num_ranks: int, budget: int, num_microbatches: int | None,
                  widest: int) -> int | None:
    """`num_microbatches` (None: free), or InfeasibleError where M micro-batches of `budget` tokens on each of
    `num_ranks` cannot hold the items' tokens, split or not (probe28 P28-05: the fills' refusal said a larger
    budget "may fit" and named a `min_cap` refused again); its `min_cap` the least budget the tokens allow at M.
    Not where an item is over the budget at the `widest` degree: no count helps it, and the planner names it
    (probe30 P30-04: this refusal came first and sent the user to a count or budget refused again)."""
    tokens = int(lengths.sum())
    if (num_microbatches is None or tokens <= num_microbatches * num_ranks * budget
            or int(lengths.max(initial=0)) > budget * widest):
        return num_microbatches
    least, cap = -(-tokens // (num_ranks * budget)), -(-tokens // (num_ranks * num_microbatches))
    raise InfeasibleError(f"`num_microbatches`={num_microbatches} is too few: the items' {tokens} tokens need at least "
                          f"{least} micro-batches of max_tokens_per_microbatch={budget} tokens on {num_ranks} ranks, "
                          f"split or not (or a budget of at least {cap} at {num_microbatches})", min_cap=cap)


def padded(plan, num_microbatches: int):
    """`plan` (a split plan of at most `num_microbatches` micro-batches) with empty ones appended."""
    extra = num_microbatches - plan.num_microbatches
    loads = np.vstack((plan.cell_loads, np.zeros((extra, plan.num_ranks))))
    tokens = np.vstack((plan.cell_tokens, np.zeros((extra, plan.num_ranks), dtype=np.int64)))
    for array in (loads, tokens):
        array.setflags(write=False)
    passes = None if plan.passes is None else plan.passes + (None,) * extra
    return replace(plan, num_microbatches=num_microbatches, cell_loads=loads, cell_tokens=tokens, passes=passes,
                   step_cost=step_cost(loads, plan.microbatch_overhead))


def at_most(plan_at, num_microbatches: int | None):
    """`plan_at(num_microbatches)` (a split micro-batch plan, or InfeasibleError), or the plan `plan_at(None)`
    padded to `num_microbatches` where that is lower or the fixed M has none (module docstring)."""
    if num_microbatches is None:
        return plan_at(num_microbatches)
    fixed, refusal = None, None
    try:
        fixed = plan_at(num_microbatches)
    except InfeasibleError as error:
        refusal = error
    if fixed is not None and fixed.status is Status.OPTIMAL:
        return fixed
    try:
        free = plan_at(None)
    except InfeasibleError:
        free = None
    plan = None if free is None or free.num_microbatches > num_microbatches else padded(free, num_microbatches)
    if plan is None or (fixed is not None and fixed.step_cost <= plan.step_cost):
        if fixed is None:
            raise refusal
        return fixed
    bound = min(plan.step_cost, free.lower_bound if fixed is None else max(free.lower_bound, fixed.lower_bound))
    return replace(plan, lower_bound=bound, status=Status.OPTIMAL if plan.step_cost == bound else Status.FEASIBLE)

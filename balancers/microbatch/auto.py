"""The `auto` micro-batch kernel: the best of the others for the instance's size.

    n <= microbatch_exact.MAX_ITEMS: the exact search
    padded: the joint greedy and the sorted runs (`cells.sorted_fill`), the plan of lower step cost (the first on
          ties)
    else: the cell LPT, and the joint greedy too up to GREEDY_MAX_WORK item × cell pairs (beyond, up to
          GREEDY_MAX_PAIRS item × micro-batch pairs where the cell LPT's plan is GREEDY_GAP above the bound),
          the plan of lower step cost (the first on ties)
    M above the fewest micro-batches any plan needs (`min_microbatches`), unpadded, above MAX_ITEMS:
          also the plan of those fewest (`_fewest_plan`, kept for the next M), its other micro-batches
          empty, where it costs less.  Spread over M·D cells, items of about one a cell balance
          badly (probe22 P22-12: the cell LPT at D = 512 × 8, M = 8, 11.8 % above the bound; the joint
          greedy, which fills few micro-batches, 0.4 %; the fewest's plan, one micro-batch, 0.02 %).
          A free M tries the fewest first and keeps the cheapest M (`api._solve`): its plans are unchanged
    M above the fewest + 1, where neither plan is within GREEDY_GAP of the certified bound: also the plan of
          the fewest + 1 (`_far_above`; kept too), where it costs less (probe23 P23-03: the fewest's cells of
          ~2.7 items each balance ~3 % above the bound at D 512, one micro-batch more, 2 a cell, 0.3-0.5 %)
    M = 1 (a cell per rank, a plain step under the cap T; also where a larger M's fewest is 1),
          `solve_with_plain_step` only: also `balance`'s default plan of the same items with
          max_tokens_per_rank = T, searched further, so one micro-batch is never worse than the plain
          step's planner
          (`balance_microbatches` without `sources`; with them it runs `solve`: that plan's loads,
          level to a few 1e-5, leave a communication-aware pass that may not raise the step no
          room, and its fallback moved ~80 % of the bytes across nodes instead of ~3 %); where the
          cells' plan is then LPT's regrouped (large instances), the plain step starts from that
          LPT plan and the cells' own solve runs only when that plain step is not cheaper
    every entry point plans the items that cost or hold tokens (`microbatch.empty`), the empty ones dealt apart
          (probe27 P27-07: two empty items pushed 11 past MAX_ITEMS and the step from 16.3 to 16.5)
    every entry point plans the items in `kernels.auto.in_canonical_order` (`in_canonical_order`): the step
          cost does not depend on the order the items come in (`balance`'s `auto` does the same)
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from ..kernels import auto
from ..problem import InfeasibleError, make_problem
from . import cells as microbatch_cells, exact as microbatch_exact, greedy as microbatch_greedy
from .empty import apart_from_empty_items
from .plan import MicroBatchProblem, MicroBatchResult, cell_loads, float_sum, step_cost
from .search import improve, searches

GREEDY_MAX_WORK = 300_000  # item × cell pairs up to which `auto` also runs the joint greedy
# ... and beyond, item × micro-batch pairs up to which it runs the searching joint greedy (`greedy.scans` False:
# ~25 CPU ms at 2048 items, M 8) where the cell LPT's plan is more than GREEDY_GAP above the bound (probe23 P23-03:
# at D = 64 × 32, M 8 the cell LPT's 5.3 % against the greedy's 2.7 %; on the default mix it is within 0.1-0.5 %)
GREEDY_MAX_PAIRS = 32_768
GREEDY_GAP = 0.01
FEWEST_KEY = "auto_fewest"  # `packings` entry of `_fewest_plan`
CANONICAL_KEY = "auto_canonical"  # `packings` entry of `_canonical`


def _canonical(problem: MicroBatchProblem) -> tuple[MicroBatchProblem, np.ndarray] | None:
    """`auto.in_canonical_order(problem)`, the reordered items and their `packings` kept on the problem for every
    call on the same items (the arrays themselves): the runs kept there for the next M (`greedy._Run`,
    `cells.tight_cells`) answer the next call, as on items given in that order (padded `auto` at 2560 × 32 placed
    every item afresh for each M it tried)."""
    kept = problem.packings.get(CANONICAL_KEY)
    if kept is None or kept[0] is not problem.lengths or kept[1] is not problem.item_costs:
        canonical = auto.in_canonical_order(problem, packings={})
        kept = problem.packings[CANONICAL_KEY] = (problem.lengths, problem.item_costs, canonical)
    if kept[2] is None:
        return None
    reordered, order = kept[2]
    return replace(problem, lengths=reordered.lengths, item_costs=reordered.item_costs, orders=reordered.orders,
                   packings=reordered.packings), order


def in_canonical_order(kernel):
    """`kernel` (a micro-batch kernel, or `plain_step`) run on the items in `auto.in_canonical_order` (an array
    argument, a plan of the items, taken into that order too; `_canonical`), its plan mapped back to the items' own
    order: the plan's step cost does not depend on the order the items come in."""
    @functools.wraps(kernel)
    def run(problem: MicroBatchProblem, *args) -> MicroBatchResult | None:
        canonical = _canonical(problem)
        if canonical is None:
            return kernel(problem, *args)
        reordered, order = canonical
        for name in ("min_microbatches", "cost_bound", "total_tokens", "total_cost"):  # of the same items
            if name in problem.__dict__:
                reordered.__dict__[name] = problem.__dict__[name]
        result = kernel(reordered, *(arg[order] if isinstance(arg, np.ndarray) else arg for arg in args))
        if result is None:
            return None
        return result._replace(rank=auto.in_given_order(result.rank, order),
                               microbatch=auto.in_given_order(result.microbatch, order))
    return run


def plan_cost(problem: MicroBatchProblem, result: MicroBatchResult, num_microbatches: int) -> float:
    """Σ_m max_r load(r, m) + M · overhead of a kernel's result (the loads as `cell_accounts`
    sums them; the tokens are not needed)."""
    size = num_microbatches * problem.num_ranks
    loads = cell_loads(problem, result.microbatch * problem.num_ranks + result.rank, size)
    return step_cost(loads.reshape(num_microbatches, problem.num_ranks), problem.microbatch_overhead)


@in_canonical_order
def plain_step(problem: MicroBatchProblem, lpt_plan: np.ndarray | None = None) -> MicroBatchResult | None:
    """One micro-batch as a plain step: `balance(lengths, D, max_tokens_per_rank=T)`'s plan (its
    default kernel, `auto`; `lpt_plan`: its LPT start where the caller has it), searched as the cells
    are; None when it finds no room under T, or for padded cells of explicit costs (which `balance`
    does not take)."""
    if problem.padded and problem.cost is None:
        return None
    source = dict(costs=problem.item_costs) if problem.cost is None else dict(cost=problem.cost)
    try:
        plain = make_problem(problem.lengths, problem.num_ranks, padded=problem.padded,
                             max_tokens_per_rank=problem.max_tokens_per_microbatch, **source)
        # the same items and costs: the orders the cells already sorted hold for it too
        plain = replace(plain, orders=dict(problem.orders))
        assignment = auto.solve(plain, lpt_plan).assignment
    except InfeasibleError:
        return None
    return _one_cell_each(improve(problem, assignment, 1))


def _cells_are_lpt(problem: MicroBatchProblem) -> bool:
    """Whether `solve(problem, 1)` is the capped LPT's plan regrouped (where LPT finds room) while
    `auto` improves only its best start, LPT's on ties: then the plain step's plan costs no more
    and, at the same cost, is that same plan."""
    n = problem.num_items
    return (not problem.padded and n > max(microbatch_exact.MAX_ITEMS, auto.ALL_STARTS_MAX_ITEMS, auto.GROUP_MAX_ITEMS)
            and n * problem.num_ranks > GREEDY_MAX_WORK and not searches(problem, 1))


@apart_from_empty_items
def solve_with_plain_step(problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
    """`solve`'s plan, with one micro-batch (M = 1, or the fewest M' = 1 a larger M may take) `_one_microbatch`'s:
    also `plain_step`'s when cheaper (the first on ties)."""
    return _or_fewest(problem, num_microbatches, plain_step=True)


@in_canonical_order
def _one_microbatch(problem: MicroBatchProblem) -> MicroBatchResult | None:
    """`solve_with_plain_step` at M = 1.

    Where the cells' plan is LPT's (`_cells_are_lpt`), the plain step takes that LPT plan as its
    start, and a plain step cheaper than it is the answer without the cells' own solve.  Else the
    plain step comes first, and the cells' search stops once it provably ends above its cost
    (`microbatch_search.ends_above`): the plan it would have dropped is not searched further."""
    if _cells_are_lpt(problem):
        start = microbatch_cells.lpt_cells(problem, 1)
        plain = None if start is None else plain_step.__wrapped__(problem, start)  # in canonical order already
        if plain is not None and plan_cost(problem, plain, 1) < plan_cost(problem, _one_cell_each(start), 1):
            return plain
    plain = plain_step.__wrapped__(problem)
    cost = None if plain is None else plan_cost(problem, plain, 1)
    result = _solve.__wrapped__(problem, 1, cost)
    if plain is None or (result is not None and plan_cost(problem, result, 1) <= cost):
        return result
    return plain


@apart_from_empty_items
def solve_exact(problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
    """The registry's 'exact' kernel: `microbatch_exact.solve` from auto's plan where auto runs its heuristics
    (above `microbatch_exact.MAX_ITEMS` items), so a search the budget cuts short never returns a plan worse
    than the default algorithm's (probe20 P20-27: the joint greedy's alone, 1.5-2.4 % above auto's)."""
    incumbent = None if problem.num_items <= microbatch_exact.MAX_ITEMS else solve(problem, num_microbatches)
    return microbatch_exact.solve(problem, num_microbatches, incumbent)


def from_packing(problem: MicroBatchProblem, cell_of: np.ndarray, num_microbatches: int) -> MicroBatchResult:
    """A packing's cells (`microbatch_exact.packing`: M·D cells in no particular order) regrouped, most loaded
    first, and improved (`improve`), as a kernel's start is."""
    return microbatch_greedy.split(improve(problem, cell_of, num_microbatches), problem.num_ranks)


def _one_cell_each(rank: np.ndarray) -> MicroBatchResult:
    """One micro-batch: every item in micro-batch 0 of its rank."""
    return MicroBatchResult(rank=rank, microbatch=np.zeros_like(rank))


@apart_from_empty_items
def solve_each(problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
    """`solve_with_plain_step` without the fewest micro-batches' plan (`_fewest_plan`): the cells planned for M.
    A pipeline's start and PP-unaware baseline (`balance_microbatches(pipeline=...)`): the fewest's plan, kept
    without a pipeline where its Σ_m max is lower, packs the items into fewer micro-batches, and the pipeline
    search started from it ended up to 6.3 % slower on 23 of 121 held-out rows (rev15 R15-05); nor the joint
    greedy `_greedy_pays` adds (rev16 R16-11: 5 of 180 held-out pipeline rows 1.2-6.1 % slower, none faster)."""
    return _one_microbatch(problem) if num_microbatches == 1 else _solve(problem, num_microbatches, None, False)


@apart_from_empty_items
def solve(problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
    """`_solve`'s plan for M, and where M exceeds the fewest micro-batches any plan needs, `_fewest_plan`'s (the
    rest of the M micro-batches empty) when it costs less or M's finds none (M's on ties)."""
    return _or_fewest(problem, num_microbatches, plain_step=False)


def _or_fewest(problem: MicroBatchProblem, num_microbatches: int, plain_step: bool) -> MicroBatchResult | None:
    """`solve` (`plain_step`: `solve_with_plain_step`), where M's plan is `_solve`'s (`_one_microbatch`'s at M = 1
    with `plain_step`) and the fewest's is kept on the problem for the other M a free M tries (`_fewest_plan`)."""
    fewest = _kept_fewest(problem)
    if fewest is None or num_microbatches < fewest:
        return _one_microbatch(problem) if plain_step and num_microbatches == 1 else _solve(problem, num_microbatches)
    if num_microbatches == fewest:
        return _fewest_plan(problem, plain_step and fewest == 1)
    result = _solve(problem, num_microbatches)
    cost = None if result is None else plan_cost(problem, result, num_microbatches)
    if cost is not None and cost <= problem.step_bound(num_microbatches):
        return result  # at the bound: the fewest's plan cannot cost less (rev15 R15-06: 4.1x the time for it)
    plans = [plan for plan in (result, _fewest_plan(problem, plain_step and fewest == 1)) if plan is not None]
    costs = [cost if plan is result else plan_cost(problem, plan, num_microbatches) for plan in plans]
    if num_microbatches > fewest + 1 and _far_above(problem, min(costs, default=None), num_microbatches):
        after = _fewest_plan(problem, False, 1, greedy_pays=False)  # the fewest + 1's cells
        if after is not None:
            plans.append(after)
            costs.append(plan_cost(problem, after, num_microbatches))
    return plans[int(np.argmin(costs))] if plans else None  # the first on ties: M's, the fewest's, the fewest + 1's


def _kept_fewest(problem: MicroBatchProblem) -> int | None:
    """The fewest micro-batches any plan needs where `_or_fewest` weighs their plan at larger M (unpadded, above
    `microbatch_exact.MAX_ITEMS` items), else None."""
    return None if problem.padded or problem.num_items <= microbatch_exact.MAX_ITEMS else problem.min_microbatches


def one_microbatch_plan(problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
    """The plan `solve_with_plain_step` weighs at M > 1 and `solve` does not: where the fewest micro-batches
    `_or_fewest` weighs are one, `_one_microbatch`'s (kept, `_fewest_plan`), the other micro-batches empty; else
    None (at M = 1, or where both weigh the same plans)."""
    if num_microbatches == 1 or _kept_fewest(problem) != 1:
        return None
    return _fewest_plan(problem, True)


def _far_above(problem: MicroBatchProblem, cost: float | None, num_microbatches: int) -> bool:
    """Whether the step `cost` of the best plan at M (None: none packs) is more than GREEDY_GAP above the
    certified bound (`MicroBatchProblem.certified_bound`): then `_or_fewest` weighs the plan of the fewest + 1
    micro-batches too (probe23 P23-03: 75 %-empty batches at D 512 fill the fewest, 3, micro-batches ~2.7 items a
    cell, which the cell LPT balances ~3 % above the bound; in 4, 2 a cell, 0.3-0.5 %).  That plan is `_solve`'s
    without the extra joint greedy of `_greedy_pays` (the held-out rows it improves need only the cells')."""
    certified = float_sum([problem.certified_bound, num_microbatches * problem.microbatch_overhead])
    return cost is None or cost > certified * (1.0 + GREEDY_GAP)


def _fewest_plan(problem: MicroBatchProblem, one_microbatch: bool, more: int = 0,
                 greedy_pays: bool = True) -> MicroBatchResult | None:
    """`_solve`'s plan (`one_microbatch`: `_one_microbatch`'s; `greedy_pays` as `_solve`'s) with the fewest
    micro-batches any plan needs (and `more`), kept on the problem (`packings`, shared by its copies) for the next
    M: the same items (the arrays themselves) and settings."""
    key = (FEWEST_KEY, one_microbatch, more, greedy_pays)
    items = (problem.lengths, problem.item_costs)
    settings = (problem.num_ranks, problem.max_tokens_per_microbatch, problem.work_limit, problem.microbatch_overhead)
    kept = problem.packings.get(key)
    if kept is None or any(a is not b for a, b in zip(kept[0], items)) or kept[1] != settings:
        fewest = problem.min_microbatches + more
        plan = (_one_microbatch(problem) if one_microbatch else
                _solve(problem, fewest) if greedy_pays else _solve(problem, fewest, None, False))
        kept = problem.packings[key] = (items, settings, plan)
    return kept[2]


@in_canonical_order
def _solve(problem: MicroBatchProblem, num_microbatches: int, above: float | None = None,
           greedy_pays: bool = True) -> MicroBatchResult | None:
    """Exact search for the smallest instances, the better of the joint greedy and the cell
    LPT (both searched) up to GREEDY_MAX_WORK item-cell pairs, the cell LPT alone above (with the greedy
    where `_greedy_pays`, if `greedy_pays`); the
    plan of least step cost (the first on ties).  `above`: a cost the caller already holds
    (searches stop where their plans provably end above it, `microbatch_search.improve`)."""
    if problem.num_items <= microbatch_exact.MAX_ITEMS:
        return microbatch_exact.solve(problem, num_microbatches)
    if problem.padded:  # the joint greedy's and the sorted runs' (`cells.sorted_fill`; probe23 P23-04)
        results = [result for result in (microbatch_greedy.solve(problem, num_microbatches),
                                         microbatch_cells.sorted_fill(problem, num_microbatches)) if result is not None]
        return min(results, key=lambda result: plan_cost(problem, result, num_microbatches), default=None)
    kernels = [microbatch_cells.solve]
    if problem.num_items * num_microbatches * problem.num_ranks <= GREEDY_MAX_WORK:
        kernels.append(microbatch_greedy.solve)
    results = [result for result in (kernel(problem, num_microbatches, above) for kernel in kernels)
               if result is not None]
    if not results:
        # the cell LPT found no room under the budget; the joint greedy may still find some
        return None if microbatch_greedy.solve in kernels else microbatch_greedy.solve(problem, num_microbatches, above)
    if greedy_pays and len(results) == 1 and _greedy_pays(problem, num_microbatches, results[0]):
        results += [result for result in [microbatch_greedy.solve(problem, num_microbatches, above)] if result]
    if len(results) == 1:
        return results[0]  # nothing to compare it with
    return min(results, key=lambda result: plan_cost(problem, result, num_microbatches))  # the first on ties


def _greedy_pays(problem: MicroBatchProblem, num_microbatches: int, result: MicroBatchResult) -> bool:
    """Whether `_solve` runs the joint greedy beyond GREEDY_MAX_WORK too: M > 1 (one micro-batch has `balance`'s
    plan too, `_one_microbatch`, and `_cells_are_lpt` holds), it searches (O(n·M log D), not the O(n·M·D) scan),
    n · M <= GREEDY_MAX_PAIRS (and within a `time_limit` at `microbatch_exact.GREEDY_CELLS_PER_SECOND`, as
    'exact''s greedy start), and the cell LPT's plan `result` is more than GREEDY_GAP above the bound."""
    pairs = problem.num_items * num_microbatches
    limit = problem.time_limit
    if num_microbatches == 1 or pairs > GREEDY_MAX_PAIRS or microbatch_greedy.scans(problem) or \
            (limit is not None and pairs > limit * microbatch_exact.GREEDY_CELLS_PER_SECOND):
        return False
    return plan_cost(problem, result, num_microbatches) > problem.step_bound(num_microbatches) * (1.0 + GREEDY_GAP)

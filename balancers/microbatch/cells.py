"""All M·D cells balanced as one P||Cmax, then regrouped into micro-batches and searched.

minimise Σ_m max_r load(r, m) s.t. tokens(r, m) <= T, for a given M (see `microbatch`):

    cells = lpt(items, M·D ranks, cap T)     # every cell near Σ c / (M·D), largest first
    (every cell starting at L_0 - L_m, L the water-filling levels of the micro-batches,
        each at least its largest item, so the largest items share one level)
    (LPT finds no room under T: cells = best-fit decreasing on the tokens, the densest
        packing, from which the search rebalances the costs)
    regroup: sort the cells by load, cut into micro-batches of D
    local search (`microbatch_search.improve`) within the work budget

If every cell of a micro-batch sat at the same load, the step would cost Σ c / D, the
bound; LPT's rounds (numpy, `lpt.solve`) get every cell within about one small item of
the mean in O(n log n), and regrouping puts the few cells a large item lifts above the
mean into the same micro-batch, so they cost one maximum instead of one each.  The fast
kernel for large instances (2560 ranks × 32 samples in tens of milliseconds).  Original
to orchmllm; LPT is Graham's (1969).
"""

from __future__ import annotations

import numpy as np

from ..kernels import lpt
from ..problem import InfeasibleError, sorted_order
from .best_fit import best_fit
from .greedy import solve as greedy_solve, split
from .plan import MicroBatchProblem, MicroBatchResult, balancing_problem, cells_problem
from .search import improve


def levels(problem: MicroBatchProblem, num_microbatches: int) -> np.ndarray:
    """Target load of each micro-batch's cells, most loaded first: water-filling of Σ c over
    the micro-batches, each at least the largest item it must hold (the (j·D)-th largest)."""
    d = problem.num_ranks
    costs = problem.sorted_costs
    remaining = float(costs.sum())
    targets = np.zeros(num_microbatches)
    for m in range(num_microbatches):
        mean = max(remaining, 0.0) / ((num_microbatches - m) * d)
        top = float(costs[m * d]) if m * d < costs.size else 0.0
        targets[m] = max(mean, top)
        remaining -= d * targets[m]
    return np.maximum.accumulate(targets[::-1])[::-1]  # never below a later micro-batch's


def lpt_cells(problem: MicroBatchProblem, num_microbatches: int, offsets: np.ndarray | None = None,
              base: float | None = None, shared: bool = False):
    """LPT's cell (m·D + r) per unpadded item over all M·D cells under the budget, or None without room.

    With `offsets` (per micro-batch, >= 0) the cells start at those loads: one pinned
    placeholder per cell, all larger than every item (so LPT's first round places one
    each), ahead of the items, dropped afterwards; cell k·D + r holds the k-th micro-batch's
    by (-placeholder, index).  A placeholder costs `base` + its offset (default base 2 Σ c + 1;
    one above every item in the costs' units keeps LPT on integer keys, `lpt`).  `shared`: the
    caller never writes the cells (`lpt.solve`'s: then read-only, kept for a pipeline's shaped LPT).
    """
    d = problem.num_ranks
    size = num_microbatches * d
    if offsets is None:
        cells, pinned = cells_problem(problem, size), 0
    else:
        base = 2.0 * float(problem.item_costs.sum()) + 1.0 if base is None else base
        placeholder = base + offsets  # one per micro-batch, for each of its D cells
        # Their order as `sorted_order` gives it (largest first, ties by index): the micro-batches
        # by (-placeholder, m), each one's cells in index order; ahead of every item.
        by_placeholder = np.lexsort((np.arange(num_microbatches), -placeholder))
        order = np.concatenate(((by_placeholder[:, None] * d + np.arange(d)).ravel(), size + problem.cost_order))
        cells = balancing_problem(np.concatenate((np.zeros(size, dtype=np.int64), problem.lengths)),
                                  np.concatenate((np.repeat(placeholder, d), problem.item_costs)), size,
                                  problem.max_tokens_per_microbatch, order,
                                  np.concatenate((np.repeat(placeholder[by_placeholder], d), problem.sorted_costs)))
        pinned = size
    try:
        return lpt.solve(cells, quick_refusal=True, shared=shared).assignment[pinned:]
    except InfeasibleError:
        return None


def tight_cells(problem: MicroBatchProblem, num_microbatches: int) -> np.ndarray | None:
    """Best-fit decreasing on the tokens over the M·D cells (cell m·D + r per item), or None
    when even that leaves an item without room: every item, longest first (ties by index),
    goes to the cell with the least room that still takes it (ties by cell).

    Best fit takes an untouched cell (room T, the lowest first) only where no other has room,
    so with more cells it makes the same choices: one packing (`best_fit`, kept on the problem
    for the next M) answers every M, the cells it opens deciding which M it fits in.

    >>> from orchmllm.balancers.microbatch.api import make_microbatch_problem
    >>> problem = make_microbatch_problem([6, 5, 4, 3, 2], 1, max_tokens_per_microbatch=10)
    >>> tight_cells(problem, 2).tolist(), tight_cells(problem, 1)
    ([0, 1, 0, 1, 1], None)
    """
    budget = problem.max_tokens_per_microbatch
    kept = problem.packings.get(budget)
    if kept is None or kept[0] is not problem.lengths:
        kept = problem.packings[budget] = (problem.lengths, *best_fit(problem.lengths, problem.length_order, budget))
    _, cell_of, opened = kept
    return cell_of if opened <= num_microbatches * problem.num_ranks else None


def solve(problem: MicroBatchProblem, num_microbatches: int, above: float | None = None) -> MicroBatchResult | None:
    """LPT over all cells from the water-filling levels (plain LPT when they are flat; the
    tight token packing when LPT finds no room), regrouped and improved within the work
    budget (`above`: as `improve`'s).  Padded cells (count · max c, not a sum) are the joint
    greedy's (`microbatch_greedy.solve`)."""
    if problem.padded:
        return greedy_solve(problem, num_microbatches, above)
    targets = levels(problem, num_microbatches)
    offsets = targets[0] - targets if targets[0] > targets[-1] else None
    start = lpt_cells(problem, num_microbatches, offsets, shared=True)  # `improve` reads it (`regroup`)
    if start is None and offsets is not None:
        start = lpt_cells(problem, num_microbatches, shared=True)
    if start is None:
        start = tight_cells(problem, num_microbatches)
    if start is None:
        return None
    return split(improve(problem, start, num_microbatches, above), problem.num_ranks)


def sorted_fill(problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
    """Padded cells as sorted runs: items longest first, each cell taking the next items while count × its longest
    (its first) fits T, the cells regrouped by load into micro-batches of D (`improve`); None when they make more
    than M·D cells.  The fewest padded cells of runs in that order, each holding items of similar length (probe23
    P23-04: at D = 64 × 32, T 16k, the padded joint greedy's plan was 8 % slower, with one micro-batch more, and
    found no room at M = 4 where these runs fit).

    >>> from orchmllm.balancers.microbatch.api import make_microbatch_problem
    >>> problem = make_microbatch_problem([9, 2, 8, 3, 3], 1, max_tokens_per_microbatch=10, padded=True)
    >>> sorted_fill(problem, 3).microbatch.tolist(), sorted_fill(problem, 2)
    ([0, 1, 2, 1, 1], None)
    """
    starts = _run_starts(problem)
    if len(starts) > num_microbatches * problem.num_ranks:
        return None
    cell_of = np.empty(problem.num_items, dtype=np.int64)
    cell_of[problem.length_order] = np.repeat(np.arange(len(starts)), np.diff(starts + [problem.num_items]))
    return split(improve(problem, cell_of, num_microbatches), problem.num_ranks)


def _run_starts(problem: MicroBatchProblem) -> list:
    """`sorted_fill`'s runs: the position (in `length_order`) of each run's first item, longest first; a run of
    length l holds T // l items (of no tokens: all the rest).  The same for every M: kept on the problem
    (`packings`), found a length at a time (the runs of one length step T // l apart; padded `auto` at 2560 × 32,
    T 8k, 13.9k runs for each of the four M it tried)."""
    cap = problem.max_tokens_per_microbatch
    kept = problem.packings.get(("sorted_fill", cap))
    if kept is None or kept[0] is not problem.lengths:
        lengths, n = problem.lengths[problem.length_order], problem.num_items
        firsts = np.flatnonzero(lengths[1:] != lengths[:-1]) + 1  # where each length starts
        starts, start = [], 0
        for end, length in zip(firsts.tolist() + [n], lengths[np.concatenate(([0], firsts))].tolist()):
            if start < end:
                step = cap // length if length else n  # items of no tokens: one cell holds them all
                starts += range(start, end, step)
                start = starts[-1] + step
        kept = problem.packings[("sorted_fill", cap)] = (problem.lengths, starts)
    return kept[1]

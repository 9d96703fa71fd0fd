"""The shaped start on fewer micro-batches (`planner.arrange`): where the largest item's chain holds the certified
bound (1F1B, interleaved), the items cut into the best shape of k < M cells a replica, the second shaped start's way
(`shaped.lpt_shaped`, the D largest pinned), run in the first k slots, the last M - k cells empty.

Why: where items are large beside the best shape's cells (X̄·x_k), cells of the M-shape hold one or two of them,
and a replica whose cells hold a few items near the largest runs its chain plus most of its other cells' work:
D = 2560 x 32, M = 32, P = 8, 1F1B (bench_pipeline's planning-time instance, seed 7): every replica's largest cell
0.97-1.0 of the largest item, the plan 1.274x the bound.  The shape of fewer cells has larger ones (k = 11: about
2.6x the M-shape's), room for the large items one a cell, and on 1F1B and interleaved the empty cells at the end
add nothing to the chains (an empty cell's operations last the overhead o alone, 0 there): its start met the bound
(the largest item's chain) at k = 11-12 there, 1F1B, and k = 8 interleaved.

Where its step meets the bound no plan is faster: the planner returns it at once (`planner.arrange`), optimal.
Elsewhere it is dropped unused (its cost: one LPT and one walk), so no plan is slower than without it.

k: the fewest runnable micro-batches whose best shape's bound τ_k·X̄_k is at most FEWER_LEVEL of the certified
bound (τ_k falls as k grows: bisected); chosen on seeds 410-415 (D 2560 x 32 and 512 x 32 / x 16, the five mixes,
P 4 / 8, 1F1B and interleaved): at 0.92 the first count that met the bound on every default D 2560 row (k = 11,
τ_k·X̄ 0.90-0.91 of it; k = 10, 0.94-0.95, met it on 2 of 6), speech and long from the fewest.
"""

from __future__ import annotations

import numpy as np

from ..microbatch.plan import MicroBatchProblem
from .profile import best_profile
from .schedules import replica_times
from .search import STOP_GAP
from .shaped import lpt_shaped
from .spec import Pipeline
from .step import start_cells

FEWER_LEVEL = 0.92  # τ_k·X̄_k at most this share of the bound (module)


def fewer_count(problem: MicroBatchProblem, pipeline: Pipeline, num_microbatches: int, bound: float) -> int | None:
    """The micro-batch count k < M of the start on fewer micro-batches (module), or None where no runnable count
    below M has τ_k·X̄_k <= FEWER_LEVEL·bound (X̄_k = Σ c / D + k·o)."""
    counts = [k for k in range(1, num_microbatches) if pipeline.runnable(k) == k]
    mean = problem.total_cost / problem.num_ranks

    def low(k: int) -> bool:
        return best_profile(pipeline, k)[0] * (mean + k * problem.microbatch_overhead) <= FEWER_LEVEL * bound
    lo, hi = 0, len(counts)  # the first count that is low, bisected (τ_k·X̄_k falls as k grows)
    while lo < hi:
        middle = (lo + hi) // 2
        lo, hi = (lo, middle) if low(counts[middle]) else (middle + 1, hi)
    return counts[lo] if lo < len(counts) else None


def fewer_start(problem: MicroBatchProblem, pipeline: Pipeline, num_microbatches: int, bound: float
                ) -> tuple | None:
    """(replica, slot per item, their `cell_accounts` of M cells or None) of the start on fewer micro-batches
    (module), or None where no count is low enough or its LPT finds no room."""
    count = fewer_count(problem, pipeline, num_microbatches, bound)
    if count is None:
        return None
    mean = problem.total_cost / problem.num_ranks + count * problem.microbatch_overhead
    start = lpt_shaped(problem, count, pipeline, mean, most=True)
    if start is None:
        return None
    replica, slot, accounts = start
    if accounts is not None:  # slots k..M-1 empty
        accounts = tuple(np.concatenate([grid, np.zeros((num_microbatches - count, grid.shape[1]), grid.dtype)])
                         for grid in accounts)
    return replica, slot, accounts


def fewer_met(problem: MicroBatchProblem, pipeline: Pipeline, plain: tuple, rows, bound: float) -> tuple | None:
    """`planner.arrange`'s answer for the start on fewer micro-batches where its step meets the certified `bound`
    (no plan is faster), else None (dropped): (replica, slot, the plain cells' step, its cells (costs, None, replica
    times), their `cell_accounts` or None).  Made for 1F1B and interleaved on uniform stages, unpadded, where the
    bound is above τ·X̄ raised by STOP_GAP (the largest item's chain or the pigeonholes hold it).  `plain`: the plain
    cells (costs, tokens, first-stage parts), (D, M); `rows()`: their rows holding their step or None (all)."""
    cost, _, firsts = plain
    m = cost.shape[1]
    if pipeline.schedule == "gpipe" or firsts is not None or problem.padded:
        return None
    mean = float(problem.item_costs.sum()) / problem.num_ranks + m * problem.microbatch_overhead
    start = None if not bound > best_profile(pipeline, m)[0] * mean * (1 + STOP_GAP) else \
        fewer_start(problem, pipeline, m, bound)
    if start is None:
        return None
    replica, slot, accounts = start
    cells = start_cells(problem, replica, slot, m, accounts)[0]
    shown = rows()
    shown = cost if shown is None else cost[shown]
    times = replica_times(pipeline, *pipeline.stage_times(np.concatenate([shown, cells])))
    if float(times[shown.shape[0]:].max()) > bound:
        return None
    return replica, slot, float(times[:shown.shape[0]].max()), (cells, None, times[shown.shape[0]:]), accounts

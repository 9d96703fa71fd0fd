"""Communication-aware micro-batch plans: every item near its source, no micro-batch's max raised.

Given a plain plan of M micro-batches whose micro-batch m costs t_m = max_r load(r, m), find

    minimise  sum(item_bytes[i] for i if node(rank[i]) != node(sources[i]))
    s.t.      load(r, m) <= t_m,  tokens(r, m) <= T      for every cell (r, m)

so the step cost Σ_m t_m is kept.  An item may stay on its rank in any of its M
micro-batches, so the M·D cells are balanced as one problem: cell c = r·M + m starts at
load max(t) - t_m, so that one target max(t) is t_m for every cell, and the filler deal of
`locality_fill` runs on it with each rank's M cells as its first group:

    filler = the smallest items, 0.3-1 % of the total cost (they carry few bytes)
    items longer than T / 2, then T / 4, then the rest (T / 8, T / 16 too on a second try
            when the first runs out of token room), largest first, each tier in turn:
        to the least-loaded of their rank's own cells that fit, then of their node's, then of all
    the filler, largest first, to the least-loaded cells (it tops every cell up)
    repair if a cell is still above its t_m
    every cell within its t_m and T (recomputed in item order), else None: the caller then
        keeps each micro-batch local on its own (`microbatch._keep_local`)

Original to orchmllm.
"""

from __future__ import annotations

import numpy as np

from .locality_deal import NoRoom
from .locality_fill import FINE_TIERS, TIERS, filler_share, fill_locally
from .microbatch_plan import MicroBatchProblem, MicroBatchResult, balancing_problem, cell_accounts
from .partial_plan import PartialPlan


def keep_cells_local(problem: MicroBatchProblem, result: MicroBatchResult, num_microbatches: int,
                     sources: np.ndarray, item_bytes: np.ndarray, gpus_per_node: int) -> MicroBatchResult | None:
    """Cells of `result`'s step cost or less that keep items on their source rank, else their node;
    None when the deal and repair miss a micro-batch's max (unpadded problems only)."""
    m = num_microbatches
    plain_loads, _ = cell_accounts(problem, result.rank, result.microbatch, m)
    maxima = plain_loads.max(axis=1)
    target = float(maxima.max())
    cells = balancing_problem(problem.lengths, problem.item_costs, m * problem.num_ranks, problem.max_tokens,
                              problem.cost_order)
    total = float(problem.item_costs.sum())
    slack = problem.num_ranks * float(maxima.sum()) / total - 1.0 if total > 0 else 0.0  # room above the mean
    for tiers in (TIERS, FINE_TIERS):
        state = PartialPlan(cells, target)
        state.loads += np.tile(target - maxima, problem.num_ranks)  # cell r·M + m starts at max(t) - t_m
        try:
            fill_locally(state, sources * m, item_bytes, m, gpus_per_node, filler_share(slack), tiers)
        except NoRoom:
            continue
        rank, microbatch = np.divmod(state.destinations, m)
        loads, tokens = cell_accounts(problem, rank, microbatch, m)
        if np.all(loads.max(axis=1) <= maxima) and tokens.max() <= problem.max_tokens:
            return result._replace(rank=rank, microbatch=microbatch)
    return None

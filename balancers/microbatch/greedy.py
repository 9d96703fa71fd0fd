"""Joint greedy over the cells (rank, micro-batch), then move/swap local search and regrouping.

minimise Σ_m max_r load(r, m) s.t. tokens(r, m) <= T, for a given M (see `microbatch`):

    cells = M × D empty cells; level[m] = max_r load(r, m)
    for i in items by cost, largest first (ties by index):
        among the cells with room for i, take the one whose micro-batch level rises least
        (ties: the cell i fills closest to its level, then the lowest cell index)
    repeat while it helps (a work budget counts the operations):
        regroup: sort the M·D cells by load and cut into micro-batches of D (for fixed
            cells, the grouping that minimises the sum of group maxima)
        local search: for the most loaded cell of each micro-batch, the move of one of its
            items, or its swap with an item of another cell, that lowers Σ_m level most
Original to orchmllm.  Heuristic: `microbatch_exact` proves small instances.
"""

from __future__ import annotations

import numpy as np

from ..problem import sorted_order
from .plan import MicroBatchProblem, MicroBatchResult
from .search import improve


class Cells:
    """Loads, tokens, counts and (padded) largest cost and length of M·D cells, flat by m·D + r."""

    def __init__(self, problem: MicroBatchProblem, num_microbatches: int):
        self.problem = problem
        self.num_microbatches = num_microbatches
        size = num_microbatches * problem.num_ranks
        self.loads = np.zeros(size)
        self.tokens = np.zeros(size, dtype=np.int64)
        self.counts = np.zeros(size, dtype=np.int64)
        self.top_cost = np.zeros(size)
        self.top_length = np.zeros(size, dtype=np.int64)

    def offer(self, cost: float, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(load, tokens) of every cell if the item were added to it."""
        if self.problem.padded:
            grown = self.counts + 1
            return grown * np.maximum(self.top_cost, cost), grown * np.maximum(self.top_length, length)
        return self.loads + cost, self.tokens + length

    def add(self, cell: int, cost: float, length: int) -> None:
        self.counts[cell] += 1
        self.top_cost[cell] = max(self.top_cost[cell], cost)
        self.top_length[cell] = max(self.top_length[cell], length)
        if self.problem.padded:
            self.loads[cell] = self.counts[cell] * self.top_cost[cell]
            self.tokens[cell] = self.counts[cell] * self.top_length[cell]
        else:
            self.loads[cell] += cost
            self.tokens[cell] += length


def greedy_cells(problem: MicroBatchProblem, num_microbatches: int) -> np.ndarray | None:
    """The joint greedy's cell (m·D + r) per item, or None when some item finds no room."""
    d = problem.num_ranks
    cells = Cells(problem, num_microbatches)
    level = np.zeros(num_microbatches)
    cell_of = np.empty(problem.num_items, dtype=np.int64)
    costs, lengths = problem.item_costs, problem.lengths
    for item in sorted_order(costs).tolist():
        cost, length = float(costs[item]), int(lengths[item])
        loads, tokens = cells.offer(cost, length)
        excess = loads - np.repeat(level, d)
        excess[tokens > problem.max_tokens_per_microbatch] = np.inf
        rise = np.maximum(excess, 0.0)
        best = rise.min()
        if best == np.inf:
            return None
        candidates = np.flatnonzero(rise == best)
        cell = int(candidates[np.argmin(np.abs(excess[candidates]))])
        cell_of[item] = cell
        cells.add(cell, cost, length)
        m = cell // d
        level[m] = max(level[m], cells.loads[cell])
    return cell_of


def split(cell_of: np.ndarray, num_ranks: int) -> MicroBatchResult:
    return MicroBatchResult(rank=cell_of % num_ranks, microbatch=cell_of // num_ranks)


def solve(problem: MicroBatchProblem, num_microbatches: int, above: float | None = None) -> MicroBatchResult | None:
    """Joint greedy, then local search and regrouping within the problem's work budget (`above`: as
    `improve`'s)."""
    cell_of = greedy_cells(problem, num_microbatches)
    if cell_of is None:
        return None
    return split(improve(problem, cell_of, num_microbatches, above), problem.num_ranks)

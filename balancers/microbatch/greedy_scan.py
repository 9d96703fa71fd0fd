"""The joint greedy as written in `greedy`, every cell weighed for every item (O(n·M·D)): the reference of the sorted
search, and the greedy where lengths grow along the cost order (`greedy.greedy_cells`).  Original to orchmllm."""

from __future__ import annotations

import numpy as np

from .plan import MicroBatchProblem


class Cells:
    """Loads, tokens, counts and (padded) largest cost and length of M·D cells, flat by m·D + r."""

    def __init__(self, problem: MicroBatchProblem, num_microbatches: int):
        self.problem, self.num_microbatches, size = problem, num_microbatches, num_microbatches * problem.num_ranks
        self.loads, self.top_cost = np.zeros(size), np.zeros(size)
        self.tokens, self.counts, self.top_length = (np.zeros(size, dtype=np.int64) for _ in range(3))

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
        padded = self.problem.padded
        self.loads[cell] = self.counts[cell] * self.top_cost[cell] if padded else self.loads[cell] + cost
        self.tokens[cell] = self.counts[cell] * self.top_length[cell] if padded else self.tokens[cell] + length


def fresh_wins(excess: float, alone: float) -> bool:
    """Whether a cell of an empty micro-batch at level 0 (excess `alone`: the item's load alone) would beat the cell
    of `excess` the item took: a lesser rise, or as little and nearer the level (`alone` > 0: `excess > alone`)."""
    return excess > max(alone, 0.0) or excess < alone <= 0.0


def scan_greedy(problem: MicroBatchProblem, num_microbatches: int, order: np.ndarray) -> tuple | None:
    """The joint greedy as written in `greedy`, every cell weighed for every item (O(n·M·D)): (cells,
    `fresh_wins`)."""
    d = problem.num_ranks
    cells = Cells(problem, num_microbatches)
    level = np.zeros(num_microbatches)
    cell_of = np.empty(problem.num_items, dtype=np.int64)
    costs, lengths = problem.item_costs, problem.lengths
    fresh_won = False
    for item in order.tolist():
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
        fresh_won = fresh_won or fresh_wins(float(excess[cell]), max(cost, 0.0) if problem.padded else cost)
        cell_of[item] = cell
        cells.add(cell, cost, length)
        m = cell // d
        level[m] = max(level[m], cells.loads[cell])
    return cell_of, fresh_won

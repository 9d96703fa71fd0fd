"""The split planner's table of item times: per-rank time and shard tokens of each item to lay out at every
allowed degree, computed once per layout and looked up by item and degree (`planner.py`, `tiers.py`)."""

from __future__ import annotations

import numpy as np

from ..problem import Problem
from .layout import shard_tokens
from .spec import ContextParallel


class TimeTable:
    """Per-rank times and shard tokens of some items at every allowed degree, on a block inside a
    node where the degree fits one (computed once, looked up by item and degree)."""

    def __init__(self, problem: Problem, spec: ContextParallel, gpus_per_node: int, items: np.ndarray):
        degrees = np.array(spec.degrees, dtype=np.int64)
        self.column = {c: k for k, c in enumerate(spec.degrees)}
        self.row = np.full(problem.num_items, -1, dtype=np.int64)
        self.row[items] = np.arange(items.size)
        self.table = spec.item_times(problem.cost, problem.lengths[items][:, None], degrees[None, :],
                                     (degrees <= gpus_per_node)[None, :])
        self.shards = {c: shard_tokens(problem.lengths[items], c) for c in spec.degrees}
        self.needs = {c: [None] * items.size for c in spec.degrees}  # degree -> per row: `shard`'s answer, once asked
        self.rows = dict(zip(items.tolist(), range(items.size)))  # item -> row, for one item at a time
        self.listed = self.table.tolist()

    def __call__(self, items: np.ndarray, degree: int) -> np.ndarray:
        return self.table[self.row[items], self.column[degree]]

    def time(self, item: int, degree: int) -> float:
        """The time of one item at `degree`."""
        return self.listed[self.rows[item]][self.column[degree]]

    def shard(self, item: int, degree: int) -> tuple[list[int], int, int]:
        """Tokens of each of the item's shards at `degree`, and the most and the fewest of them."""
        row = self.rows[item]
        need = self.needs[degree][row]
        if need is None:
            shards = self.shards[degree][row].tolist()
            need = self.needs[degree][row] = (shards, max(shards), min(shards))
        return need

    def shards_of(self, items: np.ndarray, degree: int) -> list[tuple[list[int], int, int]]:
        """`shard` of each of `items` at `degree`, made for all at once."""
        shards = self.shards[degree][self.row[items]]
        return list(zip(shards.tolist(), shards.max(axis=1).tolist(), shards.min(axis=1).tolist()))

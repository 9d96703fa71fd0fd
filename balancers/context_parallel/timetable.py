"""The split planner's table of item times: per-rank time and shard tokens of each item to lay out at every
allowed degree, computed once per layout and looked up by item and degree (`planner.py`, `tiers.py`).

Only the times are made for every item at once.  A layout reads few items one at a time (zeros_giants, D = 512 x 16,
seed 11: 2.8k of 111k rows over its 93 tables) and some degrees' shards not at all, so the rows as lists, the item ->
row map and each degree's shard table are made where first asked."""

from __future__ import annotations

import numpy as np

from ..problem import Problem
from .bound import Allotment
from .blocks import within_node
from .layout import shards_of
from .spec import ContextParallel


class TimeTable:
    """Per-rank times and shard tokens of some items at every allowed degree, on a block inside a
    node where the degree fits one (computed once, looked up by item and degree)."""

    def __init__(self, problem: Problem, spec: ContextParallel, gpus_per_node: int, items: np.ndarray,
                 allotment: Allotment | None = None):
        """`allotment`: the bound's, whose candidates' times (the same operations on the same lengths, `split.allot`)
        are the table where it holds every item."""
        degrees = np.array(spec.degrees, dtype=np.int64)
        self.column = {c: k for k, c in enumerate(spec.degrees)}
        self.row = np.full(problem.num_items, -1, dtype=np.int64)
        self.row[items] = np.arange(items.size)
        self.table = None
        if allotment is not None and allotment.candidates.size and items.size:
            rows = np.minimum(np.searchsorted(allotment.candidates, items), allotment.candidates.size - 1)
            if np.array_equal(allotment.candidates[rows], items):  # every item a candidate (allgiant: each pass)
                self.table = allotment.times[rows]
        if self.table is None:
            self.table = spec.item_times(problem.cost, problem.lengths[items][:, None], degrees[None, :],
                                         (degrees <= gpus_per_node)[None, :])
        self.lengths = lengths = problem.lengths[items]  # by row
        self.shards = _Lazy(lambda degree: shards_of(lengths, degree))  # degree -> (rows, degree) shard tokens
        self.needs = {c: {} for c in spec.degrees}  # degree -> row -> `shard`'s answer, once asked
        self.rows = _Rows(self.row)  # item -> row, for one item at a time
        self.listed = _Lazy(lambda row: self.table[row].tolist())  # row -> its times as a list of floats
        self.costs, self.gpus_per_node = problem.item_costs, gpus_per_node
        self.degrees = degrees

    def __call__(self, items: np.ndarray, degree: int) -> np.ndarray:
        return self.table[self.row[items], self.column[degree]]

    def time(self, item: int, degree: int) -> float:
        """The time of one item at `degree`."""
        return self.listed[self.rows[item]][self.column[degree]]

    def placed(self, items: np.ndarray, start: np.ndarray, degree: np.ndarray) -> np.ndarray | None:
        """`plan.split_times` of `items` on blocks (start, degree), read from the table (the same float operations
        elementwise): their unsplit costs at degree 1; None where a split item's block is not where the table put
        its group (inside a node where its degree fits one, `blocks.within_node`)."""
        split = degree > 1
        if not np.array_equal(within_node(start[split], degree[split], self.gpus_per_node),
                              degree[split] <= self.gpus_per_node):
            return None
        return np.where(split, self.table[self.row[items], np.searchsorted(self.degrees, degree)], self.costs[items])

    def shard(self, item: int, degree: int) -> tuple[list[int], int, int]:
        """Tokens of each of the item's shards at `degree`, and the most and the fewest of them (`most_fewest`)."""
        row, needs = self.rows[item], self.needs[degree]
        need = needs.get(row)
        if need is None:
            length = int(self.lengths[row])
            need = needs[row] = (self.shards[degree][row].tolist(), -(-length // degree), length // degree)
        return need

    def shards_of(self, items: np.ndarray, degree: int) -> list[tuple[list[int], int, int]]:
        """`shard` of each of `items` at `degree`, made for all at once."""
        rows = self.row[items]
        most, fewest = self.most_fewest(rows, degree)
        return list(zip(self.shards[degree][rows].tolist(), most.tolist(), fewest.tolist()))

    def most_fewest(self, rows: np.ndarray, degree: int) -> tuple[np.ndarray, np.ndarray]:
        """The most and the fewest tokens of the shards at `degree` of the items at `rows`: ⌈l / degree⌉ and
        ⌊l / degree⌋ of their lengths l, without their shards (the counts of a row of `shards` sum to l and differ by
        at most one, `layout.shard_tokens`)."""
        lengths = self.lengths[rows]
        return -(-lengths // degree), lengths // degree


class _Lazy(dict):
    """Key -> `make(key)`, made where first asked and kept."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        value = self[key] = self.make(key)
        return value


class _Rows:
    """Item -> its row of the table (`TimeTable.row`, read as an int); KeyError for an item the table does not
    hold (its row -1 would read the last row: another item's times)."""

    def __init__(self, row: np.ndarray):
        self.row = row

    def __getitem__(self, item: int) -> int:
        row = int(self.row[item])
        if row < 0:
            raise KeyError(item)
        return row

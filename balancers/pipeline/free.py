"""Items that cost nothing, left out of the pipeline planner and dealt after it (probe23 P23-08).

Such an item changes no cell's cost (unpadded cells: a cell's cost is its items' sum plus the micro-batch overhead,
paid by every cell), so it may go to any cell where its tokens fit.  Yet the planner moved and timed them like the
others: with 90 % empty items at D = 512 x 32, M 16 (1F1B, P 8) the planning took 0.71 CPU s against 0.09 s for the
other items alone, and its budget spent on them left the step 1.9 % above theirs; where they held a few tokens
(costs= 0), the shaped start's capped LPT took 25 s.  So the planner runs on the items that cost something, and the
others are dealt after it: those holding tokens longest first, each to the cell of most room left (in rounds of one
item a cell), the others one a cell in turn; where one of them does not fit so, every item is planned as before.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from ..microbatch.plan import MicroBatchProblem
from ..problem import read_only, token_sums


def without_free_items(problem: MicroBatchProblem, rank: np.ndarray, microbatch: np.ndarray, num_microbatches: int,
                       first_stage: np.ndarray | None, accounts: tuple | None, plan: Callable) -> tuple | None:
    """`plan(problem, rank, microbatch, first_stage, accounts)` (`planner.arrange`'s answer: replica, slot, ...,
    the final cells' accounts or None) of the items that cost something, the others dealt after it (`dealt`); None
    where no item costs 0 (or every one does), the cells are padded (a cell's cost counts its items), or a free item
    finds no room."""
    costly = problem.item_costs > 0
    if problem.padded or costly.all() or not costly.any():
        return None
    items = np.flatnonzero(costly)
    holds_tokens = bool(problem.lengths[~costly].any())  # else the plain cells' and the final cells' tokens hold
    part = dataclasses.replace(problem, lengths=read_only(problem.lengths[items]),
                               item_costs=read_only(problem.item_costs[items]), orders={}, packings={})
    found = plan(part, rank[items], microbatch[items], None if first_stage is None else first_stage[items],
                 None if holds_tokens else accounts)
    placed = dealt(problem, items, *found[:2], num_microbatches)
    if placed is None:
        return None
    return (*placed, *found[2:-1], None if holds_tokens else found[-1])


def dealt(problem: MicroBatchProblem, items: np.ndarray, replica: np.ndarray, slot: np.ndarray,
          num_microbatches: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(replica, slot) of every item: `items`' as given, the others holding tokens dealt longest first (ties by
    index) in rounds of one a cell, the i-th of a round to the cell of i-th most room left (ties by index:
    slot·D + replica), then those holding none one a cell in turn from cell 0; None where one finds too little room.

    >>> from orchmllm.balancers.microbatch.api import make_microbatch_problem
    >>> problem = make_microbatch_problem([0, 5, 3, 2], 2, max_tokens_per_microbatch=6, costs=[0.0, 2.0, 0.0, 1.0])
    >>> [values.tolist() for values in dealt(problem, np.array([1, 3]), np.array([0, 1]), np.array([0, 0]), 1)]
    [[0, 0, 1, 1], [0, 0, 0, 0]]
    """
    d = problem.num_ranks
    cells = d * num_microbatches
    room = problem.max_tokens_per_microbatch - token_sums(slot * d + replica, problem.lengths[items], cells)
    is_free = np.ones(problem.num_items, dtype=bool)
    is_free[items] = False
    free = np.flatnonzero(is_free)
    free = free[np.argsort(-problem.lengths[free], kind="stable")]
    held = int(np.count_nonzero(problem.lengths[free]))  # the first `held` hold tokens
    cell = np.empty(free.size, dtype=np.int64)
    cell[held:] = np.arange(free.size - held) % cells
    for start in range(0, held, cells):
        lengths = problem.lengths[free[start:min(start + cells, held)]]
        roomiest = np.argsort(-room, kind="stable")[:lengths.size]
        if (lengths > room[roomiest]).any():
            return None
        room[roomiest] -= lengths
        cell[start:start + lengths.size] = roomiest
    replicas, slots = np.empty(problem.num_items, dtype=np.int64), np.empty(problem.num_items, dtype=np.int64)
    replicas[items], slots[items] = replica, slot
    replicas[free], slots[free] = cell % d, cell // d
    return replicas, slots

"""Items that cost nothing and hold no tokens, left out of the pipeline planner (probe23 P23-08).

Such an item changes no cell's cost (unpadded cells: a cell's cost is its items' sum plus the micro-batch overhead,
paid by every cell) nor its tokens, so it fits every cell at no cost.  Yet the search moved and timed them like
the others: with 90 % empty items at D = 512 x 32, M 16 (1F1B, P 8) the planning took 0.78 CPU s against 0.10 s
for the other items alone, and its budget spent on them left the step 1.9 % above theirs.  So the planner runs on
the other items alone and these stay where the plain plan put them (replica = its rank, slot = its micro-batch).
Items of cost 0 that hold tokens stay in the search: they weigh on the token budget.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..microbatch.plan import MicroBatchProblem
from ..problem import read_only


def costly_part(problem: MicroBatchProblem, rank: np.ndarray, microbatch: np.ndarray,
                first_stage: np.ndarray | None) -> tuple | None:
    """(the problem, rank, micro-batch and first-stage parts of its items that cost something or hold tokens, their
    indices) where some other item neither costs nor holds anything, the cells are unpadded and one item costs;
    else None (the planner runs on every item).

    >>> from orchmllm.balancers.microbatch.api import make_microbatch_problem
    >>> problem = make_microbatch_problem([0, 5, 0, 3], 2, max_tokens_per_microbatch=8, costs=[0.0, 2.0, 0.0, 1.0])
    >>> part = costly_part(problem, np.zeros(4, dtype=np.int64), np.zeros(4, dtype=np.int64), None)
    >>> part[0].lengths.tolist(), part[-1].tolist()
    ([5, 3], [1, 3])
    """
    if problem.padded or problem.num_items == 0:
        return None
    kept = (problem.item_costs > 0) | (problem.lengths > 0)
    if kept.all() or not (problem.item_costs > 0).any():
        return None
    items = np.flatnonzero(kept)
    part = dataclasses.replace(problem, lengths=read_only(problem.lengths[items]),
                               item_costs=read_only(problem.item_costs[items]), orders={}, packings={})
    return part, rank[items], microbatch[items], None if first_stage is None else first_stage[items], items


def with_free_items(rank: np.ndarray, microbatch: np.ndarray, items: np.ndarray, replica: np.ndarray,
                    slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(replica, slot) of every item: `items`' those planned (`replica`, `slot`), the others' their plain cell."""
    replicas, slots = np.array(rank, dtype=np.int64), np.array(microbatch, dtype=np.int64)
    replicas[items], slots[items] = replica, slot
    return replicas, slots

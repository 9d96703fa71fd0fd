"""Empty items (no tokens, no cost) planned apart from the others: a micro-batch kernel's size rules count the
items that cost or hold tokens, so padding a batch with empty samples never changes the step.

An empty item changes no cell's load or tokens (unpadded: a padded cell costs count · max, so there every item
counts), so any cell takes it; the kernel plans the other items alone and the empty ones are dealt one a cell in
turn from the cells holding the fewest items.  Without this the exact search's MAX_ITEMS and `auto`'s other
item-count rules counted them (probe27 P27-07: 11 items, step 16.3; with two empty ones appended, 13 items took
the heuristic: 16.5), as `kernels.auto._costly_items` keeps them out of `balance`'s searches.  Original to orchmllm.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from .plan import MicroBatchProblem, MicroBatchResult

EMPTY_KEY = "empty_items_apart"  # `packings` entry of `_without_empty_items`
_ITEMS_BOUNDS = ("min_microbatches", "cost_bound", "certified_bound", "total_tokens", "total_cost")


def _without_empty_items(problem: MicroBatchProblem) -> tuple[MicroBatchProblem, np.ndarray, np.ndarray] | None:
    """(`problem` over its items that cost or hold tokens, their indices, the empty items' indices), or None where
    none is empty, every one is, or the cells are padded.  The smaller problem's arrays, orders, packings and bounds
    are kept on `problem` for every call on the same items (the arrays themselves), as `auto._canonical` keeps its
    own."""
    kept = problem.packings.get(EMPTY_KEY)
    if kept is None or kept[0] is not problem.lengths or kept[1] is not problem.item_costs:
        kept = problem.packings[EMPTY_KEY] = (problem.lengths, problem.item_costs, _items_that_count(problem))
    if kept[2] is None:
        return None
    smaller, items, empty = kept[2]
    copy = replace(problem, lengths=smaller.lengths, item_costs=smaller.item_costs, orders=smaller.orders,
                   packings=smaller.packings)
    if (copy.num_ranks, copy.max_tokens_per_microbatch) == (smaller.num_ranks, smaller.max_tokens_per_microbatch):
        for name in _ITEMS_BOUNDS:  # of the same items, ranks and budget
            copy.__dict__[name] = smaller.__dict__[name]
    return copy, items, empty


def _items_that_count(problem: MicroBatchProblem) -> tuple[MicroBatchProblem, np.ndarray, np.ndarray] | None:
    if problem.padded:
        return None
    counts = (problem.lengths != 0) | (problem.item_costs != 0)
    if counts.all() or not counts.any():
        return None
    items = np.flatnonzero(counts)
    smaller = replace(problem, lengths=problem.lengths[items], item_costs=problem.item_costs[items], orders={},
                      packings={})
    for name in _ITEMS_BOUNDS:  # once, for every call's copy
        getattr(smaller, name)
    return smaller, items, np.flatnonzero(~counts)


def apart_from_empty_items(kernel):
    """`kernel` (a micro-batch kernel) run on the items that cost or hold tokens (`_without_empty_items`), the
    empty ones then dealt one a cell in turn from the cells holding the fewest items (ties: micro-batch, then rank,
    first); the kernel itself where no item is empty."""
    @functools.wraps(kernel)
    def run(problem: MicroBatchProblem, num_microbatches: int, *args) -> MicroBatchResult | None:
        smaller = _without_empty_items(problem)
        if smaller is None:
            return kernel(problem, num_microbatches, *args)
        smaller, items, empty = smaller
        result = kernel(smaller, num_microbatches, *args)
        if result is None:
            return None
        d = problem.num_ranks
        held = np.bincount(result.microbatch * d + result.rank, minlength=num_microbatches * d)
        turn = np.lexsort((np.arange(held.size), held))
        cell = np.empty(problem.num_items, dtype=np.int64)
        cell[items] = result.microbatch * d + result.rank
        cell[empty] = turn[np.arange(empty.size) % turn.size]
        return result._replace(rank=cell % d, microbatch=cell // d)
    return run

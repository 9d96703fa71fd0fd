"""Exact micro-batch cells for small instances: depth-first branch and bound.

minimise Σ_m max_r load(r, m) s.t. tokens(r, m) <= T, for a given M (see `microbatch`).
Items go in cost order, largest first, each into every cell with room in turn, except
cells that are copies of an earlier one: an empty cell of a micro-batch after its first
empty cell, a whole empty micro-batch after the first, a cell whose (load, tokens, count,
largest item) equals an earlier cell's of the same micro-batch.  A branch is cut when its
Σ_m level, or the certified bound, reaches the incumbent (the heuristic's plan); above MAX_DEPTH items
the search would recurse past Python's stack, and the incumbent comes back unproven.  Every
node counts M·D cells against the budget (`cell_budget`: the work budget, or the time limit
at CELLS_PER_SECOND): when it runs out the incumbent comes back as `feasible` (`time_limit` where the budget was the
time limit's), otherwise as proven `optimal` (or None: proven that nothing fits, or no packing found within the
budget).  `packing_exists` settles whether any packing fits at all
(the M·D cells as interchangeable bins), for the errors that name the fewest M that fit.
Original to orchmllm.
"""

from __future__ import annotations

import numpy as np

from ..problem import Status, sorted_order
from . import greedy as microbatch_greedy
from .plan import MicroBatchProblem, MicroBatchResult, cell_accounts, step_cost

MAX_ITEMS = 12  # `auto` searches exactly up to this many items, else runs the heuristic
MAX_DEPTH = 400  # `packing_exists` recurses once per item; Python's stack holds 1000 frames
CELLS_PER_SECOND = 500_000  # cells a node looks at per second of `time_limit` (Python, this VM under load)
# (item, micro-batch) pairs the joint greedy start weighs per second of `time_limit`: 5.2 M pairs took 2.8 CPU s at
# D = 2560 × 32, M = 64; beyond the limit's share the start is skipped for the incumbent
# (probe22 P22-11: 0.1 s ran 2.9 s)
GREEDY_CELLS_PER_SECOND = 2_000_000


def cell_budget(problem: MicroBatchProblem) -> int:
    """Cells the search may look at: the work budget, or `time_limit` at CELLS_PER_SECOND."""
    if problem.time_limit is None:
        return problem.work_limit
    return int(problem.time_limit * CELLS_PER_SECOND)


class _Budget(Exception):
    pass


def solve(problem: MicroBatchProblem, num_microbatches: int,
          incumbent: MicroBatchResult | None = None) -> MicroBatchResult | None:
    """The optimum for M = num_microbatches when proven within the work budget, else the incumbent: the
    cheaper of the joint greedy's plan and `incumbent` (`auto.solve_exact` passes auto's own).  Under a
    `time_limit` the greedy start runs only where its n · M pairs fit the limit (GREEDY_CELLS_PER_SECOND)."""
    start, best_cost = _start(problem, num_microbatches, incumbent)
    floor = problem.cost_bound
    if best_cost <= floor:
        return start._replace(status=Status.OPTIMAL, lower_bound=best_cost)
    if problem.num_items > MAX_DEPTH:  # one frame per item would pass Python's stack: the incumbent, unproven
        return start
    d, cap, padded = problem.num_ranks, problem.max_tokens_per_microbatch, problem.padded
    order = sorted_order(problem.item_costs).tolist()
    costs = problem.item_costs.tolist()
    lengths = problem.lengths.tolist()
    cell_load = [[0.0] * d for _ in range(num_microbatches)]
    cell_tokens = [[0] * d for _ in range(num_microbatches)]
    cell_count = [[0] * d for _ in range(num_microbatches)]
    cell_top = [[(0.0, 0)] * d for _ in range(num_microbatches)]
    level = [0.0] * num_microbatches
    placed = [0] * problem.num_items
    best = {"cost": best_cost, "cells": None}
    nodes = [cell_budget(problem)]

    cells = num_microbatches * d

    def descend(depth: int, partial: float) -> None:
        nodes[0] -= cells  # a node looks at every cell once
        if nodes[0] < 0:
            raise _Budget
        if depth == len(order):
            if partial < best["cost"]:
                best["cost"], best["cells"] = partial, list(placed)
            return
        item = order[depth]
        cost, length = costs[item], lengths[item]
        seen_empty_microbatch = False
        for m in range(num_microbatches):
            if not any(cell_count[m]):
                if seen_empty_microbatch:
                    continue
                seen_empty_microbatch = True
            seen = set()
            for r in range(d):
                state = (cell_load[m][r], cell_tokens[m][r], cell_count[m][r], cell_top[m][r])
                if state in seen:
                    continue
                seen.add(state)
                count = cell_count[m][r] + 1
                top_cost, top_length = max(cell_top[m][r][0], cost), max(cell_top[m][r][1], length)
                tokens = count * top_length if padded else cell_tokens[m][r] + length
                if tokens > cap:
                    continue
                load = count * top_cost if padded else cell_load[m][r] + cost
                new_partial = partial + max(0.0, load - level[m])
                if max(new_partial, floor) >= best["cost"]:
                    continue
                saved = (cell_load[m][r], cell_tokens[m][r], cell_count[m][r], cell_top[m][r], level[m])
                cell_load[m][r], cell_tokens[m][r], cell_count[m][r] = load, tokens, count
                cell_top[m][r], level[m] = (top_cost, top_length), max(level[m], load)
                placed[item] = m * d + r
                descend(depth + 1, new_partial)
                (cell_load[m][r], cell_tokens[m][r], cell_count[m][r], cell_top[m][r], level[m]) = saved

    try:
        descend(0, 0.0)
    except _Budget:
        found = start if best["cells"] is None else microbatch_greedy.split(np.array(best["cells"], dtype=np.int64), d)
        return found if found is None or problem.time_limit is None else found._replace(status=Status.TIME_LIMIT)
    if best["cells"] is None:  # nothing beats the incumbent; without one, nothing fits
        return None if start is None else start._replace(status=Status.OPTIMAL, lower_bound=best_cost)
    found = microbatch_greedy.split(np.array(best["cells"], dtype=np.int64), d)
    loads, _ = cell_accounts(problem, found.rank, found.microbatch, num_microbatches)
    return found._replace(status=Status.OPTIMAL, lower_bound=step_cost(loads, 0.0))


def _start(problem: MicroBatchProblem, num_microbatches: int,
           incumbent: MicroBatchResult | None) -> tuple[MicroBatchResult | None, float]:
    """(plan, step cost) of the cheaper of the joint greedy's plan (where the time limit buys it) and `incumbent`."""
    start, best_cost = None, np.inf
    greedy = None
    if incumbent is None or problem.time_limit is None or _start_pairs(problem, num_microbatches) <= \
            problem.time_limit * GREEDY_CELLS_PER_SECOND:
        greedy = microbatch_greedy.solve(problem, num_microbatches)
    for candidate in (greedy, incumbent):
        if candidate is not None:
            loads, _ = cell_accounts(problem, candidate.rank, candidate.microbatch, num_microbatches)
            if step_cost(loads, 0.0) < best_cost:
                start, best_cost = candidate, step_cost(loads, 0.0)
    return start, best_cost


def _start_pairs(problem: MicroBatchProblem, num_microbatches: int) -> int:
    """The (item, cell) pairs the greedy start weighs: n · M searched, n · M · D scanned (rev15 R15-04: explicit
    `costs=` that do not follow the lengths took the scan, 0.94 CPU s under time_limit=0.1)."""
    pairs = problem.num_items * num_microbatches
    return pairs * problem.num_ranks if microbatch_greedy.scans(problem) else pairs


def packing_exists(problem: MicroBatchProblem, num_microbatches: int) -> bool | None:
    """Whether the items fit into M × D cells of the budget at all, by exhaustive search (`packing`): True or
    False when settled, None when the work budget runs out first.

    >>> from orchmllm.balancers.microbatch.api import make_microbatch_problem
    >>> problem = make_microbatch_problem([4] * 7, 1, max_tokens_per_microbatch=10)
    >>> packing_exists(problem, 3), packing_exists(problem, 4)
    (False, True)
    """
    found = packing(problem, num_microbatches)
    return found if found is None or found is False else True


def packing(problem: MicroBatchProblem, num_microbatches: int) -> np.ndarray | bool | None:
    """A packing of the items into M × D cells of the budget by exhaustive search: each item's cell (in
    [0, M·D), the cells in no particular order), False when none exists, None when the work budget runs out
    first (or would: more than MAX_DEPTH items, or one node per item costs more than the budget).

    Only tokens matter, so the cells are M·D interchangeable bins: items longest first, each
    into every cell with room whose state (tokens; padded: count and longest) no earlier cell
    shares.  Every node counts M·D operations, as in `solve`.

    >>> from orchmllm.balancers.microbatch.api import make_microbatch_problem
    >>> packing(make_microbatch_problem([4] * 5, 1, max_tokens_per_microbatch=10), 3).tolist()
    [0, 0, 1, 1, 2]
    """
    cells = num_microbatches * problem.num_ranks
    budget = cell_budget(problem)
    if problem.num_items > MAX_DEPTH or problem.num_items * cells > budget:
        return None
    lengths = problem.lengths[problem.length_order].tolist()
    cap, padded = problem.max_tokens_per_microbatch, problem.padded
    tokens, count, top = [0] * cells, [0] * cells, [0] * cells
    placed = [0] * len(lengths)
    work = [budget]

    def place(depth: int) -> bool:
        work[0] -= cells
        if work[0] < 0:
            raise _Budget
        if depth == len(lengths):
            return True
        length = lengths[depth]
        seen = set()
        for cell in range(cells):
            state = (count[cell], top[cell]) if padded else tokens[cell]
            if state in seen:
                continue
            seen.add(state)
            longest = top[cell] if count[cell] else length  # longest first: a cell's first item
            held = (count[cell] + 1) * longest if padded else tokens[cell] + length
            if held > cap:
                continue
            saved = (tokens[cell], count[cell], top[cell])
            tokens[cell], count[cell], top[cell] = held, count[cell] + 1, longest
            placed[depth] = cell
            if place(depth + 1):
                return True
            tokens[cell], count[cell], top[cell] = saved
        return False

    try:
        if not place(0):
            return False
    except _Budget:
        return None
    cell_of = np.empty(problem.num_items, dtype=np.int64)
    cell_of[problem.length_order] = placed
    return cell_of

"""Repair of a grouping whose micro-batch finds no layout: spill from that micro-batch only.

A fill (`grouping.group_microbatches`) may give a micro-batch whose items fit its D · T tokens in sum
but not by shards: items longer than T need blocks of c ranks with ⌈l / c⌉ tokens free on each, and
the giants' blocks beside them leave less.  Lowering every micro-batch's fill then empties the other
micro-batches too (more of them, each less full).  Instead, micro-batch by micro-batch, in order:

    if micro-batch m has no layout:
        move out of m its items longer than T (never its longest item), least time first, the fewest
            that let m lay out (doubling, then bisection), into micro-batch m + 1 (a new one after the last)
        refill m with m + 1's items within T, longest time first, at most the tokens moved out: the
            longest prefix found by bisection whose plan lays out with m's cost no higher (a micro-batch
            costs its max, so work below it is free)

Each micro-batch is planned by the split planner (`plan_pass`), so every plan returned lays out; counts
(not a clock) bound the search, so every rank gets the same plan.
"""

from __future__ import annotations

import numpy as np


def repaired_grouping(microbatch: np.ndarray, lengths: np.ndarray, times: np.ndarray, budget: int,
                      plan_pass) -> tuple[np.ndarray, list] | None:
    """`microbatch` with every micro-batch that has no layout repaired (see the module) and the plans of
    its micro-batches; None when some micro-batch has no layout even with all but its longest item moved."""
    microbatch = microbatch.copy()
    passes, m = [], 0
    while m <= int(microbatch.max()):
        items = np.flatnonzero(microbatch == m)
        plan = plan_pass(items) if items.size else None
        if items.size and plan is None:
            plan = _spill(microbatch, m, lengths, times, budget, plan_pass)
            if plan is None:
                return None
        passes.append(plan)
        m += 1
    return microbatch, passes


def _spill(microbatch: np.ndarray, m: int, lengths: np.ndarray, times: np.ndarray, budget: int, plan_pass):
    """Micro-batch m's plan after its items longer than T move out, least time first, the fewest that lets it
    lay out (found by doubling, then bisection: moving more out frees blocks), and its refill from micro-batch
    m + 1 (`_refill`); `microbatch` updated in place; None when none lays out."""
    items = np.flatnonzero(microbatch == m)
    keep = items[np.argmax(times[items])]  # the longest item (first by index) defines the micro-batch
    over = items[(lengths[items] > budget) & (items != keep)]
    over = over[np.lexsort((over, times[over]))]
    plans = {}

    def laid(count: int):
        if count not in plans:
            plans[count] = plan_pass(np.setdiff1d(items, over[:count]))
        return plans[count]

    failed, count = 0, 1  # `failed`: the most moved out that was tried and does not lay out
    while count < over.size and laid(count) is None:
        failed, count = count, min(2 * count, over.size)
    if over.size == 0 or laid(count) is None:
        return None
    while count - failed > 1:
        middle = (failed + count) // 2
        failed, count = (middle, count) if laid(middle) is None else (failed, middle)
    later = np.flatnonzero(microbatch == m + 1)
    microbatch[over[:count]] = m + 1
    return _refill(microbatch, m, np.setdiff1d(items, over[:count]), laid(count), later,
                   int(lengths[over[:count]].sum()), lengths, times, budget, plan_pass)


def _refill(microbatch: np.ndarray, m: int, rest: np.ndarray, plan, later: np.ndarray, room: int,
            lengths: np.ndarray, times: np.ndarray, budget: int, plan_pass):
    """Micro-batch m's plan with the longest prefix (bisected) of `later`'s items within T, by time
    descending, within `room` tokens, that lays out at no higher cost than `plan` (m's items `rest`)."""
    short = later[lengths[later] <= budget]
    short = short[np.lexsort((short, -times[short]))]
    limit = int(np.searchsorted(np.cumsum(lengths[short]), room, side="right"))
    cost = float(plan.loads.max())

    def fits(count: int):
        found = plan_pass(np.sort(np.concatenate([rest, short[:count]])))
        return found if found is not None and float(found.loads.max()) <= cost else None

    low, best, high = 0, plan, limit
    while low < high:
        middle = (low + high + 1) // 2
        found = fits(middle)
        if found is not None:
            low, best = middle, found
        else:
            high = middle - 1
    microbatch[short[:low]] = m
    return best

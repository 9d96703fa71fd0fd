"""The repair's certificate of failure: a lower bound on the ranks that no sequence of full fixes
brings within the target (`ranks_left_over`); where it equals the ranks above the target, the repair's
searches cannot help and are skipped (`repair.repair`)."""

from __future__ import annotations

import numpy as np

from .partial_plan import PartialPlan


def _without_fix(state: PartialPlan, over: np.ndarray, margin: float) -> np.ndarray:
    """Which of the `over` ranks no full fix can reach: a fix of item i on rank r shifts delta = cost_i -
    cost_j (an item j's cost, or 0 for a move) with e_r <= delta <= some rank's room, and no room ever
    grows past today's largest (see `ranks_left_over`): a rank none of whose items has such a cost j
    (within `margin`) keeps its excess through every round."""
    loads, target = state.loads, state.target
    on = np.zeros(loads.size, dtype=bool)
    on[over] = True
    items = state.item_of_rank[on[state.destinations[state.item_of_rank]]]  # largest first: `low` descends
    costs = state.costs[items]
    low = costs - max(target - float(loads.min()), 0.0) - margin  # delta <= the largest room
    high = costs - (loads[state.destinations[items]] - target) + margin  # delta >= e_r
    # the least cost j >= low is the largest negated cost <= -low (ascending needles search fast)
    least = np.searchsorted(state.negated_sorted_costs, -low, side="right") - 1
    reached = ((least >= 0) & (state.negated_sorted_costs[np.maximum(least, 0)] >= -high)) | (
        (low <= 0.0) & (high >= 0.0))  # another item's cost, or a move's 0
    fixable = np.zeros(loads.size, dtype=bool)
    fixable[state.destinations[items[reached]]] = True
    return ~fixable[over]


def ranks_left_over(state: PartialPlan, coming: np.ndarray | None = None) -> int:
    """A lower bound on the ranks that no sequence of full fixes brings within the target.

    A full fix of rank r (above the target by e_r) moves delta >= e_r onto a partner p with room
    (target - load_p) >= delta and leaves p and r rooms summing to p's room - e_r, each below it: the
    rooms of the ranks within the target are bins, every rank above it an item of size e_r that must
    go whole into one bin (of room >= e_r), and a bin's items sum to its room at most.  So the items
    of size >= x fit in the bins of room >= x: per x = each item's size, the fewest items to leave out
    (largest first) for the rest to fit; the ranks that no single move or swap reaches at all
    (`_without_fix`) are left out first.  Items count only above the rounding of any summation order
    (less that rounding from each), so a rank counted stays above the target however its load is summed.

    With `coming` (the costs of items still to be placed, on any ranks): a bound that holds after them
    too.  Placing items only grows loads: excesses grow, rooms shrink, the largest room too, so the bound
    above only grows, given the rounding of the largest load they could make and, for a rank out of
    reach, that none of them could fix it either (each costs less than its excess: delta < e_r).
    """
    loads, target = state.loads, state.target
    coming = np.zeros(0) if coming is None else coming
    top = max(target, loads.max()) + float(coming.sum())
    rounding = 4 * (max(state.costs.size, loads.size) + 1) * np.finfo(np.float64).eps * top
    excess = loads - target
    over = np.flatnonzero(excess > rounding)
    if over.size == 0:
        return 0
    unreached = _without_fix(state, over, rounding)
    if coming.size:  # a coming item's fix shifts at most its cost (no cost is negative)
        unreached &= float(coming.max()) - excess[over] + rounding < min(0.0, float(state.costs.min()))
    sizes = np.sort(excess[over[~unreached]])[::-1] - rounding  # descending
    if sizes.size == 0:
        return int(np.count_nonzero(unreached))
    rooms = np.sort(np.maximum(-excess, 0.0))
    room_from = np.append(np.cumsum(rooms[::-1])[::-1], 0.0)  # room_from[k]: the rooms from the k-th smallest on
    fitting = room_from[np.searchsorted(rooms, sizes, side="left")]  # per item k: the room of bins >= sizes[k]
    summed = np.cumsum(sizes)
    # items 0..k go to bins >= sizes[k]: leave out the d largest, d the fewest with summed[k] - summed[d - 1] <= fitting
    left_out = np.where(summed > fitting, np.searchsorted(summed, summed - fitting, side="left") + 1, 0)
    return int(np.count_nonzero(unreached)) + int(left_out.max())

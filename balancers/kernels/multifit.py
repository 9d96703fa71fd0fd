"""MULTIFIT (Coffman, Garey & Johnson 1978) with best-fit decreasing packing.

minimise max(loads) where loads[r] = sum(cost[i] for i on r), through bin packing: a
makespan C is reachable if the items, largest first, fit into D bins of capacity C:

    def fits(C):
        bins = []
        for c in sorted(costs, reverse=True):
            room = [b for b in bins if C - load(b) >= c]
            if room: put c in the fullest of them    # best fit
            elif len(bins) < D: open a bin with c
            else: return False
        return True
    bisect C between the lower bound and LPT's makespan

Strong where LPT is weakest, with two or three items per rank: LPT puts the D largest
items on separate ranks and then fills by load, while packing to a target completes
ranks with the items that fit.  Guarantee: the first-fit version is within 13/11 of the
optimum (Yue 1990); this best-fit version has no proven bound, so the plan returned is
the better of the packing and LPT (never worse than LPT).  Each probe is O(n log D)
bisections plus O(D) list moves per item (C-level memmove), per run of equal costs and
bin where lengths repeat; at most `MAX_PROBES` probes.  Deterministic: items by (cost,
index); bins of equal room in a fixed order.  A memory cap falls back to the capped LPT
plan when the packing overflows it; padded problems are packed on f(l) as a surrogate
(`padded` is exact for them).
"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np

from ..bounds import lower_bound
from ..problem import KernelResult, Problem, rank_loads, rank_tokens
from . import lpt

MAX_PROBES = 12
"""Bisection steps on the capacity."""

DEAD_ROOM_MARGIN = 1e-9
"""Of the bins' room, what `pack`'s early refusal leaves to float rounding (far above n ulps)."""


def pack(costs: np.ndarray, num_ranks: int, capacity: float, order: np.ndarray | None = None,
         runs: tuple[list[float], list[int]] | None = None) -> np.ndarray | None:
    """Best-fit decreasing into `num_ranks` bins of `capacity`; None when the items do not fit
    (`order`: `sorted_order(costs)`, `runs`: `equal_runs(costs, order)`, where the caller has them).

    A bin left with less room than the least item never takes another: once such dead room exceeds
    the slack (num_ranks · capacity - Σ costs, plus DEAD_ROOM_MARGIN of it all for rounding),
    the items cannot all fit, and the probe stops there with the None it would end with.  Such a bin
    leaves the room list (no item picks it).  Items of equal cost come in runs: the bin with the least
    room for the first takes the next ones while its room lasts (its room stays the least that fits), so
    a run is placed bin by bin, each bin searched for and moved in the room list once: the same bins as
    the textbook loop, about half the time of placing each item on its own at 512 x 8 (issue 24)."""
    order = lpt.sorted_order(costs) if order is None else order
    ranks: list[int] = []  # bin of each item, in `order`
    rooms: list[float] = []  # remaining room of the open bins that may take another item, ascending
    bins: list[int] = []  # parallel: bin index
    opened = 0
    least = float(costs.min()) if costs.size else 0.0
    spare = num_ranks * capacity * (1.0 + DEAD_ROOM_MARGIN) - float(costs.sum())  # dead room that may still fit
    find, place_room, place_bin, record = bisect_left, rooms.insert, bins.insert, ranks.append  # bound once: hot loop
    live = 0  # len(rooms)
    for cost, left in zip(*(runs or equal_runs(costs, order))):
        while left:
            slot = find(rooms, cost)
            if slot < live:
                room, rank = rooms[slot] - cost, bins[slot]
            elif opened < num_ranks and cost <= capacity:
                room, rank, slot = capacity - cost, opened, live
                opened += 1
                live += 1
                place_room(slot, capacity)  # at the end for now: no room in the list takes this cost
                place_bin(slot, rank)
            else:
                return None
            record(rank)
            left -= 1
            while left and room >= cost:  # the least room that fits still: the run's next item goes here too
                room -= cost
                record(rank)
                left -= 1
            if room >= least:
                below = find(rooms, room, 0, slot)  # where pop, then insert puts it
                if below == slot:
                    rooms[slot] = room
                else:
                    del rooms[slot], bins[slot]
                    place_room(below, room)
                    place_bin(below, rank)
                continue
            del rooms[slot], bins[slot]
            live -= 1
            spare -= room  # dead room, out of the lists: no item fits it
            if spare < 0:
                return None
    assignment = np.empty(costs.size, dtype=np.int64)
    assignment[order] = ranks
    return assignment


def equal_runs(costs: np.ndarray, order: np.ndarray) -> tuple[list[float], list[int]]:
    """The costs in `order` as runs of equal ones: (cost, how many) each."""
    if not costs.size:
        return [], []
    ordered = costs[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    return ordered[starts].tolist(), np.diff(starts, append=costs.size).tolist()


def search(problem: Problem, upper: np.ndarray) -> np.ndarray:
    """Bisect the capacity between the lower bound and the makespan of plan `upper`."""
    best, best_makespan = upper, float(rank_loads(problem, upper).max())
    low = lower_bound(problem)
    integral = bool(np.all(problem.item_costs == np.floor(problem.item_costs)))
    runs = equal_runs(problem.item_costs, problem.cost_order)  # shared by the probes
    for _ in range(MAX_PROBES):
        capacity = (low + best_makespan) / 2
        if integral:
            capacity = float(np.floor(capacity))
            if capacity < low:
                break
        if capacity >= best_makespan:
            break
        packed = pack(problem.item_costs, problem.num_ranks, capacity, problem.cost_order, runs)
        if packed is None:
            low = capacity + 1 if integral else capacity
            continue
        makespan = float(rank_loads(problem, packed).max())
        if makespan < best_makespan:
            best, best_makespan = packed, makespan
        else:
            break
    return best


def solve(problem: Problem) -> KernelResult:
    """MULTIFIT kernel: the packing found by bisection, or LPT's plan when that is better."""
    start = lpt.greedy_unpadded(problem.item_costs, problem.num_ranks, problem.cost_order)
    assignment = search(problem, start)
    cap = problem.max_tokens_per_rank
    if cap is not None and rank_tokens(problem, assignment).max() > cap:
        return lpt.solve(problem)
    return KernelResult(assignment)

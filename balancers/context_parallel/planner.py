"""The split planner: the canonical allotment at the bound, groups on aligned blocks, the rest dealt.

    T* = canonical bound (`bound.py`)
    for T in T*, T*·(1 + 1/64), ..., T*·(1 + 7/64), then the items' times above (while groups
            overflow the free blocks, as long as the estimate below improves; none after a first
            target that leaves the groups no token room, nor after NO_ROOM_RUN such targets in a row):
        degree[i] = smallest degree whose time fits T (only items long for the step split); lone items moved up
            a degree where they outnumber the ranks (`pairing.py`)
        per degree c, largest first (`placement.py`): its items, longest time first, into the first group of c
            ranks that stays within T and the token budget (first-fit decreasing), each group
            on the next free aligned block of c ranks inside a node; an item whose group found
            no free block joins the least-loaded group of its degree or above
        keep the layout whose estimate max(largest group time, water level) is least
        where the first target's layout overflows (or none has token room): two tiers (`tiers.py`, the
            longest items alone, the rest by LPT over the widest blocks left) instead if their estimate is
            less; where it is within the ladder's last step, T*·(1 + 7/64), the ladder stops there (a speed
            rule: the ladder went on to beat such two tiers in 0 of 44 layouts of the long workload, D = 2560 x
            16, T = 16k and 32k, where its targets after the first took 0.4 s of 2.4 s at T = 16k; it may
            change such a plan)
    the unsplit items, largest first, dealt round robin to the ranks with room under T (a
        group's ranks start with its time), the rest in LPT rounds (`locality_deal.take_anywhere`; where the first
        LPT round's least-loaded rank has no token room for the largest item, `locality.token_lpt`);
        where no rank has token room for one, every item laid out as above instead

Several split items of one degree may share a group; no rank is in two groups.  The local
search that follows is `search.py`.
"""

from __future__ import annotations

import math

import numpy as np

from ..locality.deal import DEAL_WINDOW, NoRoom, take_anywhere
from ..locality.partial_plan import PartialPlan
from ..locality.token_lpt import TokenRoomExhausted, token_bound_lpt
from ..problem import InfeasibleError, Problem
from .bound import Allotment
from .pairing import packable_degrees, pigeonhole_degrees
from .placement import place_groups
from .plan import rank_accounts
from .spec import ContextParallel
from .tiers import two_tiers
from .timetable import TimeTable

LAYOUT_SHARE = 1 / 4
"""Unsplit items costing more than this share of the target are laid out with the groups (best
fit, longest first), the others dealt after them."""

LADDER_STEP = 1 / 64
LADDER_STEPS = 8
LADDER_BREAKPOINTS = 32
"""Targets T*·(1 + k·LADDER_STEP), k < LADDER_STEPS, then up to LADDER_BREAKPOINTS item times above
them, tried while the groups overflow the free blocks."""
NO_ROOM_RUN = 3
"""Targets in a row without token room after which the ladder stops (a speed rule).  Wider targets drop degrees,
so shards grow and room rarely comes back: of 1127 ladder placements (issue 24 families and giant mixes, D = 512,
seeds 3, 5, 8) 150 found no room after a target that had it, and in 3 of 712 layouts a later target found room
and a lower estimate again, after at most 2 such targets in a row.  Such runs went on to the ladder's end (up to
39 targets: the bimodal family at D = 512, 0.12 s of 0.5 s; zeros_giants at D = 2560, 0.36 s of 2.9 s)."""


def _targets(allotment: Allotment, bound: float) -> list[float]:
    """The ladder: T*·(1 + k·LADDER_STEP) for k < LADDER_STEPS, then the items' own times above it
    (where some canonical degree drops), at most LADDER_BREAKPOINTS of them."""
    ladder = [bound * (1 + step * LADDER_STEP) for step in range(LADDER_STEPS)]
    times = np.where(allotment.allowed, allotment.times, np.inf)
    above = np.unique(times[(times > ladder[-1]) & np.isfinite(times)])[:LADDER_BREAKPOINTS]
    return ladder + above.tolist()


def water_level(loads: np.ndarray, work: float) -> float:
    """The level h with sum(max(0, h - loads)) = work: where ranks starting at `loads` end when
    `work` is spread perfectly.

    >>> water_level(np.array([0.0, 0.0, 6.0]), 4.0), water_level(np.array([0.0, 0.0, 1.0]), 5.0)
    (2.0, 2.0)
    """
    ascending = np.sort(loads)
    below = np.arange(1, ascending.size + 1) * ascending - np.cumsum(ascending)  # work to lift the first k to the k-th
    k = int(np.searchsorted(below, work, side="right"))  # ranks the level covers
    return float((work + ascending[:k].sum()) / k)


def layout(problem: Problem, spec: ContextParallel, gpus_per_node: int, allotment: Allotment, bound: float,
           long: np.ndarray, layouts: dict | None = None,
           times: TimeTable | None = None) -> tuple[np.ndarray, np.ndarray, float, tuple] | None:
    """(block starts, degrees, target, the ranks' (loads, tokens)) of the best layout on the ladder above
    the bound (None when none has token room): the items `long` laid out, the others' starts -1.
    `layouts`: the layouts of the targets, shared by calls with more `long` items (`place_groups`); `times`: the
    `TimeTable` of `long`, where the caller made it."""
    best, best_estimate, overflowed, tiered = None, math.inf, True, ()  # (): two tiers not weighed yet
    roomless = 0  # the targets in a row without token room
    times = TimeTable(problem, spec, gpus_per_node, long, allotment) if times is None else times
    cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
    # no item splits at the bound, yet more whole items cost over half of it than there are ranks (`split.plan_split`)
    crowded_only = spec.degrees[0] == 1 and 2 in spec.degrees and not (allotment.degrees_at(bound) > 1).any()
    free_riders = _free_riders(problem, spec, times, long)
    for target in _targets(allotment, bound):
        degree = packable_degrees(times, problem.lengths, allotment.degrees_at(target), target, cap,
                                  problem.num_ranks, spec.degrees)
        if crowded_only:
            degree = pigeonhole_degrees(times, problem.lengths, degree, long, target, cap, problem.num_ranks)
        riding = free_riders[degree[free_riders] == 1]
        placed = place_groups(problem, spec, gpus_per_node, times, degree, long[~np.isin(long, riding[1:])] if
                              riding.size > 1 else long, target, layouts)
        if placed is not None and riding.size > 1:  # the others go where the first went (`_free_riders`)
            placed[0][riding[1:]], placed[1][riding[1:]] = placed[0][riding[0]], placed[1][riding[0]]
        roomless = roomless + 1 if placed is None else 0
        if placed is None:  # no token room: where the first target had none, or NO_ROOM_RUN in a row had none, stop
            # (speed rules: wider ones pack groups fuller and rarely find room, 1 of 270 layouts surveyed; see
            # NO_ROOM_RUN; they may change such a plan)
            if best is None or roomless >= NO_ROOM_RUN:
                break
            continue
        start, degree, overflow = placed
        laid = start >= 0
        loads, tokens = laid_accounts(problem, spec, gpus_per_node, start, degree, times)
        estimate = max(float(loads.max()), water_level(loads, float(problem.item_costs[~laid].sum())))
        if estimate >= best_estimate:  # a wider target did not pay
            break
        first = best is None
        best, best_estimate, overflowed = (start, degree, target, (loads, tokens)), estimate, overflow
        if not overflow:
            break
        if first:  # the first target's groups overflowed the ranks: two tiers, where they do better, end it
            tiered = _tiered(problem, spec, gpus_per_node, times, long, best_estimate)
            if tiered is not None and tiered[0][2] <= bound * (1 + (LADDER_STEPS - 1) * LADDER_STEP):
                return tiered[0]
    if overflowed and tiered is not None:  # the groups overflowed at every target, or none found token room
        # Weighed at the first target, two tiers stand where their estimate is below the best target's (the best k
        # under a lower ceiling is the same where its estimate is below it, `two_tiers`): not dealt again
        tiered = tiered or _tiered(problem, spec, gpus_per_node, times, long, best_estimate)
        best = tiered[0] if tiered is not None and tiered[1] < best_estimate else best
    return best


def _free_riders(problem: Problem, spec: ContextParallel, times: TimeTable, long: np.ndarray) -> np.ndarray:
    """The items of `long` with no tokens and no time unsplit (empty items of a cost with no per-item term; none
    where `spec` leaves out degree 1, which splits every item): at
    degree 1, `place_groups` lays them out last (longest time first) and each goes where the first of them went.
    Adding nothing to any rank, none moves a load, and its choice (the fullest rank within the target, else the
    least-loaded rank or group, ties by start; no token need) reads only loads: a group's time is at least its
    least-loaded rank's.  So one of them is laid out, the others copy its block (zeros_giants, D = 2560 x 16: 90 %
    of the items empty, placed one by one in every all-items layout)."""
    empty = long[problem.lengths[long] == 0] if spec.degrees[0] == 1 else long[:0]
    return empty[times(empty, 1) == 0] if empty.size else empty


def _tiered(problem: Problem, spec: ContextParallel, gpus_per_node: int, times: TimeTable, long: np.ndarray,
            ceiling: float) -> tuple[tuple[np.ndarray, np.ndarray, float, tuple], float] | None:
    """(`layout`'s answer for the layout of two tiers (`tiers.py`), their own estimate), where that is below
    `ceiling`; else None."""
    rest_work = float(problem.item_costs.sum() - problem.item_costs[long].sum())
    tiers = two_tiers(problem, spec, gpus_per_node, times, long, rest_work, water_level, ceiling)
    if tiers is None or not tiers[2] < ceiling:
        return None
    start, degree, estimate = tiers
    loads, tokens = laid_accounts(problem, spec, gpus_per_node, start, degree, times)
    return (start, degree, max(estimate, float(loads.max())), (loads, tokens)), estimate


def laid_accounts(problem: Problem, spec: ContextParallel, gpus_per_node: int, start: np.ndarray,
                  degree: np.ndarray, times: TimeTable | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(loads, tokens) per rank of the laid-out items (start >= 0) alone: their `rank_accounts`, summed over
    their shards only (the same pairs in the same order, so the same floats) rather than over every item's, their
    times read from the layout's table `times`, where given, if it holds them (`TimeTable.placed`)."""
    laid = np.flatnonzero(start >= 0)
    start, degree = start[laid], degree[laid]
    loads, tokens, _ = rank_accounts(_items_of(problem, laid, None), spec, gpus_per_node, start, degree,
                                     None if times is None else times.placed(laid, start, degree))
    return loads, tokens


def _items_of(problem: Problem, items: np.ndarray, cap: int | None) -> Problem:
    """The unpadded problem of `problem`'s `items` alone, capped at `cap` tokens a rank."""
    return Problem(lengths=problem.lengths[items], item_costs=problem.item_costs[items], num_ranks=problem.num_ranks,
                   cost=problem.cost, padded=False, max_tokens_per_rank=cap, time_limit=None)


def fill(problem: Problem, start: np.ndarray, target: float, accounts: tuple) -> np.ndarray | None:
    """The block starts with a rank for every item not laid out (start -1): dealt to the room
    left under `target` by the laid-out ones' (loads, tokens) `accounts` (`locality_deal.take_anywhere`; from its
    first LPT round on, where that round's least-loaded rank has no token room for the largest item waiting, the
    rest by `token_lpt.token_bound_lpt`); None when the deal finds no token room."""
    loads, tokens = accounts
    rest = np.flatnonzero(start < 0)
    state = PartialPlan(_items_of(problem, rest, problem.max_tokens_per_rank), target)
    state.loads += loads
    state.tokens += tokens
    try:
        take_anywhere(state, np.arange(rest.size), max_lpt_rounds=0)
    except NoRoom:  # at its first LPT round, nothing placed by it yet
        waiting = np.flatnonzero(state.destinations < 0)
        waiting = state.item_of_rank[np.sort(state.cost_rank[waiting])]  # largest first, as take_anywhere
        try:
            if state.tokens[np.argmin(state.loads)] + state.lengths[waiting[0]] > state.cap:
                token_bound_lpt(state, waiting, DEAL_WINDOW * np.finfo(np.float64).eps * target)
            else:  # the same rounds as without the stop: its deal keeps nothing again, then the LPT round
                take_anywhere(state, waiting)
        except (NoRoom, TokenRoomExhausted):
            return None
    start = start.copy()
    start[rest] = state.destinations
    return start


def laid_out(problem: Problem, spec: ContextParallel, gpus_per_node: int, allotment: Allotment,
             bound: float) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(block starts, degrees) of every item: the long ones laid out, the rest dealt; where the
    deal finds no token room, every item laid out (an unsplit item that fits no rank then joins
    a group, split).  InfeasibleError when no layout meets the budget.  Third: every item's time on its block
    (`plan.split_times`), read from the layout's table (`TimeTable.placed`), or None where it does not hold them.

    Laid out first: the split items and the unsplit ones dearer than LAYOUT_SHARE of the bound."""
    long = np.flatnonzero((allotment.degrees_at(bound) > 1) | (problem.item_costs > LAYOUT_SHARE * bound))
    layouts = {} if long.size < problem.num_items else None
    for items in (long, np.arange(problem.num_items)):
        times = TimeTable(problem, spec, gpus_per_node, items, allotment)
        laid = layout(problem, spec, gpus_per_node, allotment, bound, items, layouts, times)
        if laid is not None:
            start, degree, target, accounts = laid
            start = fill(problem, start, target, accounts)
            if start is not None:
                return start, degree, _item_time(problem, times, items, start, degree)
        if long.size == problem.num_items:  # every item was laid out already: the same layout again
            break
    cap = problem.max_tokens_per_rank
    raise InfeasibleError(f"the split planner found no layout of the items within max_tokens_per_rank={cap}; "
                          f"a larger budget, larger degrees or `allow_inter_node` may fit", min_cap=2 * cap)


def _item_time(problem: Problem, times: TimeTable, items: np.ndarray, start: np.ndarray,
               degree: np.ndarray) -> np.ndarray | None:
    """`plan.split_times` of the plan (start, degree) whose laid-out `items` are those of the table `times`, the
    others dealt unsplit: the table's times of `items` (`TimeTable.placed`), the others' costs; None where the table
    does not hold them (a split item not in `items`, or a block the table did not assume)."""
    item_time = problem.item_costs.copy()
    others = np.ones(problem.num_items, dtype=bool)
    others[items] = False
    if np.any(degree[others] != 1):
        return None
    placed = times.placed(items, start[items], degree[items])
    if placed is None:
        return None
    item_time[items] = placed
    return item_time

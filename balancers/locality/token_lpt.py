"""LPT under a token cap in rounds: the items left once the least-loaded rank has no token room for the largest.

Where token room binds (a nearly full micro-batch of the split planner: ranks without a group fill their tokens before
the target, those holding groups have token room above it), every item left goes above the target but the few that
still fit the token-full ranks.  `deal.take_anywhere` makes those rounds one by one (`token_bound.py`: thousands of
events, each a few numpy calls); this makes the same kind of plan in a few vectorised rounds:

    tight = the ranks without token room for the largest waiting item
    while some tight rank fits a waiting item under the target (cost a hair short of it, tokens within the cap):
        each such tight rank, by (first item that fits it, load, rank), takes the largest waiting item that fits it
            and no rank before it in that order took
    for every waiting item, largest first (ties by index):
        to the least-loaded rank (ties by rank) with token room for it, possibly above the target

The second loop is LPT (Graham 1969) over the ranks with token room for each item, made in rounds: the k-th item to
the k-th least-loaded rank with room for the round's first item, cut where the heap loop would give an item to a rank
of the round again (`kernels.lpt.round_length`), where a rank lacks room for its item, or where a rank left out (room
for a later item, not the first) loads no more.  Every round places at least its first item, so it ends; each item
goes where the loop puts it (tests/test_token_bound_lpt.py checks both loops against their plain code, bit for bit).

It is not take_anywhere's plan: there, the token-full ranks take an item whenever the k-th least-loaded of them fits
the k-th item of an LPT round, and ranks under the target keep deals between the rounds.  On the long workload's step
(D = 2560 x 16, T = 32k) such fills of 23-37k items take 5-18 ms here against 47-109 ms, their peaks within
-0.07/+0.07 % of those rounds' (seeds 11, 23); bench_notes cxl50_s23 has the held-out steps.
"""

from __future__ import annotations

import numpy as np

from ..kernels.lpt import round_length
from .partial_plan import PartialPlan


class TokenRoomExhausted(Exception):
    """No rank has token room for a waiting item."""


def token_bound_lpt(state: PartialPlan, waiting: np.ndarray, margin: float) -> None:
    """Place every item of `waiting` (largest first, ties by index) as the module says, under `state`'s cap;
    TokenRoomExhausted where no rank has token room for one (the items placed before stay placed)."""
    left = np.ones(waiting.size, dtype=bool)
    _top_up(state, waiting, left, state.cap - state.tokens < state.lengths[waiting[0]], margin)
    _rounds(state, waiting[left])


def _top_up(state: PartialPlan, waiting: np.ndarray, left: np.ndarray, tight: np.ndarray, margin: float) -> None:
    """The first loop of the module over the `tight` ranks (mask), `left` (per waiting item) cleared as items go."""
    costs, lengths = state.costs[waiting], state.lengths[waiting]
    while True:
        free = np.flatnonzero(left)
        if not free.size:
            return
        cost_room, token_room = state.target - margin - state.loads, state.cap - state.tokens
        ranks = np.flatnonzero(tight & (cost_room >= costs[free].min()) & (token_room >= lengths[free].min()))
        if not ranks.size:
            return
        # a lower bound of the first free item that fits each rank (the running minima descend), then the first
        # not taken before it in the order: the k-th rank in order takes the max(p_k, taken by the one before + 1)-th
        least_costs = -np.minimum.accumulate(costs[free])
        least_lengths = -np.minimum.accumulate(lengths[free])
        first = np.maximum(least_costs.searchsorted(-cost_room[ranks]), least_lengths.searchsorted(-token_room[ranks]))
        order = np.lexsort((ranks, state.loads[ranks], first))
        ranks, first = ranks[order], first[order]
        steps = np.arange(ranks.size)
        taken = steps + np.maximum.accumulate(first - steps)
        inside = taken < free.size
        ranks, items = ranks[inside], free[taken[inside]]
        fits = (costs[items] <= cost_room[ranks]) & (lengths[items] <= token_room[ranks])
        if not fits.any():
            return
        ranks, items = ranks[fits], items[fits]
        state.put(waiting[items], ranks)
        left[items] = False


def _rounds(state: PartialPlan, waiting: np.ndarray) -> None:
    """The second loop of the module, in rounds."""
    costs, lengths = state.costs[waiting], state.lengths[waiting]
    front = 0
    while front < waiting.size:
        room = state.cap - state.tokens
        roomy = room >= lengths[front]
        ranks = np.flatnonzero(roomy)
        if not ranks.size:
            raise TokenRoomExhausted
        ranks = ranks[np.lexsort((ranks, state.loads[ranks]))]
        count = min(ranks.size, waiting.size - front)
        ranks, taking = ranks[:count], np.arange(front, front + count)
        fits = lengths[taking] <= room[ranks]
        count = int(np.argmin(fits)) if not fits.all() else count
        if count > 1:
            count = round_length(state.loads[ranks[:count]], ranks[:count], costs[taking[:count]])
            count = _before_left_out(state.loads, room, roomy, ranks[:count], lengths[taking[:count]])
        state.put(waiting[taking[:count]], ranks[:count])
        front += count


def _before_left_out(loads: np.ndarray, room: np.ndarray, roomy: np.ndarray, ranks: np.ndarray,
                     lengths: np.ndarray) -> int:
    """How many of a round's pairs (the k-th item, of `lengths`, to `ranks[k]`) come before the first whose item fits
    a rank left out of the round (no room for its first item: not `roomy`) loaded no more than its rank (at least
    one: no rank left out fits the first)."""
    out = np.flatnonzero(~roomy & (room >= lengths.min()))
    if not out.size:
        return ranks.size
    out = out[np.argsort(-room[out], kind="stable")]  # most room first: those fitting an item are a prefix
    least = np.minimum.accumulate(loads[out])
    fitting = (-room[out]).searchsorted(-lengths, side="right")  # how many left out fit each item
    lower = np.where(fitting > 0, least[np.maximum(fitting - 1, 0)], np.inf)
    beaten = np.flatnonzero(lower <= loads[ranks])
    return max(int(beaten[0]), 1) if beaten.size else ranks.size

"""Two tiers: where the layout's groups overflow the ranks, the longest items alone and the rest dealt by LPT.

When the items to lay out need more blocks than the D ranks hold (giants that pair only two to a group
at their canonical degree), first fit stacks the last ones above the target on groups already full.
Instead: with the widest degree C and items by their time at C, longest first, the first k run alone,
each on a block of the next degree below C where its shards fit the budget (else C), and the others are
dealt by LPT (Graham 1969) over the whole C-blocks left, each to the least-loaded group with token room:

    for k in 0, n / TIER_STEPS, 2 n / TIER_STEPS, ..., n:
        alone blocks, largest degree first, each on the first free block of its degree (`blocks.free_blocks`:
            inside a node unless groups may cross; on nodes a power of two wide, contiguous from rank 0)
        groups = the free C-blocks left;  LPT of the rest over the groups (time at C, shards within T)
        estimate = max(the ranks' peak, the water level of the items not laid out)
    keep the k of the least estimate (a k whose lower bound on it is no less than the best's is not dealt)

A moldable-scheduling heuristic with no guarantee; the layout keeps it only where it beats the ladder.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from ..problem import Problem
from .blocks import free_blocks
from .spec import ContextParallel

TIER_STEPS = 8
"""Numbers k of items alone tried: 0, n / TIER_STEPS, ..., n."""

FLOAT_SLACK = 1e-9
"""Relative margin taken off the bounds of `_floor` that compare float sums in another order."""


def two_tiers(problem: Problem, spec: ContextParallel, gpus_per_node: int, times, long: np.ndarray,
              rest_work: float, water_level, ceiling: float = math.inf) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(block start and degree of every item, -1 and 1 where not in `long`; the estimate) of the best k
    (see the module), None when no k has token room; `times` the layout's `TimeTable` of `long`,
    `rest_work` the work of the items not laid out, `water_level(loads, work)` the layout's estimate.
    A k whose floor reaches `ceiling` is not dealt: the best k is the same where its estimate is below
    `ceiling` (the caller keeps two tiers only then)."""
    widest = spec.degrees[-1]
    if widest == 1 or not long.size:
        return None
    cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
    order = long[np.lexsort((long, -times(long, widest)))]
    below = spec.degrees[-2] if len(spec.degrees) > 1 else widest
    rows = times.row[order]
    alone = np.where(times.most_fewest(rows, below)[0] <= cap, below, widest)  # each item's degree when alone
    most, fewest = times.most_fewest(rows, widest)
    wide_time = times(order, widest)
    wide = (wide_time.tolist(), times.shards[widest][rows], most.tolist(), fewest.tolist())
    alone_time = times.table[rows, np.where(alone == below, times.column[below], times.column[widest])]
    best = None
    for k in sorted(set(np.linspace(0, order.size, TIER_STEPS + 1).astype(np.int64).tolist())):
        if int(alone[:k].sum()) > problem.num_ranks:
            break
        floor = _floor(k, alone, alone_time, wide_time, widest, problem.num_ranks, rest_work)
        if floor >= (ceiling if best is None else min(ceiling, best[2])):  # its estimate cannot be less
            continue
        laid = _deal(problem, spec, gpus_per_node, times, order, alone, k, widest, cap, wide)
        if laid is None:
            continue
        start, degree, loads = laid
        estimate = max(float(loads.max()), water_level(loads, rest_work))
        if best is None or estimate < best[2]:
            best = (start, degree, estimate)
    return best


def _floor(k: int, alone: np.ndarray, alone_time: np.ndarray, wide_time: np.ndarray, widest: int, num_ranks: int,
           rest_work: float) -> float:
    """A lower bound on the estimate of `_deal` with the first k items alone (at degrees `alone`, their times
    `alone_time`; the others dealt at `widest`, their times `wide_time` descending): the longest alone (its
    block's load), the longest dealt (alone in its group first), the groups' mean load, and every rank's work
    (the items' and `rest_work`) spread evenly, the last two less FLOAT_SLACK.  The groups counted are the
    C-blocks after the alone ranks packed from rank 0: at least those `_deal` has (every alone block lies in one
    C-block, and on nodes of odd sizes some C-blocks straddle two), so the mean stays a lower bound."""
    position = int(alone[:k].sum())
    groups = len(range(-(-position // widest) * widest, num_ranks - widest + 1, widest))
    dealt = float(wide_time[k:].sum())
    work = float((alone[:k] * alone_time[:k]).sum()) + widest * dealt + rest_work
    floor = max(float(alone_time[:k].max(initial=0.0)), float(wide_time[k]) if k < wide_time.size else 0.0)
    return max(floor, (1 - FLOAT_SLACK) * max(dealt / groups if groups else 0.0, work / num_ranks))


def _deal(problem: Problem, spec: ContextParallel, gpus_per_node: int, times, order: np.ndarray, alone: np.ndarray,
          k: int, widest: int, cap: float, wide: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(starts, degrees, per-rank loads) with the first k of `order` alone at degrees `alone` and the rest by
    LPT over the C-blocks left; None when one finds no block or no token room (at once where the items dealt
    hold more tokens than the groups' ranks: allgiant, D = 2560 x 16, T = 32k: 107 of 287 deals without room).
    `wide`: the items' (times, shards, most and fewest shard tokens) at the widest degree, in `order`.  Blocks
    are those a group may take (`blocks.free_blocks`), so on nodes of odd sizes the ones straddling two nodes are
    never used.

    A group's ranks all carry its load (every item adds its time to each), so the heap's loads are the
    ranks'.  Each item goes to the least-loaded group with token room (`_Rooms`); the groups surely short of
    its shards are parked out of the heap until an item with fewer tokens comes (tokens only grow)."""
    d = problem.num_ranks
    start = np.full(problem.num_items, -1, dtype=np.int64)
    degree = np.ones(problem.num_items, dtype=np.int64)
    loads = np.zeros(d)
    taken = np.zeros(d, dtype=bool)
    index = np.argsort(-alone[:k], kind="stable")  # largest degree first: each on the first free block of its own
    items, widths = order[index], alone[index]
    for c in np.flatnonzero(np.bincount(widths))[::-1].tolist():  # the degrees alone, largest first
        chosen = items[widths == c]
        free = free_blocks(taken, c, gpus_per_node, spec.allow_inter_node)[:chosen.size]
        if free.size < chosen.size:
            return None
        blocks = free[:, None] + np.arange(c)
        start[chosen], degree[chosen] = free, c
        taken[blocks] = True
        loads[blocks] = times(chosen, c)[:, None]
    wide_time = wide[0]
    groups = [(0.0, s) for s in free_blocks(taken, widest, gpus_per_node, spec.allow_inter_node).tolist()]
    if int(problem.lengths[order[k:]].sum()) > len(groups) * widest * cap:  # some item would find no room
        return None
    rooms = _Rooms([s for _, s in groups], widest, cap, wide)
    chosen, bounds, pending, parked, most, fewest = [], rooms.bounds, rooms.pending, rooms.parked, wide[2], wide[3]
    tail = order.size  # the items from `tail` on hold no tokens: each takes the least-loaded group of all
    if tail > k and most[tail - 1] == 0:  # after the last that holds some (zeros_giants: ~7.4k of ~7.8k, at once)
        holding = np.flatnonzero(wide[1][k:].any(axis=1))
        tail = k + (int(holding[-1]) + 1 if holding.size else 0)
    for j in range(k, tail):
        load, s = groups[0] if groups else (0.0, -1)
        held = bounds.get(s)
        if held is not None and held[1] + most[j] <= cap and not (parked and -parked[0][0] >= fewest[j]):
            heapq.heapreplace(groups, (load + wide_time[j], s))  # `rooms.take`, where its first check settles it
            held[0] += fewest[j]  # `rooms.add`, inline (36 % of this loop as a call)
            held[1] += most[j]
            pending[s].append(j)
        else:
            s = rooms.take(groups, j, wide_time[j])
            if s < 0:
                return None
        chosen.append(s)
    if tail < order.size:  # as `rooms.take` would: every parked group back (none is short of no tokens), no check
        for _, load, s in rooms.parked:
            heapq.heappush(groups, (load, s))
        parked.clear()
        if not groups:
            return None
        for time in wide_time[tail:]:
            load, s = groups[0]
            heapq.heapreplace(groups, (load + time, s))
            chosen.append(s)
    start[order[k:]], degree[order[k:]] = chosen, widest
    for load, s in groups + rooms.parked_groups():
        loads[s: s + widest] = load
    return start, degree, loads


class _Rooms:
    """The groups' tokens in `_deal`: bounds (low, high) on each group's fullest rank (an item adds between its
    shards' fewest and most tokens to it), its ranks' tokens brought up to date only where the bounds leave an
    item's room open (a micro-batch of 22k items of ~2k tokens beside 400 giants at D = 2560, T = 32k: 79k checks
    no bound settled); and the groups parked out of the heap, surely short of the shards of the items so far."""

    def __init__(self, starts: list[int], widest: int, cap: float, wide: tuple):
        _, shards, self.most, self.fewest = wide
        self.shards = np.asarray(shards)  # read only where bounds leave a room open: not made a list
        self.cap = cap
        self.bounds = {s: [0, 0] for s in starts}  # group -> (low, high) bounds on its fullest rank's tokens
        self.ranks = {s: [0] * widest for s in starts}  # group -> its ranks' tokens, without its `pending` items
        self.pending: dict[int, list[int]] = {s: [] for s in starts}
        self.parked: list[tuple[int, float, int]] = []  # heap of (-room of the fullest rank, load, group)

    def take(self, groups: list, j: int, time: float) -> int:
        """Put item j (its `time`) on the least-loaded group of the heap `groups` with room for its shards, and
        return that group (-1: none has room).  The groups parked that may hold it first go back in the heap
        (their load unchanged); those found surely short of its shards are parked."""
        parked, fewest = self.parked, self.fewest[j]
        while parked and -parked[0][0] >= fewest:
            _, load, s = heapq.heappop(parked)
            heapq.heappush(groups, (load, s))
        aside = []
        while groups:
            room = self._room(groups[0][1], j)
            if room:
                break
            entry = heapq.heappop(groups)
            if room is None:  # short of the shards by rank, not surely short of every shard this size
                aside.append(entry)
            else:
                heapq.heappush(parked, (-(self.cap - self.bounds[entry[1]][0]), *entry))
        s = -1
        if groups:
            load, s = groups[0]
            heapq.heapreplace(groups, (load + time, s))
            self.add(s, j)
        for entry in aside:
            heapq.heappush(groups, entry)
        return s

    def _room(self, s: int, j: int) -> bool | None:
        """True where item j's shards fit within `cap` on group s; False where it surely lacks room for any shard
        of item j's fewest tokens (its fullest rank's); None where its ranks decide it otherwise."""
        low, high = self.bounds[s]
        if high + self.most[j] <= self.cap:
            return True
        if low + self.fewest[j] > self.cap:
            return False
        if self.pending[s]:
            held = (np.array(self.ranks[s]) + self.shards[self.pending[s]].sum(axis=0)).tolist()
            self.ranks[s], self.pending[s] = held, []
            self.bounds[s] = [max(held), max(held)]
            return self._room(s, j)
        return True if all(tokens + add <= self.cap for tokens, add in zip(self.ranks[s], self.shards[j].tolist())) \
            else None

    def add(self, s: int, j: int) -> None:
        """Item j joins group s."""
        bounds = self.bounds[s]
        bounds[0] += self.fewest[j]
        bounds[1] += self.most[j]
        self.pending[s].append(j)

    def parked_groups(self) -> list[tuple[float, int]]:
        """The (load, group) of the groups parked."""
        return [(load, s) for _, load, s in self.parked]


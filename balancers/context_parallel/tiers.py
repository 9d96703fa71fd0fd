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
import operator

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
    alone = np.where(times.shards[below][rows].max(axis=1) <= cap, below, widest)  # each item's degree when alone
    shards = times.shards[widest][rows]
    wide_time = times(order, widest)
    wide = (wide_time.tolist(), shards.tolist(), shards.max(axis=1).tolist(), shards.min(axis=1).tolist())
    alone_time = times.table[rows, np.where(alone == below, times.column[below], times.column[widest])]
    best = None
    for k in np.unique(np.linspace(0, order.size, TIER_STEPS + 1).astype(np.int64)).tolist():
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
    LPT over the C-blocks left; None when one finds no block or no token room.  `wide`: the items' (times,
    shards, most and fewest shard tokens) at the widest degree, in `order`.  Blocks are those a group may take
    (`blocks.free_blocks`), so on nodes of odd sizes the ones straddling two nodes are never used.

    A group's ranks all carry its load (every item adds its time to each), so the heap's loads are the
    ranks'; a group's token room is settled by its fullest rank's tokens (kept with every rank's) and the item's
    fewest and most shard tokens where they decide it, else rank by rank."""
    d = problem.num_ranks
    start = np.full(problem.num_items, -1, dtype=np.int64)
    degree = np.ones(problem.num_items, dtype=np.int64)
    loads = np.zeros(d)
    taken = np.zeros(d, dtype=bool)
    index = np.argsort(-alone[:k], kind="stable")  # largest degree first: each on the first free block of its own
    items, widths = order[index], alone[index]
    for c in np.unique(widths)[::-1].tolist():
        chosen = items[widths == c]
        free = free_blocks(taken, c, gpus_per_node, spec.allow_inter_node)[:chosen.size]
        if free.size < chosen.size:
            return None
        blocks = free[:, None] + np.arange(c)
        start[chosen], degree[chosen] = free, c
        taken[blocks] = True
        loads[blocks] = times(chosen, c)[:, None]
    wide_time, shards, most, fewest = wide
    groups = [(0.0, s) for s in free_blocks(taken, widest, gpus_per_node, spec.allow_inter_node).tolist()]
    held = {s: [0, [0] * widest] for _, s in groups}  # group -> its fullest rank's tokens, every rank's
    chosen = []
    for j in range(k, order.size):
        if not groups:
            return None
        load, s = groups[0]
        tokens = held[s]
        if not _room(tokens, shards[j], most[j], fewest[j], cap):  # the least-loaded lacks room
            aside = [heapq.heappop(groups)]  # set aside those short of tokens
            while groups and not _room(held[groups[0][1]], shards[j], most[j], fewest[j], cap):
                aside.append(heapq.heappop(groups))
            if not groups:
                return None
            load, s = groups[0]
            heapq.heapreplace(groups, (load + wide_time[j], s))
            for entry in aside:
                heapq.heappush(groups, entry)
            tokens = held[s]
        else:
            heapq.heapreplace(groups, (load + wide_time[j], s))
        chosen.append(s)
        tokens[1] = list(map(operator.add, tokens[1], shards[j]))
        tokens[0] = max(tokens[1])
    start[order[k:]], degree[order[k:]] = chosen, widest
    for load, s in groups:
        loads[s: s + widest] = load
    return start, degree, loads


def _room(held: list, shard: list, most: int, fewest: int, cap: float) -> bool:
    """Whether an item's shards (`shard`, their `most` and `fewest` tokens) fit within `cap` tokens a rank on the
    group `held` = [its fullest rank's tokens, every rank's].  Kept rank by rank, not summed from the group's items
    at each check: a micro-batch of 22k items of ~2k tokens beside 400 giants at D = 2560 (giants_ties, T = 32k)
    made 79k checks that no bound settled, each over ~32 items, 0.67 s of its 0.89 s plan."""
    if held[0] + most <= cap:
        return True
    if held[0] + fewest > cap:
        return False
    return all(tokens + add <= cap for tokens, add in zip(held[1], shard))

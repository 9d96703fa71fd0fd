"""Two tiers: where the layout's groups overflow the ranks, the longest items alone and the rest dealt by LPT.

When the items to lay out need more blocks than the D ranks hold (giants that pair only two to a group
at their canonical degree), first fit stacks the last ones above the target on groups already full.
Instead: with the widest degree C and items by their time at C, longest first, the first k run alone,
each on a block of the next degree below C where its shards fit the budget (else C), and the others are
dealt by LPT (Graham 1969) over the whole C-blocks left, each to the least-loaded group with token room:

    for k in 0, n / TIER_STEPS, 2 n / TIER_STEPS, ..., n:
        alone blocks, largest degree first, from rank 0 (aligned: every degree divides the larger ones)
        groups = the C-blocks after them;  LPT of the rest over the groups (time at C, shards within T)
        estimate = max(the ranks' peak, the water level of the items not laid out)
    keep the k of the least estimate

A moldable-scheduling heuristic with no guarantee; the layout keeps it only where it beats the ladder.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from ..problem import Problem
from .spec import ContextParallel

TIER_STEPS = 8
"""Numbers k of items alone tried: 0, n / TIER_STEPS, ..., n."""


def two_tiers(problem: Problem, spec: ContextParallel, times, long: np.ndarray, rest_work: float,
              water_level) -> tuple[np.ndarray, np.ndarray, float] | None:
    """(block start and degree of every item, -1 and 1 where not in `long`; the estimate) of the best k
    (see the module), None when no k has token room; `times` the layout's `TimeTable` of `long`,
    `rest_work` the work of the items not laid out, `water_level(loads, work)` the layout's estimate."""
    widest = spec.degrees[-1]
    if widest == 1 or not long.size:
        return None
    cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
    order = long[np.lexsort((long, -times(long, widest)))]
    below = spec.degrees[-2] if len(spec.degrees) > 1 else widest
    fits = np.array([times.shard(item, below)[1] <= cap for item in order.tolist()], dtype=bool)
    alone = np.where(fits, below, widest)  # each item's degree when alone
    best = None
    for k in np.unique(np.linspace(0, order.size, TIER_STEPS + 1).astype(np.int64)).tolist():
        if int(alone[:k].sum()) > problem.num_ranks:
            break
        laid = _deal(problem, times, order, alone, k, widest, cap)
        if laid is None:
            continue
        start, degree, loads = laid
        estimate = max(float(loads.max()), water_level(loads, rest_work))
        if best is None or estimate < best[2]:
            best = (start, degree, estimate)
    return best


def _deal(problem: Problem, times, order: np.ndarray, alone: np.ndarray, k: int, widest: int,
          cap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(starts, degrees, per-rank loads) with the first k of `order` alone at degrees `alone` and the rest by
    LPT over the C-blocks left; None when one finds no token room."""
    d = problem.num_ranks
    start = np.full(problem.num_items, -1, dtype=np.int64)
    degree = np.ones(problem.num_items, dtype=np.int64)
    loads, tokens = np.zeros(d), np.zeros(d, dtype=np.int64)
    position = 0
    for index in np.argsort(-alone[:k], kind="stable").tolist():  # largest degree first: each block aligned
        item, c = int(order[index]), int(alone[index])
        start[item], degree[item] = position, c
        loads[position: position + c] = times.time(item, c)
        tokens[position: position + c] = times.shard(item, c)[0]
        position += c
    groups = [(0.0, s) for s in range(-(-position // widest) * widest, d - widest + 1, widest)]
    for item in order[k:].tolist():
        shard, aside = times.shard(item, widest)[0], []
        while groups and not (tokens[groups[0][1]: groups[0][1] + widest] + shard <= cap).all():
            aside.append(heapq.heappop(groups))
        if not groups:
            return None
        load, s = groups[0]
        time = times.time(item, widest)
        heapq.heapreplace(groups, (load + time, s))
        for entry in aside:
            heapq.heappush(groups, entry)
        start[item], degree[item] = s, widest
        loads[s: s + widest] += time
        tokens[s: s + widest] += shard
    return start, degree, loads

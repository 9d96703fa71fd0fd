"""Degrees that pack: items that would run alone on a block move to the next degree, where two share one.

At a target T an item's canonical degree c is the smallest whose time fits T.  An item whose time
there exceeds T / 2 (or whose shards hold more than half the token budget) runs alone on its block
of c ranks; when those blocks and the blocks the shorter items fill need more ranks than there
are, the layout has to stack items above T.  At the next degree c' = 2c the item takes about half
the time on twice the ranks (work never falls with the degree, and grows little for long items),
so two of them share one block.  Degree by degree from the smallest, the shortest lone items move
up (they waste the most of their block), as few as bring the estimate within the ranks:

    need = Σ_c c · (lone_c + ⌈Σ_{items of c not alone} t_i(c) / T⌉)      ranks the groups take
    for c in the split degrees ascending (but the largest), while need > D:
        move the k shortest lone items of degree c that are short at c' (time <= T / 2, shards
        <= budget / 2), k the least that makes need <= D (else the one that lowers it most)

Where no item splits at the bound, whole items over T / 2 may still outnumber the ranks (`crowded`); then the
shortest of the excess move to degree 2, whose halves may share ranks with whole items (`pigeonhole_degrees`).
"""

from __future__ import annotations

import math

import numpy as np


def _demand(time: np.ndarray, lone: np.ndarray, degree: int, target: float) -> int:
    """Ranks the groups of one degree take: a block per lone item, the others packed by time (at a target of 0,
    every time 0: one block, probe28's empty items under static context parallelism divided by it)."""
    packed = float(time[~lone].sum())
    return degree * (int(lone.sum()) + (math.ceil(packed / target) if target > 0 else int(bool((~lone).any()))))


def packable_degrees(times, lengths: np.ndarray, degree: np.ndarray, target: float, cap: float, num_ranks: int,
                     degrees: tuple[int, ...]) -> np.ndarray:
    """`degree` (the canonical degrees at `target`) with lone items moved up while the groups need
    more than `num_ranks` ranks (see the module); `times(items, c)` their times at degree c.

    >>> table = {2: np.array([6.0, 6.0, 6.0]), 4: np.array([3.2, 3.2, 3.2])}
    >>> times = lambda items, c: table[c][items]
    >>> packable_degrees(times, np.array([10, 10, 10]), np.array([2, 2, 2]), 10.0, math.inf, 4, (1, 2, 4)).tolist()
    [4, 4, 4]
    """
    degree = degree.copy()
    split = [c for c in degrees if c > 1]
    state = {}
    for c in split:
        items = np.flatnonzero(degree == c)
        time = times(items, c)
        lone = (2 * time > target) | (2 * -(-lengths[items] // c) > cap)
        state[c] = (items, time, lone)
    need = sum(_demand(time, lone, c, target) for c, (_, time, lone) in state.items())
    for c, wide in zip(split, split[1:]):
        if need <= num_ranks:
            break
        items, time, lone = state[c]
        movable = items[lone]
        wide_time = times(movable, wide)
        short = (2 * wide_time <= target) & (2 * -(-lengths[movable] // wide) <= cap)
        order = np.flatnonzero(short)[np.argsort(time[lone][short], kind="stable")]
        if not order.size:
            continue
        moved_time = np.concatenate(([0.0], np.cumsum(wide_time[order])))
        _, stay_time, stay_lone = state[wide]
        rest = float(stay_time[~stay_lone].sum())
        count = np.arange(order.size + 1)
        needs = (need - c * count + wide * (np.ceil((rest + moved_time) / target).astype(np.int64)
                                             - math.ceil(rest / target)))
        fit = np.flatnonzero(needs <= num_ranks)
        k = int(fit[0]) if fit.size else int(np.argmin(needs))
        moved = movable[order[:k]]
        degree[moved] = wide
        need = int(needs[k])
        wide_items, wide_all, wide_lone = state[wide]
        state[wide] = (np.concatenate((wide_items, moved)), np.concatenate((wide_all, wide_time[order[:k]])),
                       np.concatenate((wide_lone, np.zeros(k, dtype=bool))))
    return degree


def crowded(costs: np.ndarray, degree: np.ndarray, target: float, num_ranks: int) -> bool:
    """Whether more unsplit items (`degree` 1) cost over `target` / 2 than there are ranks: two of them then share a
    rank above the target (probe22 P22-14: 768 items of ~100k tokens, 0.55 of a rank's mean load, on 512 ranks)."""
    return int(np.count_nonzero((degree == 1) & (2 * costs > target))) > num_ranks


def pigeonhole_degrees(times, lengths: np.ndarray, degree: np.ndarray, long: np.ndarray, target: float, cap: float,
                       num_ranks: int) -> np.ndarray:
    """`degree` with the shortest unsplit items of `long` whose time exceeds `target` / 2 (no two share a rank
    within it) moved to degree 2, as many as exceed the ranks that the lone groups (time over `target` / 2) leave:
    each half then shares a rank with one whole item (those whose time at 2 fits `target` and shards fit `cap`).

    >>> table = {1: np.array([6.0, 6.0, 7.0, 1.0]), 2: np.array([3.1, 3.1, 3.6, 0.6])}
    >>> times = lambda items, c: table[c][items]
    >>> pigeonhole_degrees(times, np.array([10, 10, 12, 2]), np.ones(4, dtype=np.int64), np.arange(4), 10.0,
    ...                    math.inf, 2).tolist()
    [2, 1, 1, 1]
    """
    unsplit = long[degree[long] == 1]
    lone = unsplit[2 * times(unsplit, 1) > target]
    split = long[degree[long] > 1]
    held = sum(c * int(np.count_nonzero(2 * times(split[degree[split] == c], c) > target))
               for c in np.unique(degree[split]).tolist())
    excess = lone.size - (num_ranks - held)
    if excess <= 0:
        return degree
    fits = (times(lone, 2) <= target) & (-(-lengths[lone] // 2) <= cap)
    movable = lone[fits]
    degree = degree.copy()
    degree[movable[np.lexsort((movable, times(movable, 1)))][:excess]] = 2
    return degree

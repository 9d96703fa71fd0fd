"""The fills' grouping of items into micro-batches (`microbatch.split_microbatches`): like times together.

Items by their least time, longest first, fill micro-batch 0, then 1, ..., each within its tokens, the ranks
its items hold alone and its level's work (`group_microbatches`); the last one's items then back-fill the room
under the earlier ones' levels (`_back_fill`).  Moved out of `microbatch.py` (the module length limit).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

BACK_FILL = 0.97
"""Share of D · level of an earlier micro-batch the last one's items may fill (`_back_fill`)."""
TILING_FILL = 0.95
"""The least room (share of D · T, the first fill's) at which giants that tile the D ranks pass it (`_tiling`): at
the lower fills they would take away those fills' other groupings (documents, D 64 x 32, 2 %, T 32k: at every fill,
seed 323 1.0360 -> 1.0383x the bound; at the first only, it stays)."""


@dataclass(frozen=True, eq=False)
class ByTime:
    """The items by their least time (`table`: times at `degrees`, inf where a shard exceeds the budget), longest
    first (ties by index), and what the fills read of them in that order: made once (`by_time`), every fill's
    grouping reads it."""

    degrees: np.ndarray
    times: np.ndarray  # every item's least time
    order: np.ndarray
    table: np.ndarray  # the rows of `order`
    sharing: np.ndarray  # their `share_times`
    tokens: np.ndarray  # running sums of their tokens
    work: np.ndarray  # and of their costs
    budget: int  # T, the tokens a rank holds in a micro-batch
    free: bool  # M free: the grouping may open micro-batches past the count it is given


def by_time(table: np.ndarray, degrees: np.ndarray, costs: np.ndarray, lengths: np.ndarray, budget: int,
            free: bool = False) -> ByTime:
    """The `ByTime` of the items of `lengths` and `costs` within a budget of T tokens per rank (`free`: M free)."""
    times = row_least(table)
    order = np.argsort(-times, kind="stable")  # longest first, ties by index
    sorted_table, sorted_lengths = table[order], lengths[order]
    return ByTime(degrees, times, order, sorted_table, share_times(sorted_table, degrees, sorted_lengths, budget),
                  np.cumsum(sorted_lengths), np.cumsum(costs[order]), budget, free)


def group_microbatches(items: ByTime, num_ranks: int, num_microbatches: int, room: int) -> np.ndarray:
    """Every item's micro-batch: items by their least time (`items`), longest first (ties by index), fill
    micro-batch 0, then 1, ...; micro-batch m takes items while its tokens stay within `room` (at the first fill's
    room: past it for split giants that hold exactly the D ranks alone, `_tiling`), the ranks its items hold alone
    within D (`alone_degrees` at its level) and its work within D · level_m, level_m = max(its first item's time,
    the work left / (D · the micro-batches left)), or beyond that work while the
    later micro-batches could not hold the tokens left; the last takes the rest.  A step costs Σ_m max_r, so
    items of like time share a micro-batch (giants run side by side on their groups) and the rest level out.
    With M free (`items.free`), micro-batches go on past the M-th as the others (⌈rest / room⌉ left) while the
    rest (before the back-fill) is over D · T tokens, which no micro-batch holds: where the ranks the giants hold
    alone bound the others, the last took every item within T (allgiant, D = 512 x 16, seed 41: 113 % of D · T at
    the 90 % fill, so no layout and a failed repair; seeds 5-41: M 43-45 -> 47-49, the step 2-4 % lower and the
    planning 1.3-2.7x faster; on giant mixes at D = 16-64 as many steps lower as higher, by up to 3 %)."""
    times, order, tokens, work = items.times, items.order, items.tokens, items.work
    n = order.size
    microbatch = np.empty(n, dtype=np.int64)
    start, held, m = 0, [], 0  # (level, work, tokens, alone-held ranks) of all but the last
    while m < num_microbatches or (items.free and start < n):
        later = num_microbatches - m - 1
        end = n
        base_tokens, base_work = (int(tokens[start - 1]), float(work[start - 1])) if start else (0, 0.0)
        if items.free and later <= 0 and start < n and int(tokens[-1]) - base_tokens > num_ranks * items.budget:
            later = -(-(int(tokens[-1]) - base_tokens) // room) - 1
        if later > 0 and start < n:
            level = max(float(times[order[start]]), (float(work[-1]) - base_work) / (num_ranks * (later + 1)))
            by_tokens = int(np.searchsorted(tokens, base_tokens + room, side="right"))
            exclusive = _alone_sums(items, level, start, max(by_tokens, start + 1))
            if room >= int(TILING_FILL * num_ranks * items.budget):
                by_tokens, exclusive = _tiling(items, level, start, num_ranks, base_tokens, by_tokens, exclusive)
            by_tokens = min(by_tokens, start + int(np.searchsorted(exclusive, num_ranks, side="right")))
            by_work = int(np.searchsorted(work, base_work + num_ranks * level, side="right"))
            needed = int(np.searchsorted(tokens, int(tokens[-1]) - later * room, side="left")) + 1
            end = max(start + 1, min(by_tokens, max(by_work, needed)))
            held.append((level, float(work[end - 1]) - base_work, int(tokens[end - 1]) - base_tokens,
                         int(exclusive[end - 1 - start])))
        microbatch[order[start:end]] = m
        start, m = min(end, n), m + 1
    _back_fill(microbatch, items, held, num_ranks, room)
    return microbatch


def _tiling(items: ByTime, level: float, start: int, num_ranks: int, base_tokens: int, by_tokens: int,
            exclusive: np.ndarray) -> tuple[int, np.ndarray]:
    """`by_tokens` and the running sums of alone-held ranks (`exclusive`, of the items to it) past the room where the
    items from `start` are split giants that each hold ranks alone at `level` (2 or more) and a run of them holds
    exactly the D ranks within D · T tokens: such giants fill their ranks whatever the fill's room, so they share a
    micro-batch past it (unsplit items stay within the room: tests/test_cp_exact_microbatches.py (a); documents,
    D 64 x 32, 2 %, T 32k, seed 401: the 8 largest hold the 64 ranks with 95.8 % of D · T, over the 95 % room; the 8th
    led micro-batch 1, 1.1095 -> 1.0523x the bound).  Read past the room only where every item within it does so
    and they hold fewer than D."""
    end = start + exclusive.size
    if not 2 * exclusive.size <= exclusive[-1] < num_ranks or end >= items.order.size or \
            np.any(np.diff(exclusive, prepend=0) < 2):  # (each split giant holds 2 ranks at least)
        return by_tokens, exclusive
    held = np.concatenate((exclusive, exclusive[-1] + _alone_sums(items, level, end, start + num_ranks)))
    alone = np.diff(held, prepend=0) > 1
    run = held.size if alone.all() else int(np.argmin(alone))  # the leading split giants that hold ranks alone
    tiled = int(np.searchsorted(held[:run], num_ranks, side="left"))  # the first that fills the D ranks
    if tiled < run and held[tiled] == num_ranks and tiled >= by_tokens - start and \
            items.tokens[start + tiled] - base_tokens <= num_ranks * items.budget:
        return start + tiled + 1, held[:tiled + 1]
    return by_tokens, exclusive


def _alone_sums(items: ByTime, level: float, start: int, end: int) -> np.ndarray:
    """Running sums of the ranks the items at positions start .. end - 1 (by time) hold alone at `level`
    (`alone_degrees`): a micro-batch's and its back-fill's searches read no further than their token room, so
    the items after it are not weighed (allbig, D = 2560 x 32: 82k items at each of ~50-96 micro-batches' levels)."""
    return np.cumsum(alone_degrees(items.table[start:end], items.degrees, items.sharing[start:end], level))


def share_times(table: np.ndarray, degrees: np.ndarray, lengths: np.ndarray, budget: int) -> np.ndarray:
    """Twice each item's least time over the degrees whose shards hold at most T / 2 tokens (nan where none
    does): it may share ranks in a micro-batch of cost `level` exactly where this is <= level (doubling is
    exact, so this is `alone_degrees`' test at any level, made once per planning call)."""
    return 2 * row_least(np.where(2 * -(-lengths[:, None] // degrees[None, :]) <= budget, table, np.nan), np.fmin)


def row_least(table: np.ndarray, least=np.minimum) -> np.ndarray:
    """Each row's least entry: `table.min(axis=1)` (`least=np.fmin`: `np.fmin.reduce(table, axis=1)`, nan only where
    the row is), reduced column by column, a few degrees' columns of many items' rows (minima are exact: the same
    values, 18x faster at 40960 x 4 than along the rows).

    >>> row_least(np.array([[3.0, 1.0], [2.0, np.inf]])).tolist()
    [1.0, 2.0]
    >>> row_least(np.array([[np.nan, 2.0], [np.nan, np.nan]]), np.fmin).tolist()
    [2.0, nan]
    """
    return functools.reduce(least, table.T[1:], table[:, 0].copy())


def alone_degrees(table: np.ndarray, degrees: np.ndarray, sharing: np.ndarray, level: float) -> np.ndarray:
    """Ranks each item holds alone in a micro-batch of cost `level`, from the items' `share_times`: 0 where
    at some degree its time (`table`, one column per degree) is within level / 2 and its shards within T / 2
    tokens (it may share ranks), else the smallest degree c whose time fits the level (no other such piece
    fits beside it on a rank; the largest degree where none fits).

    >>> table, degrees = np.array([[9.0, 5.0], [4.0, 2.0], [3.0, 1.5], [np.inf, 3.0]]), np.array([1, 2])
    >>> alone_degrees(table, degrees, share_times(table, degrees, np.array([30, 20, 10, 40]), 32), 6.0).tolist()
    [2, 0, 0, 2]
    """
    alone = np.flatnonzero(~(sharing <= level))
    fits = table[alone] <= level
    out = np.zeros(table.shape[0], dtype=degrees.dtype)
    out[alone] = degrees[np.where(fits.any(axis=1), np.argmax(fits, axis=1), degrees.size - 1)]
    return out


def _back_fill(microbatch: np.ndarray, items: ByTime, held: list, num_ranks: int, room: int) -> None:
    """Move the last micro-batch's items (longest first) into the room the earlier ones leave under
    BACK_FILL · D · their level, within `room` tokens and D alone-held ranks: a micro-batch costs its
    max, so work below it is free (giants leave such room beside them)."""
    order, tokens, work = items.order, items.tokens, items.work
    first = order.size - int(np.sum(microbatch == len(held)))  # the last micro-batch's first position
    for m, (level, used_work, used_tokens, used_ranks) in enumerate(held):
        if first >= order.size:
            break
        base = (int(tokens[first - 1]), float(work[first - 1])) if first else (0, 0.0)
        by_tokens = int(np.searchsorted(tokens, base[0] + room - used_tokens, side="right"))
        exclusive = _alone_sums(items, level, first, max(by_tokens, first))
        end = max(first, int(min(
            np.searchsorted(work, base[1] + BACK_FILL * num_ranks * level - used_work, side="right"), by_tokens,
            first + np.searchsorted(exclusive, num_ranks - used_ranks, side="right"))))
        microbatch[order[first:end]] = m
        first = end

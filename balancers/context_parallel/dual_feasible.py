"""A certificate that no split plan lays items out within a token budget: a dual feasible function.

Items of lengths l_i, D ranks of T tokens each, degrees C (every item may run at any c in C whose largest
shard ⌈l / c⌉ fits T). A plan puts item i's c_i zigzag shards (`layout.shard_tokens`: l mod c of them hold
⌈l / c⌉ tokens, the others ⌊l / c⌋) on ranks, at most T tokens a rank. For a threshold x in (0, T] let

    f(p) = ⌊p / x⌋                        for a piece of p <= T / 2 tokens
    f(p) = ⌊T / x⌋ − ⌊(T − p) / x⌋        for p > T / 2 (a rank holds at most one: the rest of it <= T − p)

On any rank the pieces' f sum to at most ⌊T / x⌋ (⌊a / x⌋ + ⌊b / x⌋ <= ⌊(a + b) / x⌋), so every plan has

    Σ_i min_{c in C, ⌈l_i / c⌉ <= T} Σ_{shards s of l_i at c} f(s)  <=  D · ⌊T / x⌋,

and where the left side is larger for some x, no plan exists (as plain code:
`sum(min(sum(f(s) for s in shards(l, c)) for c in fitting(l)) for l in lengths) > D * (T // x)`).
An item whose shards at the widest degree hold at most T / 2 tokens takes the least at that degree (its
shards pair up into those of any narrower degree, and f(p) >= ⌊p / x⌋; the pairing needs every degree to
divide the wider ones, which powers of two do (`as_degrees`): with degrees (2, 3), l = 6 and x = 2 take 3
units at c = 3 and 2 at c = 2, and the certificate would be unsound), so only the others, which need a
rank of their own per shard, are minimised over their degrees.  Tried at every x that is a shard size of
the widest degree (>= T / THRESHOLDS_BELOW) and just above T / k, k = 2 .. THRESHOLDS_BELOW.

It is the bin-packing bound of Fekete and Schepers (dual feasible functions, 2001) with shards as the
pieces.  On the long workload (D = 2560, T = 16k) it finds every spill probe of a micro-batch of 320
giants and 215 items of 16-32k tokens without layout that the split planner fails, and no more: there the
planner's first-fit packs to the certificate's limit.
"""

from __future__ import annotations

import numpy as np

THRESHOLDS_BELOW = 16
"""The thresholds tried are at least T / THRESHOLDS_BELOW: pieces below the least add nothing."""


def _pieces(lengths: np.ndarray, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """(sizes, counts) of the zigzag shards of `lengths` at `degree`: l mod c of ⌈l / c⌉ tokens, the others ⌊l / c⌋."""
    small, larger = np.divmod(lengths, degree)
    return np.concatenate((small + 1, small)), np.concatenate((larger, degree - larger))


def _floor_sums(sizes: np.ndarray, counts: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Σ count · ⌊size / x⌋ over the pieces (`sizes` ascending), at every threshold `x` (>= 1, ascending)."""
    at_least = np.empty(sizes.size + 1, dtype=np.int64)  # pieces >= sizes[k]
    at_least[-1] = 0
    np.cumsum(counts[::-1], out=at_least[-2::-1])
    multiples = np.arange(1, (int(sizes[-1]) if sizes.size else 0) // int(x[0]) + 1)  # both ascending
    return at_least[np.searchsorted(sizes, x[:, None] * multiples[None, :])].sum(axis=1)


def cannot_lay_out(lengths: np.ndarray, num_ranks: int, degrees: np.ndarray, budget: int) -> bool:
    """True when no plan puts `lengths` (int64) on `num_ranks` ranks at the ascending `degrees` within `budget`
    tokens a rank (see the module); False says nothing."""
    if int(lengths.sum()) > num_ranks * budget:
        return True
    widest, least = int(degrees[-1]), budget // THRESHOLDS_BELOW + 1
    lengths = lengths[lengths > widest * (least - 1)]  # the others' shards are below every threshold
    if int(lengths.max(initial=0)) > widest * budget:  # an item no degree fits
        return True
    fits, alone = None, None
    if int(lengths.max(initial=0)) > widest * (budget // 2):  # some shard at the widest degree holds over T / 2
        fits = lengths[:, None] <= degrees * budget  # ⌈l / c⌉ <= T
        alone = (-(-lengths // widest) * 2 > budget) & (fits.sum(axis=1) > 1)  # minimised over their degrees
    sizes, counts = _pieces(lengths if alone is None else lengths[~alone], widest)
    keep = np.flatnonzero((counts > 0) & (sizes >= least))
    order = keep[np.argsort(sizes[keep])]  # ascending: the sums' searches and the thresholds read them sorted
    sizes, counts = sizes[order], counts[order]
    small = int(np.searchsorted(sizes, budget // 2, side="right"))  # the rest, over T / 2, at most one on a rank:
    # f = ⌊T / x⌋ − ⌊(T − p) / x⌋
    x = np.concatenate((sizes[:small], budget // np.arange(2, THRESHOLDS_BELOW + 1) + 1))  # all >= least
    x.sort()
    x = x[np.concatenate(([True], x[1:] != x[:-1]))]  # distinct
    units = _floor_sums(sizes[:small], counts[:small], x)
    if small < sizes.size:
        units += int(counts[small:].sum()) * (budget // x) - _floor_sums(budget - sizes[small:][::-1],
                                                                         counts[small:][::-1], x)
    if alone is not None and alone.any():
        units = units + _least_units(lengths[alone], degrees, fits[alone], budget, x)
    return bool((units > num_ranks * (budget // x)).any())


def _least_units(lengths: np.ndarray, degrees: np.ndarray, fits: np.ndarray, budget: int,
                 x: np.ndarray) -> np.ndarray:
    """Σ over the items of the least f-sum of their shards over the degrees they fit (`fits`), at every `x`."""
    best = np.full((lengths.size, x.size), np.inf)
    whole = budget // x
    for k, degree in enumerate(degrees.tolist()):
        small, larger = np.divmod(lengths, degree)
        units = np.zeros(best.shape)
        for size, count in ((small + 1, larger), (small, degree - larger)):
            size = size[:, None]
            units += count[:, None] * np.where(2 * size > budget, whole - (budget - size) // x, size // x)
        best = np.where(fits[:, k, None], np.minimum(best, units), best)
    return best.sum(axis=0)

"""Whether every layout of a micro-batch's items has a rank above a time L: pieces counted as they pack.

The canonical bound (`bound.py`) sees only work: Σ_i c_i · t_i(c_i) <= D · L.  Where every item is long,
a rank holds a few pieces of about one size, and work is not what binds: 203 items of 65k tokens on 512
ranks at T = 32k run at degree 8, four shards of 5.7e15 to a rank, and no layout is below 2.24e16 where
the canonical bound says 1.80e16 (the allbig family, seed 9).  A rank's pieces are its group's shards
(no rank is in two groups, so all of one degree c, the rank's type; type 1 for a rank in no group) and
its unsplit items; each piece has a time t and tokens s, and on every rank Σ t <= L and Σ s <= T.
For each type c take a dual feasible function u_c of one kind (below): on a rank of type c the pieces'
u_c sum to at most 1.  So a layout of peak at most L has, summed over the ranks,

    Σ_i w_i <= D,   w_i = c_i · u_{c_i}(t_i(c_i), ⌊l_i / c_i⌋)   (split items)
                    w_i = min_c u_c(f_i, l_i)                    (unsplit items: any rank's type)

and where even the least w_i over the degrees item i fits (t_i(c) <= L, ⌈l_i / c⌉ <= T) sum above D, no
layout has peak at most L (as plain code: `sum(min(w(i, c) for c in fitting(i, L)) for i in items) > D`).
The kinds of u (each a dual feasible function of Fekete and Schepers, 2001):
- work: t / L (the canonical bound's own);
- time, k pieces: (⌈(k + 1) · t / L⌉ − 1) / k (k pieces each over L / (k + 1) fill a rank; not ⌊(k + 1) · t / L⌋
  / k, which counts two pieces of exactly L / 2 as 2 on a rank of 1: the code floors (k + 1) · t / L a hair low
  (REL), at most this, and never drops that margin: rev17 R17-03);
- tokens, threshold x: ⌊s / x⌋ / ⌊T / x⌋, for a shard over T / 2: (⌊T / x⌋ − ⌊(T − s) / x⌋) / ⌊T / x⌋.
Each type's u is the kind (k from the least and the median piece time, x the least and the median shard)
with the most units over the items that fit its degree.  Times are the best-case (intra-node) t_i(c), as
the canonical bound's, and shards the smaller ⌊l / c⌋: both only lower w.  L is taken a hair high, the
time floors a hair low and D a hair high (REL), so that no float rounding raises the sum past D: the answer
holds for every layout whose ranks' summed times, as floats, are at most L.
"""

from __future__ import annotations

import numpy as np

from .spec import ContextParallel

REL = 1e-9
"""Relative margin on L, the time floors and D (float rounding of a rank's summed times and of Σ w)."""
MAX_PIECES = 2.0 ** 53  # pieces k of a time kind: float64 counts them exactly


def _time_units(times: np.ndarray, level: float, pieces: int) -> np.ndarray:
    """The time kind with `pieces` = k (module docstring), as a share of a rank."""
    return np.floor((pieces + 1) * times / (level * (1 + REL)) * (1 - REL)) / pieces


def _token_units(shards: np.ndarray, budget: int, threshold: int) -> np.ndarray:
    """The token kind at `threshold` = x (module docstring), as a share of a rank."""
    whole = budget // threshold
    return np.where(2 * shards > budget, whole - (budget - shards) // threshold, shards // threshold) / whole


class Pieces:
    """One micro-batch's items at every degree of the spec: best-case times, smaller shards and token fit, found
    once; `exceeds(level)` asks the bound at a time level (see the module)."""

    def __init__(self, lengths: np.ndarray, num_ranks: int, spec: ContextParallel, cost, budget: int,
                 times: np.ndarray | None = None):
        """`times`: the items' times at every degree, where the caller made them (`step_times.StepTimes`)."""
        degrees = np.array(spec.degrees, dtype=np.int64)
        grid = (lengths.size, degrees.size)
        length, degree = np.broadcast_to(lengths[:, None], grid), np.broadcast_to(degrees, grid)
        self.times = spec.item_times(cost, length, degree, np.broadcast_to(degrees <= spec.gpus_per_node, grid)) \
            if times is None else times
        self.shards, self.lengths, self.degrees = length // degree, lengths, degrees
        self.fits = -(-length // degree) <= budget
        self.order = np.argsort(np.where(self.fits, self.times, np.inf), axis=0, kind="stable")  # by time, per degree
        self.counts = self.fits.sum(axis=0)
        self.num_ranks, self.budget = num_ranks, budget

    def _units(self, column: int, level: float):
        """The unit function (shares of a rank) of the degree's rank type at `level`: the kind with the most units
        over the pieces that fit it; None where none fits."""
        fitting = self.order[:int(np.searchsorted(self.times[self.order[:self.counts[column], column], column], level,
                                                  side="right")), column]
        if not fitting.size:
            return None
        times, shards = self.times[fitting, column], self.shards[fitting, column]
        kinds = [lambda t, s: t / (level * (1 + REL))]
        for k in {0, fitting.size // 2}:  # the least and the median piece time (none from a piece of no time)
            if times[k] > 0:  # k at most MAX_PIECES (any k >= 1 gives a valid kind; the quotient may overflow)
                pieces = max(1, int(min(np.ceil(float(level) * (1 + REL) / float(times[k])), MAX_PIECES)) - 1)
                kinds.append(lambda t, s, k=pieces: _time_units(t, level, k))
            if 1 <= shards[k] <= self.budget:
                kinds.append(lambda t, s, x=int(shards[k]): _token_units(s, self.budget, x))
        return max(kinds, key=lambda kind: float(kind(times, shards).sum()))

    def exceeds(self, level: float) -> bool:
        """True where every layout has a rank whose time is above `level` (see the module); False says nothing."""
        split = np.full(self.times.shape, np.inf)
        unsplit = np.full(self.lengths.size, np.inf)
        whole = self.degrees[0] == 1
        fits = self.fits & (self.times <= level)
        for column, width in enumerate(self.degrees.tolist()):
            units = self._units(column, level)
            if units is None:
                continue
            split[:, column] = np.where(fits[:, column], width * units(self.times[:, column], self.shards[:, column]),
                                        np.inf)
            if whole:  # an unsplit item may sit on a rank of this type
                unsplit = np.minimum(unsplit, units(self.times[:, 0], self.lengths))
        if whole:
            split[:, 0] = np.where(fits[:, 0], unsplit, np.inf)
        return bool(split.min(axis=1).sum() > self.num_ranks * (1 + REL))


RAISE_ROUNDS = 3
RAISE_MARGIN = 0.3
"""`raised_floors`: at most this many rounds, each asking for this share more than the sum lacks (allbig, D = 512,
T = 32k: one round of 59-95 micro-batches where a margin of 1e-3 took three)."""


def raised_floors(groups: list, floors: list[float], fixed: float, goal: float, pieces) -> list[float]:
    """`floors` (lower bounds of the `groups`' peaks), raised by one share in each round where the group's
    `pieces(group)` (a `Pieces`, built once) `exceeds` it, the share that would lift Σ floors + `fixed` to `goal`;
    a group once not proven keeps its floor.  Stops once the sum reaches `goal`, or after RAISE_ROUNDS rounds."""
    floors, open_, built = list(floors), list(range(len(groups))), {}
    for _ in range(RAISE_ROUNDS):
        short = goal - fixed - float(np.sum(floors))
        lifted = float(np.sum([floors[k] for k in open_]))
        if short <= 0 or lifted <= 0:
            break
        scale = 1 + short / lifted * (1 + RAISE_MARGIN)
        proven = []
        for k in open_:
            if k not in built:
                built[k] = pieces(groups[k])
            if built[k].exceeds(floors[k] * scale):
                proven.append(k)
        for k in proven:
            floors[k] *= scale
        open_ = proven
    return floors

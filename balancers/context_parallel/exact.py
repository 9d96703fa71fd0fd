"""Exact search for small split plans: depth-first over every item's degrees and aligned blocks.

    best = incumbent
    place(k): for every block (s, c) item k may take (degrees ascending, blocks by start):
        skip it if it clashes (another group on its ranks), overflows the budget, or its peak >= best,
        or if it mirrors a block tried before (below)
        place(k + 1)
    when every item is placed: best = max(loads)

Items are placed in index order, so every rank's load is summed exactly as the plan sums it
and a proven optimum compares with `==`.  A lower bound prunes: max(peak, (Σ loads + the least
work left) / D) >= best, the average lowered by its float error (it is summed in another order).
A node count (not a clock) bounds the search: the answer is proven only when it finishes within it.

Mirrors: swapping the two halves W', W of an aligned block B of 2w ranks maps every aligned block to
one (degrees are powers of two) and, where the 2w ranks lie in one node or w is a multiple of the
node size, keeps every block's time.  So when W' and W hold the same loads, tokens and groups, a
block inside W (the upper half) leads to the mirrors of the leaves of its mirror in W' (tried before
it: same degree, lower start), with the same float peaks.  Tokens do not swap alike: a later
group over B gives its first ranks the larger shards (shard_tokens(9, 2) = [5, 4]), so a plan's
mirror may overflow the cap on B by up to A tokens where the plan fits, A = the later items with
uneven shards on 2w ranks or more (probe27 P27-02: skipping regardless certified 1.83x the optimum).
So every cap rejection records its overflow on the rank with a floor of the peaks below it (per
rank, the pairs since the item's blocks began that no other pair is at or below in both), and the
block is skipped only where every overflow recorded on B with a floor below the best exceeds A; it
then records on each rank of B its mirror's overflow less A.  By induction over the search, every
plan below a node with a peak below the best found overflows some rank by at least an overflow
recorded there with a floor at or below its peak: a skipped plan's mirror does, off B (where their
tokens agree) or on B by more than A (so the plan itself overflows).  A search that finishes
within the budget without the skips finds the same optimum with them, in fewer nodes (probe25
P25-05: 8 items just over half a cell on 8 ranks, 9800 -> 914, the same with the records).
"""

from __future__ import annotations

import math

import numpy as np

from ..problem import Problem
from .layout import shards_of
from .spec import ContextParallel

EXACT_NODES = 20_000
"""Search nodes at most; beyond, the best plan found is returned unproven."""


def block_options(problem: Problem, spec: ContextParallel, gpus_per_node: int) -> list[list[tuple]]:
    """Per item, (start, degree, time, shard tokens) of every aligned block it may run on, degrees ascending,
    blocks by start; each degree's times in one call for every item (element-wise, the same numbers)."""
    cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
    lengths, d = problem.lengths, problem.num_ranks
    options = [[] for _ in range(problem.num_items)]
    for c in spec.degrees:
        if c > d:
            continue
        starts = np.arange(0, d - c + 1, c)
        inside = starts // gpus_per_node == (starts + c - 1) // gpus_per_node
        if c > 1 and not spec.allow_inter_node:
            starts, inside = starts[inside], inside[inside]
        shape = (lengths.size, starts.size)
        times = spec.item_times(problem.cost, np.broadcast_to(lengths[:, None], shape), np.full(shape, c),
                                np.broadcast_to(inside, shape))
        shards = shards_of(lengths, c)
        fits = shards.max(axis=1) <= cap
        starts = starts.tolist()
        for item, shard, row in zip(np.flatnonzero(fits).tolist(), shards[fits].tolist(), times[fits].tolist()):
            shard = tuple(shard)
            options[item] += [(s, c, t, shard) for s, t in zip(starts, row)]
    return options


class _Search:
    def __init__(self, problem: Problem, spec: ContextParallel, gpus_per_node: int, incumbent: float):
        d = problem.num_ranks
        self.cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
        self.options = block_options(problem, spec, gpus_per_node)
        least = [min(c * t for _, c, t, _ in options) if options else math.inf for options in self.options]
        self.rest = np.concatenate((np.cumsum(least[::-1])[::-1], [0.0]))  # least work of items k..n-1
        # the average work, summed in another order than a plan's loads, lowered by its float error: else it rounds
        # above a balanced plan's peak and cuts it (probe28 P28-02: 'optimal' 1 ulp above the optimum)
        self.below = 1.0 - 2.0 * (sum(map(len, self.options)) + d) * 2.0**-52
        self.loads, self.tokens = [0.0] * d, [0] * d
        self.owner = [None] * d  # (start, degree) of the group holding each rank
        self.spreads = _spreads(self.options, d)
        self.spread = None  # spreads[item] of the item whose blocks are being tried
        self.floor = 0.0  # a lower bound on the peak of every plan below the node whose blocks are being tried
        self.window = None  # per rank, (floor, overflow) recorded since that node's blocks began (None: none)
        self.choice = [None] * problem.num_items
        self.best, self.best_choice, self.nodes, self.num_ranks = incumbent, None, 0, d
        self.gpus_per_node = gpus_per_node

    def _mirrored(self, start: int, degree: int) -> bool:
        """Whether block [start, start + degree) lies in the upper half W of an aligned block B whose
        lower half W' holds the same state, the swap keeping every block's time, and every overflow
        recorded on B since its item's blocks began, with a floor below the best, exceeds what the later
        items' shards can shift between the halves (module docstring); if so, B's records are reflected."""
        w, g = degree, self.gpus_per_node
        while 2 * w <= self.num_ranks:
            base = start - start % w
            low = base - w
            if (base % (2 * w) == w and base + w <= self.num_ranks and (low // g == (base + w - 1) // g or w % g == 0)
                    and self._twins(low, w) and self._reflected(low, w)):
                return True
            w *= 2
        return False

    def _reflected(self, low: int, w: int) -> bool:
        """Whether every overflow recorded on ranks [low, low + 2w) below the best exceeds `spread[w]`; if so,
        record on each rank what its mirror's records imply for a skipped plan: an overflow less `spread[w]`."""
        window, spread, best = self.window, self.spread[w], self.best
        if window is None:
            return True
        below = [[(floor, over) for floor, over in window[r] if floor < best] for r in range(low, low + 2 * w)]
        if any(over <= spread for records in below for _, over in records):
            return False
        for i, records in enumerate(below):
            mirror = low + (i + w) % (2 * w)
            for floor, over in records:
                window[mirror] = _added(window[mirror], floor, over - spread)
        return True

    def _twins(self, low: int, w: int) -> bool:
        """Whether ranks [low, low + w) and [low + w, low + 2w) hold the same loads, tokens and groups (a group
        holding both halves, or one group of each shifted by w)."""
        loads, tokens, owner = self.loads, self.tokens, self.owner
        for r in range(low, low + w):
            a, b = owner[r], owner[r + w]
            if loads[r] != loads[r + w] or tokens[r] != tokens[r + w]:
                return False
            if a != b and (a is None or b is None or b != (a[0] + w, a[1])):
                return False
        return True

    def _fits(self, start: int, degree: int, time: float, shard: tuple) -> bool:
        """Whether the block clashes with no group, keeps its ranks below the best and within the cap; a
        block rejected by the cap alone records its overflow on the ranks it overflows (`window`)."""
        if degree == 1:  # no group to clash with
            if self.loads[start] + time >= self.best:
                return False
            over = self.tokens[start] + shard[0] - self.cap
            if over > 0:
                self._record(start, over, self.loads[start] + time)
            return over <= 0
        ranks = range(start, start + degree)
        if any(self.owner[r] not in (None, (start, degree)) for r in ranks):
            return False
        peak = max(self.loads[r] for r in ranks) + time
        if peak >= self.best:
            return False
        fits = True
        for k, r in enumerate(ranks):
            over = self.tokens[r] + shard[k] - self.cap
            if over > 0:
                self._record(r, over, peak)
                fits = False
        return fits

    def _record(self, rank: int, over: int, peak: float) -> None:
        """Record that a block overflowed `rank` by `over` tokens where every plan below it peaks at `peak` or
        above (and at the node's floor)."""
        if self.window is None:
            self.window = [[] for _ in range(self.num_ranks)]
        self.window[rank] = _added(self.window[rank], max(self.floor, peak), over)

    def run(self, item: int, total: float) -> None:
        self.nodes += 1
        if self.nodes > EXACT_NODES:
            return
        if item == len(self.options):
            self.best, self.best_choice = max(self.loads), list(self.choice)
            return
        average = (total + self.rest[item]) / self.num_ranks * self.below
        if average >= self.best:
            return
        outer, self.window = self.window, None
        spread = self.spread = self.spreads[item]
        floor = self.floor = max(max(self.loads), average)
        for start, degree, time, shard in self.options[item]:
            if not self._fits(start, degree, time, shard) or self._mirrored(start, degree):
                continue
            ranks = range(start, start + degree)
            saved = [(self.loads[r], self.tokens[r], self.owner[r]) for r in ranks]  # restored exactly
            for k, r in enumerate(ranks):
                self.loads[r] += time
                self.tokens[r] += shard[k]
                if degree > 1:
                    self.owner[r] = (start, degree)
            self.choice[item] = (start, degree)
            self.run(item + 1, total + degree * time)
            self.spread, self.floor = spread, floor
            for r, (load, tokens, owner) in zip(ranks, saved):
                self.loads[r], self.tokens[r], self.owner[r] = load, tokens, owner
            if self.nodes > EXACT_NODES:
                break
        if outer is not None and self.window is not None:
            for rank, records in enumerate(self.window):
                for floor, over in records:
                    outer[rank] = _added(outer[rank], floor, over)
        self.window = outer if outer is not None else self.window


def _added(records: list, floor: float, over: int) -> list:
    """`records` (pairs (floor, overflow)) with (floor, over) added, keeping only the pairs no other pair is at or
    below in both."""
    if any(f <= floor and x <= over for f, x in records):
        return records
    return [(f, x) for f, x in records if f < floor or x < over] + [(floor, over)]


def _spreads(options: list[list[tuple]], num_ranks: int) -> list[dict]:
    """Per item k and half width w (2w <= D): the items after k with a block of 2w ranks or more whose shards
    differ (by one token at most), so the most tokens a rank of an aligned 2w block can gain over its mirror."""
    widths = [1 << i for i in range(num_ranks.bit_length()) if 2 << i <= num_ranks]
    uneven = [[any(c >= 2 * w and max(shard) > min(shard) for _, c, _, shard in found) for w in widths]
              for found in options]
    spreads, after = [], [0] * len(widths)
    for row in uneven[::-1]:
        spreads.append(dict(zip(widths, after)))
        after = [a + u for a, u in zip(after, row)]
    return spreads[::-1]


def exact_split(problem: Problem, spec: ContextParallel, gpus_per_node: int,
                incumbent: float = math.inf) -> tuple[np.ndarray | None, np.ndarray | None, bool]:
    """(block starts, degrees) of the best plan below `incumbent` (None, None when none is), and
    whether the search finished, proving that no plan does better."""
    search = _Search(problem, spec, gpus_per_node, incumbent)
    search.run(0, 0.0)
    proven = search.nodes <= EXACT_NODES
    if search.best_choice is None:
        return None, None, proven
    choice = np.array(search.best_choice, dtype=np.int64)
    return choice[:, 0], choice[:, 1], proven

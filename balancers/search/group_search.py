"""Local search for few items per rank: pairs and triples of ranks re-solved exactly.

minimise max(loads) where loads[r] = sum(cost[i] for i on r), from a plan:

    while work is left:
        h = heaviest rank
        if some pairs (a, b) have a re-split with max < max(loads[a], loads[b]):
            re-split them, largest gain first, disjoint (h's best pair among them;
            balancing the others makes room for h later); continue
        if some triple (h, r, s), r and s among the lightest, splits with max < loads[h]:
            re-split it; continue
        stop

A pair is solved over every subset of its union at once: with X ⊆ items(a) leaving a and
Y ⊆ items(b) arriving, a's load becomes L_a - d with d = sum(X) - sum(Y), so for every
(b, Y) the best X has sum(X) nearest to sum(Y) + (L_a - L_b) / 2: one vectorised binary
search of every (a, b, Y) in a's sorted subset sums (one flat table of every rank's subsets)
gives every pair's best re-split; a pair keeps its re-split until a move touches one of its
ranks.  A triple is an exact dynamic programme over the subsets of its pool (O(3^size)).
Every accepted change lowers the larger load of its group without lifting another rank to it,
so the loads sorted descending fall lexicographically: the search ends, and the makespan
never grows.  A work count (not a clock) bounds it, so the plan is bit-identical on every
machine; every part (table rebuilds, lookups, each step's numpy calls, each applied move,
each triple) is charged its cost as measured in the search, so that work tracks CPU time at
every size.  Memory caps are respected.

After Schwerdfeger & Walter (2016, 2018), who balance workloads by re-solving machine
pairs and triples as subset-sum problems; our own code, aimed at the makespan.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import numpy as np

from ..problem import Problem, rank_loads
from . import Improved

DEFAULT_WORK = 200_000
WORK_PER_ITEM = 250
"""Default work budget: DEFAULT_WORK plus this per item (the `auto` kernel shares it among its
starts).  Every part of the search is charged its measured cost, so the budget buys about the
same CPU time at every size (hard families, one pass at load 3.4: at most 31 ms per call, starts
included, where 500 000 took 58 ms); there it reaches the 110 of 137 proven optima that 500 000
reached (150 000 reaches 109)."""


def default_work(num_items: int) -> int:
    """The search's default `work_limit` for `num_items` items.

    >>> default_work(1000)
    450000
    """
    return DEFAULT_WORK + WORK_PER_ITEM * num_items

MAX_SUBSET_ITEMS = 12
"""A rank's subsets are all enumerated up to this many items (4096 sums); ranks holding
more offer only their subsets of the first `MAX_SUBSET_ITEMS` items by cost."""

MAX_TRIPLE_POOL = 10
"""Triples are re-solved only when they hold at most this many items (3^10 table entries)."""

TRIPLE_PARTNERS = 6
"""Triples join the heaviest rank with two of this many lightest ranks (6: 15 triples; on the
hard families 6 prove one held-out optimum more than 4 and keep the others, now that every part
is charged its cost)."""

MAX_QUERIES = 1 << 14
"""Subset sums one all-pairs evaluation may look up (it takes the heaviest ranks first), so
one evaluation costs a few ms even from a start whose light ranks hold many small items."""

_STEP_WORK = 3000
"""Work charged per pair step's fixed overhead (the subset table, choosing and solving the
pairs: ~100 numpy calls), where one unit of work is ~50 ns of CPU on the 2-core VM (~100 ns
under a load of 5).  Every part is charged its cost as measured in the search itself (a
least-squares fit over the hard families), so that the budget bounds time at every size."""

_MOVE_WORK = 800
"""Work of applying one pair's re-split: its Python bookkeeping and the pairs it voids (re-solved in
the next step), fitted as one cost."""

_TRIPLE_WORK = 1900
"""Work charged per triple dynamic programme's fixed overhead, plus a quarter unit per
table entry (3^pool)."""


def subset_sums(values: np.ndarray) -> np.ndarray:
    """sums[mask] = sum of values[b] for the bits b set in mask.

    >>> subset_sums(np.array([1, 2, 4])).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7]
    """
    sums = np.zeros(1 << values.size, dtype=values.dtype)
    for bit, value in enumerate(values.tolist()):
        sums[1 << bit: 2 << bit] = sums[: 1 << bit] + value
    return sums


@functools.lru_cache(maxsize=16)
def _split_table(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (U, S) with S ⊆ U ⊆ {0..size-1}, grouped by U, and where each U's group starts."""
    digits = np.arange(3 ** size)
    union = np.zeros(digits.size, dtype=np.int64)
    part = np.zeros(digits.size, dtype=np.int64)
    for bit in range(size):
        digit = (digits // 3 ** bit) % 3
        union |= (digit > 0).astype(np.int64) << bit
        part |= (digit == 1).astype(np.int64) << bit
    order = np.lexsort((part, union))
    union, part = union[order], part[order]
    starts = np.searchsorted(union, np.arange(1 << size))
    return union, part, starts


def exact_split(costs: np.ndarray, tokens: np.ndarray, cap: int | None, ways: int):
    """Exact split of a pool of items over `ways` ranks: (makespan, rank label per item).

    Dynamic programme over subsets: best[k][U] = min over S ⊆ U of
    max(sum(S), best[k-1][U \\ S]), O(3^size) per level; makespan inf when no split fits `cap`.

    >>> exact_split(np.array([3.0, 3, 2, 2, 2]), np.array([3, 3, 2, 2, 2]), None, 2)
    (6.0, array([0, 0, 1, 1, 1]))
    """
    size = costs.size
    sums = subset_sums(costs)
    union, part, starts = _split_table(size)
    one = sums if cap is None else np.where(subset_sums(tokens) <= cap, sums, np.inf)
    levels, choices = [one], []
    for _ in range(ways - 1):
        value = np.maximum(one[part], levels[-1][union ^ part])
        best = np.minimum.reduceat(value, starts)
        is_best = value == best[union]
        first = np.flatnonzero(is_best)
        keep = np.ones(first.size, dtype=bool)
        keep[1:] = union[first[1:]] != union[first[:-1]]
        choice = np.zeros(1 << size, dtype=np.int64)
        choice[union[first[keep]]] = part[first[keep]]
        levels.append(best)
        choices.append(choice)
    labels = np.empty(size, dtype=np.int64)
    bits = 1 << np.arange(size)
    rest = (1 << size) - 1
    makespan = float(levels[-1][rest])
    for label, choice in enumerate(reversed(choices)):
        taken = int(choice[rest])
        labels[(taken & bits) > 0] = label
        rest ^= taken
    labels[(rest & bits) > 0] = ways - 1
    return makespan, labels


class _Table(NamedTuple):
    """Every rank's subsets, flat: rank r's entries are start[r] .. start[r] + size[r] - 1, sums
    ascending (ties by mask); bit b of a mask is items[item_start[r] + b] (its first
    `MAX_SUBSET_ITEMS` items by cost, ascending index)."""

    start: np.ndarray
    size: np.ndarray
    sums: np.ndarray
    tokens: np.ndarray | None  # None without a memory cap
    masks: np.ndarray
    items: np.ndarray
    item_start: np.ndarray


class _Ranks:
    """Items per rank (ascending index), loads and tokens; the subset table and each pair's
    best re-split, cached until a move touches them."""

    def __init__(self, problem: Problem, assignment: np.ndarray):
        self.problem = problem
        self.costs, self.lengths = problem.item_costs, problem.lengths
        self.cost_list, self.length_list = self.costs.tolist(), self.lengths.tolist()
        self.assignment = np.asarray(assignment, dtype=np.int64).copy()
        num_ranks = problem.num_ranks
        self.members = [[] for _ in range(num_ranks)]
        for item, rank in enumerate(self.assignment.tolist()):
            self.members[rank].append(item)
        self.loads = rank_loads(problem, self.assignment)
        self.tokens = np.bincount(self.assignment, weights=self.lengths,
                                  minlength=num_ranks).astype(np.int64)
        self._table: _Table | None = None
        self.pair_known = np.zeros((num_ranks, num_ranks), dtype=bool)
        self.pair_value = np.full((num_ranks, num_ranks), np.inf)
        self.pair_x = np.zeros((num_ranks, num_ranks), dtype=np.int64)
        self.pair_y = np.zeros((num_ranks, num_ranks), dtype=np.int64)

    def table(self) -> tuple[_Table, int]:
        """The subset table of the current plan (rebuilt, all ranks at once, after a move)
        and the work that cost."""
        if self._table is not None:
            return self._table, 0
        assignment, num_ranks = self.assignment, self.loads.size
        counts = np.bincount(assignment, minlength=num_ranks)
        kept = np.argsort(assignment, kind="stable")  # by rank, ascending index
        if counts.max() > MAX_SUBSET_ITEMS:
            order = np.lexsort((np.arange(assignment.size), -self.costs, assignment))  # by rank, largest first
            first = np.concatenate(([0], np.cumsum(counts)[:-1]))
            kept = order[np.arange(order.size) - first[assignment[order]] < MAX_SUBSET_ITEMS]
            kept = kept[np.lexsort((kept, assignment[kept]))]
        held = np.minimum(counts, MAX_SUBSET_ITEMS)
        item_start = np.concatenate(([0], np.cumsum(held)[:-1]))
        size = 1 << held
        start = np.concatenate(([0], np.cumsum(size)[:-1]))
        owner = np.repeat(np.arange(num_ranks), size)
        masks = np.arange(owner.size) - start[owner]
        sums = np.zeros(owner.size, dtype=self.costs.dtype)
        with_tokens = self.problem.max_tokens_per_rank is not None  # token sums matter only under a cap
        tokens = np.zeros(owner.size, dtype=np.int64) if with_tokens else None
        base = item_start[owner]
        for bit in range(int(held.max())):  # bits in ascending order: the sums of `subset_sums`
            has = np.flatnonzero((masks >> bit) & 1)
            item = kept[base[has] + bit]
            sums[has] += self.costs[item]
            if with_tokens:
                tokens[has] += self.lengths[item]
        order = np.lexsort((sums, owner))
        self._table = _Table(start, size, sums[order], tokens[order] if with_tokens else None, masks[order],
                             kept, item_start)
        return self._table, int(held.max()) * owner.size

    def move(self, ranks, items: list, targets: list) -> None:
        """Give items[k] to targets[k]; every changed rank is in `ranks` (their caches go stale)."""
        self.assignment[items] = targets
        moved = dict(zip(items, targets))
        for rank in ranks:
            kept = [item for item in self.members[rank] if item not in moved]
            members = sorted(kept + [item for item, target in moved.items() if target == rank])
            self.members[rank] = members
            self.loads[rank] = math.fsum([self.cost_list[item] for item in members])
            self.tokens[rank] = sum([self.length_list[item] for item in members])
            self.pair_known[rank] = False
            self.pair_known[:, rank] = False
        self._table = None


def _lower_bound(values: np.ndarray, first: np.ndarray, length: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Per query k, the first index i in first[k] .. first[k] + length[k] - 1 with
    values[i] >= queries[k] (first[k] + length[k] if none), each segment ascending.

    A branch-free binary search, all queries at once (log2(max length) vector steps): numpy's
    searchsorted mispredicts a branch per level on unsorted queries, several times slower here.

    >>> _lower_bound(np.array([1, 3, 5, 0, 9]), np.array([0, 0, 3]), np.array([3, 3, 2]), np.array([4, 9, 1]))
    array([2, 3, 4])
    """
    base, length = first.copy(), length.copy()
    for _ in range(int(length.max() - 1).bit_length()):  # ceil(log2(max length)) halvings
        half = length >> 1
        base = np.where(values[base + half] < queries, base + half, base)
        length -= half
    return base + (values[base] < queries)


def _pair_moves(state: _Ranks, table: _Table, heavy: np.ndarray, max_queries: int):
    """The best exact re-split of every pair (a, b), a in `heavy` and L_b < L_a.

    Returns (a, b, value, X mask, Y mask) per pair (value: the pair's new maximum) and
    the work spent; pairs no move touched since they were solved come from the cache.
    `heavy` is cut to as many first ranks as surely fit `max_queries`.
    """
    loads = state.loads
    heavy = heavy[: max(1, max_queries // int(table.size.sum()))]  # each looks up at most every subset
    wanted = np.zeros(state.pair_known.shape, dtype=bool)
    wanted[heavy] = loads[None, :] < loads[heavy][:, None]
    pair_a, pair_b = np.nonzero(wanted)
    if pair_a.size == 0:
        return None, 0
    new_a, new_b = np.nonzero(wanted & ~state.pair_known)
    work = 0
    if new_a.size:
        work += _solve_pairs(state, table, new_a, new_b)
    return (pair_a, pair_b, state.pair_value[pair_a, pair_b], state.pair_x[pair_a, pair_b],
            state.pair_y[pair_a, pair_b]), work


def _solve_pairs(state: _Ranks, table: _Table, pair_a: np.ndarray, pair_b: np.ndarray) -> int:
    """Solve the pairs (a, b) exactly into the cache; returns the work spent.

    For every (pair, Y ⊆ items(b)) the best X ⊆ items(a) has sum nearest to
    sum(Y) + (L_a - L_b) / 2: one binary search of all of them in a's sorted sums.
    """
    loads, sums = state.loads, table.sums
    counts = table.size[pair_b]
    offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
    owner = np.repeat(np.arange(pair_a.size), counts)
    y = np.repeat(table.start[pair_b] - offsets, counts) + np.arange(owner.size)
    a, b = pair_a[owner], pair_b[owner]
    high, low = loads[a], loads[b]
    first, length = table.start[a], table.size[a]
    steps = int(table.size.max()).bit_length()
    above = _lower_bound(sums, first, length, sums[y] + (high - low) / 2)
    cap = state.problem.max_tokens_per_rank
    picks, values = (np.maximum(above - 1, first), np.minimum(above, first + length - 1)), []
    for pick in picks:  # the sums on either side of the ideal
        delta = sums[pick] - sums[y]
        value = np.maximum(high - delta, low + delta)
        if cap is not None:
            moved = table.tokens[pick] - table.tokens[y]
            value[(state.tokens[a] - moved > cap) | (state.tokens[b] + moved > cap)] = np.inf
        values.append(value)
    above_wins = values[1] < values[0]
    best = np.where(above_wins, values[1], values[0])
    best_x = np.where(above_wins, picks[1], picks[0])
    pair_best = np.minimum.reduceat(best, offsets)
    hit = np.flatnonzero(best == pair_best[owner])
    chosen = hit[np.searchsorted(owner[hit], np.arange(pair_a.size))]  # first candidate reaching it
    state.pair_value[pair_a, pair_b] = pair_best
    state.pair_x[pair_a, pair_b] = table.masks[best_x[chosen]]
    state.pair_y[pair_a, pair_b] = table.masks[y[chosen]]
    state.pair_known[pair_a, pair_b] = True
    return owner.size * steps // 8


def _apply_pair(state: _Ranks, table: _Table, a: int, b: int, x_mask: int, y_mask: int) -> None:
    """Move X (bits of x_mask) from a to b and Y (bits of y_mask) from b to a; the table is
    the one the masks were read from (a's and b's rows still current)."""
    x_items = table.items[table.item_start[a]: table.item_start[a] + x_mask.bit_length()].tolist()
    y_items = table.items[table.item_start[b]: table.item_start[b] + y_mask.bit_length()].tolist()
    out = [item for bit, item in enumerate(x_items) if x_mask >> bit & 1]
    back = [item for bit, item in enumerate(y_items) if y_mask >> bit & 1]
    state.move((a, b), out + back, [b] * len(out) + [a] * len(back))


def _improve_pairs(state: _Ranks, heavy: np.ndarray, max_queries: int):
    """Re-split the improving pairs with a rank in `heavy`, largest gain first, disjoint;
    returns how many and the work spent."""
    table, work = state.table()
    moves, spent = _pair_moves(state, table, heavy, max_queries)
    work += _STEP_WORK + spent
    if moves is None:
        return 0, work
    pair_a, pair_b, value, x_masks, y_masks = moves
    gain = state.loads[pair_a] - value
    order = np.lexsort((pair_b, pair_a, -gain))
    order = order[gain[order] > 0]
    used, applied = set(), []
    for a, b, x_mask, y_mask in zip(pair_a[order].tolist(), pair_b[order].tolist(),
                                    x_masks[order].tolist(), y_masks[order].tolist()):
        if a not in used and b not in used:
            used.update((a, b))
            applied.append((a, b, x_mask, y_mask))
    for move in applied:
        _apply_pair(state, table, *move)
    return len(applied), work + _MOVE_WORK * len(applied)


def _improve_triple(state: _Ranks, heaviest: int, work_limit: int):
    """The first triple (heaviest, r, s), r and s among the lightest, whose exact split
    lowers the heaviest load, trying triples while the work spent is under `work_limit`;
    returns whether one was applied and the work spent."""
    loads, work = state.loads, 0
    lighter = np.flatnonzero(loads < loads[heaviest])
    partners = lighter[np.argsort(loads[lighter], kind="stable")[:TRIPLE_PARTNERS]]
    for r, s in itertools.combinations(partners.tolist(), 2):
        ranks = (heaviest, r, s)
        pool = state.members[heaviest] + state.members[r] + state.members[s]
        if len(pool) > MAX_TRIPLE_POOL:
            continue
        if work >= work_limit:
            break
        work += _TRIPLE_WORK + 3 ** len(pool) // 4
        value, labels = exact_split(state.costs[pool], state.lengths[pool],
                                    state.problem.max_tokens_per_rank, 3)
        if value < loads[heaviest]:
            state.move(ranks, pool, [ranks[label] for label in labels.tolist()])
            return True, work
    return False, work


def _descend(state: _Ranks, work_limit: int, target: float) -> int:
    """Pair and triple descent until a local optimum, `target` or `work_limit`; the work spent."""
    work = 0
    while work < work_limit:
        work += state.loads.size  # ordering the ranks
        order = np.argsort(-state.loads, kind="stable")
        heaviest = int(order[0])
        if state.loads[heaviest] <= target:
            break
        done, spent = _improve_pairs(state, order, MAX_QUERIES)
        work += spent
        if done:
            continue
        done, spent = _improve_triple(state, heaviest, work_limit - work)
        work += spent
        if not done:
            break
    return work


def improve(problem: Problem, assignment: np.ndarray, work_limit: int | None = None,
            target: float = -math.inf) -> Improved:
    """Pair and triple descent from `assignment` (the improvers' signature: `balancers.search`).

    Stops at `target`, at a local optimum of both neighbourhoods, or when `work_limit`
    subset sums have been examined (`default_work(n)` when None).
    """
    if problem.padded:
        raise ValueError("group_search.improve handles the unpadded cost only")
    work_limit = default_work(problem.num_items) if work_limit is None else work_limit
    state = _Ranks(problem, assignment)
    work = _descend(state, work_limit, target)
    if rank_loads(problem, state.assignment).max() > rank_loads(problem, np.asarray(assignment)).max():
        return Improved(np.asarray(assignment, dtype=np.int64), work)  # float rounding only: never worse
    return Improved(state.assignment, work)

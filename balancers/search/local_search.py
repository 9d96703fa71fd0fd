"""Local search for the unpadded makespan: pairwise balancing, exchanges, exact small re-splits.

minimise max(loads) where loads[r] = sum(cost[i] for i on r), starting from a plan:

    while some pair (i-th heaviest, i-th lightest) gains:       # all pairs at once, numpy
        in each pair, the best move or swap that lowers the pair's max
    while True:                                                  # exchange descent
        h = argmax(loads); M = loads[h]
        best = min over ranks r, X ⊆ items[h], Y ⊆ items[r], 1 <= |X| <= 2, |Y| <= 2, of
               max(M - cost(X) + cost(Y), loads[r] + cost(X) - cost(Y))
        if best < M: move X to r and Y to h; continue
        re-split h with 2 (then 3) light ranks exactly if their items are few; else stop

The pair rounds are the cheap, parallel part: one searchsorted over all pairs finds,
for every item x on a heavy rank, the partner whose cost is closest to
cost(x) - (L_heavy - L_light) / 2.  The descent step is vectorised the same way: the
sums of X are sorted once, and each candidate (r, Y) looks up its ideal
cost(X) = cost(Y) + (M - loads[r]) / 2.  Re-splits are exact: a dynamic programme over
subsets of the pooled items, O(3^size), for pools of <= 10 items (the few-items-per-rank
regime where greedy plans are weakest).  Every accepted change lowers a rank that was at
the maximum (or, in a pair round, the pair's maximum) without raising another to it,
so the makespan never grows and the search ends; a work count (not a clock) bounds it,
so the plan is bit-identical on every machine.  Memory caps are respected throughout.
Sources: pairwise interchange (Finn & Horowitz 1979) and k-exchange neighbourhoods
(Frangioni, Necciari & Scutellà 2004); no guarantee beyond never returning a plan worse
than the start.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..problem import Problem, rank_loads
from . import Improved
from .group_search import exact_split


DEFAULT_WORK = 500_000
"""Least default `work_limit`, in units of about 20 ns of numpy work on this code's paths."""

WORK_PER_ITEM = 12
"""Default `work_limit` per item above that (a pair round costs `_PAIR_WORK` per item)."""

_STEP_WORK = 5_000
"""Work charged for one step's or one exact split's fixed overhead (about 100 µs)."""

_PAIR_WORK = 10
"""Work per item in one round of pairwise balancing (a few sorts and gathers)."""

_CANDIDATE_WORK = 8
"""Work per (rank, Y) exchange candidate examined (about 20 vector operations)."""

MAX_PAIRS_PER_RANK = 8192
"""Pairs of one rank's items an exchange step considers.  Up to 128 items per rank that is
all of them; above, only pairs of items close in the rank's index order (a deterministic
sample, about this many), so one step costs O(items per rank), not its square."""


def _pair_offsets(items_per_rank: int) -> int:
    """How far apart (in a rank's index order) the two items of a pair may lie: every pair
    while a rank holds at most `MAX_PAIRS_PER_RANK` of them, else a window of about that many."""
    if items_per_rank * (items_per_rank - 1) // 2 <= MAX_PAIRS_PER_RANK:
        return max(items_per_rank - 1, 0)
    return max(1, MAX_PAIRS_PER_RANK // items_per_rank)


def _subsets_upto_two(items: np.ndarray, ranks: np.ndarray, include_empty_per_rank: np.ndarray | None,
                      max_offset: int):
    """(rank, first, second) for the single items and same-rank pairs at most `max_offset`
    apart in `items`; -1 marks none.

    `items` must be grouped by rank (equal ranks adjacent).
    """
    size = items.size
    offsets = np.arange(1, min(size, max_offset + 1))
    later = np.arange(size) + offsets[:, None]  # (offset, position): the pair's second position
    # by offset, then position, as a loop over the offsets finds them; one numpy pass, not one per offset
    offset_row, first = np.nonzero((later < size) & (ranks[np.minimum(later, size - 1)] == ranks))
    second = first + offsets[offset_row]
    firsts = [items, items[first]]
    seconds = [np.full(size, -1, dtype=np.int64), items[second]]
    owners = [ranks, ranks[first]]
    if include_empty_per_rank is not None:
        firsts.append(np.full(include_empty_per_rank.size, -1, dtype=np.int64))
        seconds.append(np.full(include_empty_per_rank.size, -1, dtype=np.int64))
        owners.append(include_empty_per_rank)
    return np.concatenate(owners), np.concatenate(firsts), np.concatenate(seconds)


class _State:
    """Assignment with per-rank item lists, loads and tokens, kept exact under exchanges."""

    def __init__(self, problem: Problem, assignment: np.ndarray):
        self.problem = problem
        self.costs = problem.item_costs
        self.costs_ext = np.append(problem.item_costs, 0.0)  # index -1: no item
        self.lengths_ext = np.append(problem.lengths, 0)
        self.assignment = assignment.astype(np.int64, copy=True)
        self.loads = rank_loads(problem, self.assignment)
        self.tokens = np.bincount(self.assignment, weights=problem.lengths,
                                  minlength=problem.num_ranks).astype(np.int64)
        n = problem.num_items
        if problem.num_ranks <= 2**16:  # items by (rank, index): a radix sort of 16-bit ranks
            self._order = np.argsort(self.assignment.astype(np.uint16), kind="stable")
        else:
            self._order = np.sort(self.assignment * n + np.arange(n)) % n
        self._starts = np.concatenate(([0], np.cumsum(np.bincount(self.assignment, minlength=problem.num_ranks))))
        self._changed: dict[int, np.ndarray] = {}

    def items(self, rank: int) -> np.ndarray:
        """Indices of the items on `rank`, ascending."""
        changed = self._changed.get(rank)
        if changed is not None:
            return changed
        return self._order[self._starts[rank]: self._starts[rank + 1]]

    def exchange(self, heaviest: int, rank: int, moved_out, moved_in) -> None:
        """Move items `moved_out` from `heaviest` to `rank` and `moved_in` back (-1: none)."""
        out = np.array([item for item in moved_out if item >= 0], dtype=np.int64)
        back = np.array([item for item in moved_in if item >= 0], dtype=np.int64)
        self.assignment[out] = rank
        self.assignment[back] = heaviest
        own, other = self.items(heaviest), self.items(rank)  # ascending, holding `out` and `back`
        self._changed[heaviest] = np.sort(np.concatenate((np.delete(own, np.searchsorted(own, out)), back)))
        self._changed[rank] = np.sort(np.concatenate((np.delete(other, np.searchsorted(other, back)), out)))
        self._refresh((heaviest, rank))

    def reassign(self, ranks, pool: np.ndarray, labels: np.ndarray) -> None:
        """Give pool item k to ranks[labels[k]]."""
        targets = np.asarray(ranks, dtype=np.int64)[labels]
        self.assignment[pool] = targets
        for k, rank in enumerate(ranks):
            self._changed[rank] = np.sort(pool[labels == k])
        self._refresh(ranks)

    def _refresh(self, ranks) -> None:
        for r in ranks:
            self.loads[r] = math.fsum(self.costs[self.items(r)].tolist())
            self.tokens[r] = int(self.problem.lengths[self.items(r)].sum())


def _best_exchange(state: _State, heaviest: int, partners: np.ndarray):
    """The best (value, rank, X, Y) exchange between `heaviest` and `partners` (or None), and the work spent."""
    problem, loads = state.problem, state.loads
    top = loads[heaviest]
    own = state.items(heaviest)
    if own.size == 0:
        return None, _STEP_WORK
    _, x_first, x_second = _subsets_upto_two(own, np.zeros(own.size, dtype=np.int64), None,
                                             _pair_offsets(own.size))
    x_sum = state.costs_ext[x_first] + state.costs_ext[x_second]
    x_tokens = state.lengths_ext[x_first] + state.lengths_ext[x_second]
    order = np.argsort(x_sum, kind="stable")
    x_sum, x_tokens, x_first, x_second = x_sum[order], x_tokens[order], x_first[order], x_second[order]

    groups = [state.items(r) for r in partners.tolist()]
    sizes = [group.size for group in groups]
    y_rank, y_first, y_second = _subsets_upto_two(np.concatenate(groups), np.repeat(partners, sizes), partners,
                                                  _pair_offsets(max(sizes)))
    y_sum = state.costs_ext[y_first] + state.costs_ext[y_second]
    y_tokens = state.lengths_ext[y_first] + state.lengths_ext[y_second]

    target = y_sum + (top - loads[y_rank]) / 2
    above = np.searchsorted(x_sum, target)
    best_value, best = top, None
    for pick in (np.minimum(above, x_sum.size - 1), np.maximum(above - 1, 0)):
        delta = x_sum[pick] - y_sum
        value = np.maximum(top - delta, loads[y_rank] + delta)
        cap = problem.max_tokens_per_rank
        if cap is not None:
            moved = x_tokens[pick] - y_tokens
            fits = (state.tokens[heaviest] - moved <= cap) & (state.tokens[y_rank] + moved <= cap)
            value = np.where(fits, value, np.inf)
        index = int(np.argmin(value))
        if value[index] < best_value:
            best_value = float(value[index])
            best = (int(y_rank[index]), (int(x_first[pick[index]]), int(x_second[pick[index]])),
                    (int(y_first[index]), int(y_second[index])))
    work = _STEP_WORK + _CANDIDATE_WORK * (x_sum.size + y_sum.size)
    return (None if best is None else (best_value, *best)), work


def _best_group(state: _State, heaviest: int, partners: np.ndarray, ways: int, max_pool: int):
    """The first exact re-split of `heaviest` with `ways - 1` of `partners` that lightens it.

    Returns (value, ranks, items, labels) or None, and the work spent (table entries).
    """
    top = state.loads[heaviest]
    work = 0
    for others in itertools.combinations(partners.tolist(), ways - 1):
        ranks = (heaviest, *others)
        pool = np.concatenate([state.items(r) for r in ranks])
        if pool.size > max_pool:
            continue
        work += _STEP_WORK + (ways - 1) * 3 ** pool.size
        value, labels = exact_split(state.costs[pool], state.problem.lengths[pool],
                                    state.problem.max_tokens_per_rank, ways)
        if value < top:
            return (value, ranks, pool, labels), work
    return None, work


def _stable_order(keys: np.ndarray, top: float) -> np.ndarray:
    """argsort(keys, kind="stable") for keys in [0, top], by faster sorts of unique int64 keys: integer
    keys with their index; others by an unstable argsort, then each run of equal keys by index
    (numpy's stable sort, a timsort, takes ~2.5x as long on ~40 000 unsorted floats)."""
    size = keys.size
    if size and (top + 1) * size < 2.0**62 and np.all(keys == np.floor(keys)):
        return np.sort(keys.astype(np.int64) * size + np.arange(size)) % size
    order = np.argsort(keys)
    ordered = keys[order]
    tied = ordered[1:] == ordered[:-1]
    if not tied.any():
        return order
    run = np.concatenate(([0], np.cumsum(~tied)))  # each run of equal keys, numbered in order
    at = np.flatnonzero(np.concatenate((tied, [False])) | np.concatenate(([False], tied)))  # in a run of 2+
    order[at] = np.sort(run[at] * size + order[at]) % size
    return order


def _pair_round(problem: Problem, assignment: np.ndarray) -> int:
    """Pair the i-th heaviest rank with the i-th lightest; in every pair at once, make the
    best move or swap that lowers the pair's maximum.  Returns how many pairs changed.

    For an item x on the heavy rank the best partner y on the light one (or none) has
    cost closest to cost(x) - (L_heavy - L_light) / 2: one searchsorted over all pairs'
    items, keyed pair · span + cost.  Every change strictly lowers the sum of squared
    loads, so repeated rounds end.
    """
    costs, lengths, num_ranks = problem.item_costs, problem.lengths, problem.num_ranks
    count = num_ranks // 2
    loads = np.bincount(assignment, weights=costs, minlength=num_ranks)
    order = np.argsort(loads, kind="stable")
    light, heavy = order[:count], order[::-1][:count]
    pair = np.full(num_ranks, -1, dtype=np.int64)
    pair[light] = pair[heavy] = np.arange(count)
    on_heavy = np.zeros(num_ranks, dtype=bool)
    on_heavy[heavy] = True
    item_pair = pair[assignment]
    paired, heavy_item = item_pair >= 0, on_heavy[assignment]
    y_items = np.flatnonzero(paired & ~heavy_item)
    y_ids = np.concatenate((y_items, np.full(count, -1, dtype=np.int64)))  # -1: move, no swap
    y_pair = np.concatenate((item_pair[y_items], np.arange(count)))
    y_cost = np.concatenate((costs[y_items], np.zeros(count)))
    largest = float(costs.max())
    span = 2.0 * largest + 1.0
    keys = y_pair * span + y_cost
    sorted_y = _stable_order(keys, count * span)
    keys, y_ids, y_pair, y_cost = keys[sorted_y], y_ids[sorted_y], y_pair[sorted_y], y_cost[sorted_y]
    x_items = np.flatnonzero(paired & heavy_item)
    x_pair, high_of, low_of = item_pair[x_items], loads[heavy], loads[light]
    wanted = x_pair * span + np.clip(costs[x_items] - (high_of[x_pair] - low_of[x_pair]) / 2, 0.0, largest)
    # Ascending (so by pair, spans apart): searchsorted runs several times faster on sorted queries.
    by_wanted = np.argsort(wanted)
    x_items, x_pair = x_items[by_wanted], x_pair[by_wanted]
    x_cost, high, low = costs[x_items], high_of[x_pair], low_of[x_pair]
    above = np.searchsorted(keys, wanted[by_wanted])
    best_value = np.full(x_items.size, np.inf)
    best_y = np.zeros(x_items.size, dtype=np.int64)  # a position in the sorted y arrays
    cap = problem.max_tokens_per_rank
    if cap is not None:
        tokens = np.bincount(assignment, weights=lengths, minlength=num_ranks)
        y_tokens = np.concatenate((lengths[y_items], np.zeros(count, dtype=np.int64)))[sorted_y]
        x_tokens, heavy_tokens, light_tokens = lengths[x_items], tokens[heavy][x_pair], tokens[light][x_pair]
    for y in (np.maximum(above - 1, 0), np.minimum(above, keys.size - 1)):
        delta = x_cost - y_cost[y]
        value = np.maximum(high - delta, low + delta)
        valid = y_pair[y] == x_pair
        if cap is not None:
            moved = x_tokens - y_tokens[y]
            valid &= (heavy_tokens - moved <= cap) & (light_tokens + moved <= cap)
        value = np.where(valid, value, np.inf)
        better = value < best_value
        best_value = np.where(better, value, best_value)
        best_y = np.where(better, y, best_y)
    if x_items.size == 0:
        return 0
    starts = np.flatnonzero(np.diff(x_pair, prepend=-1))
    sizes = np.diff(np.append(starts, x_pair.size))
    best = best_value == np.repeat(np.minimum.reduceat(best_value, starts), sizes)
    lowest = np.minimum.reduceat(np.where(best, x_items, problem.num_items), starts)
    chosen = np.flatnonzero(best & (x_items == np.repeat(lowest, sizes)))  # the lowest-index best item per pair
    chosen = chosen[best_value[chosen] < high[chosen]]
    partners = y_ids[best_y[chosen]]
    assignment[x_items[chosen]] = light[x_pair[chosen]]
    swapped = partners >= 0
    assignment[partners[swapped]] = heavy[x_pair[chosen][swapped]]
    return int(chosen.size)


def default_work(num_items: int) -> int:
    """The default `work_limit` of `improve`: grows with n, so large inputs get a pair round
    and a few exchange steps, and stays bounded by O(n) work.

    >>> default_work(1000), default_work(1_000_000)
    (500000, 12000000)
    """
    return max(DEFAULT_WORK, WORK_PER_ITEM * num_items)


def improve(problem: Problem, assignment: np.ndarray, work_limit: int | None = None, target: float = -math.inf,
            *, max_partners: int | None = None, max_pool: int = 10) -> Improved:
    """Exchange descent from `assignment` (the improvers' signature: `balancers.search`).

    When no exchange of up to two items helps, the heaviest rank is re-split exactly with
    two of the 8 lightest ranks, then three of the 6 lightest, whenever their items
    together number <= `max_pool`.  `work_limit` bounds the candidates examined (about
    20 ns each; `default_work(n)` when None), so the result does not depend on the
    machine's speed.  A step looks at O(items per rank) candidates (`MAX_PAIRS_PER_RANK`),
    so memory stays O(n).
    """
    if problem.padded:
        raise ValueError("local_search.improve handles the unpadded cost only")
    # max(largest item, mean load, target): reaching it ends the search (rounding only ends it early).
    bound = max(float(problem.item_costs.max()), float(problem.item_costs.sum()) / problem.num_ranks, target)
    start_makespan = rank_loads(problem, np.asarray(assignment)).max()
    if start_makespan <= bound:
        return Improved(np.asarray(assignment, dtype=np.int64), 0)
    work_limit = default_work(problem.num_items) if work_limit is None else work_limit
    work = 0
    paired = np.asarray(assignment, dtype=np.int64).copy()
    while work < work_limit // 2 and _pair_round(problem, paired):
        work += _STEP_WORK + _PAIR_WORK * problem.num_items
    state = _State(problem, paired)
    per_rank = max(1.0, problem.num_items / problem.num_ranks)
    if max_partners is None:
        max_partners = int(min(64, max(4, 4096 // (1 + per_rank + per_rank * (per_rank - 1) / 2))))
    while work < work_limit:
        heaviest = int(np.argmax(state.loads))
        top = state.loads[heaviest]
        if top <= bound:
            break
        lighter = np.flatnonzero(state.loads < top)
        partners = lighter[np.argsort(state.loads[lighter], kind="stable")[:max_partners]]
        if partners.size == 0:
            break
        found, spent = _best_exchange(state, heaviest, partners)
        work += spent
        if found is not None:
            _, rank, moved_out, moved_in = found
            state.exchange(heaviest, rank, moved_out, moved_in)
            continue
        group = None
        for ways, width in ((3, 8), (4, 6)):
            group, spent = _best_group(state, heaviest, partners[:width], ways, max_pool)
            work += spent
            if group is not None:
                break
        if group is None:
            break
        _, ranks, pool, labels = group
        state.reassign(ranks, pool, labels)
    if rank_loads(problem, state.assignment).max() > start_makespan:
        return Improved(np.asarray(assignment, dtype=np.int64), work)
    return Improved(state.assignment, work)

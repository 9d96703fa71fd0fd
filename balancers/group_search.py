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
(b, Y) the best X has sum(X) nearest to sum(Y) + (L_a - L_b) / 2: one searchsorted of
every (a, b, Y) into the ranks' sorted subset sums gives every pair's best re-split.  A
triple is an exact dynamic programme over the subsets of its pool (O(3^size)).  Every
accepted change lowers the larger load of its group without lifting another rank to it,
so the loads sorted descending fall lexicographically: the search ends, and the makespan
never grows.  A work count (subset sums and table entries examined, not a clock) bounds
it, so the plan is bit-identical on every machine; it charges each numpy call's fixed
overhead too, so that work tracks CPU time at every size.  Memory caps are respected.

After Schwerdfeger & Walter (2016, 2018), who balance workloads by re-solving machine
pairs and triples as subset-sum problems; our own code, aimed at the makespan.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from .problem import Problem, rank_loads

MAX_SUBSET_ITEMS = 12
"""A rank's subsets are all enumerated up to this many items (4096 sums); ranks holding
more offer only their subsets of the first `MAX_SUBSET_ITEMS` items by cost."""

MAX_TRIPLE_POOL = 10
"""Triples are re-solved only when they hold at most this many items (3^10 table entries)."""

TRIPLE_PARTNERS = 4
"""Triples join the heaviest rank with two of this many lightest ranks (4: 6 triples; they
rarely succeed where the pairs failed, and 6 or 8 partners cost work the starts use better)."""

MAX_QUERIES = 1 << 14
"""Subset sums one all-pairs evaluation may look up (it takes the heaviest ranks first), so
one evaluation costs a few ms even from a start whose light ranks hold many small items."""

_CALL_WORK = 3000
"""Work charged per pair evaluation's fixed overhead (~40 numpy calls, ~150 µs, where one
unit of work is ~50 ns), so that instances with few subsets do not run far past their time."""

_TRIPLE_WORK = 1500
"""Work charged per triple dynamic programme's fixed overhead."""


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
    sums, token_sums = subset_sums(costs), subset_sums(tokens)
    union, part, starts = _split_table(size)
    one = sums if cap is None else np.where(token_sums <= cap, sums, np.inf)
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


class _Ranks:
    """Items per rank (ascending index), loads and tokens, and each rank's subset sums, cached."""

    def __init__(self, problem: Problem, assignment: np.ndarray):
        self.problem = problem
        self.costs, self.lengths = problem.item_costs, problem.lengths
        self.assignment = np.asarray(assignment, dtype=np.int64).copy()
        self.members = [[] for _ in range(problem.num_ranks)]
        for item, rank in enumerate(self.assignment.tolist()):
            self.members[rank].append(item)
        self.loads = rank_loads(problem, self.assignment)
        self.tokens = np.bincount(self.assignment, weights=self.lengths,
                                  minlength=problem.num_ranks).astype(np.int64)
        self._subsets: dict[int, tuple] = {}

    def subsets(self, rank: int):
        """(sums, token sums, masks, items) of the rank's subsets, sums ascending (ties by mask);
        bit b of a mask is items[b]."""
        cached = self._subsets.get(rank)
        if cached is None:
            items = np.array(self.members[rank], dtype=np.int64)
            if items.size > MAX_SUBSET_ITEMS:
                items = items[np.lexsort((items, -self.costs[items]))[:MAX_SUBSET_ITEMS]]
            sums = subset_sums(self.costs[items])
            tokens = subset_sums(self.lengths[items])
            masks = np.argsort(sums, kind="stable")
            cached = (sums[masks], tokens[masks], masks, items)
            self._subsets[rank] = cached
        return cached

    def move(self, ranks, items: np.ndarray, targets: np.ndarray) -> None:
        """Give items[k] to targets[k]; every changed rank is in `ranks`."""
        self.assignment[items] = targets
        pool = sorted(itertools.chain.from_iterable(self.members[rank] for rank in ranks))
        for rank in ranks:
            self.members[rank] = []
        for item in pool:
            self.members[int(self.assignment[item])].append(item)
        for rank in ranks:
            members = self.members[rank]
            self.loads[rank] = math.fsum(self.costs[members].tolist())
            self.tokens[rank] = int(self.lengths[members].sum())
            self._subsets.pop(rank, None)


def _pair_moves(state: _Ranks, heavy: np.ndarray, max_queries: int):
    """The best exact re-split of every pair (a, b), a in `heavy` and L_b < L_a.

    Returns (a, b, value, X mask, Y mask) per pair (value: the pair's new maximum) and
    the work spent.  `heavy` is cut to as many first ranks as surely fit `max_queries`.
    """
    loads, num_ranks = state.loads, state.loads.size
    tables = [state.subsets(rank) for rank in range(num_ranks)]
    size = np.array([table[0].size for table in tables])
    x_start = np.concatenate(([0], np.cumsum(size)[:-1]))
    x_sums = np.concatenate([table[0] for table in tables])
    x_tokens = np.concatenate([table[1] for table in tables])
    x_masks = np.concatenate([table[2] for table in tables])
    heavy = heavy[: max(1, max_queries // int(size.sum()))]  # each looks up at most every subset
    pair_a, pair_b = np.nonzero(loads[None, :] < loads[heavy][:, None])
    pair_a = heavy[pair_a]
    if pair_a.size == 0:
        return None, _CALL_WORK
    counts = size[pair_b]
    offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
    owner = np.repeat(np.arange(pair_a.size), counts)
    y = np.repeat(x_start[pair_b] - offsets, counts) + np.arange(owner.size)
    a, b = pair_a[owner], pair_b[owner]
    high, low = loads[a], loads[b]
    span = 2.0 * float(x_sums.max() + (loads.max() - loads.min())) + 1.0
    keys = np.repeat(np.arange(num_ranks) * span, size) + x_sums
    above = np.searchsorted(keys, a * span + x_sums[y] + (high - low) / 2)
    first, last = x_start[a], x_start[a] + size[a] - 1
    cap = state.problem.max_tokens_per_rank
    best = np.full(owner.size, np.inf)
    best_x = np.zeros(owner.size, dtype=np.int64)
    for pick in (np.clip(above - 1, first, last), np.clip(above, first, last)):
        delta = x_sums[pick] - x_sums[y]
        value = np.maximum(high - delta, low + delta)
        if cap is not None:
            moved = x_tokens[pick] - x_tokens[y]
            fits = (state.tokens[a] - moved <= cap) & (state.tokens[b] + moved <= cap)
            value = np.where(fits, value, np.inf)
        better = value < best
        best = np.where(better, value, best)
        best_x = np.where(better, pick, best_x)
    pair_best = np.minimum.reduceat(best, offsets)
    hit = np.flatnonzero(best == pair_best[owner])
    chosen = hit[np.searchsorted(owner[hit], np.arange(pair_a.size))]  # first candidate reaching it
    work = _CALL_WORK + x_sums.size + 4 * owner.size
    return (pair_a, pair_b, pair_best, x_masks[best_x[chosen]], x_masks[y[chosen]]), work


def _apply_pair(state: _Ranks, a: int, b: int, x_mask: int, y_mask: int) -> None:
    x_items, y_items = state.subsets(a)[3], state.subsets(b)[3]
    out = x_items[(x_mask >> np.arange(x_items.size)) & 1 == 1]
    back = y_items[(y_mask >> np.arange(y_items.size)) & 1 == 1]
    items = np.concatenate((out, back))
    targets = np.concatenate((np.full(out.size, b), np.full(back.size, a)))
    state.move((a, b), items, targets)


def _improve_pairs(state: _Ranks, heavy: np.ndarray, max_queries: int):
    """Re-split the improving pairs with a rank in `heavy`, largest gain first, disjoint;
    returns how many and the work spent."""
    moves, work = _pair_moves(state, heavy, max_queries)
    if moves is None:
        return 0, work
    pair_a, pair_b, value, x_masks, y_masks = moves
    gain = state.loads[pair_a] - value
    order = np.lexsort((pair_b, pair_a, -gain))
    order = order[gain[order] > 0]
    used = np.zeros(state.loads.size, dtype=bool)
    applied = []
    for k in order.tolist():
        a, b = int(pair_a[k]), int(pair_b[k])
        if not (used[a] or used[b]):
            used[a] = used[b] = True
            applied.append((a, b, int(x_masks[k]), int(y_masks[k])))
    for move in applied:
        _apply_pair(state, *move)
    return len(applied), work


def _improve_triple(state: _Ranks, heaviest: int):
    """The first triple (heaviest, r, s), r and s among the lightest, whose exact split
    lowers the heaviest load; returns whether one was applied and the work spent."""
    loads, work = state.loads, 0
    lighter = np.flatnonzero(loads < loads[heaviest])
    partners = lighter[np.argsort(loads[lighter], kind="stable")[:TRIPLE_PARTNERS]]
    for r, s in itertools.combinations(partners.tolist(), 2):
        ranks = (heaviest, r, s)
        pool = np.array(state.members[heaviest] + state.members[r] + state.members[s], dtype=np.int64)
        if pool.size > MAX_TRIPLE_POOL:
            continue
        work += _TRIPLE_WORK + 2 * 3 ** pool.size
        value, labels = exact_split(state.costs[pool], state.lengths[pool],
                                    state.problem.max_tokens_per_rank, 3)
        if value < loads[heaviest]:
            state.move(ranks, pool, np.array(ranks)[labels])
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
        done, spent = _improve_triple(state, heaviest)
        work += spent
        if not done:
            break
    return work


def improve(problem: Problem, assignment: np.ndarray, work_limit: int,
            target: float = -math.inf) -> tuple[np.ndarray, int]:
    """Pair and triple descent from `assignment` (unpadded); never worse than it.

    Stops at `target` (a proven lower bound: nothing can beat it), at a local optimum of
    both neighbourhoods, or when `work_limit` subset sums have been examined.  Returns the
    plan and the work spent.
    """
    if problem.padded:
        raise ValueError("group_search.improve handles the unpadded cost only")
    state = _Ranks(problem, assignment)
    work = _descend(state, work_limit, target)
    if rank_loads(problem, state.assignment).max() > rank_loads(problem, np.asarray(assignment)).max():
        return np.asarray(assignment, dtype=np.int64), work  # float rounding only: never worse
    return state.assignment, work

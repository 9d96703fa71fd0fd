"""LPT under a memory cap: each item, largest cost first, to the least-loaded rank with room.

minimise max(loads) s.t. tokens(r) <= cap, greedily (ties by rank):

    for i in sorted(items, key=lambda i: (-cost[i], i)):
        r = min((r for r in range(D) if tokens[r] + length[i] <= cap), key=lambda r: (loads[r], r))
        loads[r] += cost[i]; tokens[r] += length[i]

The choices are the uncapped LPT's (`lpt`'s rounds) up to the first rank that overflows, so
that prefix is taken from the uncapped plan.  From there, rounds over the ranks sorted by
(load, rank): every item of a round takes the first rank in that order with room for it that
no earlier item of the round took, while that rank stays ahead of every rank topped up earlier
in the round that has room for the item again (a taken rank is not offered twice in a round).

- While lengths do not grow (a cost model's costs rise with the lengths), the ranks with room
  for an item are those with room for the previous one and those the shorter item now fits:
  a round merges the ranks in order with the ranks each item releases, runs of the first taken
  whole (`_release_merge`), and checks the round in numpy (`_kept`).  Where the least-loaded
  ranks take item after item (a round keeps under 1/8 of its items), D items go one heap step
  each instead, ranks without room for the next item waiting in a max-room heap until the
  items are short enough (`_heap_run`).  A round or a heap run costs O(D) numpy work and O(log D)
  per item, so the whole is O(n log D) up to the number of short rounds.  A run of one length and
  cost filling 1/8 of a round or more (or all that a heap run would hold) goes at once, each rank
  taking at most what its room holds (`lpt_runs`).
- Otherwise (costs given per item, lengths up and down), each item finds its rank by a descent
  of a max-room tree over the ranks in order, O(log D) Python steps (`_tree_round`; the tree is
  rebuilt, O(D), per round).

The plan is exactly the loop's above, float sums in the same order; a full rank is never
offered again and again as the heap loop did (O(n · D) pops once the ranks fill up: 86 s on
real conversation lengths at D = 2560 × 32 cells of T = 8k, 0.13 s now).
"""

from __future__ import annotations

import heapq

import numpy as np

from ..problem import Problem, token_sums
from .lpt_runs import EqualRuns, merged_order, place_run

MIN_RUN = 8  # fewer items before lengths grow: a tree round


class _CappedState:
    """Loads and tokens per rank, and the ranks sorted by (load, rank)."""

    def __init__(self, problem: Problem, cap: int, ranks: np.ndarray, start: int):
        order = problem.cost_order
        self.lengths = problem.lengths[order]
        self.costs = problem.sorted_costs
        self.cap, self.num_ranks = cap, problem.num_ranks
        # float sums in placement order, as the loop adds them (bincount adds in array order)
        self.loads = np.bincount(ranks[:start], weights=self.costs[:start], minlength=self.num_ranks)
        self.tokens = token_sums(ranks[:start], self.lengths[:start], self.num_ranks)
        self.ranked = np.lexsort((np.arange(self.num_ranks), self.loads))

    def place(self, position: int, taken: np.ndarray) -> np.ndarray:
        """Items position.. go to the ranks at `taken` (positions in `ranked`, one item each);
        returns those ranks."""
        ranks = self.ranked[taken]
        stop = position + ranks.size
        self.loads[ranks] += self.costs[position:stop]
        self.tokens[ranks] += self.lengths[position:stop]
        self.ranked = merged_order(self.loads, np.delete(self.ranked, taken), ranks)
        return ranks

    def place_run(self, position: int, count: int) -> np.ndarray | None:
        """Ranks of the `count` items from `position` (one length, one cost > 0) placed at once (`lpt_runs`): fewer
        where the ranks' room ran out, None where `place_run` found no level."""
        length = int(self.lengths[position])
        room = self.cap - self.tokens[self.ranked]
        open_ = self.ranked[room >= length]
        chosen = open_[:count]
        after = (self.loads[open_[count]], int(open_[count])) if count < open_.size else None
        limits = (self.cap - self.tokens[chosen]) // length if length else None
        placed = place_run(self.loads[chosen], chosen, float(self.costs[position]), count, limits, after) \
            if chosen.size else (chosen, chosen, self.loads[chosen])
        if placed is None:
            return None
        ranks, taken, self.loads[chosen] = placed
        self.tokens[chosen] += taken * length
        moved = chosen[taken > 0]
        kept = np.ones(self.num_ranks, dtype=bool)
        kept[moved] = False
        self.ranked = merged_order(self.loads, self.ranked[kept[self.ranked]], moved)
        return ranks


def _release_merge(eligible: np.ndarray, late: np.ndarray, release: np.ndarray, size: int) -> np.ndarray:
    """Positions taken by slots 0.. of a round: slot j takes the first position not yet taken among
    `eligible` (ascending, open from slot 0) and the `late` ones whose `release` slot is <= j;
    stops at `size` slots or when none is open.  Runs of `eligible` are taken whole, so the loop
    makes one step per late position and per release slot."""
    if not late.size:
        return eligible[:size]
    by_time = np.lexsort((late, release))
    late = late[by_time]
    ahead_of = np.searchsorted(eligible, late).tolist()  # eligible positions before each late one
    late, release = late.tolist(), release[by_time].tolist() + [size]
    pool, late_slots, late_taken = [], [], []
    slot = used = waiting = 0
    while slot < size:
        while release[waiting] <= slot:
            heapq.heappush(pool, (late[waiting], ahead_of[waiting]))
            waiting += 1
        if pool and used >= pool[0][1]:  # no open eligible position before the first late one
            late_slots.append(slot)
            late_taken.append(heapq.heappop(pool)[0])
            slot += 1
            continue
        run = min((pool[0][1] if pool else eligible.size) - used, min(release[waiting], size) - slot)
        if run <= 0:
            break  # nothing open at this slot
        used += run
        slot += run
    taken = np.empty(slot, dtype=np.int64)
    from_eligible = np.ones(slot, dtype=bool)
    from_eligible[late_slots] = False
    taken[from_eligible] = eligible[:used]
    taken[late_slots] = late_taken
    return taken


def _merged_round(state: _CappedState, position: int, size: int) -> np.ndarray:
    """Positions taken by the items position.. of a round (at most `size`, lengths not growing);
    empty when no rank has room for the first."""
    lengths = state.lengths[position:position + size]
    room = state.cap - state.tokens[state.ranked]
    open_ = room >= lengths[0]
    eligible = np.flatnonzero(open_)
    if not eligible.size:
        return eligible
    # ranks released later in the round matter only ahead of the last rank open from the start
    ahead = eligible[size - 1] if eligible.size >= size else room.size
    late = np.flatnonzero(~open_[:ahead] & (room[:ahead] >= lengths[-1]))
    release = np.searchsorted(-lengths, -room[late], side="left")
    taken = _release_merge(eligible, late, release, size)
    return taken[:_kept(state, position, taken, lengths)]


def _kept(state: _CappedState, position: int, taken: np.ndarray, lengths: np.ndarray) -> int:
    """How many slots of a merged round keep their rank: slot j does while that rank's (load, rank)
    is below that of every rank topped up at an earlier slot with room for item j again."""
    ranks = state.ranked[taken]
    count = ranks.size
    loads = state.loads[ranks]
    topped = loads + state.costs[position:position + count]
    room_after = state.cap - state.tokens[ranks] - lengths[:count]
    back = np.maximum(np.searchsorted(-lengths[:count], -room_after, side="left"), np.arange(1, count + 1))
    by_back = np.argsort(back, kind="stable")
    rivals = np.searchsorted(back[by_back], np.arange(count), side="right")  # back <= j: rivals of slot j
    least = np.concatenate(([np.inf], np.minimum.accumulate(topped[by_back])))[rivals]
    failed = np.flatnonzero(loads >= least)
    for slot in failed.tolist():  # above a rival's load, or equal to it and a higher rank
        if loads[slot] > least[slot]:
            return slot
        tied = by_back[:rivals[slot]]
        if ranks[slot] > ranks[tied[topped[tied] == least[slot]]].min():
            return slot
    return count


def _room_tree(state: _CappedState) -> tuple[list, int]:
    """A max-room tree over the ranks in (load, rank) order, as a list (node k's children: 2k + 1, 2k + 2; the
    leaves, padded to a power of two with room -1, last), and its number of leaves."""
    rooms = state.cap - state.tokens[state.ranked]
    leaves = 1 << max(int(rooms.size - 1).bit_length(), 0)
    level = np.full(leaves, -1, dtype=np.int64)
    level[:rooms.size] = rooms
    levels = [level]
    while level.size > 1:
        level = level.reshape(-1, 2).max(axis=1)
        levels.append(level)
    return np.concatenate(levels[::-1]).tolist(), leaves


def _tree_round(state: _CappedState, position: int, size: int) -> np.ndarray:
    """Positions taken by the items position.. in a round (any lengths), each by a descent of a
    max-room tree over the ranks in order, stopping at the round check."""
    tree, leaves = _room_tree(state)
    loads, ranked = state.loads.tolist(), state.ranked.tolist()
    costs = state.costs[position:position + size].tolist()
    taken, least_topped = [], (np.inf, -1)
    for length, cost in zip(state.lengths[position:position + size].tolist(), costs):
        if tree[0] < length:
            break
        node = 0
        while node < leaves - 1:
            node = 2 * node + 1 if tree[2 * node + 1] >= length else 2 * node + 2
        where = node - (leaves - 1)
        rank = ranked[where]
        if (loads[rank], rank) > least_topped:
            break
        least_topped = min(least_topped, (loads[rank] + cost, rank))
        taken.append(where)
        tree[node] = -1
        while node:
            node = (node - 1) // 2
            tree[node] = max(tree[2 * node + 1], tree[2 * node + 2])
    return np.array(taken, dtype=np.int64)


def _free_run(state: _CappedState, position: int) -> np.ndarray:
    """Ranks of the items position.. (all of cost 0, the last in cost order), each the first rank in (load, rank)
    order with room for it: their costs change no load, so the order stays and a rank takes item after item while
    it has room.  A descent of a max-room tree over the ranks in that order, O(log D) a item, the tree updated, not
    rebuilt (a round a item, as `_tree_round` made them, took O(D) each: 53 s for 8k free items at 512 x 32, cells
    of 16k tokens); stops where no rank has room."""
    tree, leaves = _room_tree(state)
    taken, last = [], leaves - 1
    for length in state.lengths[position:].tolist():
        if tree[0] < length:
            break
        node = 0
        while node < last:  # to the first leaf with room
            node = 2 * node + 1
            if tree[node] < length:
                node += 1
        taken.append(node - last)
        room = tree[node] = tree[node] - length
        while node:  # up while the max below changes
            sibling = tree[node + 1] if node & 1 else tree[node - 1]
            node = (node - 1) >> 1
            room = room if room >= sibling else sibling
            if room == tree[node]:
                break
            tree[node] = room
    placed = state.ranked[np.array(taken, dtype=np.int64)]
    state.tokens += token_sums(placed, state.lengths[position:position + placed.size], state.num_ranks)
    return placed


def _heap_run(state: _CappedState, position: int, stop: int) -> np.ndarray:
    """Ranks of the items position..stop - 1 (lengths not growing), placed one heap step each (the
    least-loaded rank with room; a rank without room for the next item waits in a max-room heap
    until the items are short enough); stops early where no rank has room."""
    lengths = state.lengths[position:stop].tolist()
    rooms = (state.cap - state.tokens).tolist()
    room_ranked = state.cap - state.tokens[state.ranked]
    open_ = state.ranked[room_ranked >= lengths[0]]
    heap = list(zip(state.loads[open_].tolist(), open_.tolist()))  # sorted, so a heap
    waits = (room_ranked < lengths[0]) & (room_ranked >= lengths[-1])
    waiting = sorted(zip((-room_ranked[waits]).tolist(), state.ranked[waits].tolist()))
    loads = state.loads.tolist()
    placed = []
    for length, cost, following in zip(lengths, state.costs[position:stop].tolist(), lengths[1:] + [0]):
        while waiting and -waiting[0][0] >= length:
            rank = heapq.heappop(waiting)[1]
            heapq.heappush(heap, (loads[rank], rank))
        if not heap:
            break
        load, rank = heapq.heappop(heap)
        placed.append(rank)
        loads[rank] = load = load + cost
        rooms[rank] -= length
        if rooms[rank] >= following:
            heapq.heappush(heap, (load, rank))
        elif rooms[rank] >= lengths[-1]:
            heapq.heappush(waiting, (-rooms[rank], rank))
    state.loads = np.array(loads)
    state.tokens = state.cap - np.array(rooms, dtype=np.int64)
    state.ranked = np.lexsort((np.arange(state.num_ranks), state.loads))
    return np.array(placed, dtype=np.int64)


def greedy_capped(problem: Problem, cap: int, uncapped: np.ndarray, no_room, hopeless=None) -> np.ndarray:
    """The capped loop's assignment (see the module), given the uncapped LPT `assignment`;
    raises `no_room(problem, item, cap)` for the first item no rank has room for, or with `hopeless`
    given, `hopeless(problem, cap, item)` already where the loop takes the first item the uncapped
    plan has no room for (`item`) if the items left cannot fit in any way (`cannot_finish`)."""
    order, n = problem.cost_order, problem.num_items
    ranks = uncapped[order]
    start = _first_overflow(problem.lengths[order], ranks, cap, problem.num_ranks)
    state = _CappedState(problem, cap, ranks, start)
    if hopeless is not None and cannot_finish(state.lengths[start:], state.tokens, cap):
        raise hopeless(problem, cap, int(order[start]))
    grows = np.flatnonzero(state.lengths[1:] > state.lengths[:-1]) + 1  # where lengths grow
    runs = EqualRuns(state.costs, state.num_ranks, state.lengths)
    free = n - int(np.searchsorted(state.costs[::-1], 0.0, side="right"))  # the items of cost 0 from here
    assignment = np.empty(n, dtype=np.int64)
    assignment[order[:start]] = ranks[:start]
    position = given_up = start  # given_up: where a run ends that `place_run` could not place (probe57 L2)
    while position < n:
        if position >= free:
            placed = _free_run(state, position)
            assignment[order[position:position + placed.size]] = placed
            position += placed.size
            if position < n:
                raise no_room(problem, int(order[position]), cap)
            break
        run = runs.at(position) if position >= given_up else 0
        placed = state.place_run(position, run) if run else None
        given_up = runs.end(position) if run and placed is None else given_up
        if placed is not None:
            assignment[order[position:position + placed.size]] = placed
            position += placed.size
            if placed.size < run:
                raise no_room(problem, int(order[position]), cap)
            continue
        later = np.searchsorted(grows, position, side="right")
        run_end = int(grows[later]) if later < grows.size else n
        size = min(n - position, state.num_ranks, run_end - position)
        if run_end - position < MIN_RUN:
            placed = state.place(position, _tree_round(state, position, min(n - position, state.num_ranks)))
        else:
            taken = _merged_round(state, position, size)
            if 8 * taken.size < size:  # the least-loaded ranks take item after item: one heap step each
                stop = min(run_end, position + state.num_ranks, runs.next_start(position))
                tried = position >= given_up and stop <= runs.end(position)
                placed = state.place_run(position, stop - position) if tried else None
                if placed is None:
                    given_up = runs.end(position) if tried else given_up
                    placed = _heap_run(state, position, stop)
            else:
                placed = state.place(position, taken)
        if not placed.size:
            raise no_room(problem, int(order[position]), cap)
        assignment[order[position:position + placed.size]] = placed
        position += placed.size
    return assignment


def cannot_finish(lengths: np.ndarray, tokens: np.ndarray, cap: int) -> bool:
    """True only when items of `lengths` cannot be added to ranks holding `tokens` (each <= `cap`)
    in any way: for some length y, the items of length >= y hold more tokens than the ranks with
    room >= y have room (only those can take them).  A certificate, never a guess; False proves
    nothing (and is the answer where the rooms' sum could leave int64).

    >>> cannot_finish(np.array([3, 3]), np.array([2, 2, 0]), 4), cannot_finish(np.array([3, 3]), np.array([1, 1]), 4)
    (True, False)
    """
    if not lengths.size or cap * tokens.size >= 2**62:
        return False
    rooms = cap - tokens
    slack = int(rooms.sum()) - int(lengths.sum())
    # a length y fails only where the room below y exceeds this slack; below the longest item at most:
    if slack >= 0 and int(rooms[rooms < lengths.max()].sum()) <= slack:
        return False  # (the cheap case: no sort)
    items, rooms = np.sort(lengths), np.sort(rooms)
    need = np.cumsum(items[::-1])[::-1]  # tokens of the items from each one up (all as long or longer)
    have = np.concatenate((np.cumsum(rooms[::-1])[::-1], [0]))[np.searchsorted(rooms, items, side="left")]
    return bool(np.any(need > have))


def _first_overflow(lengths: np.ndarray, ranks: np.ndarray, cap: int, num_ranks: int) -> int:
    """The first position (in placement order) where the uncapped plan's rank passes `cap`, or
    len(ranks) if none does."""
    over = np.flatnonzero(token_sums(ranks, lengths, num_ranks)[ranks] > cap)  # items on ranks that end over the cap
    if not over.size:
        return ranks.size
    by_rank = over[np.argsort(ranks[over], kind="stable")]
    sums = np.cumsum(lengths[by_rank])
    group_start = np.concatenate(([True], ranks[by_rank][1:] != ranks[by_rank][:-1]))
    offsets = np.maximum.accumulate(np.where(group_start, sums - lengths[by_rank], 0))
    return int(by_rank[sums - offsets > cap].min())

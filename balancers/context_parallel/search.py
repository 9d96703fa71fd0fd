"""Local search on a split plan, from its makespan rank: move an item, split it, or widen a group.

    while moves < MAX_MOVES and makespan > bound, and the moves left may lower it by more than MAKESPAN_SLACK:
        r = the most loaded rank (lowest index on ties), M = its load
        candidates, each lowering r:
            an unsplit item of r to the least-loaded rank with token room
            an item of r (unsplit, or split in r's group) onto a block at any allowed degree:
                a free aligned block (no rank in a group) or an existing group's block
            r's group widened to the aligned block of twice its degree (its other half free)
        take the candidate whose affected ranks end lowest, if all of them end below M

Where no item of r can land below M wherever it goes (the least load, or its own ranks' without it, plus its
least time at any degree: `_stuck`), the plan is returned at once, as the search would (no move).
Every move takes r below M and puts no rank at M or above, so the number of ranks at the
makespan falls and the search ends; a move count (not a clock) bounds it, so the plan is the
same on every machine.  No guarantee beyond never returning a worse plan.

A move lowers the ranks of one block only (r's, or r's group), so taking every rank below a level L takes at least
one move per rank at L or above in no group and one per group holding such a rank (`blocks_near`).  Where those
outnumber the moves left at L = M · (1 - MAKESPAN_SLACK), no sequence of them ends below L: the search stops, its
makespan within MAKESPAN_SLACK of the one the moves left could reach (the long workload's token-tight passes at
D = 2560 x 16, T = 32k: 17-64 moves lowering it 0.003-0.008 % for 30-110 ms of a 130-230 ms pass, more ranks
within 0.01 % of it than moves).
"""

from __future__ import annotations

import math

import numpy as np

from ..problem import Problem
from .blocks import free_blocks, within_node
from .layout import shards_of
from .plan import rank_accounts, rank_pairs
from .spec import ContextParallel

MAX_MOVES = 64
"""Moves the search makes at most."""
MAKESPAN_SLACK = 1e-4
"""The search stops where the moves left cannot take the makespan below (1 - MAKESPAN_SLACK) of it (the module)."""
MOVE_CHUNK = 128
"""Unsplit items whose block moves are weighed at once (arrays of items × ranks)."""
STUCK_SLACK = 1e-9
"""Relative margin of `_stuck`'s floor over the makespan (a widened group's loads are summed in another order)."""


class _State:
    """A split plan being improved: blocks, loads, tokens and the ranks' groups."""

    def __init__(self, problem: Problem, spec: ContextParallel, gpus_per_node: int, start, degree, bound: float,
                 accounts: tuple | None = None):
        """`accounts`: the blocks' `rank_accounts` where the caller has them."""
        self.problem, self.spec, self.gpus_per_node, self.bound = problem, spec, gpus_per_node, bound
        self.start, self.degree = start.copy(), degree.copy()
        self.cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
        self.split_degrees = [c for c in spec.degrees if c > 1]
        self.column = {c: k for k, c in enumerate(self.split_degrees)}
        # item -> its `_time` at every split degree (a row per degree), where `timed`: made once per search
        self.item_times = np.empty((problem.num_items, len(self.split_degrees), 2))
        self.timed = np.zeros(problem.num_items, dtype=bool)
        self.shards: dict[tuple[int, int], np.ndarray] = {}  # (item, degree) -> `shard`
        self.loads, self.tokens, self.times = accounts or rank_accounts(problem, spec, gpus_per_node, self.start,
                                                                        self.degree)
        self.refresh()

    def refresh(self) -> None:
        """Which ranks are in a group and how many items each group holds, from the blocks."""
        self.in_group = np.zeros(self.problem.num_ranks, dtype=bool)
        split = self.degree > 1
        width = self.problem.num_ranks + 1
        keys, sizes = np.unique(self.degree[split] * width + self.start[split], return_counts=True)
        degree, start = np.divmod(keys, width)
        self.group_sizes = dict(zip(zip(start.tolist(), degree.tolist()), sizes.tolist()))  # (start, degree) -> items
        self.group_starts = {c: start[degree == c] for c in self.split_degrees}  # ascending
        for c, starts in self.group_starts.items():
            self.in_group[(starts[:, None] + np.arange(c)).ravel()] = True
        self.starts: dict[int, tuple] = {}  # degree -> `_starts` with no group left

    def shard(self, item: int, degree: int) -> np.ndarray:
        """Tokens of item `item`'s shards at `degree` (computed once per search)."""
        shard = self.shards.get((item, degree))
        if shard is None:
            shard = self.shards[item, degree] = shards_of(self.problem.lengths[item: item + 1], degree)[0]
        return shard

    def _starts(self, c: int, own: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(starts, ranks (a row each), which time: 0 inside a node, 1 across; None when all are inside) of the
        blocks of degree c an item may run on: the free ones, with its own group `own` left free, then the
        groups'; without `own` the same for every item until `refresh`."""
        if own is None and c in self.starts:
            return self.starts[c]
        taken = self.in_group.copy()
        if own is not None:
            taken[own[0]: own[0] + own[1]] = False
        starts = np.concatenate((free_blocks(taken, c, self.gpus_per_node, self.spec.allow_inter_node),
                                 self.group_starts[c]))
        inside = within_node(starts, c, self.gpus_per_node)
        found = starts, starts[:, None] + np.arange(c), None if inside.all() else np.where(inside, 0, 1)
        if own is None:
            self.starts[c] = found
        return found

    def blocks(self, item: int, loads: np.ndarray, tokens: np.ndarray, own: tuple[int, int] | None):
        """Best (peak, start, degree) over the blocks item `item` could run on but its own, with `loads` and
        `tokens` the ranks' accounts without it; `own` its current group, left free for the blocks that overlap it."""
        best = (math.inf, -1, 0)
        for c in self.split_degrees:
            starts, ranks, which = self._starts(c, own)
            if not starts.size:
                continue
            time = self._time(item, c)
            peak = (loads[ranks] + (time[0] if which is None else time[which][:, None])).max(axis=1)
            peak[(tokens[ranks] + self.shard(item, c) > self.cap).any(axis=1)] = math.inf
            if c == self.degree[item]:  # the block it is on is no move (its peak there only rounds lower)
                peak[starts == self.start[item]] = math.inf
            k = int(np.argmin(peak))
            if peak[k] < best[0]:
                best = (float(peak[k]), int(starts[k]), c)
        return best

    def _time(self, item: int, c: int) -> np.ndarray:
        """The item's time at degree c inside a node and across nodes (the same element-wise values as the
        plan's), computed once per search."""
        if not self.timed[item]:
            self._timed(np.array([item]))
        return self.item_times[item, self.column[c]]

    def candidates(self, rank: int):
        """(peak of the ranks it changes, item or -1, start, degree) of every move lowering `rank`: each unsplit
        item of `rank` to the least-loaded other rank with token room, then onto its best block
        (`_unsplit_moves`), then the moves of `rank`'s group.  An unsplit item of no time is left out: `rank`
        keeps its load without it, so its moves end at the makespan or above and are never taken (zeros_giants,
        D = 2560 x 16: 90 % of the items are empty)."""
        out = []
        unsplit = np.flatnonzero((self.start == rank) & (self.degree == 1) & (self.times > 0))
        if unsplit.size:
            out.extend(self._unsplit_moves(rank, unsplit))
        if self.in_group[rank]:
            out.extend(self._group_moves(rank))
        return out

    def _unsplit_moves(self, rank: int, items: np.ndarray) -> list[tuple]:
        """The two moves of each of `rank`'s unsplit `items`, in item order, all items at once: with an item taken
        out only `rank`'s load and tokens change, so the least-loaded other rank with token room is the first
        of them by (load, rank) where their tokens' running minimum leaves room (`argmin`'s 0 where none does);
        the block moves are `_block_moves`.  The same numbers, ties and order as item by item (the long
        workload's passes of 30k small items: a search's moves hold ten items or more each)."""
        loads, tokens = self.loads, self.tokens
        costs, lengths = self.times[items], self.problem.lengths[items]
        lowered = loads[rank] - costs  # `rank`'s load without each item
        order = np.argsort(loads, kind="stable")  # by (load, rank)
        order = order[order != rank]
        least_tokens = np.minimum.accumulate(tokens[order])  # non-increasing
        first = np.searchsorted(-least_tokens, lengths - self.cap)  # the first with room: -tokens >= length - cap
        other = np.append(order, 0)[first]
        to_rank = np.maximum(lowered, np.where(first < order.size, loads[other] + costs, math.inf)).tolist()
        blocks = self._weighed(rank, items, lowered[:, None], (tokens[rank] - lengths)[:, None])
        out = []
        for item, to, q, down, (peak, start, c) in zip(items.tolist(), to_rank, other.tolist(), lowered.tolist(),
                                                       blocks):
            out.extend(((to, item, q, 1), (max(peak, down), item, start, c)))
        return out

    def _weighed(self, lo: int, items: np.ndarray, after: np.ndarray, after_tokens: np.ndarray) -> list[tuple]:
        """`_block_moves` of `items`, MOVE_CHUNK at a time."""
        best = []
        for chunk in range(0, items.size, MOVE_CHUNK):
            part = slice(chunk, chunk + MOVE_CHUNK)
            best.extend(self._block_moves(lo, items[part], after[part], after_tokens[part]))
        return best

    def _block_moves(self, lo: int, items: np.ndarray, after: np.ndarray, after_tokens: np.ndarray) -> list[tuple]:
        """`blocks` of each of `items` taken out of ranks lo.. lo + w - 1 (an unsplit item's rank or a group of
        several items; their loads then `after`, their tokens `after_tokens`: (items, w) arrays), all at once, on
        (items, blocks) arrays: a block's peak is its ranks' most load plus the time (rounding is monotone), that
        of the one block meeting ranks lo.. (blocks of a degree are disjoint, free ones hold no rank of a group:
        the rank's block, or the group itself) from `after`.  Tokens as `blocks` counts them: an item's shards
        differ by at most one, so a block of most tokens m fits it where m + its largest shard fits, not where
        m + its least does not; the rest shard by shard."""
        best = [(math.inf, -1, 0)] * items.size
        hi, lengths = lo + after.shape[1], self.problem.lengths[items]
        for c in self.split_degrees:
            starts, ranks, which = self._starts(c, None)
            if not starts.size:
                continue
            time = self._times(items, c)
            times = time[:, :1] if which is None else time[:, which]
            block_loads, block_tokens = self.loads[ranks], self.tokens[ranks]
            peak = block_loads.max(axis=1) + times  # (items, blocks)
            shards = shards_of(lengths, c)
            most = block_tokens.max(axis=1)
            smallest, largest = shards.min(axis=1)[:, None], shards.max(axis=1)[:, None]
            over = most + smallest > self.cap
            pairs = np.nonzero(~over & (most + largest > self.cap))
            over[pairs] = (block_tokens[pairs[1]] + shards[pairs[0]] > self.cap).any(axis=1)
            hit = np.flatnonzero((starts < hi) & (starts + c > lo))
            if hit.size:
                h = int(hit[0])
                inside = (ranks[h] >= lo) & (ranks[h] < hi)
                at = np.where(inside, ranks[h] - lo, 0)
                held = np.where(inside, after[:, at], block_loads[h])  # (items, c)
                peak[:, h] = (held + times[:, 0 if which is None else h][:, None]).max(axis=1)
                held_tokens = np.where(inside, after_tokens[:, at], block_tokens[h])
                # a group's own block is no move for its members (their peak there only rounds lower)
                over[:, h] = (held_tokens + shards > self.cap).any(axis=1) | (c == hi - lo > 1)
            peak[over] = math.inf
            least = np.argmin(peak, axis=1)
            found = zip(peak[np.arange(items.size), least].tolist(), starts[least].tolist())
            best = [(value, start, c) if value < kept[0] else kept for (value, start), kept in zip(found, best)]
        return best

    def _times(self, items: np.ndarray, c: int) -> np.ndarray:
        """`_time` of each of `items` at degree c, a row each; those not yet computed in one call, at every split
        degree (element-wise, the same numbers)."""
        missing = items[~self.timed[items]]
        if missing.size:
            self._timed(missing)
        return self.item_times[items, self.column[c]]

    def _timed(self, items: np.ndarray) -> None:
        """Compute the times of `items` at every split degree, inside a node and across."""
        degrees = np.array(self.split_degrees)
        shape = (items.size, degrees.size, 2)
        lengths = np.broadcast_to(self.problem.lengths[items][:, None, None], shape)
        self.item_times[items] = self.spec.item_times(self.problem.cost, lengths,
                                                      np.broadcast_to(degrees[:, None], shape), np.array([True, False]))
        self.timed[items] = True

    def _group_moves(self, rank: int):
        """Moves of the items of `rank`'s group (all at once, `_weighed`; an item alone in its group by `blocks`,
        its own block left free), and its widening."""
        members = np.flatnonzero((self.degree > 1) & (self.start <= rank) & (rank < self.start + self.degree))
        s, c = int(self.start[members[0]]), int(self.degree[members[0]])
        group = np.arange(s, s + c)
        if members.size == 1:  # it may rejoin its own block, left free
            item = int(members[0])
            after, after_tokens = self.loads.copy(), self.tokens.copy()
            after[group] -= self.times[item]
            after_tokens[group] -= self.shard(item, c)
            peak, new_s, new_c = self.blocks(item, after, after_tokens, (s, c))
            out = [(max(peak, after[group].max()), item, new_s, new_c)]
        else:
            after = self.loads[group] - self.times[members][:, None]  # (members, c): the group's loads without each
            after_tokens = self.tokens[group] - shards_of(self.problem.lengths[members], c)
            blocks = self._weighed(s, members, after, after_tokens)
            out = [(max(peak, down), item, new_s, new_c)
                   for item, down, (peak, new_s, new_c) in zip(members.tolist(), after.max(axis=1).tolist(), blocks)]
        wide = 2 * c
        base = s - s % wide
        if wide in self.spec.degrees and base + wide <= self.problem.num_ranks and (
                self.spec.allow_inter_node or within_node(base, wide, self.gpus_per_node)):
            other = base + c if s == base else base  # the other half of the wide block
            if not self.in_group[other: other + c].any():
                out.append(self._widen(members, group, base, wide))
        return out

    def _widen(self, members: np.ndarray, group: np.ndarray, base: int, wide: int):
        """The move that runs the whole group on the aligned block of twice its degree."""
        start, degree, times, tokens = moved = (self.start.copy(), self.degree.copy(), self.times.copy(),
                                                self.tokens.copy())
        self._move(members, base, wide, moved)
        peak = math.inf if (tokens[base: base + wide] > self.cap).any() \
            else float(self._sums(base, base + wide, start, degree, times).max())
        return peak, -2, base, wide

    def _move(self, items: np.ndarray, start: int, degree: int, accounts: tuple) -> None:
        """Move `items` onto the block (start, degree) in `accounts` = (starts, degrees, item times, rank tokens),
        in place: the tokens updated exactly (integers), the items' times as `rank_accounts` counts them."""
        starts, degrees, times, tokens = accounts
        for item in items.tolist():
            s, c = int(starts[item]), int(degrees[item])
            tokens[s: s + c] -= self.shard(item, c)
            tokens[start: start + degree] += self.shard(item, degree)
            times[item] = self.problem.item_costs[item] if degree == 1 \
                else self._time(item, degree)[0 if within_node(start, degree, self.gpus_per_node) else 1]
        starts[items], degrees[items] = start, degree

    @staticmethod
    def _sums(lo: int, hi: int, start: np.ndarray, degree: np.ndarray, times: np.ndarray) -> np.ndarray:
        """The loads of ranks lo..hi - 1 as `rank_accounts` sums them (in item order, so the same floats): over
        the items on those ranks only."""
        touch = np.flatnonzero((start < hi) & (start + degree > lo))
        items, ranks = rank_pairs(start[touch], degree[touch])
        keep = (ranks >= lo) & (ranks < hi)
        return np.bincount(ranks[keep] - lo, weights=times[touch[items[keep]]], minlength=hi - lo)

    def blocks_near(self, level: float) -> int:
        """The fewest moves that can take every rank below `level`: a move lowers the ranks of one block only (its
        rank's, or its group's), so one per rank at `level` or above in no group, and one per group holding such a
        rank."""
        hot = self.loads >= level
        count = int(np.count_nonzero(hot & ~self.in_group))
        for c, starts in self.group_starts.items():
            if starts.size:
                count += int(np.count_nonzero(hot[starts[:, None] + np.arange(c)].any(axis=1)))
        return count

    def apply(self, item: int, start: int, degree: int, rank: int) -> None:
        """Make the move, in place: the loads of the ranks it changes summed again, the groups updated where one
        empties or opens."""
        if item == -2:  # widen the group of `rank`
            items = np.flatnonzero((self.degree > 1) & (self.start <= rank) & (rank < self.start + self.degree))
        else:
            items = np.array([item])
        before = (int(self.start[items[0]]), int(self.degree[items[0]]))  # a widened group's members share it
        self._move(items, start, degree, (self.start, self.degree, self.times, self.tokens))
        for s, c in (before, (start, degree)):
            self.loads[s: s + c] = self._sums(s, s + c, self.start, self.degree, self.times)
        sizes = self.group_sizes
        if before[1] > 1:
            sizes[before] -= items.size
            if not sizes[before]:
                self._regroup(before, False)
        if degree > 1:
            if (start, degree) not in sizes:
                self._regroup((start, degree), True)
            sizes[start, degree] = sizes.get((start, degree), 0) + items.size

    def _regroup(self, block: tuple[int, int], opened: bool) -> None:
        """The group on `block` opened (no item there yet) or emptied: the ranks' groups as `refresh` finds them
        again, updated here, and the blocks to find again."""
        s, c = block
        self.in_group[s: s + c] = opened
        starts = self.group_starts[c]
        at = int(np.searchsorted(starts, s))
        self.group_starts[c] = np.insert(starts, at, s) if opened else np.delete(starts, at)
        if not opened:
            del self.group_sizes[block]
        self.starts = {}


def _stuck(problem: Problem, spec: ContextParallel, start: np.ndarray, degree: np.ndarray, accounts: tuple) -> bool:
    """Whether no move of the search lowers the makespan rank, so the search would stop before its first move.
    Every move takes an item of that rank (an unsplit one of some time, or one of its group's) onto a block holding a
    rank of another block or a free one, so at least the least load, and adds the item's time at the block's degree
    (a widening: on its group's other half); only an item alone in its group may go to a narrower block inside its
    own ranks, which then hold their load without it.  Where even the least of those (inside a node or across, tokens
    ignored) is not below the makespan by STUCK_SLACK, no candidate is (allgiant, D = 512 x 16: 50 of 80 searches,
    none of which made a move, each building the search's tables for one round of candidates)."""
    loads, _, times = accounts
    rank = int(np.argmax(loads))
    on = np.flatnonzero((start <= rank) & (rank < start + degree) & ((degree > 1) | (times > 0)))
    degrees = np.array(spec.degrees, dtype=np.int64)
    shape = (on.size, degrees.size)
    both = (2, *shape)  # inside a node, then across: one call (its cost is mostly per call, on a rank's few items)
    least = np.minimum(*spec.item_times(problem.cost, np.broadcast_to(problem.lengths[on][:, None], both),
                                        np.broadcast_to(degrees, both),
                                        np.broadcast_to(np.array([True, False])[:, None, None], both)))
    floor = np.full(shape, float(loads.min()))
    floor[np.ix_(degree[on] > 1, degrees == 1)] = math.inf  # a split item moves to a block of a split degree
    alone = on[degree[on] > 1] if np.count_nonzero(degree[on] > 1) == 1 else on[:0]
    if alone.size:  # onto a narrower block inside its own ranks, without it there
        s, c = int(start[alone[0]]), int(degree[alone[0]])
        inside = np.flatnonzero(on == alone[0])[0]
        floor[inside, degrees < c] = np.minimum(floor[inside, degrees < c], (loads[s: s + c] - times[alone[0]]).min())
    return bool((floor + least >= float(loads[rank]) * (1 + STUCK_SLACK)).all())


def improve(problem: Problem, spec: ContextParallel, gpus_per_node: int, start: np.ndarray, degree: np.ndarray,
            bound: float, item_time: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, tuple]:
    """The (block starts, degrees) after the local search from the given plan, and their `rank_accounts`
    (`item_time`: the plan's item times, where the caller has them: the layout's table, `planner.laid_out`).
    A plan at the bound, or one no move can lower (`_stuck`), is returned as it is, `start` and `degree` themselves
    (the search would stop before its first move)."""
    accounts = rank_accounts(problem, spec, gpus_per_node, start, degree, item_time)
    if float(accounts[0].max()) <= bound or _stuck(problem, spec, start, degree, accounts):
        return start, degree, accounts
    state = _State(problem, spec, gpus_per_node, start, degree, bound, accounts)
    for made in range(MAX_MOVES):
        rank = int(np.argmax(state.loads))
        makespan = float(state.loads[rank])
        if makespan <= bound or state.blocks_near(makespan * (1 - MAKESPAN_SLACK)) > MAX_MOVES - made:
            break
        moves = state.candidates(rank)
        if not moves:
            break
        peak, item, new_start, new_degree = min(moves, key=lambda move: move[0])
        if not peak < makespan:
            break
        state.apply(item, new_start, new_degree, rank)
    return state.start, state.degree, (state.loads, state.tokens, state.times)

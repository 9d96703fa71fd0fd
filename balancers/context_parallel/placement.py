"""The split layout's placement engine: the groups of every degree on aligned blocks, first fit by peak.

`place_groups` lays out items degree by degree from the largest, longest time first (`planner.py` states the
rule); `Placement` holds the per-rank loads and tokens, the groups' blocks, and every degree's candidates
kept sorted by peak load, so best fit and the least-loaded block are binary searches, not scans.  Items that find
no block within the target overflow (`overflow.py`); degree 1's items that spill onto groups are laid out in runs
that defer the ranks' accounts (`spill.py`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import operator

import numpy as np

from ..problem import Problem
from .blocks import free_blocks
from .overflow import Overflows
from .spec import ContextParallel
from .spill import SpillRun, least_run
from .timetable import TimeTable

LOAD, POSITION = operator.itemgetter(0), operator.itemgetter(1)
"""A candidate's key's load and position: binary searches by load alone compare floats, not (load, position)
tuples."""

BEST_FIT_PROBES = 4
"""Candidates a search may find short of tokens, their bounds having left it open (those surely short are
parked, see `Placement._search`), before it scans them all at once (numpy)."""


class Placement(Overflows):
    """Per-rank loads and tokens of the layout being built, and its groups' blocks.

    Every degree's open groups (and every rank, while degree 1 is laid out) are kept sorted by their
    peak load, so best fit and the least-loaded block are binary searches, not scans; an item placed on
    a rank of a group raises that group's peak.  Loads and tokens are lists: an item touches a few ranks,
    where numpy's per-call cost exceeds the work (the scans of all candidates make arrays of them)."""

    def __init__(self, problem: Problem, spec: ContextParallel, gpus_per_node: int, times: TimeTable,
                 target: float):
        self.problem, self.spec, self.gpus_per_node = problem, spec, gpus_per_node
        self.times, self.target = times, target
        self.cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
        self.ranks = np.arange(problem.num_ranks)
        self.loads = [0.0] * problem.num_ranks  # a group's ranks': its peak until degree 1 is laid out (`_settle`)
        self.tokens = [0] * problem.num_ranks
        self.taken = np.zeros(problem.num_ranks, dtype=bool)  # ranks of a group of the degrees laid out before
        self.groups: dict[int, list[int]] = {}  # degree -> block starts, opened in order
        self.free: list[int] = []  # free blocks of the degree being laid out, ascending
        self.placed: dict[int, tuple[int, int]] = {}  # item -> (block start, degree)
        self.overflow = False
        self.degree = 0  # the degree being laid out
        # degree -> (load, position) of its candidates, ascending
        self.keys: dict[int, list[tuple[float, int]] | None] = {}
        self.position: dict[int, int] = {}  # a group's block start -> its position among its degree's groups
        self.peak: dict[int, float] = {}  # a group's block start -> the most load of its ranks (its key's load)
        # rank -> its group's (degree, start), written once degree 1 is laid out (`_settle`)
        self.group_of: list[tuple[int, int] | None] = [None] * problem.num_ranks
        # a group's block start -> (lower, upper) bounds on the tokens of its fullest rank
        self.most_tokens: dict[int, tuple[int, int]] = {}
        # degree -> heap of (-room, key position) of the candidates out of its keys: a search for a shard of
        # more than `room` tokens found them short (the room a rank has, or the most a group's fullest may)
        self.parked: dict[int, list[tuple[int, int]]] = {}
        self.parked_ids: set[tuple[int, int]] = set()  # (degree, key position) of the parked candidates
        self.newly_parked: list[tuple[int, tuple[float, int]]] = []  # (degree, key) found short by this search

    def open(self, degree: int) -> None:
        """Start laying out `degree`: its free blocks (the larger degrees' groups are placed)."""
        if self.groups.get(self.degree):  # the groups of the degree laid out so far take their ranks
            self.taken[self._ranks(self.degree, self.groups[self.degree])] = True
        self.free = free_blocks(self.taken, degree, self.gpus_per_node, self.spec.allow_inter_node).tolist()[::-1]
        if degree == 1:
            self._settle()
        self.degree = degree
        self.groups.setdefault(degree, [])
        self.keys[degree] = None if degree == 1 else []  # every rank's key, made when an item needs them
        self.parked[degree] = []

    def _candidates(self, item: int, degree: int, starts: np.ndarray):
        """(peak load of each block after the item, whether its shards' tokens fit; the item's time
        and its shards' tokens)."""
        if self.degree > 1:
            self._settle()
        time = self.times.time(item, degree)
        shard = np.array(self.times.shard(item, degree)[0], dtype=np.int64)
        loads, tokens = np.array(self.loads), np.array(self.tokens, dtype=np.int64)
        if degree == 1:
            return loads[starts] + time, tokens[starts] + shard[0] <= self.cap, time, shard
        blocks = starts[:, None] + np.arange(degree)
        return loads[blocks].max(axis=1) + time, (tokens[blocks] + shard <= self.cap).all(axis=1), time, shard

    def _token_room(self, degree: int, start: int, need: tuple[list[int], int, int]) -> bool:
        """Whether shards `need` = (tokens, most, fewest) fit the budget on the block at `start`: decided by
        bounds on the group's fullest rank where they settle it, else rank by rank."""
        shard, most, fewest = need
        if self.cap == math.inf:
            return True
        if degree == 1:
            return self.tokens[start] + most <= self.cap
        low, high = self.most_tokens[start]
        if high + most <= self.cap:
            return True
        if low + fewest > self.cap:
            return False
        return all(held + add <= self.cap for held, add in zip(self.tokens[start: start + degree], shard))

    def _least_fitting(self, degree: int, lo: int, hi: int, need: tuple, probes: list[int]) -> int | None:
        """The least position among keys[lo:hi] of `degree` whose shards' tokens fit (-1: none); None
        once more than BEST_FIT_PROBES candidates not surely short (those are parked) failed the check.
        Positions ascend along a run of equal loads, so each run's first fit is its least."""
        keys, best, least = self.keys[degree], -1, self._least_need(degree, need)
        groups = None if degree == 1 else self.groups[degree]
        while lo < hi:
            load = keys[lo][0]  # the run of equal loads from lo: all up to hi where the last has that load
            end = hi if keys[hi - 1][0] == load else bisect.bisect_right(keys, load, lo, hi, key=LOAD)
            for k in range(lo, end):  # not a slice: a run of equal loads may be every rank
                load, position = keys[k]
                start = position if groups is None else groups[position]
                if self._token_room(degree, start, need):
                    best = position if best < 0 else min(best, position)
                    break
                if self._room(degree, start) < least:  # short of any shard this size
                    self.newly_parked.append((degree, (load, position)))
                    continue
                probes[0] += 1
                if probes[0] > BEST_FIT_PROBES:
                    return None
            lo = end
        return best

    def _room(self, degree: int, start: int) -> int | float:
        """The most tokens a shard may add on the block at `start` (of a group: its fullest rank's, at most)."""
        return self.cap - (self.tokens[start] if degree == 1 else self.most_tokens[start][0])

    @staticmethod
    def _least_need(degree: int, need: tuple[list[int], int, int]) -> int:
        """Tokens of shards `need` that a candidate with less `_room` surely lacks."""
        return need[1] if degree == 1 else need[2]

    def _search(self, degree: int, time: float, need: tuple, fullest: bool) -> tuple[float, int] | None:
        """(peak, position) of the candidate of `degree` whose tokens fit with the highest peak within
        the target (`fullest`) or else the lowest peak, the least position among equal peaks; (inf, -1)
        when none fits; None when too many failed the token check (then scan them all).

        Candidates found surely short of tokens leave the keys (parked, by their room) until a search
        for shards they may hold: tokens only grow, so they lack room for any larger shard meanwhile."""
        parked = self.parked[degree]
        if parked:
            least = self._least_need(degree, need)
            while parked and self.parked_holds(degree, least):
                _, position = heapq.heappop(parked)
                self.parked_ids.discard((degree, position))
                bisect.insort(self.keys[degree], self._key(degree, self._start(degree, position)))
        found = self._scan(degree, time, need, fullest)
        if self.newly_parked:
            for c, key in self.newly_parked:
                keys = self.keys[c]
                del keys[bisect.bisect_left(keys, key)]
                heapq.heappush(parked, (-self._room(c, self._start(c, key[1])), key[1]))
                self.parked_ids.add((c, key[1]))
            self.newly_parked = []
        return found

    def _scan(self, degree: int, time: float, need: tuple, fullest: bool) -> tuple[float, int] | None:
        """`_search` over the keys.  Peaks rise with loads, so a run of equal peaks is a run of equal
        loads, widened where float rounding gives another load the same peak."""
        keys, target, probes = self.keys[degree], self.target, [0]
        if fullest and (not keys or keys[0][0] + time > target):  # no candidate within the target
            return math.inf, -1
        if fullest:
            end = self._within(keys, time)
            while end > 0:
                peak = keys[end - 1][0] + time
                start = end - 1  # the run of equal peaks ending at end: often that one candidate
                while start > 0 and keys[start - 1][0] + time == peak:
                    start = bisect.bisect_left(keys, keys[start - 1][0], 0, start, key=LOAD)
                position = self._least_fitting(degree, start, end, need, probes)
                if position is None or position >= 0:
                    return None if position is None else (peak, position)
                end = start
            return math.inf, -1
        found = self.least_loaded(degree, time, need)
        if found is not None:
            return found
        if keys and self._room(degree, self._start(degree, keys[0][1])) < self._least_need(degree, need):
            self._park_short(degree, need)  # the walk from the least-loaded would park them one by one
        begin = 0
        while begin < len(keys):
            peak = keys[begin][0] + time
            stop = bisect.bisect_right(keys, keys[begin][0], begin, key=LOAD)
            while stop < len(keys) and keys[stop][0] + time == peak:
                stop = bisect.bisect_right(keys, keys[stop][0], stop, key=LOAD)
            position = self._least_fitting(degree, begin, stop, need, probes)
            if position is None or position >= 0:
                return None if position is None else (peak, position)
            begin = stop
        return math.inf, -1

    def parked_holds(self, degree: int, least: int) -> bool:
        """Whether a candidate of `degree` parked has `least` tokens of room (may hold a shard that size).  Each was
        filed with its room when parked, which only shrinks since (tokens only grow): the top's is brought up to date
        while its filed room is enough, until it holds."""
        parked, groups = self.parked[degree], self.groups[degree]
        while parked and -parked[0][0] >= least:
            filed, position = parked[0]
            room = self.cap - (self.tokens[position] if degree == 1 else self.most_tokens[groups[position]][0])
            if room == -filed:  # `_room` of the candidate
                return True
            heapq.heapreplace(parked, (-room, position))
        return False

    def _park_short(self, degree: int, need: tuple) -> None:
        """Park at once every candidate of `degree` surely short of shards `need` (`_search`): allgiant, D = 512 x 16,
        searches for a giant's least-loaded rank with room parked all 512 ranks one by one, ~8 ms each."""
        keys, parked, least = self.keys[degree], self.parked[degree], self._least_need(degree, need)
        if degree == 1:  # `_room` of each
            rooms = [self.cap - self.tokens[position] for _, position in keys]
        else:
            groups = self.groups[degree]
            rooms = [self.cap - self.most_tokens[groups[position]][0] for _, position in keys]
        short = [(-room, key[1]) for key, room in zip(keys, rooms) if room < least]
        parked += short
        self.parked_ids.update(zip(itertools.repeat(degree), map(POSITION, short)))
        heapq.heapify(parked)
        keys[:] = [key for key, room in zip(keys, rooms) if room >= least]

    def least_loaded(self, degree: int, time: float, need: tuple) -> tuple[float, int] | None:
        """(peak, position) of the least-loaded candidate of `degree` where it decides `_scan(..., fullest=False)`:
        it has token room and no other load has its peak with `time` added (None elsewhere, or no candidate)."""
        keys = self.keys[degree]
        if not keys:
            return None
        load, position = keys[0]
        begin = least_run(keys)
        if (begin == len(keys) or keys[begin][0] + time != load + time) \
                and self._token_room(degree, self._start(degree, position), need):
            return load + time, position
        return None

    def _within(self, keys: list[tuple[float, int]], time: float) -> int:
        """How many of `keys` stay within the target with `time` added (float rounding included)."""
        target = self.target
        end, count = bisect.bisect_right(keys, target - time, key=LOAD), len(keys)
        while end < count and keys[end][0] + time <= target:
            end += 1
        while end > 0 and keys[end - 1][0] + time > target:
            end -= 1
        return end

    def _quick(self, degree: int, time: float, need: tuple) -> int | None:
        """`_search(..., fullest=True)` where it is decided by the keys alone (None elsewhere), as the index of its
        candidate in the keys of `degree` (-1: none within the target): nothing parked that the item may bring back,
        and no candidate within the target, or those with the highest peak within it are one run of equal loads (no
        other load has that peak, float rounding included) whose first, the least position, has token room."""
        parked, keys = self.parked[degree], self.keys[degree]
        if parked and self.parked_holds(degree, self._least_need(degree, need)):
            return None
        end = self._within(keys, time) if keys and keys[0][0] + time <= self.target else 0
        if not end:
            return -1
        load, first = keys[end - 1][0], end - 1
        if first and keys[first - 1][0] + time == load + time:  # a run of equal peaks
            first = bisect.bisect_left(keys, load, 0, first, key=LOAD)
            if first and keys[first - 1][0] + time == load + time:  # another load has that peak (float rounding)
                return None
        if degree == 1:  # `_token_room` of a rank
            return first if self.tokens[keys[first][1]] + need[1] <= self.cap else None
        return first if self._token_room(degree, self.groups[degree][keys[first][1]], need) else None

    def _start(self, degree: int, position: int) -> int:
        return position if degree == 1 else self.groups[degree][position]

    def place(self, item: int, degree: int, time: float, need: tuple[list[int], int, int]) -> int:
        """Block start for `item` at `degree` (its time and shards there, `TimeTable.time` and `shard`): best fit
        (the fullest block with room under the target) among the degree's open blocks (every rank for degree 1),
        else the next free block, else the least-loaded block of the degree or a larger one (-1: no token room)."""
        if self.keys[degree] is None:
            loads = np.array(self.loads)
            order = np.lexsort((self.ranks, loads))
            self.keys[degree] = list(zip(loads[order].tolist(), order.tolist()))
        index = self._quick(degree, time, need)
        if index is not None and index >= 0:
            return self._add(item, self._start(degree, self.keys[degree][index][1]), degree, time, need, index)
        found = (math.inf, -1) if index == -1 else self._search(degree, time, need, fullest=True)
        if found is None:  # many candidates short of tokens: all at once
            starts = self.ranks if degree == 1 else np.array(self.groups[degree], dtype=np.int64)
            peak, fits, _, _ = self._candidates(item, degree, starts)
            room = fits & (peak <= self.target)
            found = (0.0, int(np.argmax(np.where(room, peak, -math.inf)))) if room.any() else (math.inf, -1)
        if found[1] >= 0:
            return self._add(item, self._start(degree, found[1]), degree, time, need)
        if degree > 1 and self.free:
            return self._open(item, degree, time, need)
        return self._overflow(item, degree, time, need)

    def open_run(self, items: list[int], times: np.ndarray, needs: list[tuple[list[int], int, int]]) -> int:
        """Lay out at once the leading run of `items` (of the degree being laid out, above 1, longest `times` first;
        `needs` their shards) that `place` would each put alone on the next free block, and return its length: while
        nothing of the degree is parked and free blocks are left, an item opens a group where its time on the
        least-loaded one (the previous item's, or one opened before) exceeds the target, as `_quick` finds it
        (peaks rise with loads, so no candidate then lies within the target)."""
        degree, keys = self.degree, self.keys[self.degree]
        if degree == 1 or self.parked[degree] or not self.free or not items:
            return 0
        least = np.minimum(keys[0][0] if keys else math.inf, np.concatenate(([math.inf], times[:-1])))
        alone = least + times > self.target  # float sums as `_quick`'s, one item at a time
        count = min(len(self.free), len(items) if alone.all() else int(np.argmin(alone)))
        starts = self.free[: -count - 1: -1]
        del self.free[len(self.free) - count:]
        for item, start, time, need in zip(items, starts, times[:count].tolist(), needs):
            keys.append((time, self._seat(item, start, degree, time, need)))
        keys.sort()
        return count

    def spill_run(self) -> SpillRun | None:
        """The items of degree 1 (the degree being laid out) that spill onto groups, put where `place` would while
        the ranks' accounts wait (`spill.py`); None lays out every item through `place` (the tests' references)."""
        return SpillRun(self)

    def _open(self, item: int, degree: int, time: float, need: tuple[list[int], int, int]) -> int:
        """Put `item` alone on the next free block of `degree` (the degree being laid out), a new group."""
        start = self.free.pop()
        bisect.insort(self.keys[degree], (time, self._seat(item, start, degree, time, need)))
        return start

    def _seat(self, item: int, start: int, degree: int, time: float, need: tuple[list[int], int, int]) -> int:
        """A new group of `degree` on the free block at `start`, `item` alone on it: its ranks held nothing, so they
        now carry the item's time and shards.  The group's index (its key's, which the caller files)."""
        opened = self.groups[degree]
        index = len(opened)
        self.position[start], self.peak[start] = index, time
        opened.append(start)
        self.tokens[start: start + degree] = need[0]
        self.most_tokens[start] = (need[1], need[1])
        self.placed[item] = (start, degree)
        return index

    def _settle(self) -> None:
        """Write every group's peak as its ranks' loads, and its ranks' group: while the degrees above 1 are laid
        out, every item on a group adds its time to each of its ranks (in the same order as to its peak), so only
        the peak is kept, and only degree 1 asks a rank's group."""
        for c, opened in self.groups.items():
            if c > 1 and opened:
                for start in opened:
                    self.loads[start: start + c] = [self.peak[start]] * c
                    self.group_of[start: start + c] = [(c, start)] * c

    @staticmethod
    def _ranks(degree: int, starts: list[int]) -> np.ndarray:
        """The ranks of the blocks of `degree` at `starts`, a row each."""
        return np.array(starts, dtype=np.int64)[:, None] + np.arange(degree)

    def _key(self, degree: int, start: int) -> tuple[float, int]:
        """The sort key of a candidate: (load, rank) of a rank, (peak, position) of a group."""
        return (self.loads[start], start) if degree == 1 else (self.peak[start], self.position[start])

    def _refresh(self, degree: int, start: int) -> None:
        """Bring the group of `degree` at `start` up to date after its ranks took an item while degree 1 is laid
        out: its peak (and key, unless parked) and its fullest rank's tokens, exactly."""
        keys, position = self.keys[degree], self.position[start]
        parked = (degree, position) in self.parked_ids
        if not parked:
            del keys[bisect.bisect_left(keys, (self.peak[start], position))]
        self.peak[start] = max(self.loads[start: start + degree])
        held = max(self.tokens[start: start + degree])
        self.most_tokens[start] = (held, held)
        if not parked:
            bisect.insort(keys, (self.peak[start], position))

    def _grow(self, item: int, start: int, degree: int, index: int, time: float,
              need: tuple[list[int], int, int]) -> int:
        """`_add` of `item` (its `time` and shards `need`) to the group of `degree` at `start`, whose key is
        keys[degree][index], while a degree above 1 is laid out: its ranks' tokens and the bounds on its fullest rank's
        (it gains between its shards' fewest and most), its peak and key.  The block start."""
        shard, most, fewest = need
        self.tokens[start: start + degree] = map(operator.add, self.tokens[start: start + degree], shard)
        low, high = self.most_tokens[start]
        self.most_tokens[start] = (low + fewest, high + most)
        self.peak[start] += time  # every rank gained `time`, and rounding keeps their order
        keys = self.keys[degree]
        del keys[index]
        bisect.insort(keys, (self.peak[start], self.position[start]))
        self.placed[item] = (start, degree)
        return start

    def _add(self, item: int, start: int, degree: int, time: float, need: tuple[list[int], int, int],
             index: int | None = None) -> int:
        """Put the item (its shards `need` = (tokens, most, fewest)) on the block, and keep the candidates'
        keys sorted: the block's while its degree is laid out (and the bounds on its fullest rank: it
        gains between its shards' fewest and most tokens); while degree 1 is, the ranks' (unless parked),
        then their group's (`_refresh`).  `index`: the block's key's in the keys of `degree`, where known."""
        if self.degree > 1:  # a group a search found (never a parked one): only its key moves
            if index is None:
                index = bisect.bisect_left(self.keys[degree], (self.peak[start], self.position[start]))
            return self._grow(item, start, degree, index, time, need)
        shard, most, fewest = need
        if degree == 1:  # one rank: its key (unless parked) moves, then its group's
            load, keys = self.loads[start], self.keys[1]
            self.loads[start] = load + time
            self.tokens[start] += most
            if not (self.parked_ids and (1, start) in self.parked_ids):
                del keys[bisect.bisect_left(keys, (load, start)) if index is None else index]
                bisect.insort(keys, (load + time, start))
            if self.group_of[start] is not None:
                self._refresh(*self.group_of[start])
        else:
            parked = self.parked_ids
            ranks = [rank for rank in range(start, start + degree) if (1, rank) not in parked] if parked \
                else list(range(start, start + degree))
            before = [self.loads[rank] for rank in ranks]
            self.loads[start: start + degree] = [load + time for load in self.loads[start: start + degree]]
            self.tokens[start: start + degree] = map(operator.add, self.tokens[start: start + degree], shard)
            keys = self.keys[1]
            if ranks and before.count(before[0]) == len(ranks):  # one run of equal loads, adjacent in the keys
                first = bisect.bisect_left(keys, (before[0], ranks[0]))  # before and after (a rank between is theirs)
                del keys[first: first + len(ranks)]
                load = self.loads[ranks[0]]
                first = bisect.bisect_left(keys, (load, ranks[0]))
                keys[first: first] = [(load, rank) for rank in ranks]
            else:
                for rank, load in zip(ranks, before):
                    del keys[bisect.bisect_left(keys, (load, rank))]
                    bisect.insort(keys, (self.loads[rank], rank))
            group = self.group_of[start]
            if group is not None:
                self._refresh(*group)
        self.placed[item] = (start, degree)
        return start


def place_groups(problem: Problem, spec: ContextParallel, gpus_per_node: int, times: TimeTable, degree: np.ndarray,
                 long: np.ndarray, target: float,
                 layouts: dict | None = None) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """(block start of every laid-out item, -1 for the rest; every item's degree; whether some
    item found no block with room under the target), or None when one found no token room.

    Laid out: the split items and the unsplit `long` ones, degree by degree from the largest,
    longest time first; a degree-1 block is one rank.  `layouts` keeps each call's layout (None where it
    found no token room) per target, degrees and split items' times, with the unsplit items it laid out:
    a later call whose unsplit items start with those, in order and with the same times, goes on from it
    (it would lay them out the same way; `planner.laid_out` lays out the long items, then all items).
    """
    split = np.flatnonzero(degree > 1)
    unsplit = _by_time(long[degree[long] == 1], 1, times) if spec.degrees[0] == 1 else long[:0]
    key = layouts is not None and (target, degree.tobytes(), times.table[times.row[split]].tobytes())
    saved = layouts.pop(key, None) if key else None
    if saved is not None and np.array_equal(unsplit[:saved[1].size], saved[1]) \
            and times.table[times.row[saved[1]]].tobytes() == saved[2]:
        blocks, done = saved[0], saved[1].size
    else:
        blocks, done = Placement(problem, spec, gpus_per_node, times, target), 0
        for c in sorted(set(degree[split].tolist()), reverse=True) + [1] * (spec.degrees[0] == 1):
            blocks.open(c)
            if c > 1 and not _lay(blocks, _by_time(split[degree[split] == c], c, times), c):
                blocks = None
                break
    if blocks is not None:
        blocks.times = times
        if not _lay(blocks, unsplit[done:], 1):
            blocks = None
    if key:
        # not copied: nothing here changes it after this, and the one call that goes on from it pops it
        layouts[key] = (blocks, unsplit, times.table[times.row[unsplit]].tobytes())
    if blocks is None:
        return None
    start, degree = np.full(degree.size, -1, dtype=np.int64), degree.copy()
    items = np.fromiter(blocks.placed, dtype=np.int64, count=len(blocks.placed))
    pairs = np.fromiter(itertools.chain.from_iterable(blocks.placed.values()), dtype=np.int64, count=2 * items.size)
    start[items], degree[items] = pairs.reshape(-1, 2).T  # each (start, degree): not an array of tuples (3x slower)
    return start, degree, blocks.overflow


def _by_time(items: np.ndarray, degree: int, times: TimeTable) -> np.ndarray:
    """`items` by their time at `degree`, longest first (ties by index)."""
    return items[np.lexsort((items, -times(items, degree)))]


def _lay(blocks: Placement, items: np.ndarray, degree: int) -> bool:
    """Place `items` at `degree` in order (the degree opened); whether each found token room.  Their times and
    shards there are read from the table for all of them at once (none: a degree the table may not hold); those that
    open a group, overflow onto one of their degree alone (`overflow.py`) or spill onto one from degree 1 are laid
    out without `Placement.place`."""
    if not items.size:
        return True
    times, needs, items = blocks.times(items, degree), blocks.times.shards_of(items, degree), items.tolist()
    alone = blocks.open_run(items, times, needs)  # the run of items that each open a group, placed at once
    items, times, needs = items[alone:], times[alone:].tolist(), needs[alone:]
    if degree > 1:
        return blocks.lay_groups(items, times, needs)
    run = blocks.spill_run()
    if run is not None:
        return run.lay(items, times, needs)
    return all(blocks.place(item, 1, time, need) >= 0 for item, time, need in zip(items, times, needs))

"""Degree 1's items that spill onto groups, in runs: the placement's rank-level accounts wait until a search needs them.

While degree 1 is laid out (`placement.place_groups`), most long unsplit items find no rank within the target and
go to the least-loaded group of a larger degree (the long workload's T = 16k step: 14.8k of its 15.4k such items).
`Placement.place` keeps every rank's load and key exact after each of them; `SpillRun` puts such an item where
`place` would, keeping exact only what that choice reads (the groups' peaks and keys, the ranks' tokens), and brings
the rest up to date (`catch_up`) before `place` lays out an item it does not decide (or `fresh_run` a run of such
items onto the least-loaded ranks, one each, as `place` would: a degree-1 fast path of `place` kept here, beside the
loop that calls it, since placement.py is at the module cap):

- a group's ranks' loads: where they were equal, each took the same times in the same order, so each is its peak
  (an item onto a group whose ranks' loads differ, one of them having taken an item of degree 1, goes to `place`);
- the ranks' keys: one below its rank's load still shows that no rank takes the item within the target, and bounds
  the floor of degree 1 from below;
- a group's fullest rank's tokens: bounds (low, high) that grow by its shards' fewest and most, as `Placement._add`
  keeps them while a degree above 1 is laid out.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator


def least_run(keys: list[tuple[float, int]]) -> int:
    """How many of the sorted (load, position) `keys` (not empty) share the least load."""
    low = keys[0][0]
    return 1 if len(keys) == 1 or keys[1][0] != low else bisect.bisect_right(keys, (low, math.inf))


class SpillRun:
    """The items of degree 1 spilled onto groups since the rank-level accounts were last brought up to date."""

    def __init__(self, blocks):
        self.blocks = blocks
        # (degree, its column of the time table) of the degrees with groups: they open none while degree 1 is laid out
        self.degrees = [(c, blocks.times.column[c]) for c, opened in blocks.groups.items() if c > 1 and opened]
        self.touched: dict[int, tuple[int, float]] = {}  # group start -> (degree, its ranks' load before the run)

    def lay(self, items: list[int], times: list[float], needs: list[tuple[list[int], int, int]]) -> bool:
        """`place` each of `items` (of degree 1, their times and shards) in order but those `spill` puts and the runs
        `fresh_run` lays out, the accounts caught up before each `place`; whether each found token room."""
        rows = enumerate(zip(items, times, needs))
        for k, (item, time, need) in rows:
            spilled = self.spill(item, time, need)
            if spilled:
                continue
            if self.touched:
                self.catch_up()
            fresh = 0 if spilled is False else self.fresh_run(items, times, needs, k)
            if fresh:
                next(itertools.islice(rows, fresh - 1, fresh - 1), None)  # past the run's other items
            elif self.blocks.place(item, 1, time, need) < 0:
                return False
        self.catch_up()
        return True

    def fresh_run(self, items: list[int], times: list[float], needs: list[tuple[list[int], int, int]],
                  begin: int) -> int:
        """Lay out at once the run of `items` from `begin` that `place` would each put on the next of the least-loaded
        ranks (their loads equal, often empty ranks), and return its length (the accounts caught up, nothing of degree
        1 parked): where every rank above that load exceeds the target with the item (the previous item's rank, or
        one loaded before), the fullest rank within it is the least-loaded one of least index (`Placement._quick`),
        and the item moves it out of their run (long workload, T = 32k, seed 23: 5.1k of its 8.5k items of degree 1).
        Called only where `spill` answered None (some rank takes the first item within the target, none parked)."""
        blocks = self.blocks
        keys, target = blocks.keys[1], blocks.target
        low, equal = keys[0][0], least_run(keys)
        least = keys[equal][0] if equal < len(keys) else math.inf  # the least load above `low`
        cap, count, end, fresh = blocks.cap, 0, min(equal, len(items) - begin), []
        while count < end:
            time, most, rank = times[begin + count], needs[begin + count][1], keys[count][1]
            peak = low + time
            if not low < peak <= target < least + time or blocks.tokens[rank] + most > cap \
                    or blocks.group_of[rank] is not None:
                break
            blocks.loads[rank] = peak
            least = min(least, peak)
            blocks.tokens[rank] += most
            blocks.placed[items[begin + count]] = (rank, 1)
            fresh.append((peak, rank))
            count += 1
        if count:
            del keys[:count]
            keys += fresh
            keys.sort()
        return count

    def spill(self, item: int, time: float, need: tuple[list[int], int, int]) -> bool | None:
        """Put `item` (its `time` and shards `need` at degree 1) where `place` would and return True, where that is
        settled here: no rank takes it within the target, no parked candidate may hold it, one degree's least floor
        is below every other's and degree 1's, and that degree's least-loaded group decides (`Placement.least_loaded`),
        its ranks' loads equal.  Otherwise None where some rank takes it within the target and nothing of degree 1 is
        parked (the only case where `fresh_run` may lay it out), else False."""
        blocks = self.blocks
        ranks, parked = blocks.keys[1], blocks.parked[1]
        if ranks is None:  # the ranks' keys not made yet (`Placement.place` makes them)
            return False
        lowest = ranks[0][0] + time if ranks else math.inf  # degree 1's floor (inf: every rank parked)
        if lowest <= blocks.target:
            return None if ranks and not parked else False
        if parked and blocks.parked_holds(1, need[1]):
            return False
        row, least, second = blocks.times.listed[blocks.times.rows[item]], (math.inf, 0, 0.0), (math.inf, 0, 0.0)
        for c, column in self.degrees:
            parked, keys = blocks.parked[c], blocks.keys[c]
            if parked and blocks.parked_holds(c, blocks.times.shard(item, c)[2]):
                return False
            if keys:
                floor = (keys[0][0] + row[column], c, row[column])
                if floor < least:
                    least, second = floor, least
                elif floor < second:
                    second = floor
        peak, c, at = least
        if not peak < min(second[0], lowest):  # not one degree's alone (nor finite)
            return False
        shards = blocks.times.shard(item, c)
        found = blocks.least_loaded(c, at, shards)
        if found is None:
            return False
        keys, start = blocks.keys[c], blocks.groups[c][found[1]]
        if start not in self.touched:
            before = blocks.loads[start: start + c]
            if before.count(before[0]) < c:
                return False
            self.touched[start] = (c, before[0])
        blocks.tokens[start: start + c] = map(operator.add, blocks.tokens[start: start + c], shards[0])
        low, high = blocks.most_tokens[start]
        blocks.most_tokens[start] = (low + shards[2], high + shards[1])
        del keys[0]  # the least-loaded group's key: `least_loaded` found it first
        blocks.peak[start] += at  # every rank gained `at`, and rounding keeps their order
        bisect.insort(keys, (blocks.peak[start], found[1]))
        blocks.placed[item], blocks.overflow = (start, c), True
        return True

    def catch_up(self) -> None:
        """Bring the touched groups' ranks' loads and keys, and their fullest rank's tokens, up to date."""
        blocks, keys, moved = self.blocks, self.blocks.keys[1], []  # (position in keys, how many, load, first rank)
        every_key = not blocks.parked[1]  # no rank is parked: each has its key
        for start, (c, before) in self.touched.items():
            load = blocks.peak[start]
            blocks.loads[start: start + c] = [load] * c
            held = max(blocks.tokens[start: start + c])
            blocks.most_tokens[start] = (held, held)
            if every_key:  # one run of keys, adjacent (a rank between is the group's)
                moved.append((bisect.bisect_left(keys, (before, start)), c, load, start))
            else:
                moved += [(bisect.bisect_left(keys, (before, rank)), 1, load, rank) for rank in range(start, start + c)
                          if (1, rank) not in blocks.parked_ids]
        for position, count, load, first in moved:  # positions found while the keys were sorted
            keys[position: position + count] = zip([load] * count, range(first, first + count))
        if moved:
            keys.sort()
        self.touched.clear()

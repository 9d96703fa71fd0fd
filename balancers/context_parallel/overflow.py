"""The split layout's overflows: items that find no block within the target go to the least-loaded block with token
room of their degree or a larger one (`planner.py` states the rule; `placement.Placement` keeps the candidates).

Once a degree above 1 has no free block left, most of its items overflow (allgiant, D = 512 x 16: 7.1k of its ~35k
items of degree 4, the others open a group or fit one within the target), and most such overflows are decided by one
degree's least-loaded group (`Overflows._onto_least`, `_lowest` walks the others): `Overflows.lay_groups` puts those
there without `place`'s best-fit search.
"""

from __future__ import annotations

import math

import numpy as np


class Overflows:
    """`placement.Placement`'s overflows: the least-loaded block with room over its degree and the larger ones."""

    def lay_groups(self, items: list[int], times: list[float], needs: list[tuple[list[int], int, int]]) -> bool:
        """`place` each of `items` (of the degree being laid out, above 1; their times and shards) in order, but those
        that overflow where one degree's least-loaded group decides (`_onto_least`): no free block left, no group of
        the item's degree within the target with it (none parked may hold it: `_onto_least` sees a parked candidate
        that may in its floor); and those that `_quick` decides, which best fit puts on a group or onto the next free
        block.  Whether each found token room."""
        degree, keys, target, table = self.degree, self.keys[self.degree], self.target, self.times
        columns = [(c, table.column[c]) for c, opened in self.groups.items() if c > degree and opened]
        groups, parked = self.groups[degree], self.parked[degree]
        for item, time, need in zip(items, times, needs):
            within = keys and keys[0][0] + time <= target  # a group within the target with the item
            if not self.free and not within:
                row = table.listed[table.rows[item]]
                if self._onto_least(item, [(degree, time)] + [(c, row[k]) for c, k in columns],
                                    _shards(table, item, degree, need)) is not None:
                    continue
            else:  # a free block is left or a group within the target (`_quick` unless none is and none is parked)
                index = self._quick(degree, time, need) if within or parked else -1
                if index == -1:  # no group within the target: the next free block
                    self._open(item, degree, time, need)
                    continue
                if index is not None:
                    self._grow(item, groups[keys[index][1]], degree, index, time, need)
                    continue
            if self.place(item, degree, time, need) < 0:
                return False
        return True

    def _onto_least(self, item: int, degrees: list[tuple[int, float]], shards) -> int | None:
        """Where one of `degrees` ((degree, the item's time there) pairs, the item's own and the larger ones with
        groups) has the least floor (`_least_floor`) and its least-loaded candidate decides (`least_loaded`), put `item`
        there (`shards(c)`: its shards at degree c) and return its block start; else None."""
        least = self._least_floor(degrees, shards)
        if least is None:
            return None
        _, c, at = least
        need = shards(c)
        found = self.least_loaded(c, at, need)
        if found is None:
            return None
        self.overflow = True
        start = self._start(c, found[1])  # the least-loaded: the first key
        return self._grow(item, start, c, 0, at, need) if self.degree > 1 else self._add(item, start, c, at, need, 0)

    def _least_floor(self, degrees: list[tuple[int, float]], shards) -> tuple[float, int, float] | None:
        """(floor, degree, the item's time there) of the one of `degrees` ((degree, time) pairs) whose `_floor` is
        finite and below every other's; None where none is (a tie, or a parked candidate that may hold the item)."""
        least, second = (math.inf, 0, 0.0), math.inf
        for c, at in degrees:
            keys = self.keys[c]  # `_floor`, inline where nothing of the degree is parked
            floor = self._floor(c, at, shards)[0] if self.parked[c] else keys[0][0] + at if keys else math.inf
            if floor < least[0]:
                least, second = (floor, c, at), least[0]
            elif floor < second:
                second = floor
        return least if -math.inf < least[0] < second else None

    def _overflow(self, item: int, degree: int, time: float, need: tuple[list[int], int, int]) -> int:
        """Put `item` (its `time` and shards `need` at `degree`) on the least-loaded block of its degree or a
        larger one where its tokens fit (-1: none): no block has room under the target."""
        self.overflow = True
        shards = _shards(self.times, item, degree, need)
        degrees = [(c, time if c == degree else self.times.time(item, c)) for c, opened in self.groups.items()
                   if c >= degree and (c == 1 or opened)]
        start = self._onto_least(item, degrees, shards)
        if start is not None:
            return start
        floors = sorted((*self._floor(c, at, shards), at) for c, at in degrees)  # (floor, degree, time there)
        best = (math.inf, -1, 0, 0.0)
        for floor, c, at in floors:
            if floor > best[0]:  # this degree's search cannot find a lower peak, nor the next ones'
                break
            best = min(best, (*self._lowest(item, c, at, shards(c)), at))
        _, start, c, at = best
        if start < 0:
            return -1
        return self._add(item, start, c, at, shards(c))

    def _lowest(self, item: int, degree: int, time: float, need: tuple) -> tuple[float, int, int]:
        """(peak, block start, degree) of the least-loaded block of `degree` where the item (its `time` and shards
        `need` there) has token room, the least start among equal peaks; (inf, -1, degree) where none has."""
        found = self._search(degree, time, need, fullest=False)
        if found is None:  # many candidates short of tokens: all at once
            starts = self.ranks if degree == 1 else np.array(self.groups[degree], dtype=np.int64)
            peak, fits, _, _ = self._candidates(item, degree, starts)
            peak = np.where(fits, peak, math.inf)
            k = int(np.argmin(peak))
            return (float(peak[k]), int(starts[k]), degree) if peak[k] < math.inf else (math.inf, -1, degree)
        return (found[0], self._start(degree, found[1]), degree) if found[1] >= 0 else (math.inf, -1, degree)

    def _floor(self, degree: int, time: float, shards) -> tuple[float, int]:
        """(a lower bound on the peak `_search` finds for an item of `time` and shards `shards(degree)` at `degree`,
        the degree): the least key plus the time; -inf where a parked
        candidate may hold the item (the search brings it back), inf where no candidate is left."""
        if self.parked[degree] and self.parked_holds(degree, self._least_need(degree, shards(degree))):
            return -math.inf, degree
        keys = self.keys[degree]
        return (keys[0][0] + time if keys else math.inf), degree


def _shards(table, item: int, degree: int, need: tuple[list[int], int, int]):
    """The item's shards at a degree c (`TimeTable.shard`, made once per item and degree): `need` at `degree`."""
    return lambda c: need if c == degree else table.shard(item, c)

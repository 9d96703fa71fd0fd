"""The padded joint greedy where no cell fits and every empty cell is a rise (`greedy._PaddedRows.run`), its rises and
their fits taken a run of equal loads at a time from numpy-sorted progressions.

A filled cell's load with one more item is (count + 1) · its first cost, whatever the item, so each cell's loads to
come are a progression of its own (up to its room under T), and a micro-batch's filled cells take items in the order
of those loads, whatever the other micro-batches do.  With no fit left, the greedy's item rises the micro-batch whose
least next load is nearest its level (the first on ties) to that load, and then the cells of that load fit and take
one item each: the run of that load, lowest cell first (the rise, `_best_fit`'s tie, then `_take_fits`' order).  So
a micro-batch's runs come from its sorted progressions (`_Stream`), and a heap of the micro-batches' rises picks the
next: no Python work per item.  A rise is exact in floats (a cell's next load v = (c + 1) · cost is at most twice its
load c · cost <= the level L < v, so v - L is exact, Sterbenz): unequal loads never tie, as `_best_fit` allows.
It stops, leaving the item to `run`, before an item an empty cell could take or tie (its rise, cost - level, not
above the filled cells' least; or a fit of the run costing no more than an empty cell's level), an item an empty
micro-batch would win (`_Run`'s snapshot), or a run longer than the items left.  Original to orchmllm.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

CHUNK = 1024, 16384  # loads a micro-batch's progressions yield at a time (about): the first, doubling up to the last


class _Stream:
    """A micro-batch's cells (those with room for one more) and their loads to come, sorted by (load, cell) and cut
    into runs of one load (`values`; `starts` in `order`, and its end), generated a chunk of loads at a time
    (`extend`), a chunk twice the last: the loads a micro-batch takes are not known ahead."""

    def __init__(self, pairs: list, counts: np.ndarray, costs: np.ndarray, lengths: np.ndarray, cap: int, limit: int):
        self.cells = np.array([cell for _, cell in pairs], dtype=np.int64)
        self.first, self.cost = counts[self.cells], costs[self.cells]
        lengths = lengths[self.cells]
        room = np.where(lengths > 0, cap // np.maximum(lengths, 1) - self.first, limit)
        self.room = np.minimum(room, limit)  # loads each may take: count + 1 .. count + room
        self.made = np.zeros(len(pairs), dtype=np.int64)  # loads generated, each below `bound`
        self.bound = pairs[0][0] if pairs else 0.0
        self.values, self.starts, self.order = [], [0], []  # runs: load, first position in `order` (cells)
        self.taken, self.chunk = 0, CHUNK[0]  # runs taken

    def next_value(self, run: int) -> float | None:
        """The load of run `run` (generated where needed), None where the cells have no room for it."""
        while run >= len(self.values):
            if not self.extend():
                return None
        return self.values[run]

    def extend(self) -> bool:
        """The loads below a bound ~`chunk` loads higher, whole runs (every cell's loads below it); False: none left."""
        left = self.made < self.room
        if not left.any():
            return False
        with np.errstate(over="ignore", divide="ignore"):  # subnormal costs: their inverses' sum overflows, span 0
            span = self.chunk / float((1.0 / self.cost[left]).sum())
        self.chunk = min(2 * self.chunk, CHUNK[1])
        while True:
            bound = self.bound + span
            upto = np.clip(self._below(bound) - self.first, self.made, self.room)
            if (upto > self.made).any():
                break
            span = 2.0 * span if span > 0.0 else float(self.cost[left].max())
        size = upto - self.made
        index = np.repeat(np.arange(len(size)), size)
        offset = np.arange(index.size) - np.repeat(np.cumsum(size) - size, size)
        loads = (self.first[index] + self.made[index] + offset + 1).astype(np.float64) * self.cost[index]
        cells = self.cells[index]
        order = np.lexsort((cells, loads))
        loads, cells = loads[order], cells[order]
        starts = np.flatnonzero(np.concatenate(([True], loads[1:] != loads[:-1])))
        base = self.starts.pop()
        self.values += loads[starts].tolist()
        self.starts += (starts + base).tolist()
        self.order += cells.tolist()
        self.starts.append(len(self.order))
        self.made, self.bound = upto, bound
        return True

    def _below(self, bound: float) -> np.ndarray:
        """Per cell the largest multiplier j with j · cost < `bound` (float products, as the greedy computes them), at
        most its count + room."""
        top = self.first + self.room
        with np.errstate(over="ignore"):
            j = np.minimum(np.ceil(np.minimum(bound / self.cost, 2.0 ** 53)), top).astype(np.int64) - 1
        while True:  # the division's rounding: a step either way
            up = ((j + 1).astype(np.float64) * self.cost < bound) & (j < top)
            down = (j.astype(np.float64) * self.cost >= bound) & (j > 0)
            if not (up.any() or down.any()):
                return j
            j += up.astype(np.int64) - down

    def row(self, counts: np.ndarray, lengths: np.ndarray, cap: int) -> list:
        """The cells' sorted (load with one more item, cell) pairs at `counts`, those with room for one more."""
        counts = counts[self.cells]
        room = (counts + 1) * lengths[self.cells] <= cap
        loads, cells = (counts[room] + 1).astype(np.float64) * self.cost[room], self.cells[room]
        order = np.lexsort((cells, loads))
        return list(zip(loads[order].tolist(), cells[order].tolist()))


def take_runs(state, costs: list, at: int, positive: int) -> int:
    """Items `at`.. (before `positive`, costs > 0) placed as `state.run` would, no cell fitting and the first item's
    cost above every empty cell's level, up to the first rise it leaves to `run` (see the module); the position
    reached."""
    level, chosen = state.level, state.chosen
    counts, lengths = np.array(state.counts, dtype=np.int64), np.array(state.top_length, dtype=np.int64)
    costs_of, limit = np.array(state.top_cost), positive - at
    streams = {}  # made for a micro-batch once it is the heap's top: the keys are its row's least load
    heap = [(row[0][0] - level[m], m) for m, row in enumerate(state.rows) if row]
    heapq.heapify(heap)
    holds_empty, fresh_won = [cell >= 0 for cell in state.empty], state.fresh_won
    opened = max([level[m] for m, holds in enumerate(holds_empty) if holds], default=-math.inf)
    while heap:
        best, m = heap[0]
        stream = streams.get(m)
        if stream is None:
            stream = streams[m] = _Stream(state.rows[m], counts, costs_of, lengths, state.cap, limit)
            stream.next_value(0)
        run, starts, values = stream.taken, stream.starts, stream.values
        first, last = starts[run], starts[run + 1]
        end = at + last - first
        if end > positive or costs[end - 1] <= opened or costs[at] - opened <= best or (
                not fresh_won and best > costs[at]):
            break
        chosen += stream.order[first:last]
        at, level[m] = end, values[run]
        if holds_empty[m]:
            opened = max(opened, values[run])
        stream.taken = run = run + 1
        if run < len(values) or stream.next_value(run) is not None:
            heapq.heapreplace(heap, (values[run] - values[run - 1], m))
        else:
            heapq.heappop(heap)
    taken = [stream.order[:stream.starts[stream.taken]] for stream in streams.values() if stream.taken]
    if taken and at < len(costs):  # the counts and the rows after the runs taken (at the end no one reads them)
        counts += np.bincount(np.concatenate(taken), minlength=counts.size)
        state.counts[:] = counts.tolist()
        for m, stream in streams.items():
            if stream.taken:
                state.rows[m] = stream.row(counts, lengths, state.cap)
    return at

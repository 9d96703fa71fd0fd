"""Multiway largest differencing method (Karmarkar & Karp 1982; verl's balancer, unequal sizes).

minimise max(loads) where loads[r] = sum(cost[i] for i on r), by differencing:

    parts = [[cost[i]] + [0] * (D - 1) for i in items]        # one D-way partition each
    while len(parts) > 1:
        a, b = the two parts with the largest max - min
        parts.append(sorted(x + y for x, y in zip(sorted(a), sorted(b, reverse=True))))

Guarantee: none better than 2 - 1/D is known for D > 2 (Michiels et al. 2007), but on
instances with many items per rank the plan is typically much tighter than LPT's.

This implementation never builds the D-vectors the pseudocode implies for most parts:

- items wait in a stream sorted by cost, so every item inside a part is at least as
  large as every waiting one;
- a part of fewer than D items has one item per subset and difference = its largest
  item: joining two such parts is a union, joining a waiting item an append;
- a part of D subsets (a "full" part) takes a waiting item into its smallest subset.
  While the full part and the next waiting item stay the two largest, it keeps doing
  so, and that run is LPT on its subsets: it is placed a round at a time with numpy
  (`lpt.round_length`), stopping at the first item where another part or the next
  waiting item would have been chosen instead.  Where waiting items larger than its
  difference would form a new part first, that part (all of them, if fewer than D)
  joins it at once, each item into the next smallest subset, which is where the run's
  next LPT step puts it: the run goes on through them, so one round covers many joins;
- only two parts that together hold more than D subsets are paired densely.

Ties: a part beats a waiting item of equal difference (so a run of equal items joins one
part in a single step), an older part a newer one, and subsets tie by slot, so the plan is bit-identical everywhere.
Items are tracked by union-find: a subset is named after one of its items, and pairing subset b into a sets
parent[b] = a.

Memory cap: when the differencing plan overflows it, the capped LPT plan is returned
(or its InfeasibleError raised).  Padded problems are differenced on f(l), a surrogate
for count · f(max l); `padded` is the exact solver for them.
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np

from ..problem import KernelResult, Problem, rank_tokens
from . import lpt


def _positions(runs: list[range]) -> np.ndarray:
    """The stream positions in `runs` (disjoint ranges), ascending: O(runs) Python, not O(items).

    >>> _positions([range(7, 9), range(2, 5)]).tolist()
    [2, 3, 4, 7, 8]
    """
    if len(runs) == 1:
        return np.arange(runs[0].start, runs[0].stop)
    runs = sorted(runs, key=lambda run: run.start)
    starts = np.array([run.start for run in runs], dtype=np.int64)
    counts = np.array([len(run) for run in runs], dtype=np.int64)
    return np.repeat(starts - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))


class _Part:
    """A D-way partition: `items` (< D single-item subsets) or full `sums` by slot."""

    __slots__ = ("items", "count", "sums", "ids", "top")

    def __init__(self, items=None, top=None, sums=None, ids=None, count=0):
        self.items = items  # stream positions of its items as runs (ranges), any order, while not full
        self.count = count  # how many items (not full)
        self.sums = sums  # full: float64 subset sums by slot
        self.ids = ids  # full: int64 subset names (a stream position) by slot
        self.top = float(sums.max()) if top is None else top  # the largest subset sum

    def difference(self) -> float:
        return self.top if self.items is not None else self.top - float(self.sums.min())

    def ascending(self, num_ranks: int, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Subset sums and names by (sum, slot); empty subsets (name -1) first.

        `costs` are the stream's, descending by position, so later positions sort first.
        """
        if self.items is None:
            order = lpt.ranks_by_load(self.sums, False)
            return self.sums[order], self.ids[order]
        sums = np.zeros(num_ranks)
        ids = np.full(num_ranks, -1, dtype=np.int64)
        positions = _positions(self.items)[::-1]
        sums[num_ranks - positions.size:] = costs[positions]
        ids[num_ranks - positions.size:] = positions
        return sums, ids


def _with_items(items: list[range], count: int, top: float, num_ranks: int, costs: np.ndarray) -> _Part:
    part = _Part(items=items, top=top, count=count)
    if count < num_ranks:
        return part
    sums, ids = part.ascending(num_ranks, costs)
    return _Part(sums=sums, ids=ids)


def _combine(a: _Part, b: _Part, stream: "_Stream") -> _Part:
    """Pair a's largest subset with b's smallest, and so on."""
    num_ranks, costs, parent = stream.num_ranks, stream.costs, stream.parent
    if a.items is not None and b.items is not None and a.count + b.count <= num_ranks:
        large, small = (a, b) if a.count >= b.count else (b, a)
        large.items.extend(small.items)
        return _with_items(large.items, a.count + b.count, max(a.top, b.top), num_ranks, costs)
    if (a.items is None) != (b.items is None):
        # A part with p single items meets a full one: only the full part's p smallest
        # subsets change (the rest pair with empty subsets), so select just those.
        full, partial = (a, b) if a.items is None else (b, a)
        positions = _positions(partial.items)  # largest cost first
        slots = lpt.smallest_ranks(full.sums, positions.size, stream.integer)
        full.sums[slots] += costs[positions]
        parent[positions] = full.ids[slots]
        full.top = max(full.top, float(full.sums[slots].max()))
        return full
    sums_a, ids_a = a.ascending(num_ranks, costs)
    sums_b, ids_b = b.ascending(num_ranks, costs)
    sums_a, ids_a = sums_a[::-1], ids_a[::-1]
    both = (ids_a >= 0) & (ids_b >= 0)
    parent[ids_b[both]] = ids_a[both]
    return _Part(sums=sums_a + sums_b, ids=np.where(ids_a >= 0, ids_a, ids_b))


class _Stream:
    """Waiting items by cost, largest first, with the differencing state around them."""

    def __init__(self, costs: np.ndarray, num_ranks: int, order: np.ndarray | None = None):
        self.order = lpt.sorted_order(costs) if order is None else order
        self.costs = costs[self.order]
        self.negated = -self.costs  # ascending, for searchsorted
        self.size = costs.size
        self.next = 0
        self.num_ranks = num_ranks
        self.integer = lpt.integer_loads(costs, num_ranks)
        self.parent = np.arange(costs.size)

    def count_above(self, value: float) -> int:
        """Waiting items with cost > value."""
        return int(np.searchsorted(self.negated, -value, side="left")) - self.next

    def absorb(self, part: _Part, rival: float) -> _Part:
        """Give the next waiting item to `part`, then more while part and item stay the top two.

        `rival` is the largest difference among the other parts (-inf when none): an item
        is taken only while its cost exceeds rival (a part wins ties), the part's
        difference exceeds rival (the older part wins ties) and is at least the cost of
        the item after it.
        """
        stop = self.next + max(1, self.count_above(rival))
        if part.items is not None:
            return self._append(part, rival, stop)
        return self._absorb_full(part, rival, stop)

    def _append(self, part: _Part, rival: float, stop: int) -> _Part:
        largest = part.top
        # The difference of a part with free subsets is its largest item, at least any
        # waiting cost: it keeps the lead while it exceeds the rival, until it is full.
        stop = min(stop, self.next + self.num_ranks - part.count)
        if largest <= rival:
            stop = self.next + 1
        last = part.items[-1]
        if last.stop == self.next:  # one run
            part.items[-1] = range(last.start, stop)
        else:
            part.items.append(range(self.next, stop))
        count, self.next = part.count + stop - self.next, stop
        return _with_items(part.items, count, largest, self.num_ranks, self.costs)

    def _absorb_full(self, part: _Part, rival: float, stop: int) -> _Part:
        sums, first, window = part.sums, self.next, 256
        decides = first + 1  # the next item the run decides on: past the items of a part it joins
        while self.next < stop:
            position = self.next
            # Runs are often short: select a window of the smallest subsets, doubled
            # whenever a round fills it.
            ranks = lpt.smallest_ranks(sums, min(self.num_ranks, stop - position, window), self.integer)
            loads = sums[ranks]
            chunk = self.costs[position: position + ranks.size]
            placed = lpt.round_length(loads, ranks, chunk, self.integer)
            topped = loads[:placed] + chunk[:placed]
            difference = np.maximum.accumulate(np.concatenate(([part.top], topped[:-1]))) - loads[:placed]
            following = np.full(placed, -np.inf)
            tail = self.costs[position + 1: position + 1 + placed]
            following[: tail.size] = tail
            keeps = (difference >= following) & (difference > rival)
            keeps[0] |= position == first
            failed = np.flatnonzero(~keeps)
            ended, decides = self._run_end(failed, difference, rival, position, decides)
            failed = failed[:0] if ended is None else np.array([ended])
            if failed.size:
                placed = int(failed[0])
            self.parent[position: position + placed] = part.ids[ranks[:placed]]
            sums[ranks[:placed]] = topped[:placed]
            part.top = max(part.top, float(topped[:placed].max())) if placed else part.top
            self.next += placed
            if failed.size:
                break
            window *= 2 if placed == ranks.size else 1
        return part

    def _run_end(self, failed: np.ndarray, difference: np.ndarray, rival: float, position: int,
                  decides: int) -> tuple[int | None, int]:
        """Where the run stops in this round (None: it goes on), and the next item it decides on.

        The part takes item k while its difference d > rival and d >= the cost of item k + 1
        (`keeps`).  Where only the second fails, items k, k + 1, ... of cost > d form a new
        part, which takes every such item (at most D) and then joins this one: each of its
        items, larger than d, goes to the next smallest subset, as the next LPT step of the run
        would place it.  So the run goes on past those items unless they are D (a full part
        that joins no one at once) or d <= rival.
        """
        spread = difference[failed]
        # items from each failed one on that cost more than its difference: the part they would form
        counts = (np.searchsorted(self.negated, -spread, side="left") - position - failed).tolist()
        failed, spread = failed.tolist(), spread.tolist()
        at = bisect.bisect_left(failed, decides - position)  # items of a joining part decide nothing
        while at < len(failed):
            k = failed[at]
            if spread[at] <= rival or counts[at] >= self.num_ranks:
                return k, decides
            decides = position + k + counts[at]
            at = bisect.bisect_left(failed, decides - position, at + 1)
        return None, decides


def differencing(costs: np.ndarray, num_ranks: int, order: np.ndarray | None = None) -> np.ndarray:
    """Largest differencing assignment of additive costs to `num_ranks` >= 2 ranks; `order`:
    `sorted_order(costs)` when the caller has it (a problem's `cost_order`).

    Items of cost 0 (last in the order) change no load: they are differenced apart from the others and dealt
    round-robin over the ranks by (item count, rank), fewest first.  Differenced among themselves every part ties
    at difference 0 and each took one item per join (O(n · D): 2.9 s at 2560 × 32 zero-length items; probe22 P22-01).
    """
    order = lpt.sorted_order(costs) if order is None else order
    cut = int(np.searchsorted(-costs[order], 0.0, side="left"))  # positive costs first: the index of the first 0
    if cut == costs.size:
        return _differenced(costs, num_ranks, order)
    assignment = np.empty(costs.size, dtype=np.int64)
    counts = np.zeros(num_ranks, dtype=np.int64)
    if cut:
        positive = order[:cut]
        assignment[positive] = _differenced(costs[positive], num_ranks, np.arange(cut))
        counts = np.bincount(assignment[positive], minlength=num_ranks)
    dealt = np.lexsort((np.arange(num_ranks), counts))
    assignment[order[cut:]] = dealt[np.arange(costs.size - cut) % num_ranks]
    return assignment


def _differenced(costs: np.ndarray, num_ranks: int, order: np.ndarray) -> np.ndarray:
    stream = _Stream(costs, num_ranks, order)
    n = stream.size
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    heap: list[tuple[float, int, _Part]] = []  # (-difference, age, part)
    age = 0

    def pop_largest() -> _Part | None:
        """The part with the largest difference, or None when the next waiting item is larger."""
        if stream.next < n and (not heap or stream.costs[stream.next] > -heap[0][0]):
            return None
        return heapq.heappop(heap)[2]

    while stream.next < n or len(heap) > 1:
        first = pop_largest()
        if first is None:
            stream.next += 1
        second = pop_largest()
        if first is None and second is None:
            position = stream.next - 1
            stream.next += 1
            merged = _with_items([range(position, position + 2)], 2, float(stream.costs[position]), num_ranks,
                                 stream.costs)
        elif first is None or second is None:
            part = second if first is None else first
            if first is None:
                stream.next -= 1
            merged = stream.absorb(part, -heap[0][0] if heap else -np.inf)
        else:
            merged = _combine(first, second, stream)
        heapq.heappush(heap, (-merged.difference(), age, merged))
        age += 1
    final = heap[0][2]
    names = _positions(final.items) if final.items is not None else final.ids
    parent = find_roots(stream.parent)
    rank_of_name = np.zeros(n, dtype=np.int64)
    rank_of_name[np.asarray(names, dtype=np.int64)] = np.arange(len(names))
    assignment = np.empty(n, dtype=np.int64)
    assignment[stream.order] = rank_of_name[parent]
    return assignment


def find_roots(parent: np.ndarray) -> np.ndarray:
    """Every element's root in a union-find forest of parent pointers (a root points to itself),
    by pointer jumping: O(n log depth) numpy work.

    >>> find_roots(np.array([0, 0, 1, 2, 4])).tolist()
    [0, 0, 0, 0, 4]
    """
    while True:
        grand = parent[parent]
        if np.array_equal(grand, parent):
            return grand
        parent = grand


def solve(problem: Problem, lpt_plan: np.ndarray | None = None) -> KernelResult:
    """KK kernel; falls back to the capped LPT plan when the differencing plan overflows a cap
    (`lpt_plan`: that plan where the caller has it)."""
    if problem.num_ranks == 1:
        assignment = np.zeros(problem.num_items, dtype=np.int64)
    else:
        assignment = differencing(problem.item_costs, problem.num_ranks, problem.cost_order)
    cap = problem.max_tokens_per_rank
    if cap is not None and rank_tokens(problem, assignment).max() > cap:
        return lpt.solve(problem) if lpt_plan is None else KernelResult(lpt_plan)
    return KernelResult(assignment)

"""Plain-code references of the LPT (plain and capped) and Karmarkar–Karp kernels, of the
communication-aware deal and its rounds of full fixes, and of the micro-batch cells' group
deal, best-fit packing and search step, for tests and same-run baselines.

minimise max(loads) where loads[r] = sum(cost[i] for i on r), the textbook way, in pure
Python: slow (O(n log D) heap steps; O(n · D log D) for differencing on full D-vectors),
but with the tie rules of `lpt`, `karmarkar_karp`, `locality_deal`, `group_deal` and `tight_cells`, so the fast
kernels must reach exactly what these reach (the tests assert it; the benchmarks time
them as baselines).
"""

from __future__ import annotations

import bisect
import heapq

import numpy as np


def heap_lpt(costs: np.ndarray, num_ranks: int) -> np.ndarray:
    """The textbook LPT loop: largest cost first (ties by index) onto the least-loaded rank
    (ties by rank); returns the assignment."""
    order = np.lexsort((np.arange(costs.size), -costs))
    heap = [(0.0, rank) for rank in range(num_ranks)]
    assignment = np.empty(costs.size, dtype=np.int64)
    for item in order.tolist():
        load, rank = heapq.heappop(heap)
        assignment[item] = rank
        heapq.heappush(heap, (load + float(costs[item]), rank))
    return assignment


def capped_lpt(costs: np.ndarray, lengths: np.ndarray, num_ranks: int, cap: int) -> np.ndarray | None:
    """LPT under a token cap, by scanning: largest cost first (ties by index) onto the least-loaded
    rank with room (ties by rank); returns the assignment, or None when an item finds no room."""
    loads = np.zeros(num_ranks)
    tokens = np.zeros(num_ranks, dtype=np.int64)
    assignment = np.empty(costs.size, dtype=np.int64)
    for item in np.lexsort((np.arange(costs.size), -costs)).tolist():
        room = np.flatnonzero(tokens + lengths[item] <= cap)
        if room.size == 0:
            return None
        rank = int(room[np.argmin(loads[room])])
        assignment[item] = rank
        loads[rank] += costs[item]
        tokens[rank] += lengths[item]
    return assignment


def dense_kk(costs: np.ndarray, num_ranks: int) -> list[float]:
    """Largest differencing on full D-vectors with `karmarkar_karp`'s tie rules (waiting items
    by cost then index, parts before waiting items of equal difference, older parts first);
    returns the rank loads, ascending."""
    order = sorted(range(costs.size), key=lambda i: (-costs[i], i))
    heap = [(-float(costs[i]), 1, k, [float(costs[i])] + [0.0] * (num_ranks - 1))
            for k, i in enumerate(order)]
    heapq.heapify(heap)
    age = 0
    while len(heap) > 1:
        first, second = heapq.heappop(heap)[-1], heapq.heappop(heap)[-1]
        merged = sorted(x + y for x, y in zip(sorted(first, reverse=True), sorted(second)))
        heapq.heappush(heap, (-(merged[-1] - merged[0]), 0, age, merged))
        age += 1
    return sorted(heap[0][-1])


def locality_first_phases(costs: np.ndarray, lengths: np.ndarray, sources: np.ndarray, num_ranks: int,
                          gpus_per_node: int, target: float, cap: float, window: int) -> np.ndarray:
    """The plain code of `locality_deal`'s three phases; returns the destinations (-1: unplaced).

    Keep home item by item, deal each node's left-over items to its least-loaded ranks node
    by node, then deal what is left to the least-loaded ranks of all (an LPT round when a
    deal keeps nothing); `cap` is math.inf when there is none, `window` the items a node's
    round deals (DEAL_WINDOW · gpus_per_node).
    """
    deal = _PlainDeal(costs, lengths, num_ranks, target, cap)
    order = sorted(range(costs.size), key=lambda i: (-costs[i], i))
    for item in order:
        if deal.fits(item, int(sources[item])):
            deal.put(item, int(sources[item]))
    for node in range(num_ranks // gpus_per_node):
        left = [i for i in order if deal.destinations[i] < 0 and sources[i] // gpus_per_node == node]
        deal.take_in_node(left, range(node * gpus_per_node, (node + 1) * gpus_per_node), window)
    deal.take_anywhere([i for i in order if deal.destinations[i] < 0], window // gpus_per_node)
    return np.array(deal.destinations)


class _PlainDeal:
    """Loads, tokens and destinations of `locality_first_phases`, with its deal steps."""

    def __init__(self, costs, lengths, num_ranks: int, target: float, cap: float):
        self.costs, self.lengths, self.num_ranks, self.target, self.cap = costs, lengths, num_ranks, target, cap
        self.loads, self.tokens = [0.0] * num_ranks, [0] * num_ranks
        self.destinations = [-1] * costs.size

    def put(self, item, rank):
        self.destinations[item] = rank
        self.loads[rank] += self.costs[item]
        self.tokens[rank] += self.lengths[item]

    def fits(self, item, rank):
        return self.loads[rank] + self.costs[item] <= self.target and self.tokens[rank] + self.lengths[item] <= self.cap

    def deal(self, items, ranks, per_rank):
        """Items dealt round robin to ranks; per rank, the prefix of its deal that fits."""
        margin = per_rank * np.finfo(np.float64).eps * self.target
        kept, sums = [], {r: (self.loads[r], self.tokens[r]) for r in ranks}
        for k, item in enumerate(items[:per_rank * len(ranks)]):
            rank = ranks[k % len(ranks)]
            if sums[rank] is None:  # the rank's deal stopped
                continue
            load, held = sums[rank][0] + self.costs[item], sums[rank][1] + self.lengths[item]
            sums[rank] = (load, held) if load <= self.target - margin and held <= self.cap else None
            if sums[rank] is not None:
                kept.append((item, rank))
        return kept

    def take_in_node(self, left, node_ranks, window):
        """Deal a node's left-over items (cost order) to its least-loaded ranks, round by round."""
        costs, loads = self.costs, self.loads
        while left:
            ranks = sorted(node_ranks, key=lambda r: (loads[r], r))
            while left and costs[left[0]] > self.target - loads[ranks[0]]:
                left.pop(0)  # fits no rank of the node, now or later
            if not left:
                break
            roomy = max(1, sum(loads[r] + costs[left[0]] <= self.target for r in ranks))
            kept = self.deal(left[:window], ranks[:roomy], window)
            # the node keeps the deal's longest prefix that fits
            count = next((k for k, (item, _) in enumerate(kept) if item != left[k]), len(kept))
            for item, rank in kept[:count]:
                self.put(item, rank)
            if count == 0:  # the least-loaded rank lacks token room: the least-loaded rank that fits
                fitting = [r for r in ranks if self.fits(left[0], r)]
                if fitting:
                    self.put(left[0], fitting[0])
                count = 1
            left = left[count:]

    def take_anywhere(self, waiting, per_rank):
        """Deal what is left to the least-loaded ranks of all; an LPT round when a deal keeps nothing."""
        costs, lengths, loads, tokens, target, cap = (self.costs, self.lengths, self.loads, self.tokens, self.target,
                                                      self.cap)
        while waiting:
            ranks = sorted(range(self.num_ranks), key=lambda r: (loads[r], r))
            roomy = [r for r in ranks if loads[r] + costs[waiting[0]] <= target]
            kept = self.deal(waiting, roomy, per_rank) if roomy else []
            if kept:
                for item, rank in kept:
                    self.put(item, rank)
                waiting = [i for i in waiting if self.destinations[i] < 0]
                continue
            chunk = ranks[:len(waiting)]  # an LPT round
            decided = [self.fits(item, rank) for item, rank in zip(waiting, chunk)]
            lead = 0
            while (lead < len(chunk) and costs[waiting[lead]] > target - loads[chunk[0]]
                   and tokens[chunk[lead]] + lengths[waiting[lead]] <= cap):
                lead += 1
            decided[:lead] = [True] * lead
            if not decided[0]:
                chunk[0] = min((r for r in ranks if tokens[r] + lengths[waiting[0]] <= cap),
                               key=lambda r: (loads[r], r))
                decided = [True] + [d and r != chunk[0] for d, r in zip(decided[1:], chunk[1:])]
            for item, rank, placed in zip(waiting, chunk, decided):
                if placed:
                    self.put(item, rank)
            waiting = [i for i in waiting if self.destinations[i] < 0]


def best_fit_cells(lengths: np.ndarray, num_cells: int, cap: int) -> np.ndarray | None:
    """Best-fit decreasing on a sorted list of (room, cell): every item, longest first (ties by
    index), to the cell with the least room that still takes it (ties by cell); returns the
    cells, or None when an item finds no room (`microbatch_cells.tight_cells`'s rule)."""
    rooms = [(cap, cell) for cell in range(num_cells)]
    cell_of = np.empty(lengths.size, dtype=np.int64)
    for item in np.lexsort((np.arange(lengths.size), -lengths)).tolist():
        length = int(lengths[item])
        where = bisect.bisect_left(rooms, (length, -1))
        if where == len(rooms):
            return None
        room, cell = rooms.pop(where)
        cell_of[item] = cell
        bisect.insort(rooms, (room - length, cell))
    return cell_of


def cell_best_change(costs: np.ndarray, lengths: np.ndarray, cell_of: np.ndarray, num_ranks: int,
                     num_microbatches: int, cap: int, cell: int) -> tuple[float, int, int, int]:
    """The best move or swap out of `cell` (m·D + r) among M micro-batches of D cells (`microbatch_search`'s step:
    the change of Σ_m max_r load): every item i of the cell (cost descending, ties by index), moved to every other
    cell b (by index), then swapped with every item j outside it (by index); in the cell's micro-batch the change is
    max(its other cells' max, the cell's new load, b's new load) - the cell's load, elsewhere max(its other cells'
    max, the cell's new load) - the cell's load + how far b's new load passes b's micro-batch's max; tokens within
    `cap`; (change, item, target cell, swapped item or -1) of the first strict minimum below 0, else
    (0.0, -1, -1, -1)."""
    num_cells = num_ranks * num_microbatches
    loads = np.bincount(cell_of, weights=costs, minlength=num_cells).tolist()  # summed in item order
    costs, lengths, cell_of = costs.tolist(), lengths.tolist(), cell_of.tolist()
    room = [cap] * num_cells
    for length, at in zip(lengths, cell_of):
        room[at] -= length
    load, home = loads[cell], range(cell - cell % num_ranks, cell - cell % num_ranks + num_ranks)
    level = [max(loads[b - b % num_ranks:b - b % num_ranks + num_ranks]) for b in range(num_cells)]

    def excluded(target):  # the most loaded cell of the micro-batch that neither changes, 0 at least
        return max([0.0] + [loads[c] for c in home if c not in (cell, target)])

    def change(target, moved):  # moved: the cost leaving the cell (net of what comes back)
        if target in home:
            return max(excluded(target), load - moved, loads[target] + moved) - load
        return max(excluded(-1), load - moved) - load + max(loads[target] + moved - level[target], 0.0)

    best = (0.0, -1, -1, -1)
    members = sorted((i for i in range(len(costs)) if cell_of[i] == cell), key=lambda i: (-costs[i], i))
    for item in members:
        cost, length = costs[item], lengths[item]
        for target in range(num_cells):
            if target != cell and room[target] >= length and change(target, cost) < best[0]:
                best = (change(target, cost), item, target, -1)
        for other in range(len(costs)):
            target, delta, shift = cell_of[other], cost - costs[other], length - lengths[other]
            if (target != cell and delta > 0 and room[target] >= shift and room[cell] >= -shift
                    and change(target, delta) < best[0]):
                best = (change(target, delta), item, target, other)
    return best


def group_deal(costs: np.ndarray, lengths: np.ndarray, groups: np.ndarray, cells_per_group: int,
               loads: np.ndarray, tokens: np.ndarray, limit: float, cap: float, items: np.ndarray,
               least_loaded: bool) -> np.ndarray:
    """The plain code of `group_deal.deal_in_groups`; returns the destinations (-1: not dealt or
    left over).

    Each item of `items`, largest first (ties by index), goes to a cell of its group (cells
    g·G .. g·G + G - 1) with cost room (limit - load) and token room (cap - tokens) for it:
    the roomiest (ties by cell) when `least_loaded`, else the first; none: it is left over.
    """
    room = [limit - float(load) for load in loads]
    token_room = [cap - float(held) for held in tokens]
    destinations = [-1] * costs.size
    for item in sorted(items.tolist(), key=lambda i: (-costs[i], i)):
        first = int(groups[item]) * cells_per_group
        fitting = [c for c in range(first, first + cells_per_group)
                   if costs[item] <= room[c] and lengths[item] <= token_room[c]]
        if fitting:
            cell = max(fitting, key=lambda c: (room[c], -c)) if least_loaded else fitting[0]
            room[cell] -= float(costs[item])
            token_room[cell] -= float(lengths[item])
            destinations[item] = cell
    return np.array(destinations, dtype=np.int64)


def full_fixes_round(costs: np.ndarray, loads: np.ndarray, target: float, items: np.ndarray, item_rank: np.ndarray,
                     partner: np.ndarray, partner_rank: np.ndarray, ranks: np.ndarray) -> tuple[list, list]:
    """One round of full fixes of `locality_repair` (no cap), in plain loops: row k offers moving
    `items[k]` off its over-target rank `item_rank[k]` by a swap with `partner[k, c]` (or a move,
    -1) on `partner_rank[k, c]`.  Until no rank has a candidate left, every rank not yet changed
    takes its best valid one (smallest delta, then row, then column) on a partner rank not yet
    changed, the ranks most loaded first (`ranks` order) winning a partner rank they share.
    Returns the fixes (item, partner rank, partner item, item rank) in the order taken and the
    ranks without any valid candidate."""
    valid = {}
    for row, item in enumerate(items.tolist()):
        rank = int(item_rank[row])
        for column in range(partner.shape[1]):
            other, other_rank = int(partner[row, column]), int(partner_rank[row, column])
            delta = float(costs[item]) - (float(costs[other]) if other >= 0 else 0.0)
            if (other_rank != rank and delta > 0 and loads[rank] - delta <= target
                    and loads[other_rank] + delta <= target):
                valid[row, column] = delta
    hopeless = sorted(set(ranks.tolist()) - {int(item_rank[row]) for row, _ in valid})
    position = {rank: k for k, rank in enumerate(ranks.tolist())}
    changed, fixes = set(), []
    while True:
        best = {}
        for (row, column), delta in valid.items():
            rank, other_rank = int(item_rank[row]), int(partner_rank[row, column])
            if rank not in changed and other_rank not in changed:
                best[rank] = min(best.get(rank, (np.inf,)), (delta, row, column))
        if not best:
            return fixes, hopeless
        taken = set()
        for rank in sorted(best, key=position.get):
            _, row, column = best[rank]
            other_rank = int(partner_rank[row, column])
            if other_rank not in taken:
                taken.add(other_rank)
                changed.add(rank)
                fixes.append((int(items[row]), other_rank, int(partner[row, column]), rank))
        changed |= taken

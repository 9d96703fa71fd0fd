"""The first three phases of communication-aware balancing: keep home, take in node, take anywhere.

    every rank keeps its own items, largest first, each one that still fits under target
    the rest, largest first, per node: dealt round robin to the node's least-loaded ranks
        that have room (DEAL_WINDOW · gpus_per_node items per node per round), while each
        fits its rank
    what no rank of its node takes: dealt the same way to the least-loaded ranks of all
        (an LPT round, k-th largest -> k-th least loaded, when nothing fits)

Each phase works on a `PartialPlan` in vectorised rounds that make exactly the choices of
these loops (`orchmllm.balancers.kernels.reference.locality_first_phases` is the plain code).
"""

from __future__ import annotations

import functools

import numpy as np

from ..kernels.lpt import ranks_by_load, smallest_ranks
from .partial_plan import PartialPlan, node_of, runs
from .token_bound import _deal, _resort, _token_bound_rounds

DEAL_WINDOW = 4  # a round deals DEAL_WINDOW · gpus_per_node items per node (DEAL_WINDOW · h over all ranks)


class NoRoom(Exception):
    """The deal found no rank with room, or gave up (`take_anywhere`'s `max_lpt_rounds`); the caller
    falls back."""


def _by_segment(state: PartialPlan, segments: np.ndarray, candidates: np.ndarray):
    """Candidates grouped by segment, largest first (ties by index) within one; `segments` holds
    each candidate's segment.

    Returns (keys, cost_ranks, starts, ends, segments): keys = segment << state.rank_bits | cost rank,
    sorted (`PartialPlan.group_keys`); cost_ranks[k] the cost rank of keys[k] (its item
    state.item_of_rank[cost_ranks[k]]); segment segments[s] spans keys[starts[s]:ends[s]], found by
    one binary search per segment up to the largest, not by passes over the keys.
    """
    keys = state.group_keys(segments, candidates)
    bits = state.rank_bits
    count = int(keys[-1] >> bits) + 1 if keys.size else 0
    bounds = np.append(np.searchsorted(keys, (np.arange(count, dtype=np.int64) << bits).astype(keys.dtype)), keys.size)
    present = np.flatnonzero(bounds[1:] > bounds[:-1])
    return keys, keys & ((1 << bits) - 1), bounds[present], bounds[present + 1], present


def _first_fitting(state: PartialPlan, keys: np.ndarray, segments: np.ndarray, pointer: np.ndarray,
                   room: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per segment, the first key at or after `pointer` whose item's cost is at most `room` (`ends`, the
    segment's end, where none is)."""
    if state.uniform:  # one cost: the item at `pointer` fits, or none does
        return np.where(state.sorted_costs[0] <= room, pointer, ends)
    first_fitting_rank = np.searchsorted(state.negated_sorted_costs, -room, side="left")
    needles = (segments.astype(np.int64) << state.rank_bits) + first_fitting_rank
    return np.maximum(np.searchsorted(keys, needles.astype(keys.dtype, copy=False)), pointer)


def _prefix_sums(values: np.ndarray) -> np.ndarray:
    """0, then the running sums of `values` (written in place of a concatenated copy)."""
    sums = np.zeros(values.size + 1)
    np.cumsum(values, out=sums[1:])
    return sums


def _last_multiple(cost: float, bounds: np.ndarray, most: int) -> np.ndarray:
    """Per bound, the largest j in [-1, most] with j · cost <= bound (-1 below 0): `np.searchsorted` of the
    bounds in the prefix sums j · cost (exact: `PartialPlan.exact_cost`), side right, less one.  Rounding is
    monotone and integers below 2**53 are floats, so the rounded quotient's floor is j or j + 1: the exact
    product settles it."""
    last = np.clip(np.floor(bounds / cost), -1, most).astype(np.int64)
    last -= (last >= 0) & (last * cost > bounds)
    return last


def selection(items: np.ndarray | None) -> slice | np.ndarray:
    """How a phase reads its `items` (ascending distinct indices, None: all) from the item arrays: a slice where
    they are one run of consecutive indices (views: the fill's items but its filler, where every item costs the
    same), else the indices themselves.

    >>> selection(None), selection(np.array([3, 4, 5])), selection(np.array([3, 5])).tolist()
    (slice(None, None, None), slice(3, 6, None), [3, 5])
    """
    if items is None:
        return slice(None)
    if items.size and int(items[-1]) - int(items[0]) == items.size - 1:
        return slice(int(items[0]), int(items[-1]) + 1)
    return items


def keep_home(state: PartialPlan, sources: np.ndarray, items: np.ndarray | None = None) -> None:
    """Every rank keeps its own items (`items`, ascending, default all), largest first, each one
    that still fits.

    A rank whose items all fit keeps them at once (their summed cost a hair short of the
    target, so that no order of summation lets one through that the item-by-item test
    would refuse).  The others go in rounds: each keeps at once the run of its next
    items that fit together (by prefix sums of cost and tokens, with the same margin)
    from the first one that fits, so rounds number about the items a rank skips, not the
    items it keeps.
    """
    num_ranks = state.loads.size
    select = selection(items)
    homes = sources[select]
    one_cost = state.exact_cost  # every sum of these costs exact: a count of items times the cost
    if one_cost is None:
        costs = state.costs[select] if isinstance(select, slice) else state.costs_of(items)
        totals = np.bincount(homes, weights=costs, minlength=num_ranks)
    else:
        totals = np.bincount(homes, minlength=num_ranks) * one_cost
    margin = homes.size * np.finfo(np.float64).eps * float(totals.sum())  # bounds any summation's rounding
    whole = state.loads + totals <= state.target - margin
    if state.cap < np.inf:
        lengths = state.lengths[select]
        token_totals = np.bincount(homes, weights=lengths, minlength=num_ranks)
        whole &= state.tokens + token_totals <= state.cap
        state.tokens[whole] += token_totals[whole]
    state.loads[whole] += totals[whole]
    stays = whole[homes]
    rest = np.flatnonzero(~stays)
    if isinstance(select, slice):
        np.copyto(state.destinations[select], homes, where=stays)
        rest += select.start or 0
    else:
        state.destinations[items[stays]] = homes[stays]
        rest = items[rest]
    rest_homes = sources[rest]
    if one_cost is not None and state.cap == np.inf and _kept_in_counts(state, rest, rest_homes, margin):
        return
    keys, cost_rank, pointer, ends, ranks = _by_segment(state, rest_homes, rest)
    cost_sums = None  # the j-th of one cost is j · cost: not stored
    if one_cost is None:
        cost_sums = _prefix_sums(state.sorted_costs[:cost_rank.size] if state.uniform
                                 else state.sorted_costs[cost_rank])
    token_sums = _prefix_sums(state.lengths[state.item_of_rank[cost_rank]]) if state.cap < np.inf else None
    while ranks.size:
        room = state.target - state.loads[ranks]
        position = _first_fitting(state, keys, ranks, pointer, room, ends)
        alive = position < ends
        ranks, position, ends, room = ranks[alive], position[alive], ends[alive], room[alive]
        if cost_sums is None:
            run_end = _last_multiple(one_cost, position * one_cost + room - margin, cost_rank.size)
        else:
            run_end = np.searchsorted(cost_sums, cost_sums[position] + room - margin, side="right") - 1
        if token_sums is not None:
            token_room = state.cap - state.tokens[ranks]
            run_end = np.minimum(
                run_end, np.searchsorted(token_sums, token_sums[position] + token_room, side="right") - 1)
        first = state.item_of_rank[cost_rank[position]]
        run_end = np.minimum(np.maximum(run_end, position + state.fits(first, ranks)), ends)
        count = run_end - position
        kept = cost_rank[np.repeat(run_end - count.cumsum(), count) + np.arange(count.sum())]
        state.put_runs(state.items_ranked(kept), np.repeat(ranks, count), state.ranked_costs(kept))
        pointer = np.maximum(run_end, position + 1)
        left = pointer < ends
        ranks, pointer, ends = ranks[left], pointer[left], ends[left]



def _kept_in_counts(state: PartialPlan, rest: np.ndarray, homes: np.ndarray, margin: float) -> bool:
    """`keep_home`'s rounds over the items `rest` (ascending; `homes` theirs) where every item costs the same, every
    sum of costs is exact (`PartialPlan.exact_cost`) and no cap binds: the same rounds in counts per rank, at the
    same places in the keys (home, index) and with the same loads, but without the keys.  A rank then keeps the first
    of its items; a round that keeps none moves past one item (rounding), and where the rank keeps one after that,
    nothing is done (False): the caller makes the rounds on the keys.  The kept items are read off the runs of
    equal homes (a sample's frames share theirs): a few thousand runs, not a sort of 10^5 keys."""
    cost, num_ranks = state.exact_cost, state.loads.size
    run_start = np.concatenate(([0], np.flatnonzero(homes[1:] != homes[:-1]) + 1)) if rest.size else rest
    run_length, run_home = np.diff(run_start, append=rest.size), homes[run_start]
    counts = np.bincount(run_home, weights=run_length, minlength=num_ranks).astype(np.int64)
    ranks = np.flatnonzero(counts)
    ends = np.cumsum(counts[ranks])
    first = ends - counts[ranks]  # each rank's first key
    loads, kept = state.loads.copy(), np.zeros(ranks.size, dtype=np.int64)
    live, pointer = np.arange(ranks.size), first
    while live.size:
        room = state.target - loads[ranks[live]]
        position = np.where(cost <= room, pointer, ends[live])  # `_first_fitting` of one cost
        alive = position < ends[live]
        live, position, room = live[alive], position[alive], room[alive]
        on = ranks[live]
        run_end = _last_multiple(cost, position * cost + room - margin, rest.size)
        run_end = np.minimum(np.maximum(run_end, position + (loads[on] + cost <= state.target)), ends[live])
        count = run_end - position
        if np.any((count > 0) & (position != first[live] + kept[live])):
            return False
        kept[live] += count
        loads[on] += count * cost  # `put_runs`' bincount of count copies: exact
        pointer = np.maximum(run_end, position + 1)
        left = pointer < ends[live]
        live, pointer = live[left], pointer[left]
    state.loads[:] = loads
    kept_of, first_of = np.zeros(num_ranks, dtype=np.int64), np.zeros(num_ranks, dtype=np.int64)
    kept_of[ranks], first_of[ranks] = kept, first
    by_home = np.argsort(run_home.astype(np.uint16) if num_ranks <= 2**16 else run_home, kind="stable")  # radix
    before = np.empty_like(run_length)  # the run's home's items in its earlier runs
    before[by_home] = np.cumsum(run_length[by_home]) - run_length[by_home] - first_of[run_home[by_home]]
    take = np.clip(kept_of[run_home] - before, 0, run_length)
    state.destinations[rest[np.repeat(run_start - np.cumsum(take) + take, take) + np.arange(int(take.sum()))]] = (
        np.repeat(run_home, take))
    return True


@functools.lru_cache(maxsize=64)
def _round_robin_row(window: int, ranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`window` items dealt round robin over `ranks` ranks (item k to rank k mod ranks; ranks <=
    window), listed rank by rank: each one's position in the window, its rank, and the index
    in that listing of its rank's first item (read-only)."""
    index = np.arange(window)
    per_rank, longer = divmod(window, ranks)  # the first `longer` ranks take one more
    boundary = longer * (per_rank + 1)
    in_longer = index < boundary
    rank = np.where(in_longer, index // (per_rank + 1), longer + (index - boundary) // per_rank)
    turn = np.where(in_longer, index % (per_rank + 1), (index - boundary) % per_rank)
    rows = (rank + turn * ranks, rank, rank * per_rank + np.minimum(rank, longer))
    for row in rows:
        row.setflags(write=False)
    return rows


@functools.lru_cache(maxsize=64)
def _round_robin_table(window: int, most_ranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_round_robin_row` stacked for h = 0..most_ranks ranks (row 0 that of one rank)."""
    tables = tuple(np.stack(table) for table in zip(*(_round_robin_row(window, max(h, 1))
                                                      for h in range(most_ranks + 1))))
    for table in tables:
        table.setflags(write=False)
    return tables


def _round_robin(roomy: np.ndarray, window: int, most_ranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_round_robin_row` for h = max(roomy, 1) ranks (roomy <= most_ranks), one row per entry of `roomy`."""
    return tuple(table[roomy] for table in _round_robin_table(window, most_ranks))


def _running_sums(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per row of `values` (a deal listed rank by rank), each entry's running sum within its
    rank; `first` holds, flat, the index of each entry's rank's first entry."""
    running = np.cumsum(values, axis=1)
    running -= (running - values).ravel()[first].reshape(running.shape)
    return running



def take_in_node(state: PartialPlan, sources: np.ndarray, gpus_per_node: int,
                 items: np.ndarray | None = None) -> np.ndarray:
    """Largest first, the left-over items of each node dealt to its least-loaded ranks that fit.

    In rounds for every node at once: with the node's ranks by (load, rank) and h of them
    having room for its next item that fits any, the node's next `DEAL_WINDOW` · gpus_per_node
    items are dealt round robin to those h ranks (the k-th to the (k mod h)-th), and the
    node keeps the longest prefix of the deal in which every item fits its rank (the
    items dealt to the rank before it included, their summed cost a hair short of the
    target so that rounding never lets one through); the next round deals from the first
    item that did not fit.  Items costlier than the room of the node's least-loaded rank
    are skipped at once: no rank of the node can take them later.  This is LPT inside the
    node (the least-loaded ranks take the largest items, turn by turn) with a handful of
    rounds, not one per item.  With a memory cap, an item that fits the least-loaded
    rank's cost room but not its tokens goes to the least-loaded rank of the node that
    fits, if any.  `items` (ascending; default: every unplaced one) are those dealt.  Returns
    those no rank of their node could take.
    """
    window_size = DEAL_WINDOW * gpus_per_node
    margin = window_size * np.finfo(np.float64).eps * state.target  # bounds a rank's summed rounding
    unplaced = np.flatnonzero(state.destinations < 0) if items is None else items
    keys, cost_rank, pointer, ends, nodes = _by_segment(state, node_of(sources[unplaced], gpus_per_node), unplaced)
    order = state.items_ranked(cost_rank)
    if state.exact_cost is not None and state.cap == np.inf:  # one cost, exact sums: the rounds in counts
        _counted_rounds(state, order, pointer, ends, nodes, gpus_per_node, margin)
        return unplaced[state.destinations[unplaced] < 0]
    node_loads = state.loads.reshape(-1, gpus_per_node)  # a view: follows every put
    while nodes.size:
        loads = node_loads[nodes]
        by_load = np.argsort(loads, axis=1, kind="stable")
        loads.sort(axis=1)
        position = _first_fitting(state, keys, nodes, pointer, state.target - loads[:, 0], ends)
        alive = position < ends
        if not alive.all():
            nodes, position, ends, by_load, loads = (nodes[alive], position[alive], ends[alive], by_load[alive],
                                                     loads[alive])
            if not nodes.size:
                break
        roomy = np.count_nonzero(loads + state.costs_of(order[position])[:, None] <= state.target, axis=1)
        # The deal rank by rank, each item with its rank's load after it; a window no longer than
        # the most items any node has left (a power of two, for the cache) deals the same.
        remaining = ends - position
        width = min(window_size, max(gpus_per_node, 1 << int(remaining.max() - 1).bit_length()))
        dealt, rank_column, first = _round_robin(roomy, width, gpus_per_node)
        window = position[:, None] + dealt
        if remaining.min() >= width:  # every node's window lies inside its items
            inside, items = True, order[window]
            costs = state.costs_of(items)
        else:
            inside = window < ends[:, None]
            items = order[np.minimum(window, ends[:, None] - 1)]
            costs = np.where(inside, state.costs_of(items), 0.0)
        row = np.arange(nodes.size)[:, None]
        first = (row * width + first).ravel()
        rank_flat = (row * gpus_per_node + rank_column).ravel()
        after = loads.ravel()[rank_flat].reshape(items.shape) + _running_sums(costs, first)
        fits = inside & (after <= state.target - margin)
        ranks = nodes[:, None] * gpus_per_node + by_load.ravel()[rank_flat].reshape(items.shape)
        if state.cap < np.inf:
            fits &= state.tokens[ranks] + _running_sums(np.where(inside, state.lengths[items], 0.0), first) <= state.cap
        count = np.where(fits, window_size, dealt).min(axis=1)  # the deal's first item that does not fit
        kept = dealt < count[:, None]
        state.put_runs(items[kept], ranks[kept], costs[kept])
        count = _place_stuck(state, order, position, nodes, gpus_per_node, count)  # no token room (or rounding)
        pointer = position + count
        left = pointer < ends
        nodes, pointer, ends = nodes[left], pointer[left], ends[left]
    return unplaced[state.destinations[unplaced] < 0]



def _counted_rounds(state: PartialPlan, order: np.ndarray, pointer: np.ndarray, ends: np.ndarray, nodes: np.ndarray,
                    gpus_per_node: int, margin: float) -> None:
    """`take_in_node`'s rounds where every item costs the same, every sum of costs is exact
    (`PartialPlan.exact_cost`: loads are whole multiples of it) and no cap binds: the same rounds in counts.

    With the node's h roomy ranks by (load, rank), rank j of them takes its t-th item of the round while
    load_j + (t + 1) · cost <= target - margin, i.e. its first `fit_j` items: the deal's first item that does
    not fit is the first of j + h · fit_j over j, or the window's end, or the node's; the node keeps the items
    before it, k-th to rank k mod h (a table row per h: `_dealt_columns`).  No running sums, no item costs, no
    bincount over the ranks: a round's loads grow by counts."""
    cost, window_size = state.exact_cost, DEAL_WINDOW * gpus_per_node
    node_loads = state.loads.reshape(-1, gpus_per_node)  # a view: follows every put
    most = _last_multiple(cost, np.array([state.target - margin]), 2**62)[0]  # the most costs within the bound
    column, dealt_columns = np.arange(gpus_per_node), _dealt_columns(window_size, gpus_per_node)
    slot = np.arange(window_size)
    while nodes.size:
        loads = node_loads[nodes]
        by_load = np.argsort(loads, axis=1, kind="stable")
        loads.sort(axis=1)
        alive = cost <= state.target - loads[:, 0]  # `_first_fitting`: the next item fits the least loaded, or none
        if not alive.all():
            nodes, pointer, ends = nodes[alive], pointer[alive], ends[alive]
            by_load, loads = by_load[alive], loads[alive]
            if not nodes.size:
                break
        # no roomy rank: `_round_robin` deals to one, where the item misses
        roomy = np.maximum(np.count_nonzero(loads + cost <= state.target, axis=1), 1)[:, None]
        fit = np.clip(most - np.rint(loads / cost).astype(np.int64), 0, window_size)  # a miss past the window: none
        dealt = column < roomy
        first_miss = np.where(dealt, column + roomy * fit, window_size).min(axis=1)
        count = np.minimum(np.minimum(first_miss, ends - pointer), window_size)
        taken = np.where(dealt, count[:, None] // roomy + (column < count[:, None] % roomy), 0)
        node_loads[nodes[:, None], by_load] += taken * cost
        kept = slot < count[:, None]
        by_load += nodes[:, None] * gpus_per_node  # the node's ranks by load
        dealt_to = dealt_columns[roomy[:, 0]][kept]
        dealt_to += np.repeat(np.arange(0, by_load.size, gpus_per_node), count)
        state.destinations[order[(pointer[:, None] + slot)[kept]]] = by_load.ravel()[dealt_to]
        count = _place_stuck(state, order, pointer, nodes, gpus_per_node, count)  # rounding: a miss of the margin
        pointer = pointer + count
        left = pointer < ends
        nodes, pointer, ends = nodes[left], pointer[left], ends[left]


def _place_stuck(state: PartialPlan, order: np.ndarray, position: np.ndarray, nodes: np.ndarray, gpus_per_node: int,
                 count: np.ndarray) -> np.ndarray:
    """The round's counts, where a node's deal kept no item (`count` 0: its least-loaded rank lacks token room, or
    rounding) its next item placed on the least-loaded rank of the node it fits, if any, and counted as dealt."""
    stuck = np.flatnonzero(count == 0)
    if not stuck.size:
        return count
    item, row_ranks = order[position[stuck]], nodes[stuck, None] * gpus_per_node + np.arange(gpus_per_node)
    fits = state.fits(item[:, None], row_ranks)
    chosen = np.argmin(np.where(fits, state.loads[row_ranks], np.inf), axis=1)
    placed = fits.any(axis=1)
    state.put(item[placed], row_ranks[placed, chosen[placed]])
    return np.maximum(count, 1)


@functools.lru_cache(maxsize=16)
def _dealt_columns(window: int, most_ranks: int) -> np.ndarray:
    """Row h: the rank (0 .. h - 1) of each of `window` items dealt round robin over h ranks (k mod h), for h = 1
    .. most_ranks (row 0 unused), read-only."""
    table = np.arange(window) % np.maximum(np.arange(most_ranks + 1), 1)[:, None]
    table.setflags(write=False)
    return table

def take_anywhere(state: PartialPlan, overflow: np.ndarray, max_lpt_rounds: int | None = None) -> None:
    """Largest first, the items no rank of their node took, dealt to the least-loaded ranks that fit.

    In rounds: with ranks by (load, rank) and h of them having room for the largest waiting
    item, the next `DEAL_WINDOW` · h items are dealt round robin to those h ranks (the k-th to
    the (k mod h)-th); each rank keeps the longest prefix of its deal that fits (summed
    cost a hair short of the target, tokens within the cap) and the rest wait, in order,
    for the next round.  A round that keeps nothing (no rank has room for the largest
    waiting item, or no token room) is an LPT round instead (`_lpt_round`), which always
    places the largest item, possibly above the target.  From the first LPT round on, the ranks
    stay sorted through the rounds (`_resort`), and a deal is made only by the ranks that keep
    their first item.  Where token room binds, LPT rounds may place one item each, thousands in a
    row (`token_bound._token_bound_rounds` makes them at O(log) a round, but the few in which a
    rank may pair): past `max_lpt_rounds` of them the deal gives up (NoRoom).
    """
    waiting = state.item_of_rank[np.sort(state.cost_rank[overflow])]  # cost ranks are distinct
    margin = DEAL_WINDOW * np.finfo(np.float64).eps * state.target  # bounds a rank's summed rounding
    most = None  # one cost, exact sums, no cap: the most copies of the cost within the bound (`_deal` in counts)
    if state.exact_cost is not None and state.cap == np.inf:
        most = int(_last_multiple(state.exact_cost, np.array([state.target - margin]), 2**62)[0])
    order = None  # the ranks by (load, rank): sorted for the first LPT round, then kept through the rounds
    lpt_rounds = 0
    while waiting.size:
        if order is not None:  # from the first LPT round on, the rounds in which token room binds
            allowed = waiting.size if max_lpt_rounds is None else max_lpt_rounds - lpt_rounds
            waiting, rounds = _token_bound_rounds(state, waiting, allowed, margin, order, DEAL_WINDOW)
            lpt_rounds += rounds
            if not waiting.size:
                break
        roomy = int(np.count_nonzero(state.loads + state.costs[waiting[0]] <= state.target))
        count = min(waiting.size, DEAL_WINDOW * roomy)
        width = min(roomy, count)  # fewer items than roomy ranks: only the first `count` ranks are dealt to
        if order is not None:
            ranks = order[:width]
        else:  # a deal before any LPT round selects the ranks it deals to (often one round does all)
            ranks = smallest_ranks(state.loads, width, integer=False) if width else np.zeros(0, dtype=np.int64)
        # Once LPT rounds come between deals (token room binds), most deals keep nothing: only the ranks
        # that keep their first item are dealt to (the others keep none), and often none is.
        keeping = np.arange(width)
        if order is not None:
            keeping = np.flatnonzero(_first_kept(state, waiting[:width], ranks, margin))
        kept = _deal(state, waiting, count, width, keeping, ranks[keeping], margin, most) if keeping.size else None
        if kept is None or not kept[0].size:  # the deal keeps nothing
            order = ranks_by_load(state.loads, integer=False) if order is None else order
            lpt_rounds += 1
            if max_lpt_rounds is not None and lpt_rounds > max_lpt_rounds:
                raise NoRoom
            waiting = _lpt_round(state, waiting, order)
            continue
        state.put_runs(waiting[kept[0]], kept[1])
        waiting = np.delete(waiting, kept[0])
        if order is not None:
            _resort(state.loads, order)


def _first_kept(state: PartialPlan, firsts: np.ndarray, ranks: np.ndarray, margin: float) -> np.ndarray:
    """Which ranks of a deal keep their first item `firsts[k]` (cost a hair short of the target, tokens
    within the cap): the others keep nothing (running sums only grow)."""
    fits = state.loads[ranks] + state.costs[firsts] <= state.target - margin
    if state.cap < np.inf:
        fits &= state.tokens[ranks] + state.lengths[firsts] <= state.cap
    return fits


def _lpt_round(state: PartialPlan, waiting: np.ndarray, order: np.ndarray) -> np.ndarray:
    """One LPT round over all ranks: the k-th largest waiting item to the k-th least-loaded rank
    if it fits; returns the items still waiting (`order`, the ranks by (load, rank), kept in place).

    The largest item is always placed (on the least-loaded rank with token room), possibly
    above the target, and so are the items after it that fit on no rank (placed together).
    """
    ranks = order[:min(waiting.size, state.loads.size)].copy()
    chunk = waiting[: ranks.size]
    fits = state.fits(chunk, ranks)
    # The leading items too costly for every rank's room fit nowhere, now or later:
    # each goes above the target on its rank of the round (token room permitting).
    hopeless = ((state.costs[chunk] > state.target - state.loads[ranks[0]])
                & (state.tokens[ranks] + state.lengths[chunk] <= state.cap))
    lead = int(np.argmin(hopeless)) if not hopeless.all() else hopeless.size
    fits[:lead] = True
    if not fits[0]:
        room = state.tokens + state.lengths[chunk[0]] <= state.cap
        if not room.any():
            raise NoRoom
        fits[0] = True
        ranks[0] = int(np.argmin(np.where(room, state.loads, np.inf)))
        fits[1:] &= ranks[1:] != ranks[0]
    state.put(chunk[fits], ranks[fits])
    _resort(state.loads, order)
    return np.concatenate([chunk[~fits], waiting[ranks.size:]])


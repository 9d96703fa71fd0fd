"""The fourth phase of communication-aware balancing: repair the ranks left above the target.

    unless the ranks' rooms provably cannot take every excess (`ranks_left_over`):
    while a rank is above target: the move or swap that fixes it adding the fewest inter-node bytes, partners
        from its own node first (every node at once), then from the roomiest ranks (`ROOMY_PARTNERS`, then more),
        while the searches bring ranks within reach of a full fix (`IDLE_SEARCH_WORK`)
"""

from __future__ import annotations

import functools

import numpy as np

from .partial_plan import PartialPlan
from .reach import ranks_left_over
from .windows import candidate_windows, window_max

ROOMY_PARTNERS = 16  # roomiest ranks searched first for a partner from another node
REPAIR_SEARCHES = 128  # byte-aware searches (`best_fix` rounds) before `repair` gives up
IDLE_SEARCH_WORK = 1 << 18  # (item, partner) pairs the searches may weigh with no rank becoming fixable (at least)
SEARCH_WORK = (1 << 21, 256)  # the most pairs all searches may weigh: a floor, and a share per item (`search_work`)
ACROSS_CANDIDATES = (16, 256)  # smallest swaps per item tried by the passes of `repair_across_nodes`


def _may_beat(state: PartialPlan, rank: int, row_costs: np.ndarray, partner_rank: np.ndarray,
              partner_cost: np.ndarray | float, bound: float) -> np.ndarray:
    """Whether a fix of an item on `rank` (costs `row_costs`, ascending) with each partner column (its rank, its cost;
    0 for a move) may leave max(rank's load, partner's load) <= `bound`: the least over rows x of
    max(load - x + c, partner_load - c + x), a V in x, is at the rows nearest its vertex."""
    high, low = state.loads[rank] + partner_cost, state.loads[partner_rank] - partner_cost
    at = np.searchsorted(row_costs, (high - low) / 2)
    below, above = row_costs[np.maximum(at - 1, 0)], row_costs[np.minimum(at, row_costs.size - 1)]
    return np.minimum(np.maximum(high - below, low + below), np.maximum(high - above, low + above)) <= bound


def best_fix(state: PartialPlan, members: list[np.ndarray], rank: int, pool: np.ndarray, home_node: np.ndarray,
             item_bytes: np.ndarray, gpus_per_node: int, beat: float | None = None):
    """The best move or swap taking load off `rank` with partner ranks in `pool` (see `repair`).

    `members[r]` lists the items on rank r by index.  Every item on `rank` (rows) meets every partner (columns: items
    on the pool's ranks by index, then the pool's ranks for moves), a block of rows at a time; only the columns that
    may leave a peak of `beat` (default: the rank's load) or less are built (`_may_beat`, up to rounding): the others
    take no full fix and beat no partial one, and keep their order, so the choice is that over every column.  Returns
    (key, item, partner item or -1, partner rank) or None; smaller keys are better.
    """
    items = members[rank]
    if pool.size == 0 or items.size == 0:
        return None
    target, cap = state.target, state.cap
    others, row_costs = np.concatenate([members[p] for p in pool.tolist()]), np.sort(state.costs[items])
    bound = (state.loads[rank] if beat is None else beat) + 2 * _rounding(state)
    others = np.sort(others[_may_beat(state, rank, row_costs, state.destinations[others], state.costs[others], bound)])
    pool = pool[_may_beat(state, rank, row_costs, pool, 0.0, bound)]
    if others.size + pool.size == 0:
        return None
    partner = np.concatenate([others, np.full(pool.size, -1)])
    partner_rank = np.concatenate([state.destinations[others], pool])
    partner_cost = np.concatenate([state.costs[others], np.zeros(pool.size)])
    partner_tokens = np.concatenate([state.lengths[others], np.zeros(pool.size)])
    partner_load, partner_room_tokens = state.loads[partner_rank], cap - state.tokens[partner_rank]
    partner_node = partner_rank // gpus_per_node
    # Inter-node bytes a partner item adds by going to `rank` (the empty partner adds none).
    partner_bytes = np.where(partner >= 0, item_bytes[partner], 0.0)
    partner_home = home_node[np.maximum(partner, 0)]
    partner_added = partner_bytes * ((rank // gpus_per_node != partner_home).astype(np.float64)
                                     - (partner_node != partner_home))
    item_added_here = np.where(rank // gpus_per_node != home_node[items], item_bytes[items], 0.0)

    def added(at, columns):  # inter-node bytes the fixes of items[at] with `columns` add (only those read)
        rows = items[at]
        return (np.where(partner_node[columns] != home_node[rows], item_bytes[rows], 0.0) - item_added_here[at]
                + partner_added[columns])

    best_full, best_partial = None, None
    block = max(1, (1 << 20) // partner.size)
    for first in range(0, items.size, block):
        rows = items[first:first + block]
        delta = state.costs[rows, None] - partner_cost
        rank_after = state.loads[rank] - delta
        partner_after = partner_load + delta
        valid = delta > 0
        if cap < np.inf:  # token room: only a cap reads it
            delta_tokens = state.lengths[rows, None] - partner_tokens
            valid &= (delta_tokens <= partner_room_tokens) & (state.tokens[rank] - delta_tokens <= cap)
        full = np.flatnonzero(valid & (rank_after <= target) & (partner_after <= target))
        if full.size:
            full_rows, full_columns = np.divmod(full, partner.size)
            full_added = added(first + full_rows, full_columns)
            pick = np.lexsort((delta.ravel()[full], full_added))[0]
            row, column = int(full_rows[pick]), int(full_columns[pick])
            key = (0, float(full_added[pick]), float(delta[row, column]))
            if best_full is None or key < best_full[0]:
                best_full = (key, int(rows[row]), int(partner[column]), int(partner_rank[column]))
        if best_full is not None:
            continue
        # No full fix: per item the partner that lowers max(rank, partner) most (first on ties).
        peak = np.where(valid, np.maximum(rank_after, partner_after), np.inf)
        column = np.argmin(peak, axis=1)
        line = np.arange(rows.size)
        row_peak, row_added = peak[line, column], added(first + line, column)
        better = np.flatnonzero(row_peak < state.loads[rank])
        if better.size:
            row = int(better[np.lexsort((row_added[better], row_peak[better]))[0]])
            key = (1, float(row_peak[row]), float(row_added[row]))
            if best_partial is None or key < best_partial[0]:
                best_partial = (key, int(rows[row]), int(partner[column[row]]), int(partner_rank[column[row]]))
    return best_full if best_full is not None else best_partial


def _ascending(state: PartialPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Items by cost ascending (ties by index descending), their costs, and each item's position: the plan's
    largest-first order read backwards."""
    return state.item_of_rank[::-1], state.sorted_costs[::-1], state.costs.size - 1 - state.cost_rank


def _room(state: PartialPlan, partner_rank: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Whether each candidate's partner rank stays within the target taking delta = `shift` (the test of `_valid` that
    fails most: on real traces for ~99 % of the candidates of the across-node passes)."""
    return state.loads[partner_rank] + shift <= state.target


def _valid(state: PartialPlan, items: np.ndarray, partner_rank: np.ndarray, shift: np.ndarray,
           partner_lengths: np.ndarray | None) -> np.ndarray:
    """Whether each candidate whose partner has the room (`_room`), listed flat (item i, the partner's rank, delta =
    cost_i - cost_j and the partner item's length, 0 for a move; None without a cap, which alone reads them), is a
    valid fix: its own rank within the target, both within the cap after it, delta > 0, the partner another rank."""
    item_rank = state.destinations[items]
    valid = (partner_rank != item_rank) & (shift > 0) & (state.loads[item_rank] - shift <= state.target)
    if state.cap < np.inf:
        shift_tokens = state.lengths[items] - partner_lengths
        valid &= ((state.tokens[partner_rank] + shift_tokens <= state.cap)
                  & (state.tokens[item_rank] - shift_tokens <= state.cap))
    return valid


def _rounding(state: PartialPlan) -> float:
    """A bound on the rounding of a room or a delta (a margin that filters of candidates keep)."""
    return 16 * np.finfo(np.float64).eps * max(state.target, float(np.abs(state.loads).max()))


def _room_needed(state: PartialPlan, items: np.ndarray) -> np.ndarray:
    """Per item i (on rank r), the most load a partner rank may hold and still take a valid fix of it: a fix takes at
    least the excess load_r - target off r and puts it on the partner, so the partner needs that much room (up to
    rounding: the bound drops only candidates that are not valid)."""
    return 2 * state.target - state.loads[state.destinations[items]] + _rounding(state)


def _live(rows: np.ndarray, columns: np.ndarray, width: int, shift: np.ndarray,
          valid: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Of candidates (rows, columns) with `_valid`'s answers: the rows with a valid one (only they can take a fix),
    where the valid ones sit among those rows' `width` columns, and the rows' deltas (inf where no valid fix)."""
    valid_rows = rows[valid]  # ascending, as `np.nonzero` lists them
    first = np.concatenate(([valid_rows.size > 0], valid_rows[1:] != valid_rows[:-1]))[:valid_rows.size]
    live = valid_rows[first]
    at = (np.cumsum(first) - 1, columns[valid])
    delta = np.full((live.size, width), np.inf)
    delta[at] = shift[valid]
    return live, at, delta


def _valid_deltas(state: PartialPlan, items: np.ndarray, partner_rank: np.ndarray, partner_costs: np.ndarray,
                  partner_lengths: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The rows of candidates (as in `_apply_fixes`; the partner items' costs and lengths given, 0 for a move) with a
    valid one (`_valid`): only they can take a fix; and those rows' deltas cost_i - cost_j, inf where the fix is not
    valid."""
    delta = state.costs[items, None] - partner_costs
    room = _room(state, partner_rank, delta)
    # The other tests run only where it holds, unless it holds for many (a default mix's rounds): the
    # indices of the candidates kept and their gathers cost several tests of every candidate.
    if np.count_nonzero(room) > room.size // 8:
        valid = room & _valid(state, items[:, None], partner_rank, delta, partner_lengths)
        live, delta = np.flatnonzero(valid.any(axis=1)), np.where(valid, delta, np.inf)
        return live, delta if live.size == items.size else delta[live]
    rows, columns = np.nonzero(room)
    shift = delta[rows, columns]
    valid = _valid(state, items[rows], partner_rank[rows, columns], shift,
                   None if partner_lengths is None else partner_lengths[rows, columns])
    live, _, valid_delta = _live(rows, columns, delta.shape[1], shift, valid)
    return live, valid_delta


def _live_rows(live: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """`arrays` (a row per candidate row) at the `live` rows: as they are where every row is."""
    return arrays if live.size == arrays[0].shape[0] else tuple(array[live] for array in arrays)


def _apply_fixes(state: PartialPlan, items: np.ndarray, partner: np.ndarray, partner_rank: np.ndarray,
                 ranks: np.ndarray, delta: np.ndarray | None = None) -> np.ndarray:
    """Apply a round of full fixes to the over-target `ranks` (most loaded first) and return those without any valid
    candidate.

    Row k of `partner` / `partner_rank` lists the candidates for `items[k]` (on an over-target rank r): a swap with
    item j on rank p, or a move to p (j = -1).  A candidate is valid when both ranks end within the target and the
    cap (`delta`: `_valid_deltas` of them, when the caller has it, every row with a valid one).  Every rank takes
    its smallest valid delta = cost_i - cost_j (ties by column, then item); where fixes meet on a partner rank the
    most loaded rank wins and the others take their best on ranks no fix of the round touched.
    """
    order_of = np.full(state.loads.size, -1, dtype=np.int64)
    order_of[ranks] = np.arange(ranks.size)
    if delta is None:  # partner -1: a move, cost and length 0
        live, delta = _valid_deltas(state, items, partner_rank, np.append(state.costs, 0.0)[partner],
                                    np.append(state.lengths, 0.0)[partner])
        items, partner, partner_rank = _live_rows(live, items, partner, partner_rank)
    item_rank = state.destinations[items]
    used = np.zeros(state.loads.size, dtype=bool)  # ranks a fix of this round changed
    chosen = []
    # Each row's columns by (delta, column): its best is the first whose rank no fix of the round
    # changed, so a fix only moves on the rows whose best it took.
    by_delta = np.argsort(delta, axis=1, kind="stable")
    width = delta.shape[1]
    rows = np.arange(items.size)  # the rows still alive
    pointer = np.zeros(items.size, dtype=np.int64)  # each one's best, in by_delta
    column = by_delta[:, 0]
    row_delta = delta[rows, column]
    candid = np.zeros(state.loads.size, dtype=bool)
    candid[item_rank] = True
    hopeless = ranks[~candid[ranks]]
    while rows.size:
        rank_of = item_rank[rows]
        order = np.lexsort((row_delta, rank_of))  # per rank, its item with the smallest delta
        first = order[np.concatenate(([True], rank_of[order][1:] != rank_of[order][:-1]))]
        fixed = first[np.isfinite(row_delta[first])]
        if fixed.size == 0:
            break
        fixed = fixed[np.argsort(order_of[rank_of[fixed]], kind="stable")]
        _, keep = np.unique(partner_rank[rows[fixed], column[fixed]], return_index=True)
        fixed = fixed[np.sort(keep)]
        fixed_rows, fixed_columns = rows[fixed], column[fixed]
        chosen.append((items[fixed_rows], partner_rank[fixed_rows, fixed_columns], partner[fixed_rows, fixed_columns],
                       item_rank[fixed_rows]))
        used[item_rank[fixed_rows]] = True
        used[partner_rank[fixed_rows, fixed_columns]] = True
        alive = ~used[item_rank[rows]]
        rows, pointer, column, row_delta = rows[alive], pointer[alive], column[alive], row_delta[alive]
        stale = np.flatnonzero(used[partner_rank[rows, column]])
        while stale.size:
            pointer[stale] += 1
            ended = pointer[stale] == width
            row_delta[stale[ended]] = np.inf
            stale = stale[~ended]
            column[stale] = by_delta[rows[stale], pointer[stale]]
            row_delta[stale] = delta[rows[stale], column[stale]]
            stale = stale[np.isfinite(row_delta[stale]) & used[partner_rank[rows[stale], column[stale]]]]
        alive = np.isfinite(row_delta)  # rows that may still give a fix
        rows, pointer, column, row_delta = rows[alive], pointer[alive], column[alive], row_delta[alive]
    if chosen:
        moved, destination, back, back_rank = (np.concatenate(part) for part in zip(*chosen))
        swapped = back >= 0
        state.take(np.concatenate([moved, back[swapped]]))
        state.put(moved, destination)
        state.put(back[swapped], back_rank[swapped])
    return hopeless


def _searched(keys: np.ndarray, needles: np.ndarray, bound: int) -> np.ndarray:
    """np.searchsorted(keys, needles) of needles in [0, bound), searched in ascending order (several times faster than
    scattered ones once the keys outgrow the caches): sorted as one int64 needle << shift | index where that fits (a
    sort takes a third of an argsort's time), else by an argsort."""
    shift = max(int(needles.size - 1).bit_length(), 1)
    if bound <= 1 << (63 - shift):
        packed = np.sort(needles << shift | np.arange(needles.size))
        by, ascending = packed & ((1 << shift) - 1), packed >> shift
    else:
        by = np.argsort(needles)
        ascending = needles[by]
    position = np.empty_like(needles)
    position[by] = np.searchsorted(keys, ascending)
    return position


def _settle(state: PartialPlan, stuck: np.ndarray) -> None:
    """Mark stuck the ranks a round of full fixes left above the target by no more than rounding: its fixes were
    valid by their loads as predicted, and fixing such a rank again passes the rounding from rank to rank (probe25
    P25-09: two ranks 1.8e-12 above a target of 14387 swapped an item back and forth, a pass without end).  Every
    round then fixes a rank or marks one stuck, so a pass ends."""
    stuck |= (state.loads > state.target) & (state.loads <= state.target + _rounding(state))


def _over_target(state: PartialPlan, stuck: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(over-target ranks not stuck, most loaded first with ties by rank; the items on them)."""
    over = np.flatnonzero((state.loads > state.target) & ~stuck)
    over = over[np.lexsort((over, -state.loads[over]))]
    on_over = np.zeros(state.loads.size, dtype=bool)
    on_over[over] = True
    return over, np.flatnonzero(on_over[state.destinations])


def repair_in_node(state: PartialPlan, gpus_per_node: int) -> None:
    """Rounds of full fixes inside nodes for every over-target rank at once (the first phase of `repair`).

    Inside a node a move or swap changes no inter-node bytes, so the best full fix of an over-target rank r is the
    smallest delta = cost_i - cost_j >= load_r - target that a partner rank p of its node has room for: per item i
    on r and partner p, the largest item j on p with cost_j <= cost_i - (load_r - target), or no item (a move);
    `_apply_fixes` takes them.  A rank without one is left to the next phases.
    """
    ascending, ascending_costs, ascending_rank = _ascending(state)
    bits, num_ranks = state.rank_bits, state.loads.size  # keys rank << bits | position: a shift, not a division
    offsets = np.arange(gpus_per_node, dtype=np.int64)
    stuck = np.zeros(num_ranks, dtype=bool)
    while True:
        over, items = _over_target(state, stuck)
        if over.size == 0:
            return
        item_rank = state.destinations[items]
        in_node = np.zeros(num_ranks // gpus_per_node, dtype=bool)
        in_node[over // gpus_per_node] = True
        held = np.flatnonzero(in_node[state.destinations // gpus_per_node])
        keys = np.sort(state.destinations[held] << bits | ascending_rank[held])
        partner_rank = (item_rank - item_rank % gpus_per_node)[:, None] + offsets
        # Only partners with the room a fix needs are searched (most have not: the others take no fix).
        rows, columns = np.nonzero(state.loads[partner_rank] <= _room_needed(state, items)[:, None])
        limit = state.costs[items] - (state.loads[item_rank] - state.target)
        count = np.searchsorted(ascending_costs, limit, side="right")  # items with cost <= limit
        other = partner_rank[rows, columns]
        position = _searched(keys, other << bits | count[rows], num_ranks << bits) - 1
        found = keys[np.maximum(position, 0)]
        found = np.where((position >= 0) & (found >> bits == other), ascending[found & ((1 << bits) - 1)], -1)
        shift = state.costs[items[rows]] - np.where(found >= 0, state.costs[found], 0.0)
        found_lengths = np.where(found >= 0, state.lengths[found], 0.0) if state.cap < np.inf else None
        valid = _room(state, other, shift) & _valid(state, items[rows], other, shift, found_lengths)
        live, at, delta = _live(rows, columns, gpus_per_node, shift, valid)
        partner = np.full(delta.shape, -1, dtype=np.int64)
        partner[at] = found[valid]  # a candidate that is not valid takes no fix: its partner is never read
        stuck[_apply_fixes(state, items[live], partner, partner_rank[live], over, delta)] = True
        _settle(state, stuck)


def repair_across_nodes(state: PartialPlan, candidates: int) -> None:
    """Rounds of full fixes for every over-target rank at once, partners anywhere (the second phase of `repair`).

    For every item i on an over-target rank r, the candidates are the `candidates` largest items j (any rank) with
    cost_j <= cost_i - (load_r - target), i.e. the smallest swaps that bring r within the target, and the move of i
    to the roomiest rank; `_apply_fixes` takes them.  A rank without a valid candidate is left to the byte-aware
    search of `repair`.
    """
    stuck = np.zeros(state.loads.size, dtype=bool)
    windows = None
    while True:
        over, items = _over_target(state, stuck)
        if over.size == 0:
            return
        windows = candidate_windows(state, candidates) if windows is None else windows
        item_rank = state.destinations[items]
        limit = state.costs[items] - (state.loads[item_rank] - state.target)
        # the first candidate's position: the items of cost > limit come before it in the largest-first order
        start = np.searchsorted(state.negated_sorted_costs, -limit, side="left")
        roomiest = int(np.argmin(state.loads))
        if items.size * (candidates + 1) > state.costs.size:  # the rows outweigh a pass over the order
            items, start = _near(state, items, start, windows["cost"][start, 0], candidates, roomiest)
        # Columns: the candidate swaps, then the move to the roomiest rank (partner -1, cost and length 0).
        window = {name: rows[start] for name, rows in windows.items()}
        for name, values in window.items():
            values[:, -1] = -1 if name == "partner" else 0
        partner, partner_costs, partner_lengths = window["partner"], window["cost"], window.get("length")
        partner_rank = np.append(state.destinations, roomiest)[partner]  # -1: the roomiest
        live, delta = _valid_deltas(state, items, partner_rank, partner_costs, partner_lengths)
        items, partner, partner_rank = _live_rows(live, items, partner, partner_rank)
        stuck[_apply_fixes(state, items, partner, partner_rank, over, delta)] = True
        _settle(state, stuck)


def _near(state: PartialPlan, items: np.ndarray, start: np.ndarray, first_costs: np.ndarray, candidates: int,
          roomiest: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of `repair_across_nodes` (`items`, their first candidates' positions `start` and costs) that may hold a
    valid fix.  A row's deltas grow along it (the candidates' costs descend) and a valid fix's delta fits its
    partner rank's room, so a row whose first delta exceeds every room in its window (`window_max` of the rooms of
    the ranks in the largest-first order; past the items: moves to the roomiest rank), and whose move the roomiest
    rank's room, has none (up to rounding): on real traces most rows of the wide pass."""
    ranks = np.append(state.destinations[state.item_of_rank], np.full(candidates + 1, roomiest))
    reach = window_max(state.target - state.loads[ranks], candidates) + _rounding(state)  # the last: moves only
    costs = state.costs[items]
    near = (costs - first_costs <= reach[start]) | (costs <= reach[-1])
    return items[near], start[near]


def repair(state: PartialPlan, sources: np.ndarray, item_bytes: np.ndarray, gpus_per_node: int) -> None:
    """Bring ranks above the target down by moves or swaps, same node first, fewest inter-node bytes.

    For an over-target rank r and each item i on it, every item j on a partner rank (a swap) and every partner
    rank itself (a move) is a candidate; it shifts delta = cost_i - cost_j from r to the partner's rank.  Full
    fixes (both ranks end within the target) win, fewest added inter-node bytes first, then smallest delta;
    without one, the candidate that lowers max(r, partner rank) most.  Partners come from r's node first (for
    all nodes at once, `repair_in_node`), then, most loaded rank first, from the other ranks roomiest first:
    the `ROOMY_PARTNERS` roomiest, then four times as many, and so on while no full fix is found and a rank left
    out could still offer one (room >= load_r - target) or a better partial one (a partner p lowers the peak to
    (load_r + load_p) / 2 at best), so a search passes over the items of the few ranks that can help, not of
    every rank.  The first full fix found is taken; partial fixes are the best over all ranks.  Stops when no
    candidate improves, or after `REPAIR_SEARCHES` searches, or before them when more ranks are above the
    target than they could fix, or before any pass when more will stay above it whatever the full fixes do
    (`ranks_left_over`; each search brings one rank down at most), or when the searches weigh
    `IDLE_SEARCH_WORK` (item, partner) pairs with neither a full fix nor fewer ranks out of every full fix's
    reach (few large items: partial fixes only pass a large item from rank to rank, a search over every rank
    apiece), or past `SEARCH_WORK` pairs in all (a budget in proportion to the items, above a floor).  The
    passes are skipped once every rank above the target is out of reach (they make full fixes only).  The
    caller then drops the state and falls back (to placing the plain plan: `locality.balance_locally`).
    """
    num_ranks = state.loads.size
    searches = min(4 * num_ranks, REPAIR_SEARCHES)
    for run_pass in (functools.partial(repair_in_node, state, gpus_per_node),
                     *(functools.partial(repair_across_nodes, state, candidates) for candidates in ACROSS_CANDIDATES)):
        # the bound holds from any state, and grows as each pass consumes rooms
        over = int(np.count_nonzero(state.loads > state.target))
        left = ranks_left_over(state) if over else 0
        if over > searches and left > searches:
            return  # the full fixes leave more ranks above the target than the searches can bring down
        if left == over:
            break  # no full fix applies (it would leave fewer ranks above the target): the passes change nothing
        run_pass()
    if state.loads.max() <= state.target:
        return
    # A search brings one rank (the most loaded) within the target at most: with more ranks above it by more than
    # rounding, some stay above and the caller drops the plan, so the searches are spared.
    rounding = 4 * (state.costs.size + 1) * np.finfo(np.float64).eps * state.target
    if np.count_nonzero(state.loads > state.target + rounding) > searches:
        return
    _search_fixes(state, sources // gpus_per_node, item_bytes, gpus_per_node, searches, rounding)


def idle_search_work(num_items: int) -> int:
    """The pairs the searches may weigh without progress: the budget's floor less half its share per item, at least
    `IDLE_SEARCH_WORK`.  Small instances, where the floor costs little against the default mix, idle longer
    (nonuniform 64 x 16, near_mean 128 x 24 idle 1.6 M pairs before full fixes); from 14 k items on, the short stop
    (near_mean 512 x 32's micro-batch path)."""
    return max(IDLE_SEARCH_WORK, SEARCH_WORK[0] - SEARCH_WORK[1] // 2 * num_items)


def search_work(num_items: int) -> int:
    """The pairs all searches may weigh: the share per item, or under 8 k items half the floor plus the idle allowance
    (small repairs that idle long and then succeed: near_mean 128 x 24's micro-batch path, 2.1 M)."""
    return max(SEARCH_WORK[1] * num_items, SEARCH_WORK[0] // 2 + idle_search_work(num_items))


def _search_fixes(state: PartialPlan, home_node: np.ndarray, item_bytes: np.ndarray, gpus_per_node: int,
                  searches: int, rounding: float) -> None:
    """The byte-aware searches of `repair` (`best_fix`, most loaded rank first, pools widened roomiest first), at most
    `searches`, stopped as `repair` says."""
    num_ranks, everyone = state.loads.size, np.arange(state.loads.size)
    by_rank = np.argsort(state.destinations, kind="stable")
    bounds = np.searchsorted(state.destinations[by_rank], np.arange(num_ranks + 1)).tolist()
    members = [by_rank[bounds[r]:bounds[r + 1]] for r in range(num_ranks)]
    held = np.diff(bounds)  # items per rank
    # `ranks_left_over` at the last check (None after a full fix), and the pairs weighed since that check
    unfixable, idle = ranks_left_over(state), 0
    budget = search_work(state.costs.size)  # pairs left to weigh
    idle_work = idle_search_work(state.costs.size)
    for done in range(searches):
        rank = int(np.argmax(state.loads))
        if (state.loads[rank] <= state.target
                or np.count_nonzero(state.loads > state.target + rounding) > searches - done):
            return  # within the target, or more ranks above it than the searches left can bring down
        others = np.delete(everyone, rank)
        others = others[np.lexsort((others, state.loads[others]))]  # roomiest first
        best, searched = None, 0
        while searched < others.size and (best is None or best[0][0] > 0):
            peak_to_beat = state.loads[rank] if best is None else best[0][1]
            least = state.loads[others[searched]]
            if state.target - least < state.loads[rank] - state.target and (
                    (state.loads[rank] + least) / 2 > peak_to_beat
                    or (best is None and (state.loads[rank] + least) / 2 >= peak_to_beat)):
                break
            searched = min(others.size, max(ROOMY_PARTNERS, 4 * searched))
            pool = np.sort(others[:searched])
            work = int(held[rank]) * (int(held[pool].sum()) + pool.size)
            budget -= work
            if budget < 0:
                return  # searched longer than any repair that succeeded on the traces and mixes surveyed
            if idle + work > idle_work:
                left = ranks_left_over(state)
                if unfixable is not None and 0 < unfixable <= left:
                    return  # no progress: as many ranks as before stay out of every full fix's reach
                unfixable, idle = left, 0
            idle += work
            best = best_fix(state, members, rank, pool, home_node, item_bytes, gpus_per_node, peak_to_beat)
        if best is None:
            return
        if best[0][0] == 0:  # a full fix: one rank fewer above the target
            unfixable, idle = None, 0
        _, item, other, other_rank = best
        moved, there = (np.array([item, other] if other >= 0 else [item]),
                        np.array([other_rank, rank][:1 + (other >= 0)]))
        state.take(moved)
        state.put(moved, there)
        members[rank] = np.sort(np.concatenate([members[rank][members[rank] != item], moved[1:]]))
        members[other_rank] = np.sort(np.concatenate([members[other_rank][members[other_rank] != other], moved[:1]]))
        held[[rank, other_rank]] = members[rank].size, members[other_rank].size


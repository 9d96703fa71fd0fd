"""The fourth phase of communication-aware balancing: repair the ranks left above the target.

    while a rank is above target: the move or swap that fixes it adding the fewest
        inter-node bytes, partners from its own node first (every node at once), then
        from the roomiest ranks (`ROOMY_PARTNERS`, then more)
"""

from __future__ import annotations

import numpy as np

from .partial_plan import PartialPlan

ROOMY_PARTNERS = 16  # roomiest ranks searched first for a partner from another node


def best_fix(state: PartialPlan, members: list[np.ndarray], rank: int, pool: np.ndarray, home_node: np.ndarray,
              item_bytes: np.ndarray, gpus_per_node: int):
    """The best move or swap taking load off `rank` with partner ranks in `pool` (see `repair`).

    `members[r]` lists the items on rank r by index.  Every item on `rank` (rows) meets every partner (columns: items on the
    pool's ranks by index, then the pool's ranks for moves), a block of rows at a time.
    Returns (key, item, partner item or -1, partner rank) or None; smaller keys are better.
    """
    if pool.size == 0:
        return None
    target, cap = state.target, state.cap
    others = np.sort(np.concatenate([members[p] for p in pool.tolist()]))
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
    items = members[rank]
    item_added_here = np.where(rank // gpus_per_node != home_node[items], item_bytes[items], 0.0)
    best_full, best_partial = None, None
    block = max(1, (1 << 20) // partner.size)
    for first in range(0, items.size, block):
        rows = items[first:first + block]
        delta = state.costs[rows, None] - partner_cost
        delta_tokens = state.lengths[rows, None] - partner_tokens
        rank_after = state.loads[rank] - delta
        partner_after = partner_load + delta
        valid = (delta > 0) & (delta_tokens <= partner_room_tokens) & (state.tokens[rank] - delta_tokens <= cap)
        added = (np.where(partner_node != home_node[rows, None], item_bytes[rows, None], 0.0)
                 - item_added_here[first:first + block, None] + partner_added)
        full = np.flatnonzero(valid & (rank_after <= target) & (partner_after <= target))
        if full.size:
            pick = full[np.lexsort((delta.ravel()[full], added.ravel()[full]))[0]]
            row, column = divmod(int(pick), partner.size)
            key = (0, float(added[row, column]), float(delta[row, column]))
            if best_full is None or key < best_full[0]:
                best_full = (key, int(rows[row]), int(partner[column]), int(partner_rank[column]))
        if best_full is not None:
            continue
        # No full fix: per item the partner that lowers max(rank, partner) most (first on ties).
        peak = np.where(valid, np.maximum(rank_after, partner_after), np.inf)
        column = np.argmin(peak, axis=1)
        line = np.arange(rows.size)
        row_peak, row_added = peak[line, column], added[line, column]
        better = np.flatnonzero(row_peak < state.loads[rank])
        if better.size:
            row = int(better[np.lexsort((row_added[better], row_peak[better]))[0]])
            key = (1, float(row_peak[row]), float(row_added[row]))
            if best_partial is None or key < best_partial[0]:
                best_partial = (key, int(rows[row]), int(partner[column[row]]), int(partner_rank[column[row]]))
    return best_full if best_full is not None else best_partial


def _search_sorted(keys: np.ndarray, needles: np.ndarray) -> np.ndarray:
    """np.searchsorted(keys, needles) for non-negative int64 needles, searched in sorted order.

    Sorted needles let each search start where the last one ended (several times faster
    than scattered ones); needle · count + index keys sort as fast as the needles alone.
    """
    count = needles.size
    if count == 0 or float(needles.max()) * count >= 2.0**62:
        return np.searchsorted(keys, needles)
    packed = np.sort(needles * count + np.arange(count))
    position = np.empty(count, dtype=np.int64)
    position[packed % count] = np.searchsorted(keys, packed // count)
    return position


def repair_in_node(state: PartialPlan, gpus_per_node: int) -> None:
    """Rounds of full fixes inside nodes for every node at once (the first phase of `repair`).

    Inside a node a move or swap changes no inter-node bytes, so the best full fix of an
    over-target rank r is the smallest delta = cost_i - cost_j >= load_r - target that
    the partner rank p has room for: per item i on r and partner rank p, the largest
    item j on p with cost_j <= cost_i - (load_r - target), or no item (a move).  Each
    round fixes the most loaded over-target rank of every node that has a fix; a rank
    without one is left to `repair`.
    """
    n, num_ranks = state.costs.size, state.loads.size
    ascending = state.item_of_rank[::-1]  # by cost ascending, ties by index descending
    ascending_costs = state.costs[ascending]
    ascending_rank = np.empty(n, dtype=np.int64)
    ascending_rank[ascending] = np.arange(n)
    offsets = np.arange(gpus_per_node, dtype=np.int64)
    stuck = np.zeros(num_ranks, dtype=bool)
    while True:
        over = np.flatnonzero((state.loads > state.target) & ~stuck)
        if over.size == 0:
            return
        # The most loaded over-target rank of each node (ties by rank).
        over = over[np.lexsort((over, -state.loads[over], over // gpus_per_node))]
        node = over // gpus_per_node
        ranks = over[np.concatenate(([True], node[1:] != node[:-1]))]
        chosen = np.zeros(num_ranks, dtype=bool)
        chosen[ranks] = True
        items = np.flatnonzero(chosen[state.destinations])
        item_rank = state.destinations[items]
        in_node = np.zeros(num_ranks // gpus_per_node, dtype=bool)
        in_node[ranks // gpus_per_node] = True
        held = np.flatnonzero(in_node[state.destinations // gpus_per_node])
        keys = np.sort(state.destinations[held] * n + ascending_rank[held])
        partner_rank = (item_rank - item_rank % gpus_per_node)[:, None] + offsets
        limit = state.costs[items] - (state.loads[item_rank] - state.target)
        count = np.searchsorted(ascending_costs, limit, side="right")  # items with cost <= limit
        position = _search_sorted(keys, (partner_rank * n + count[:, None]).ravel()).reshape(partner_rank.shape) - 1
        found = keys[np.maximum(position, 0)]
        has_partner = (position >= 0) & (found // n == partner_rank)
        partner = np.where(has_partner, ascending[found % n], -1)
        partner_cost = np.where(has_partner, state.costs[partner], 0.0)
        partner_tokens = np.where(has_partner, state.lengths[partner], 0.0)
        delta = state.costs[items, None] - partner_cost
        delta_tokens = state.lengths[items, None] - partner_tokens
        valid = ((partner_rank != item_rank[:, None]) & (delta > 0)
                 & (state.loads[item_rank, None] - delta <= state.target)
                 & (state.loads[partner_rank] + delta <= state.target)
                 & (state.tokens[partner_rank] + delta_tokens <= state.cap)
                 & (state.tokens[item_rank, None] - delta_tokens <= state.cap))
        delta = np.where(valid, delta, np.inf)
        column = np.argmin(delta, axis=1)  # per item, the first partner rank on ties
        line = np.arange(items.size)
        row_delta = delta[line, column]
        # Per rank, its item with the smallest delta (ties by item index).
        order = np.lexsort((row_delta, item_rank))
        first = order[np.concatenate(([True], item_rank[order][1:] != item_rank[order][:-1]))]
        fixed = first[np.isfinite(row_delta[first])]
        stuck[item_rank[first[~np.isfinite(row_delta[first])]]] = True
        if fixed.size == 0:
            continue
        moved, destination = items[fixed], partner_rank[fixed, column[fixed]]
        back, back_rank = partner[fixed, column[fixed]], item_rank[fixed]
        swapped = back >= 0
        state.take(np.concatenate([moved, back[swapped]]))
        state.put(moved, destination)
        state.put(back[swapped], back_rank[swapped])


def repair(state: PartialPlan, sources: np.ndarray, item_bytes: np.ndarray, gpus_per_node: int) -> None:
    """Bring ranks above the target down by moves or swaps, same node first, fewest inter-node bytes.

    For an over-target rank r and each item i on it, every item j on a partner rank (a
    swap) and every partner rank itself (a move) is a candidate; it shifts
    delta = cost_i - cost_j from r to the partner's rank.  Full fixes (both ranks end
    within the target) win, fewest added inter-node bytes first, then smallest delta;
    without one, the candidate that lowers max(r, partner rank) most.  Partners come from
    r's node first (for all nodes at once, `repair_in_node`), then, most loaded rank
    first, from the other ranks roomiest first: the `ROOMY_PARTNERS` roomiest, then
    four times as many, and so on while no full fix is found and a rank left out could
    still offer one (room >= load_r - target) or a better partial one (a partner p
    lowers the peak to (load_r + load_p) / 2 at best), so a search passes over the items
    of the few ranks that can help, not of every rank.  The first full fix found is
    taken; partial fixes are the best over all ranks.  Stops when no candidate improves.
    """
    repair_in_node(state, gpus_per_node)
    home_node = sources // gpus_per_node
    num_ranks = state.loads.size
    everyone = np.arange(num_ranks)
    by_rank = np.argsort(state.destinations, kind="stable")
    bounds = np.searchsorted(state.destinations[by_rank], np.arange(num_ranks + 1)).tolist()
    members = [by_rank[bounds[r]:bounds[r + 1]] for r in range(num_ranks)]
    for _ in range(4 * num_ranks):
        rank = int(np.argmax(state.loads))
        if state.loads[rank] <= state.target:
            return
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
            best = best_fix(state, members, rank, np.sort(others[:searched]), home_node, item_bytes, gpus_per_node)
        if best is None:
            return
        _, item, other, other_rank = best
        moved, there = np.array([item, other] if other >= 0 else [item]), np.array([other_rank, rank][:1 + (other >= 0)])
        state.take(moved)
        state.put(moved, there)
        members[rank] = np.sort(np.concatenate([members[rank][members[rank] != item], moved[1:]]))
        members[other_rank] = np.sort(np.concatenate([members[other_rank][members[other_rank] != other], moved[:1]]))


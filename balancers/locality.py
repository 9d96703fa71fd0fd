"""Communication-aware balancing: reach the plain makespan while moving only what must move.

Items start on `sources[i]`; moving item i off its rank costs `item_bytes[i]`, across
nodes far more than within one.  Given a plain plan of makespan M (any kernel), find

    minimise  sum(item_bytes[i] for i if node(dest[i]) != node(sources[i]))   (then off-rank bytes)
    s.t.      max(loads(dest)) <= M · (1 + slack),  tokens(dest) <= cap

Plain code (unpadded cost):
    target = M * (1 + slack)
    every rank keeps its own items, largest first, each one that still fits under target
    the rest, largest first, per node: dealt round robin to the node's least-loaded ranks
        that have room (4 · gpus_per_node items per node per round), while each fits its rank
    what no rank of its node takes: dealt the same way to the least-loaded ranks of all
        (an LPT round, k-th largest -> k-th least loaded, when nothing fits)
    while a rank is above target: the move or swap that fixes it adding the fewest
        inter-node bytes, partners from its own node first (every node at once), then
        from the roomiest ranks (repair)
A heuristic (the exact problem is a generalised assignment problem, NP-hard; bounds on
the inter-node bytes it must move are in `orchmllm.topology.bounds`); overloaded ranks
shed only what does not fit and under-loaded ranks take it, same node first.  Padded
cost, or whenever the above misses the target or the cap: the plain plan itself, its
groups placed on ranks by an exact sparse linear assignment (`assign_groups`, also used
by `orchmllm.topology.place`), then items of equal length re-dealt among the places such
items take (no rank's load or tokens change).  Either way the result is never worse than
the plain makespan times (1 + slack).  Original to orchmllm; the LAP is scipy's LAPJVsp
(Jonker-Volgenant).
"""

from __future__ import annotations

import functools

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import min_weight_full_bipartite_matching

from .lpt import smallest_ranks
from .problem import Problem, rank_loads, rank_tokens


def as_sources(sources, num_items: int, num_ranks: int, name: str = "sources") -> np.ndarray:
    """Validate source ranks: 1-D integers in [0, num_ranks), one per item; int64 copy."""
    if isinstance(sources, (str, bytes)) or sources is None:
        raise TypeError(f"`{name}` must be a 1-D sequence of rank indices; got {type(sources).__name__}")
    array = np.asarray(sources)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D; got shape {array.shape}")
    if array.size != num_items:
        raise ValueError(f"`{name}` must have one rank per item: {array.size} entries != {num_items} items")
    if array.size and (array.dtype == object or array.dtype.kind not in "iu"):
        if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.floor(array)):
            array = array.astype(np.int64)
        else:
            raise TypeError(f"`{name}` must hold integer ranks; got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.int64)
    bad = np.flatnonzero((array < 0) | (array >= num_ranks))
    if bad.size:
        raise ValueError(f"`{name}` must be ranks in [0, {num_ranks}); got {array[bad[0]]} at index {bad[0]}")
    return array


def as_item_bytes(item_bytes, num_items: int, name: str = "item_bytes") -> np.ndarray:
    """Validate per-item byte counts: 1-D finite non-negative numbers; float64 copy."""
    if isinstance(item_bytes, (str, bytes)) or item_bytes is None:
        raise TypeError(f"`{name}` must be a 1-D sequence of byte counts; got {type(item_bytes).__name__}")
    array = np.asarray(item_bytes)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D; got shape {array.shape}")
    if array.size != num_items:
        raise ValueError(f"`{name}` must have one entry per item: {array.size} entries != {num_items} items")
    if array.size and (array.dtype == object or array.dtype.kind not in "iuf"):
        raise TypeError(f"`{name}` must hold numbers; got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0))
    if bad.size:
        raise ValueError(f"`{name}` must be finite and non-negative; got {array[bad[0]]} at index {bad[0]}")
    return array


def _max_weight_bijection(rows: np.ndarray, cols: np.ndarray, weights: np.ndarray, size: int,
                          *, unlisted_allowed: bool = True) -> np.ndarray:
    """col_of_row of a bijection of range(size) onto itself maximising the summed weights.

    (rows, cols, weights) lists distinct pairs with weight >= 0.  With `unlisted_allowed`,
    every other pair is allowed at weight 0: a maximum-weight matching on the listed pairs
    is found exactly as a min-weight full matching (scipy's LAPJVsp) of the rows into the
    columns plus one private dummy column per row (costs top - weight > 0, so columns may
    stay free), and rows left on their dummy take the free columns in ascending order.
    Otherwise only listed pairs are allowed, and they must admit a perfect matching.
    """
    top = float(weights.max(initial=0.0)) + 1.0
    costs = top - weights
    width = size
    if unlisted_allowed:
        everyone = np.arange(size, dtype=np.int64)
        rows, cols = np.concatenate([rows, everyone]), np.concatenate([cols, everyone + size])
        costs = np.concatenate([costs, np.full(size, top)])
        width = 2 * size
    matrix = csr_matrix((costs, (rows, cols)), shape=(size, width))
    matched_rows, matched_cols = min_weight_full_bipartite_matching(matrix)
    col_of_row = np.empty(size, dtype=np.int64)
    col_of_row[matched_rows] = matched_cols
    dummy = col_of_row >= size
    if dummy.any():
        taken = np.zeros(size, dtype=bool)
        taken[col_of_row[~dummy]] = True
        col_of_row[dummy] = np.flatnonzero(~taken)
    return col_of_row


def _pair_bytes(left: np.ndarray, right: np.ndarray, item_bytes: np.ndarray, width: int):
    """Summed bytes per distinct (left, right) pair: (lefts, rights, bytes)."""
    unique, inverse = np.unique(left * width + right, return_inverse=True)
    return unique // width, unique % width, np.bincount(inverse, weights=item_bytes)


def assign_groups(group_of_item: np.ndarray, sources: np.ndarray, item_bytes: np.ndarray,
                  num_ranks: int, gpus_per_node: int | None = None) -> np.ndarray:
    """rank_of_group: a bijection of D groups onto D ranks keeping the most bytes in place.

    Without `gpus_per_node`: maximise bytes that stay on their rank, exactly (one sparse
    linear assignment).  With it: first maximise bytes that stay on their node, exactly
    (groups -> node slots, gpus_per_node slots per node), then, within every node,
    maximise bytes that stay on their rank for that node's groups (exact per node).
    """
    if gpus_per_node is None:
        groups, ranks, weights = _pair_bytes(group_of_item, sources, item_bytes, num_ranks)
        return _max_weight_bijection(groups, ranks, weights, num_ranks)
    num_nodes = num_ranks // gpus_per_node
    groups, nodes, weights = _pair_bytes(group_of_item, sources // gpus_per_node, item_bytes, num_nodes)
    slot_offsets = np.arange(gpus_per_node, dtype=np.int64)
    slot_of_group = _max_weight_bijection(
        np.repeat(groups, gpus_per_node), (nodes[:, None] * gpus_per_node + slot_offsets).ravel(),
        np.repeat(weights, gpus_per_node), num_ranks)
    return ranks_within_nodes(slot_of_group // gpus_per_node, group_of_item, sources, item_bytes,
                              gpus_per_node)


def ranks_within_nodes(node_of_group: np.ndarray, group_of_item: np.ndarray, sources: np.ndarray,
                       item_bytes: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """rank_of_group keeping every group on its node and the most bytes on their rank (exact).

    `node_of_group` must give every node exactly gpus_per_node groups.
    """
    num_ranks = node_of_group.size
    slot_offsets = np.arange(gpus_per_node, dtype=np.int64)
    block_groups = np.repeat(np.arange(num_ranks, dtype=np.int64), gpus_per_node)
    block_ranks = (node_of_group[:, None] * gpus_per_node + slot_offsets).ravel()
    groups, ranks, weights = _pair_bytes(group_of_item, sources, item_bytes, num_ranks)
    keys = groups * num_ranks + ranks
    block_keys = block_groups * num_ranks + block_ranks
    block_weights = np.zeros(block_keys.size)
    if keys.size:
        found = np.minimum(np.searchsorted(keys, block_keys), keys.size - 1)
        block_weights = np.where(keys[found] == block_keys, weights[found], 0.0)
    return _max_weight_bijection(block_groups, block_ranks, block_weights, num_ranks, unlisted_allowed=False)


def _by_segment(state: "_State", segment: np.ndarray, candidates: np.ndarray):
    """Candidates grouped by segment, largest first (ties by index) within one.

    Returns (keys, items, starts, ends, segments): keys = segment · n + cost rank, sorted;
    items[k] the item of keys[k]; segment segments[s] spans keys[starts[s]:ends[s]].
    """
    n = state.costs.size
    keys = segment[candidates]  # built in place: fresh large arrays cost more than the arithmetic
    keys *= n
    keys += state.cost_rank[candidates]
    keys.sort()
    owner = keys // n
    starts = np.flatnonzero(np.concatenate(([True], owner[1:] != owner[:-1]))) if keys.size else keys
    return keys, state.item_of_rank[keys % n], starts, np.append(starts[1:], keys.size), owner[starts]


def _first_fitting(state: "_State", keys: np.ndarray, segments: np.ndarray, pointer: np.ndarray,
                   room: np.ndarray) -> np.ndarray:
    """Per segment, the first key at or after `pointer` whose item's cost is at most `room`."""
    first_fitting_rank = np.searchsorted(state.negated_sorted_costs, -room, side="left")
    return np.maximum(np.searchsorted(keys, segments * state.costs.size + first_fitting_rank), pointer)


class _State:
    """Destinations, rank loads and rank tokens of a partial plan under a target and a cap."""

    def __init__(self, problem: Problem, target: float):
        self.costs, self.lengths = problem.item_costs, problem.lengths.astype(np.float64)
        self.target = target
        self.cap = np.inf if problem.max_tokens_per_rank is None else float(problem.max_tokens_per_rank)
        self.item_of_rank = problem.cost_order  # largest first, ties by index
        self.cost_rank = np.empty(problem.num_items, dtype=np.int64)
        self.cost_rank[self.item_of_rank] = np.arange(problem.num_items)
        self.negated_sorted_costs = -problem.sorted_costs
        self.destinations = np.full(problem.num_items, -1, dtype=np.int64)
        self.loads = np.zeros(problem.num_ranks)
        self.tokens = np.zeros(problem.num_ranks)

    def fits(self, items: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """Whether each item fits on its rank under the target and the cap (rows of a 2-D `ranks`
        when `items` has a trailing axis of 1)."""
        fits = self.loads[ranks] + self.costs[items] <= self.target
        if self.cap < np.inf:
            fits &= self.tokens[ranks] + self.lengths[items] <= self.cap
        return fits

    def take(self, items: np.ndarray) -> None:
        """Remove placed items from their ranks."""
        np.subtract.at(self.loads, self.destinations[items], self.costs[items])
        np.subtract.at(self.tokens, self.destinations[items], self.lengths[items])
        self.destinations[items] = -1

    def put_runs(self, items: np.ndarray, ranks: np.ndarray) -> None:
        """Place items on ranks (a rank any number of times)."""
        self.destinations[items] = ranks
        self.loads += np.bincount(ranks, weights=self.costs[items], minlength=self.loads.size)
        self.tokens += np.bincount(ranks, weights=self.lengths[items], minlength=self.loads.size)

    def put(self, items: np.ndarray, ranks: np.ndarray) -> None:
        """Place items on ranks (each rank at most once per call)."""
        self.destinations[items] = ranks
        self.loads[ranks] += self.costs[items]
        self.tokens[ranks] += self.lengths[items]


def _keep_home(state: _State, sources: np.ndarray) -> None:
    """Every rank keeps its own items, largest first, each one that still fits.

    A rank whose items all fit keeps them at once (their summed cost a hair short of the
    target, so that no order of summation lets one through that the item-by-item test
    would refuse).  The others go in rounds: each keeps at once the run of its next
    items that fit together (by prefix sums of cost and tokens, with the same margin)
    from the first one that fits, so rounds number about the items a rank skips, not the
    items it keeps.
    """
    num_ranks = state.loads.size
    totals = np.bincount(sources, weights=state.costs, minlength=num_ranks)
    margin = sources.size * np.finfo(np.float64).eps * float(totals.sum())  # bounds any summation's rounding
    token_totals = np.bincount(sources, weights=state.lengths, minlength=num_ranks)
    whole = (totals <= state.target - margin) & (token_totals <= state.cap)
    state.loads[whole], state.tokens[whole] = totals[whole], token_totals[whole]
    stays = whole[sources]
    state.destinations[stays] = sources[stays]
    keys, order, pointer, ends, ranks = _by_segment(state, sources, np.flatnonzero(~stays))
    cost_sums = np.concatenate(([0.0], np.cumsum(state.costs[order])))
    token_sums = np.concatenate(([0.0], np.cumsum(state.lengths[order]))) if state.cap < np.inf else None
    while ranks.size:
        room = state.target - state.loads[ranks]
        position = _first_fitting(state, keys, ranks, pointer, room)
        alive = position < ends
        ranks, position, ends, room = ranks[alive], position[alive], ends[alive], room[alive]
        run_end = np.searchsorted(cost_sums, cost_sums[position] + room - margin, side="right") - 1
        if token_sums is not None:
            token_room = state.cap - state.tokens[ranks]
            run_end = np.minimum(run_end, np.searchsorted(token_sums, token_sums[position] + token_room, side="right") - 1)
        first = order[position]
        run_end = np.minimum(np.maximum(run_end, position + state.fits(first, ranks)), ends)
        count = run_end - position
        kept = np.repeat(run_end - count.cumsum(), count) + np.arange(count.sum())
        state.put_runs(order[kept], np.repeat(ranks, count))
        pointer = np.maximum(run_end, position + 1)
        left = pointer < ends
        ranks, pointer, ends = ranks[left], pointer[left], ends[left]


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


def _round_robin(roomy: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_round_robin_row` for h = max(roomy, 1) ranks, one row per entry of `roomy`."""
    if roomy.size == 0:
        return (np.zeros((0, window), dtype=np.int64),) * 3
    counts, row = np.unique(np.maximum(roomy, 1), return_inverse=True)
    tables = zip(*(_round_robin_row(window, int(count)) for count in counts))
    return tuple(np.stack(table)[row.ravel()] for table in tables)


def _running_sums(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Per row of `values` (a deal listed rank by rank), each entry's running sum within its
    rank; `first` holds, flat, the index of each entry's rank's first entry."""
    running = np.cumsum(values, axis=1)
    running -= (running - values).ravel()[first].reshape(running.shape)
    return running


def _take_in_node(state: _State, sources: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Largest first, the left-over items of each node dealt to its least-loaded ranks that fit.

    In rounds for every node at once: with the node's ranks by (load, rank) and h of them
    having room for its next item that fits any, the node's next `_WINDOW` · gpus_per_node
    items are dealt round robin to those h ranks (the k-th to the (k mod h)-th), and the
    node keeps the longest prefix of the deal in which every item fits its rank (the
    items dealt to the rank before it included, their summed cost a hair short of the
    target so that rounding never lets one through); the next round deals from the first
    item that did not fit.  Items costlier than the room of the node's least-loaded rank
    are skipped at once: no rank of the node can take them later.  This is LPT inside the
    node (the least-loaded ranks take the largest items, turn by turn) with a handful of
    rounds, not one per item.  With a memory cap, an item that fits the least-loaded
    rank's cost room but not its tokens goes to the least-loaded rank of the node that
    fits, if any.  Returns the items no rank of their node could take.
    """
    window_size = _WINDOW * gpus_per_node
    margin = window_size * np.finfo(np.float64).eps * state.target  # bounds a rank's summed rounding
    keys, order, pointer, ends, nodes = _by_segment(state, sources // gpus_per_node,
                                                    np.flatnonzero(state.destinations < 0))
    node_loads = state.loads.reshape(-1, gpus_per_node)  # a view: follows every put
    while nodes.size:
        loads = node_loads[nodes]
        by_load = np.argsort(loads, axis=1, kind="stable")
        loads.sort(axis=1)
        position = _first_fitting(state, keys, nodes, pointer, state.target - loads[:, 0])
        alive = position < ends
        nodes, position, ends, by_load, loads = nodes[alive], position[alive], ends[alive], by_load[alive], loads[alive]
        roomy = np.count_nonzero(loads + state.costs[order[position]][:, None] <= state.target, axis=1)
        # The deal rank by rank, each item with its rank's load after it.
        dealt, rank_column, first = _round_robin(roomy, window_size)
        window = position[:, None] + dealt
        inside = window < ends[:, None]
        items = order[np.minimum(window, ends[:, None] - 1)]
        row = np.arange(nodes.size)[:, None]
        first = (row * window_size + first).ravel()
        rank_flat = (row * gpus_per_node + rank_column).ravel()
        after = loads.ravel()[rank_flat].reshape(items.shape) + _running_sums(
            np.where(inside, state.costs[items], 0.0), first)
        fits = inside & (after <= state.target - margin)
        ranks = nodes[:, None] * gpus_per_node + by_load.ravel()[rank_flat].reshape(items.shape)
        if state.cap < np.inf:
            fits &= state.tokens[ranks] + _running_sums(np.where(inside, state.lengths[items], 0.0), first) <= state.cap
        count = np.where(fits, window_size, dealt).min(axis=1)  # the deal's first item that does not fit
        kept = dealt < count[:, None]
        state.put_runs(items[kept], ranks[kept])
        stuck = np.flatnonzero(count == 0)  # the least-loaded rank lacks token room (or rounding)
        if stuck.size:
            item, row_ranks = order[position[stuck]], nodes[stuck, None] * gpus_per_node + np.arange(gpus_per_node)
            fits = state.fits(item[:, None], row_ranks)
            chosen = np.argmin(np.where(fits, state.loads[row_ranks], np.inf), axis=1)
            placed = fits.any(axis=1)
            state.put(item[placed], row_ranks[placed, chosen[placed]])
            count[stuck] = 1
        pointer = position + count
        left = pointer < ends
        nodes, pointer, ends = nodes[left], pointer[left], ends[left]
    return np.flatnonzero(state.destinations < 0)


_WINDOW = 4  # a round deals _WINDOW · gpus_per_node items per node (_WINDOW · h over all ranks)


def _take_anywhere(state: _State, overflow: np.ndarray) -> None:
    """Largest first, the items no rank of their node took, dealt to the least-loaded ranks that fit.

    In rounds: with ranks by (load, rank) and h of them having room for the largest waiting
    item, the next `_WINDOW` · h items are dealt round robin to those h ranks (the k-th to
    the (k mod h)-th); each rank keeps the longest prefix of its deal that fits (summed
    cost a hair short of the target, tokens within the cap) and the rest wait, in order,
    for the next round.  A round that keeps nothing (no rank has room for the largest
    waiting item, or no token room) is an LPT round instead (`_lpt_round`), which always
    places the largest item, possibly above the target.
    """
    waiting = overflow[np.argsort(state.cost_rank[overflow])]
    margin = _WINDOW * np.finfo(np.float64).eps * state.target  # bounds a rank's summed rounding
    while waiting.size:
        roomy = int(np.count_nonzero(state.loads + state.costs[waiting[0]] <= state.target))
        ranks = smallest_ranks(state.loads, roomy, integer=False) if roomy else np.zeros(0, dtype=np.int64)
        count = min(waiting.size, _WINDOW * roomy)
        passes = -(-count // max(roomy, 1))
        dealt = np.full(passes * roomy, -1, dtype=np.int64)  # pass by pass, rank by rank
        dealt[:count] = waiting[:count]
        dealt = dealt.reshape(passes, roomy)
        inside = dealt >= 0
        fits = state.loads[ranks] + np.cumsum(np.where(inside, state.costs[dealt], 0.0), axis=0) <= state.target - margin
        if state.cap < np.inf:
            fits &= state.tokens[ranks] + np.cumsum(np.where(inside, state.lengths[dealt], 0.0), axis=0) <= state.cap
        kept = (fits & inside).ravel()[:count]  # running sums only grow: a prefix of every rank's deal
        if not kept.any():
            waiting = _lpt_round(state, waiting)
            continue
        state.put_runs(waiting[:count][kept], np.tile(ranks, passes)[:count][kept])
        waiting = np.concatenate([waiting[:count][~kept], waiting[count:]])


def _lpt_round(state: _State, waiting: np.ndarray) -> np.ndarray:
    """One LPT round over all ranks: the k-th largest waiting item to the k-th least-loaded rank
    if it fits; returns the items still waiting.

    The largest item is always placed (on the least-loaded rank with token room), possibly
    above the target, and so are the items after it that fit on no rank (placed together).
    """
    ranks = smallest_ranks(state.loads, min(waiting.size, state.loads.size), integer=False)
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
            raise _NoRoom
        fits[0] = True
        ranks[0] = int(np.argmin(np.where(room, state.loads, np.inf)))
        fits[1:] &= ranks[1:] != ranks[0]
    state.put(chunk[fits], ranks[fits])
    return np.concatenate([chunk[~fits], waiting[ranks.size:]])


def _best_fix(state: _State, members: list[np.ndarray], rank: int, pool: np.ndarray, home_node: np.ndarray,
              item_bytes: np.ndarray, gpus_per_node: int):
    """The best move or swap taking load off `rank` with partner ranks in `pool` (see `_repair`).

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


def _repair_in_node(state: _State, gpus_per_node: int) -> None:
    """Rounds of full fixes inside nodes for every node at once (the first phase of `_repair`).

    Inside a node a move or swap changes no inter-node bytes, so the best full fix of an
    over-target rank r is the smallest delta = cost_i - cost_j >= load_r - target that
    the partner rank p has room for: per item i on r and partner rank p, the largest
    item j on p with cost_j <= cost_i - (load_r - target), or no item (a move).  Each
    round fixes the most loaded over-target rank of every node that has a fix; a rank
    without one is left to `_repair`.
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


def _repair(state: _State, sources: np.ndarray, item_bytes: np.ndarray, gpus_per_node: int) -> None:
    """Bring ranks above the target down by moves or swaps, same node first, fewest inter-node bytes.

    For an over-target rank r and each item i on it, every item j on a partner rank (a
    swap) and every partner rank itself (a move) is a candidate; it shifts
    delta = cost_i - cost_j from r to the partner's rank.  Full fixes (both ranks end
    within the target) win, fewest added inter-node bytes first, then smallest delta;
    without one, the candidate that lowers max(r, partner rank) most.  Partners come from
    r's node first (for all nodes at once, `_repair_in_node`), then, most loaded rank
    first, from the other ranks roomiest first: the `_ROOMY_PARTNERS` roomiest, then
    four times as many, and so on while no full fix is found and a rank left out could
    still offer one (room >= load_r - target) or a better partial one (a partner p
    lowers the peak to (load_r + load_p) / 2 at best), so a search passes over the items
    of the few ranks that can help, not of every rank.  The first full fix found is
    taken; partial fixes are the best over all ranks.  Stops when no candidate improves.
    """
    _repair_in_node(state, gpus_per_node)
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
            searched = min(others.size, max(_ROOMY_PARTNERS, 4 * searched))
            best = _best_fix(state, members, rank, np.sort(others[:searched]), home_node, item_bytes, gpus_per_node)
        if best is None:
            return
        _, item, other, other_rank = best
        moved, there = np.array([item, other] if other >= 0 else [item]), np.array([other_rank, rank][:1 + (other >= 0)])
        state.take(moved)
        state.put(moved, there)
        members[rank] = np.sort(np.concatenate([members[rank][members[rank] != item], moved[1:]]))
        members[other_rank] = np.sort(np.concatenate([members[other_rank][members[other_rank] != other], moved[:1]]))


_ROOMY_PARTNERS = 16


class _NoRoom(Exception):
    """The locality heuristic found no rank with room; the caller falls back."""


def _unpadded(problem: Problem, target: float, sources: np.ndarray, item_bytes: np.ndarray,
              gpus_per_node: int) -> np.ndarray:
    """Keep home, take within the node, take anywhere, repair (unpadded cost)."""
    state = _State(problem, target)
    _keep_home(state, sources)
    overflow = _take_in_node(state, sources, gpus_per_node)
    _take_anywhere(state, overflow)
    if state.loads.max() > target:
        _repair(state, sources, item_bytes, gpus_per_node)
    return state.destinations


def _runs(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start of the run of equal keys each entry belongs to, its position inside that run)."""
    n = sorted_keys.size
    starts = np.flatnonzero(np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1]))) if n else sorted_keys
    run_start = np.repeat(starts, np.diff(np.append(starts, n)))
    return run_start, np.arange(n) - run_start


def _match_by_key(items: np.ndarray, item_keys: np.ndarray, slots: np.ndarray, slot_keys: np.ndarray,
                  item_rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pair items with slots of the same key, most bytes first: (matched items, their slots).

    Within a key, items go in `item_rank` order (bytes descending, ties by index) and
    slots in index order; the k-th item takes the k-th slot while slots last.
    """
    n = item_rank.size
    items = items[np.argsort(item_keys[items] * n + item_rank[items])]  # unique keys: no ties
    slots = slots[np.argsort(slot_keys[slots] * n + slots)]
    keys, available = item_keys[items], slot_keys[slots]
    _, position = _runs(keys)
    first = np.searchsorted(available, keys, side="left")
    count = np.searchsorted(available, keys, side="right") - first
    taken = position < count
    return items[taken], slots[first[taken] + position[taken]]


def _swap_equal_items(lengths: np.ndarray, destinations: np.ndarray, sources: np.ndarray,
                      item_bytes: np.ndarray, gpus_per_node: int, num_ranks: int) -> np.ndarray:
    """Re-deal items of equal length among the places such items take, keeping the most bytes local.

    Items of one length cost the same and hold the same tokens, so any permutation among
    them leaves every rank's load and tokens (padded or not) unchanged.  Per length: the
    items with the most bytes that the node's places can hold stay on their node; of
    those, as many as the rank's places allow stay on their rank (most bytes first); the
    rest of the node's kept items take its other places; everything else takes what is
    left.  This maximises, per length, the bytes kept on their node (exactly), and keeps
    on their rank as many of those as the rank's places allow.
    """
    n = lengths.size
    length_class = np.unique(lengths, return_inverse=True)[1].astype(np.int64).ravel()
    item_rank = np.empty(n, dtype=np.int64)
    item_rank[np.lexsort((np.arange(n), -item_bytes))] = np.arange(n)
    everything = np.arange(n, dtype=np.int64)
    by_node = length_class * num_ranks + sources // gpus_per_node
    # Which items stay on their node: the most bytes, as many as the node has places.
    stay, _ = _match_by_key(everything, by_node, everything, length_class * num_ranks + destinations // gpus_per_node,
                            item_rank)
    result = np.full(n, -1, dtype=np.int64)
    free = np.ones(n, dtype=bool)
    levels = ((stay, length_class * num_ranks + sources, length_class * num_ranks + destinations),
              (stay, by_node, length_class * num_ranks + destinations // gpus_per_node),
              (everything, length_class, length_class))
    for candidates, item_keys, slot_keys in levels:
        waiting = candidates[result[candidates] < 0]
        matched, slots = _match_by_key(waiting, item_keys, np.flatnonzero(free), slot_keys, item_rank)
        result[matched] = destinations[slots]
        free[slots] = False
    return result


def balance_locally(problem: Problem, plain_assignment: np.ndarray, sources: np.ndarray,
                    item_bytes: np.ndarray, gpus_per_node: int, makespan_slack: float) -> np.ndarray:
    """An assignment within (1 + makespan_slack) of the plain plan's makespan moving few bytes.

    `sources` and `item_bytes` must be validated (`as_sources`, `as_item_bytes`) and
    `gpus_per_node` must divide `problem.num_ranks`.  Unpadded: keep home, take within
    the node, take anywhere, repair.  Padded, or when that misses the target or the cap:
    the plain plan with its groups placed on ranks by `assign_groups`, then items of equal
    length re-dealt among their places (`_swap_equal_items`: no rank's load or tokens
    change, up to the order of a float sum; the re-deal is dropped if that lifts a rank
    above the target).
    """
    target = float(rank_loads(problem, plain_assignment).max()) * (1.0 + makespan_slack)
    cap = problem.max_tokens_per_rank
    if not problem.padded:
        try:
            candidate = _unpadded(problem, target, sources, item_bytes, gpus_per_node)
        except _NoRoom:
            candidate = None
        if candidate is not None and rank_loads(problem, candidate).max() <= target and (
                cap is None or rank_tokens(problem, candidate).max() <= cap):
            return candidate
    placed = assign_groups(plain_assignment, sources, item_bytes, problem.num_ranks, gpus_per_node)[plain_assignment]
    swapped = _swap_equal_items(problem.lengths, placed, sources, item_bytes, gpus_per_node, problem.num_ranks)
    # Equal items hold equal costs, but a rank's float sum in another order can gain an ulp.
    return swapped if rank_loads(problem, swapped).max() <= target else placed

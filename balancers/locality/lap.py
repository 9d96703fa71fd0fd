"""Exact placement of D groups on D ranks keeping the most bytes in place: sparse linear assignment.

    maximise sum(item_bytes[i] for i if rank_of_group[group_of_item[i]] == sources[i])
    over bijections rank_of_group of the groups onto the ranks

(per node first when ranks are grouped into nodes, then per rank within each node).  The
LAP is scipy's LAPJVsp (Jonker-Volgenant), exact; `orchmllm.topology.place` and the
communication-aware balancer's fallback both place groups with it.  `assign_groups_greedily`
puts the groups on nodes greedily by bytes instead (the micro-batch fallback: one placement per
micro-batch, where the exact node-level LAP took 40-55 ms apiece at D = 2560), and so does
`assign_groups` given `max_entries` where the node-level LAP would list more (group, slot) pairs
(the balancer's fallback: LAP_MAX_ENTRIES).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix

from ..problem import sorted_order
from .partial_plan import runs

NODES_PER_BLOCK = 256  # nodes whose ranks `assign_groups_greedily` places in one LAP (`_ranks_within_nodes_by_blocks`)
# The balancer's fallback places groups on nodes greedily where the node-level LAP would list more than LAP_MAX_ENTRIES
# (group, slot) pairs and its groups draw from more than DENSE_NODES_PER_GROUP source nodes on average (length-grouped
# sampling: one per item).  There LAPJVsp's time grows ~D^2.5 (2560 x 32 sorted: 651 800 pairs, 1-2 s; the greedy
# 15 ms for 0.02-0.14 % more bytes across nodes), at 2**16 pairs it took 0.03 s (512 x 16 sorted).  Padded plans in
# the sampled order reach it too at D >= 1024 (their length runs draw from ~14 nodes a group; rev16 R16-01: +0.07-0.25 %
# bytes across nodes, makespans equal, 0.12 -> 0.04 s at 2560 x 16); groups from one or two nodes stay exact.
LAP_MAX_ENTRIES, DENSE_NODES_PER_GROUP = 2**16, 2


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
    from scipy.sparse.csgraph import min_weight_full_bipartite_matching  # scipy's graph stack: on first use

    top = float(weights.max(initial=0.0))
    top += max(1.0, float(np.spacing(top)))  # every cost > 0: scipy drops explicit zeros, i.e. the edge
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
    """Summed bytes per distinct (left, right) pair: (lefts, rights, bytes), the pairs ascending (summed in
    item order).  Below 65 536 on both sides the pairs are ordered by two stable radix argsorts of 16 bits
    (right, then left) instead of `np.unique`'s sort of the packed keys left · width + right."""
    if not left.size or max(int(left.max()), int(right.max())) >= 2**16:
        unique, inverse = np.unique(left * width + right, return_inverse=True)
    else:
        order = np.argsort(right.astype(np.uint16), kind="stable")
        order = order[np.argsort(left[order].astype(np.uint16), kind="stable")]
        keys = left[order] * width + right[order]
        new = np.concatenate(([True], keys[1:] != keys[:-1]))
        inverse = np.empty(left.size, dtype=np.int64)
        inverse[order] = np.cumsum(new) - 1
        unique = keys[new]
    return unique // width, unique % width, np.bincount(inverse, weights=item_bytes)


def assign_groups(group_of_item: np.ndarray, sources: np.ndarray, item_bytes: np.ndarray,
                  num_ranks: int, gpus_per_node: int | None = None, max_entries: int | None = None) -> np.ndarray:
    """rank_of_group: a bijection of D groups onto D ranks keeping the most bytes in place.

    Without `gpus_per_node`: maximise bytes that stay on their rank, exactly (one sparse
    linear assignment).  With it: first maximise bytes that stay on their node, exactly
    (groups -> node slots, gpus_per_node slots per node), then, within every node,
    maximise bytes that stay on their rank for that node's groups (exact per node).  With
    `max_entries` too, where the node level would list more (group, slot) pairs than that
    (distinct (group, source node) pairs × gpus_per_node) and the groups draw from more than
    DENSE_NODES_PER_GROUP nodes on average: `assign_groups_greedily` instead.

    >>> assign_groups(np.array([0, 0, 1, 1]), np.array([1, 1, 0, 0]), np.array([5., 5., 3., 3.]), 2).tolist()
    [1, 0]
    """
    if gpus_per_node is None:
        groups, ranks, weights = _pair_bytes(group_of_item, sources, item_bytes, num_ranks)
        return _max_weight_bijection(groups, ranks, weights, num_ranks)
    num_nodes = num_ranks // gpus_per_node
    groups, nodes, weights = _pair_bytes(group_of_item, sources // gpus_per_node, item_bytes, num_nodes)
    if max_entries is not None and groups.size * gpus_per_node > max_entries \
            and groups.size > DENSE_NODES_PER_GROUP * num_ranks:
        return _nodes_greedily(groups, nodes, weights, group_of_item, sources, item_bytes, num_ranks, gpus_per_node)
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


def assign_groups_greedily(group_of_item: np.ndarray, sources: np.ndarray, item_bytes: np.ndarray,
                           num_ranks: int, gpus_per_node: int) -> np.ndarray:
    """rank_of_group: `assign_groups`' bijection with the groups put on nodes greedily by bytes.

    Node level: the (group, node) pairs by bytes descending (ties by group, then node) each
    join while their group has no node and their node a free slot (the groups left take the
    free slots in node order); then, within every node, the most bytes on their rank (exact,
    `ranks_within_nodes`).  Plain code of the node level:

        for g, n in sorted(pairs, key=lambda p: (-bytes[p], p)):
            if node_of[g] is None and free[n]:
                node_of[g], free[n] = n, free[n] - 1

    >>> groups, sources = np.array([0, 0, 1, 1]), np.array([1, 1, 0, 0])
    >>> assign_groups_greedily(groups, sources, np.array([5., 5., 3., 3.]), 2, 1).tolist()
    [1, 0]
    """
    num_nodes = num_ranks // gpus_per_node
    groups, nodes, weights = _pair_bytes(group_of_item, sources // gpus_per_node, item_bytes, num_nodes)
    return _nodes_greedily(groups, nodes, weights, group_of_item, sources, item_bytes, num_ranks, gpus_per_node)


def _nodes_greedily(groups: np.ndarray, nodes: np.ndarray, weights: np.ndarray, group_of_item: np.ndarray,
                    sources: np.ndarray, item_bytes: np.ndarray, num_ranks: int, gpus_per_node: int) -> np.ndarray:
    """`assign_groups_greedily` given the summed bytes of its (group, node) pairs (`_pair_bytes`)."""
    num_nodes = num_ranks // gpus_per_node
    node_of_group = np.full(num_ranks, -1, dtype=np.int64)
    held = _proposals(groups, nodes, weights, num_ranks, gpus_per_node)
    node_of_group[groups[held]] = nodes[held]
    room = gpus_per_node - np.bincount(nodes[held], minlength=num_nodes)
    node_of_group[node_of_group < 0] = np.repeat(np.arange(num_nodes, dtype=np.int64), room)
    return _ranks_within_nodes_by_blocks(node_of_group, group_of_item, sources, item_bytes, gpus_per_node)


def _ranks_within_nodes_by_blocks(node_of_group: np.ndarray, group_of_item: np.ndarray, sources: np.ndarray,
                                  item_bytes: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """`ranks_within_nodes`, its LAP solved for NODES_PER_BLOCK nodes at a time: the nodes are independent, and
    the LAP's time grows faster than its size (23 040 ranks: 106 ms at once, 43 ms by blocks of 256 nodes)."""
    num_ranks = node_of_group.size
    block_of_group = node_of_group // NODES_PER_BLOCK
    groups = np.argsort(block_of_group, kind="stable")
    local = np.empty(num_ranks, dtype=np.int64)  # a group's index within its block
    group_starts = np.searchsorted(block_of_group[groups], np.arange(block_of_group.max(initial=0) + 2))
    local[groups] = np.arange(num_ranks) - np.repeat(group_starts[:-1], np.diff(group_starts))
    # only the items that stay on their group's node count, each within its group's block
    items = np.flatnonzero(sources // gpus_per_node == node_of_group[group_of_item])
    items = items[np.argsort(block_of_group[group_of_item[items]], kind="stable")]
    item_starts = np.searchsorted(block_of_group[group_of_item[items]], np.arange(group_starts.size))
    rank_of_group = np.empty(num_ranks, dtype=np.int64)
    for block in range(group_starts.size - 1):
        members = groups[group_starts[block]:group_starts[block + 1]]
        held = items[item_starts[block]:item_starts[block + 1]]
        first = block * NODES_PER_BLOCK * gpus_per_node
        rank_of_group[members] = first + ranks_within_nodes(
            node_of_group[members] - block * NODES_PER_BLOCK, local[group_of_item[held]], sources[held] - first,
            item_bytes[held], gpus_per_node)
    return rank_of_group


def _proposals(groups: np.ndarray, nodes: np.ndarray, weights: np.ndarray, num_groups: int,
               slots: int) -> np.ndarray:
    """The pairs the greedy keeps (`assign_groups_greedily`), by proposals: every group without a node
    proposes its next heaviest pair, every node keeps its `slots` best pairs (by the greedy's order)
    of those it holds and those proposed, until no group is left with a pair to propose.  With
    preferences on both sides given by one strict order of the pairs, this is the greedy's
    matching (the unique stable one), in at most max-degree rounds of numpy."""
    order = sorted_order(weights)  # the pairs come by (group, node): ties keep that order
    size = groups.size
    place = np.empty(size, dtype=np.int64)  # each pair's position in the greedy's order (order[place[p]] == p)
    place[order] = np.arange(size)
    own = order[np.sort(groups * size + place) % size]  # every group's pairs, best first
    start = np.searchsorted(groups[own], np.arange(num_groups))
    end = np.append(start[1:], groups.size)
    pointer, held = start.copy(), np.zeros(0, dtype=np.int64)
    proposing = np.flatnonzero(pointer < end)
    while proposing.size:
        proposed = own[pointer[proposing]]
        pointer[proposing] += 1
        pairs = np.concatenate([held, proposed])
        pairs = order[np.sort(nodes[pairs] * size + place[pairs]) % size]  # by node, then the greedy's order
        kept = runs(nodes[pairs])[1] < slots
        held, refused = pairs[kept], groups[pairs[~kept]]
        proposing = refused[pointer[refused] < end[refused]]
    return held

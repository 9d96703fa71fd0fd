"""Exact placement of D groups on D ranks keeping the most bytes in place: sparse linear assignment.

    maximise sum(item_bytes[i] for i if rank_of_group[group_of_item[i]] == sources[i])
    over bijections rank_of_group of the groups onto the ranks

(per node first when ranks are grouped into nodes, then per rank within each node).  The
LAP is scipy's LAPJVsp (Jonker-Volgenant), exact; `orchmllm.topology.place` and the
communication-aware balancer's fallback both place groups with it.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix


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

    >>> assign_groups(np.array([0, 0, 1, 1]), np.array([1, 1, 0, 0]), np.array([5., 5., 3., 3.]), 2).tolist()
    [1, 0]
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

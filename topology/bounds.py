"""Lower bounds on the inter-node bytes of any plan that reaches a given makespan.

Nodes k = 0..N-1 of g ranks; C_k is the cost of the items that start on node k, M the
makespan, so a node can hold at most g·M of cost, and S = N·g·M - sum_k C_k is the free
capacity of the whole cluster.
- Send: node k must send away items of cost >= e_k = max(0, C_k - g·M).  The fewest
  bytes that do so are at least the fractional knapsack: node k's items in increasing
  bytes per cost, the last one in part, until their cost reaches e_k.  Call it s_k.
- Receive: every other node holds at most g·M, so node j ends with at least g·M - S of
  cost and receives at least r_cost_j = max(0, g·M - S - C_j); in bytes, at least the
  fractional knapsack of that cost over the items that start elsewhere.  Call it r_j.
- Total: bytes_inter_node >= sum_k s_k.  Busiest node: max over k of max(send, receive)
  >= max(max_k s_k, max_j r_j, sum_k s_k / N).
Padded ranks cost at least the sum of their items' f(l), so the bounds hold for them too
with item costs f(l).  Plain code: `inter_node_lower_bound(costs, sources, bytes, topo, M)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..balancers.validation import as_item_bytes, as_sources
from .cluster import Topology


@dataclass(frozen=True, eq=False)
class InterNodeBound:
    """Lower bounds on total and busiest-node inter-node bytes, and the per-node ones."""

    bytes_inter_node: float
    busiest_node_inter_bytes: float
    node_send: np.ndarray
    node_recv: np.ndarray


def _cheapest_bytes(need: float, costs: np.ndarray, item_bytes: np.ndarray) -> float:
    """Fractional knapsack: fewest bytes of items (parts allowed) whose cost reaches `need`."""
    if need <= 0:
        return 0.0
    useful = costs > 0
    costs, item_bytes = costs[useful], item_bytes[useful]
    order = np.argsort(item_bytes / costs, kind="stable")
    costs, item_bytes = costs[order], item_bytes[order]
    covered = np.cumsum(costs)
    whole = int(np.searchsorted(covered, need))
    if whole >= costs.size:
        return float(item_bytes.sum())
    before = float(covered[whole - 1]) if whole else 0.0
    return float(item_bytes[:whole].sum()) + (need - before) * float(item_bytes[whole] / costs[whole])


def inter_node_lower_bound(item_costs, sources, item_bytes, topology: Topology, makespan: float) -> InterNodeBound:
    """Bounds on inter-node bytes for every plan with makespan <= `makespan` (see module doc)."""
    if not isinstance(topology, Topology):
        raise TypeError(f"`topology` must be a Topology; got {type(topology).__name__}")
    costs = as_item_bytes(item_costs, np.size(item_costs), name="item_costs")
    sources = as_sources(sources, costs.size, topology.world_size)
    item_bytes = as_item_bytes(item_bytes, costs.size)
    gpus, nodes = topology.gpus_per_node, topology.num_nodes
    node = sources // gpus
    node_cost = np.bincount(node, weights=costs, minlength=nodes)
    capacity = gpus * float(makespan)
    free = nodes * capacity - float(costs.sum())
    send, recv = np.zeros(nodes), np.zeros(nodes)
    # Only nodes over capacity must send, only nodes with more room than the slack must receive.
    for k in np.flatnonzero(node_cost > capacity).tolist():
        own = node == k
        send[k] = _cheapest_bytes(node_cost[k] - capacity, costs[own], item_bytes[own])
    for k in np.flatnonzero(capacity - free - node_cost > 0).tolist():
        others = node != k
        recv[k] = _cheapest_bytes(capacity - free - node_cost[k], costs[others], item_bytes[others])
    for array in (send, recv):
        array.setflags(write=False)
    total = float(send.sum())
    busiest = max(float(send.max()), float(recv.max()), total / nodes)
    return InterNodeBound(total, busiest, send, recv)

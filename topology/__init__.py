"""Topology-aware placement and communication (numpy/scipy/PuLP only; never torch).

Public API:
- `Topology(num_nodes, gpus_per_node, intra_node_bw_bytes_per_s=450e9,
  inter_node_bw_bytes_per_s=50e9, latency_s=10e-6)`: frozen, validated; `.world_size`,
  `.node_of(ranks)`, `.check_world_size(n)`; `Topology.preset(name, num_nodes)` and
  `Topology.for_world_size(world_size, gpus_per_node=None, preset="h100")`, presets in
  `PRESETS` ("h100", "a100", "gb200-nvl72", "pcie").
- `traffic(sources, destinations, item_bytes, topology) -> Traffic`: bytes kept /
  moved within a node / moved across nodes, per rank and per node;
  `traffic_matrix(..., level="node")`: the node-to-node (or rank-to-rank) byte matrix.
- `estimate_exchange(sources, destinations, item_bytes, topology, strategy) -> CommEstimate`:
  modelled seconds and bytes of a "flat" all-to-all, a "nodewise" hierarchical
  all-to-all or an "allgather" (see `comm_model` for the model).
- `place(group_of_item, sources, item_bytes, topology, method="lap", time_limit=None)
  -> Placement`: a bijection of a balanced plan's groups onto ranks (`rank_of_group`,
  `destinations`, `traffic`, `status`); methods in `PLACEMENTS`: "identity", "lap"
  (exact max bytes kept on rank), "lap_node" (exact max bytes kept on node, then on
  rank), "ilp" (the paper's node-wise min-max ILP, warm-started from "lap_node").
- `inter_node_lower_bound(item_costs, sources, item_bytes, topology, makespan)
  -> InterNodeBound`: bytes any plan of that makespan must move across nodes, in total
  and at the busiest node (see `bounds` for the derivation).
- Communication-aware balancing itself lives in the balancers:
  `orchmllm.balancers.balance(lengths, D, sources=, item_bytes=, topology=)`.
"""

from .bounds import InterNodeBound, inter_node_lower_bound
from .cluster import PRESETS, Topology
from .comm_model import STRATEGIES, CommEstimate, estimate_exchange
from .placement import PLACEMENTS, Placement, place
from .traffic import Traffic, traffic, traffic_matrix

__all__ = ["PLACEMENTS", "PRESETS", "STRATEGIES", "CommEstimate", "InterNodeBound", "Placement", "Topology",
           "Traffic", "estimate_exchange", "inter_node_lower_bound", "place", "traffic",
           "traffic_matrix"]

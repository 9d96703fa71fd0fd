"""Traffic accounting for one move: which bytes stay, cross NVLink, or cross nodes.

Item i of `item_bytes[i]` bytes moves from rank `sources[i]` to rank `destinations[i]`.
    kept        = sum(b[i] for i if dst[i] == src[i])
    intra_node  = sum(b[i] for i if dst[i] != src[i] and node(dst[i]) == node(src[i]))
    inter_node  = sum(b[i] for i if node(dst[i]) != node(src[i]))
Per node, inter-node send / receive volumes are the all-to-all bottleneck: the exchange
cannot finish before the busiest node has pushed (or pulled) its bytes through its NICs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..balancers.validation import as_item_bytes, as_sources
from .cluster import Topology


@dataclass(frozen=True, eq=False)
class Traffic:
    """Bytes of a move by locality, per rank and per node (all float64 byte counts).

    `rank_send[r]` / `rank_recv[r]` count bytes rank r sends to / receives from other
    ranks; `rank_send_inter` / `rank_recv_inter` only those crossing nodes.
    `node_send_inter[k]` / `node_recv_inter[k]` are node k's inter-node volumes.
    """

    bytes_total: float
    bytes_kept: float
    bytes_intra_node: float
    bytes_inter_node: float
    rank_send: np.ndarray
    rank_recv: np.ndarray
    rank_send_inter: np.ndarray
    rank_recv_inter: np.ndarray
    node_send_inter: np.ndarray
    node_recv_inter: np.ndarray

    @property
    def busiest_node_inter_bytes(self) -> float:
        """max over nodes of max(inter-node bytes sent, received)."""
        return float(max(self.node_send_inter.max(), self.node_recv_inter.max()))

    @property
    def bytes_moved(self) -> float:
        """Bytes that leave their rank (intra- plus inter-node)."""
        return self.bytes_intra_node + self.bytes_inter_node

    @property
    def inter_node_fraction(self) -> float:
        """bytes_inter_node / bytes_total (0 when nothing is moved)."""
        return self.bytes_inter_node / self.bytes_total if self.bytes_total > 0 else 0.0


def validate_move(sources, destinations, item_bytes, topology: Topology):
    """Canonical (sources, destinations, item_bytes) arrays, validated against `topology`."""
    if not isinstance(topology, Topology):
        raise TypeError(f"`topology` must be a Topology; got {type(topology).__name__}")
    sources = as_sources(sources, np.size(sources), topology.world_size)
    destinations = as_sources(destinations, sources.size, topology.world_size, name="destinations")
    return sources, destinations, as_item_bytes(item_bytes, sources.size)


def traffic(sources, destinations, item_bytes, topology: Topology) -> Traffic:
    """Account the bytes of moving every item from its source to its destination rank."""
    sources, destinations, item_bytes = validate_move(sources, destinations, item_bytes, topology)
    return traffic_of(sources, destinations, item_bytes, topology)


def traffic_of(sources: np.ndarray, destinations: np.ndarray, item_bytes: np.ndarray,
               topology: Topology) -> Traffic:
    """`traffic` on already validated arrays (the fast path for solvers)."""
    ranks, nodes = topology.world_size, topology.num_nodes
    gpus = topology.gpus_per_node
    moved = sources != destinations
    crosses = (sources // gpus) != (destinations // gpus)
    moved_bytes = np.where(moved, item_bytes, 0.0)
    inter_bytes = np.where(crosses, item_bytes, 0.0)
    rank_send_inter = np.bincount(sources, weights=inter_bytes, minlength=ranks)
    rank_recv_inter = np.bincount(destinations, weights=inter_bytes, minlength=ranks)
    arrays = dict(
        rank_send=np.bincount(sources, weights=moved_bytes, minlength=ranks),
        rank_recv=np.bincount(destinations, weights=moved_bytes, minlength=ranks),
        rank_send_inter=rank_send_inter,
        rank_recv_inter=rank_recv_inter,
        node_send_inter=rank_send_inter.reshape(nodes, gpus).sum(axis=1),
        node_recv_inter=rank_recv_inter.reshape(nodes, gpus).sum(axis=1),
    )
    for array in arrays.values():
        array.setflags(write=False)
    total = float(item_bytes.sum())
    inter = float(inter_bytes.sum())
    return Traffic(bytes_total=total, bytes_kept=float(item_bytes[~moved].sum()),
                   bytes_intra_node=float(item_bytes[moved & ~crosses].sum()),
                   bytes_inter_node=inter, **arrays)


def traffic_matrix(sources, destinations, item_bytes, topology: Topology, level: str = "node") -> np.ndarray:
    """Bytes sent from node (or rank) i to node (or rank) j; items that stay on their rank count nowhere.

    `level` is "node" (num_nodes x num_nodes; the diagonal is traffic within a node) or
    "rank" (world_size x world_size).

    >>> topology = Topology(num_nodes=2, gpus_per_node=2)
    >>> traffic_matrix([0, 1, 3], [2, 1, 2], [5.0, 7.0, 1.0], topology).tolist()
    [[0.0, 5.0], [0.0, 1.0]]
    """
    if level not in ("node", "rank"):
        raise ValueError(f"`level` must be 'node' or 'rank'; got {level!r}")
    sources, destinations, item_bytes = validate_move(sources, destinations, item_bytes, topology)
    width = 1 if level == "rank" else topology.gpus_per_node
    size = topology.world_size // width
    moved = sources != destinations
    matrix = np.zeros((size, size))
    np.add.at(matrix, (sources[moved] // width, destinations[moved] // width), item_bytes[moved])
    return matrix

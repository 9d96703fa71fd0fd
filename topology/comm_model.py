"""Time of an exchange on a `Topology`: latency + bytes / bandwidth per link, busiest link decides.

Model.  Every GPU has one NVLink port (intra-node, `intra_node_bw_bytes_per_s` per
direction) and one NIC (inter-node, `inter_node_bw_bytes_per_s` per direction); a link
carrying m messages and b bytes in one direction is busy for
    t(link) = latency_s · m + b / bw
and a phase lasts as long as its busiest link; phases run one after another.

- "flat": one all-to-all, every rank sends each peer its bytes directly (intra-node
  peers over NVLink, others over its own NIC).  One phase.
- "nodewise" (hierarchical, the OrchMLLM paper's node-wise all-to-all):
  1. aggregate: intra-node items go straight to their destination; bytes bound for other
     nodes are striped over the node's g GPUs (each relay gets 1/g, so (g-1)/g of them
     cross NVLink);
  2. inter-node: one exchange per node pair, striped over the node's g NICs, so node k
     is busy latency_s · (peer nodes) + max(send_k, recv_k) / (g · inter bw);
  3. scatter: relays forward received bytes to their destination rank ((g-1)/g over NVLink).
- "allgather" (the paper's ablation): every rank receives every item.  Inter-node, a
  bandwidth-optimal (ring) all-gather over the node's g NICs: node k receives
  total - own_k bytes in N - 1 steps; then an intra-node all-gather in which every rank
  receives (g-1)/g of the total over NVLink in g - 1 steps.

Memory: `rank_peak_bytes` is the bytes a rank holds if nothing is freed during the
exchange (its own items + everything it receives, relayed bytes included).  Not modelled:
congestion in the network core, NCCL protocol overheads, overlap between phases.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cluster import Topology
from .traffic import traffic_of, validate_move

STRATEGIES = ("flat", "nodewise", "allgather")


@dataclass(frozen=True, eq=False)
class CommEstimate:
    """Modelled time and volume of one exchange.

    `phase_seconds` lists (phase name, seconds) in order; `seconds` is their sum.
    `bytes_inter_node` / `bytes_intra_node` are bytes that cross NICs / NVLink (relayed
    bytes count once per hop).  `bottleneck` names the link that decides the longest phase.
    """

    strategy: str
    seconds: float
    phase_seconds: tuple[tuple[str, float], ...]
    bytes_inter_node: float
    bytes_intra_node: float
    bottleneck: str
    rank_recv_bytes: np.ndarray
    rank_peak_bytes: np.ndarray


def _busiest(latency_s: float, messages: np.ndarray, volume: np.ndarray, bw: float) -> tuple[float, int]:
    """Longest link time latency · m + b / bw over an array of links, and its index."""
    times = np.where((messages > 0) | (volume > 0), latency_s * messages + volume / bw, 0.0)
    index = int(np.argmax(times)) if times.size else 0
    return (float(times[index]) if times.size else 0.0), index


def _phase(latency_s: float, links: list[tuple[str, np.ndarray, np.ndarray, float]]) -> tuple[float, str]:
    """Duration of a phase (its busiest link) and that link's name."""
    best, name = 0.0, "none"
    for label, messages, volume, bw in links:
        seconds, index = _busiest(latency_s, messages, volume, bw)
        if seconds > best:
            best, name = seconds, f"{label} {index}"
    return best, name


def _distinct_peers(left: np.ndarray, right: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per index, how many distinct partners it sends to / receives from (pairs given as arrays)."""
    pairs = np.unique(left * size + right)
    return (np.bincount(pairs // size, minlength=size).astype(np.float64),
            np.bincount(pairs % size, minlength=size).astype(np.float64))


def estimate_exchange(sources, destinations, item_bytes, topology: Topology,
                      strategy: str = "nodewise") -> CommEstimate:
    """Model the time and bytes of moving items from `sources` to `destinations` with `strategy`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown `strategy` {strategy!r}; choose one of {list(STRATEGIES)}")
    sources, destinations, item_bytes = validate_move(sources, destinations, item_bytes, topology)
    return ESTIMATORS[strategy](sources, destinations, item_bytes, topology)


def _flat(sources, destinations, item_bytes, topology: Topology) -> CommEstimate:
    move = traffic_of(sources, destinations, item_bytes, topology)
    ranks, gpus = topology.world_size, topology.gpus_per_node
    sent = (sources != destinations) & (item_bytes > 0)
    crosses = (sources // gpus) != (destinations // gpus)
    intra_out, intra_in = _distinct_peers(sources[sent & ~crosses], destinations[sent & ~crosses], ranks)
    inter_out, inter_in = _distinct_peers(sources[sent & crosses], destinations[sent & crosses], ranks)
    intra_bw, inter_bw = topology.intra_node_bw_bytes_per_s, topology.inter_node_bw_bytes_per_s
    seconds, bottleneck = _phase(topology.latency_s, [
        ("rank NVLink send", intra_out, move.rank_send - move.rank_send_inter, intra_bw),
        ("rank NVLink recv", intra_in, move.rank_recv - move.rank_recv_inter, intra_bw),
        ("rank NIC send", inter_out, move.rank_send_inter, inter_bw),
        ("rank NIC recv", inter_in, move.rank_recv_inter, inter_bw),
    ])
    own = np.bincount(sources, weights=item_bytes, minlength=ranks)
    return CommEstimate("flat", seconds, (("all-to-all", seconds),), move.bytes_inter_node,
                        move.bytes_intra_node, bottleneck, _frozen(move.rank_recv),
                        _frozen(own + move.rank_recv))


def _nodewise(sources, destinations, item_bytes, topology: Topology) -> CommEstimate:
    move = traffic_of(sources, destinations, item_bytes, topology)
    ranks, gpus, nodes = topology.world_size, topology.gpus_per_node, topology.num_nodes
    latency = topology.latency_s
    intra_bw, inter_bw = topology.intra_node_bw_bytes_per_s, topology.inter_node_bw_bytes_per_s
    sent = (sources != destinations) & (item_bytes > 0)
    crosses = (sources // gpus) != (destinations // gpus)
    direct = sent & ~crosses
    direct_out, direct_in = _distinct_peers(sources[direct], destinations[direct], ranks)
    node_of_rank = np.arange(ranks) // gpus
    share = (gpus - 1) / gpus
    # Phase 1: direct intra-node items, and inter-bound bytes striped over the local relays.
    relays = gpus - 1 if gpus > 1 else 0
    out_1 = np.where(move.rank_send_inter > 0, relays, direct_out)
    stash = (move.node_send_inter[node_of_rank] - move.rank_send_inter) / gpus
    in_1 = np.maximum(direct_in, np.where(stash > 0, relays, 0))
    direct_send = move.rank_send - move.rank_send_inter
    direct_recv = move.rank_recv - move.rank_recv_inter
    aggregate, where_1 = _phase(latency, [
        ("rank NVLink send", out_1, direct_send + share * move.rank_send_inter, intra_bw),
        ("rank NVLink recv", in_1, direct_recv + stash, intra_bw),
    ])
    # Phase 2: one message per node pair, striped over the node's NICs.
    inter = sent & crosses
    node_out, node_in = _distinct_peers(sources[inter] // gpus, destinations[inter] // gpus, nodes)
    exchange, where_2 = _phase(latency, [
        ("node NICs send", node_out, move.node_send_inter, gpus * inter_bw),
        ("node NICs recv", node_in, move.node_recv_inter, gpus * inter_bw),
    ])
    # Phase 3: relays forward what arrived to its destination rank.
    forward = (move.node_recv_inter[node_of_rank] - move.rank_recv_inter) / gpus
    out_3 = np.where(forward > 0, relays, 0)
    in_3 = np.where(move.rank_recv_inter > 0, relays, 0)
    scatter, where_3 = _phase(latency, [
        ("rank NVLink send", out_3, forward, intra_bw),
        ("rank NVLink recv", in_3, share * move.rank_recv_inter, intra_bw),
    ])
    phases = (("aggregate", aggregate), ("inter-node", exchange), ("scatter", scatter))
    bottleneck = (where_1, where_2, where_3)[int(np.argmax([aggregate, exchange, scatter]))]
    own = np.bincount(sources, weights=item_bytes, minlength=ranks)
    relayed = move.node_recv_inter[node_of_rank] / gpus
    nvlink = move.bytes_intra_node + 2 * share * move.bytes_inter_node
    return CommEstimate("nodewise", aggregate + exchange + scatter, phases, move.bytes_inter_node,
                        nvlink, bottleneck, _frozen(move.rank_recv),
                        _frozen(own + move.rank_recv + stash + relayed))


def _allgather(sources, destinations, item_bytes, topology: Topology) -> CommEstimate:
    ranks, gpus, nodes = topology.world_size, topology.gpus_per_node, topology.num_nodes
    own = np.bincount(sources, weights=item_bytes, minlength=ranks)
    node_own = own.reshape(nodes, gpus).sum(axis=1)
    total = float(item_bytes.sum())
    share = (gpus - 1) / gpus
    steps_inter = np.full(nodes, nodes - 1, dtype=np.float64)
    exchange, where_1 = _phase(topology.latency_s, [
        ("node NICs recv", steps_inter, total - node_own, gpus * topology.inter_node_bw_bytes_per_s)])
    steps_intra = np.full(ranks, gpus - 1, dtype=np.float64)
    gather, where_2 = _phase(topology.latency_s, [
        ("rank NVLink recv", steps_intra, np.full(ranks, share * total), topology.intra_node_bw_bytes_per_s)])
    bottleneck = where_1 if exchange >= gather else where_2
    return CommEstimate("allgather", exchange + gather, (("inter-node", exchange), ("intra-node", gather)),
                        float((total - node_own).sum()), float(ranks * share * total), bottleneck,
                        _frozen(total - own), _frozen(np.full(ranks, total)))


def _frozen(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=np.float64)
    array.setflags(write=False)
    return array


ESTIMATORS = {"flat": _flat, "nodewise": _nodewise, "allgather": _allgather}

"""The exchange time model: hand-computed phases, scaling laws and the strategies' ordering."""

import numpy as np
import pytest

from orchmllm.topology import STRATEGIES, Topology, estimate_exchange, traffic

# 2 nodes × 2 gpus, NVLink 100 B/s, NIC 10 B/s, 1 s per message: easy arithmetic.
SMALL = Topology(2, 2, intra_node_bw_bytes_per_s=100.0, inter_node_bw_bytes_per_s=10.0, latency_s=1.0)
# rank 0 -> rank 1 (same node, 50 B), rank 1 -> rank 2 (other node, 40 B).
MOVE = dict(sources=[0, 1], destinations=[1, 2], item_bytes=[50.0, 40.0])


def test_flat_is_decided_by_the_busiest_link():
    estimate = estimate_exchange(**MOVE, topology=SMALL, strategy="flat")
    # rank 1's NIC: 1 message + 40 B / 10 B/s = 5 s; rank 0's NVLink only 1 + 0.5 s.
    assert estimate.seconds == pytest.approx(5.0)
    assert estimate.bottleneck == "rank NIC send 1"
    assert estimate.bytes_inter_node == 40 and estimate.bytes_intra_node == 50
    assert estimate.rank_recv_bytes.tolist() == [0, 50, 40, 0]
    assert estimate.rank_peak_bytes.tolist() == [50, 90, 40, 0]


def test_nodewise_phases_hand_computed():
    estimate = estimate_exchange(**MOVE, topology=SMALL, strategy="nodewise")
    phases = dict(estimate.phase_seconds)
    # aggregate: rank 0 sends 50 B to rank 1 directly (1 + 0.5 s); rank 1 stripes its
    # 40 inter-node bytes over the node's 2 GPUs, 20 B to rank 0 (1 + 0.2 s).
    assert phases["aggregate"] == pytest.approx(1.5)
    # inter-node: node 0 sends 40 B over 2 NICs: 1 + 40 / 20 = 3 s.
    assert phases["inter-node"] == pytest.approx(3.0)
    # scatter: rank 3 forwards its 20 B stripe to rank 2: 1 + 0.2 s.
    assert phases["scatter"] == pytest.approx(1.2)
    assert estimate.seconds == pytest.approx(5.7)
    assert estimate.bytes_inter_node == 40
    assert estimate.bytes_intra_node == 50 + 20 + 20


def test_allgather_hand_computed():
    estimate = estimate_exchange(**MOVE, topology=SMALL, strategy="allgather")
    phases = dict(estimate.phase_seconds)
    # node 1 must receive all 90 B over its 2 NICs in 1 ring step: 1 + 90 / 20 s.
    assert phases["inter-node"] == pytest.approx(5.5)
    # then every rank receives half the total over NVLink in 1 step: 1 + 45 / 100 s.
    assert phases["intra-node"] == pytest.approx(1.45)
    assert estimate.rank_peak_bytes.tolist() == [90] * 4
    assert estimate.rank_recv_bytes.tolist() == [40, 50, 90, 90]


@pytest.mark.parametrize("strategy", ["flat", "nodewise"])
def test_nothing_moved_costs_nothing(strategy):
    estimate = estimate_exchange([0, 1, 2], [0, 1, 2], [5.0, 6.0, 7.0], SMALL, strategy)
    assert estimate.seconds == 0 and estimate.bytes_inter_node == 0
    assert estimate.bottleneck == "none"


def _random_move(topology, seed, num_items=400):
    rng = np.random.default_rng(seed)
    sources = rng.integers(0, topology.world_size, num_items)
    destinations = rng.integers(0, topology.world_size, num_items)
    return sources, destinations, rng.integers(1, 10_000, num_items).astype(float)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_without_latency_time_scales_inversely_with_bandwidth(strategy):
    base = Topology(4, 4, intra_node_bw_bytes_per_s=300e9, inter_node_bw_bytes_per_s=25e9, latency_s=0.0)
    fast = Topology(4, 4, intra_node_bw_bytes_per_s=600e9, inter_node_bw_bytes_per_s=50e9, latency_s=0.0)
    move = _random_move(base, seed=1)
    assert estimate_exchange(*move, fast, strategy).seconds == pytest.approx(
        estimate_exchange(*move, base, strategy).seconds / 2)


def test_nodewise_sends_far_fewer_messages_than_flat_when_latency_dominates():
    topology = Topology(8, 8, latency_s=10e-6)
    sources, destinations, _ = _random_move(topology, seed=2, num_items=4000)
    tiny = np.full(sources.size, 64.0)
    flat = estimate_exchange(sources, destinations, tiny, topology, "flat")
    nodewise = estimate_exchange(sources, destinations, tiny, topology, "nodewise")
    assert nodewise.seconds < flat.seconds / 2


def test_allgather_moves_and_holds_more_than_an_all_to_all():
    topology = Topology.preset("h100", num_nodes=4)
    sources, destinations, item_bytes = _random_move(topology, seed=3)
    gather = estimate_exchange(sources, destinations, item_bytes, topology, "allgather")
    for strategy in ("flat", "nodewise"):
        exchange = estimate_exchange(sources, destinations, item_bytes, topology, strategy)
        assert gather.bytes_inter_node > exchange.bytes_inter_node
        assert gather.rank_peak_bytes.max() > exchange.rank_peak_bytes.max()
    assert np.all(gather.rank_peak_bytes == item_bytes.sum())


@pytest.mark.parametrize("strategy", ["flat", "nodewise"])
def test_all_to_all_volumes_match_the_traffic(strategy):
    topology = Topology(3, 4)
    sources, destinations, item_bytes = _random_move(topology, seed=4)
    estimate = estimate_exchange(sources, destinations, item_bytes, topology, strategy)
    move = traffic(sources, destinations, item_bytes, topology)
    assert estimate.bytes_inter_node == pytest.approx(move.bytes_inter_node)
    assert estimate.rank_recv_bytes == pytest.approx(move.rank_recv)
    assert estimate.seconds == pytest.approx(sum(seconds for _, seconds in estimate.phase_seconds))


def test_unknown_strategy_lists_the_known_ones():
    with pytest.raises(ValueError,
                       match=r"unknown `strategy` 'ring'; choose one of \['flat', 'nodewise', 'allgather'\]"):
        estimate_exchange(**MOVE, topology=SMALL, strategy="ring")


def test_bad_moves_are_rejected():
    with pytest.raises(ValueError, match=r"`destinations` must be ranks in \[0, 4\); got 7"):
        estimate_exchange([0, 1], [1, 7], [1.0, 1.0], SMALL, "flat")
    with pytest.raises(ValueError, match="`item_bytes` must be finite and non-negative"):
        estimate_exchange([0, 1], [1, 2], [1.0, -np.inf], SMALL, "nodewise")

"""Topology validation and presets, and traffic accounting against hand-computed moves."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmllm.topology import PRESETS, Topology, traffic


def test_rank_lives_on_node_rank_div_gpus():
    topology = Topology(num_nodes=3, gpus_per_node=4)
    assert topology.world_size == 12
    assert topology.node_of([0, 3, 4, 11]).tolist() == [0, 0, 1, 2]


def test_defaults_are_the_h100_preset():
    assert Topology(2, 8) == Topology.preset("h100", num_nodes=2)
    assert Topology(2, 8).inter_node_bw_bytes_per_s == 50e9  # 400 Gb/s per GPU


@pytest.mark.parametrize("name", sorted(PRESETS), ids=sorted(PRESETS))
def test_presets_are_valid_and_nvlink_beats_the_network(name):
    topology = Topology.preset(name, num_nodes=2)
    assert topology.world_size == 2 * topology.gpus_per_node
    assert topology.intra_node_bw_bytes_per_s > topology.inter_node_bw_bytes_per_s


def test_for_world_size_builds_whole_nodes():
    topology = Topology.for_world_size(2560, gpus_per_node=8)
    assert (topology.num_nodes, topology.gpus_per_node) == (320, 8)
    assert Topology.for_world_size(144, preset="gb200-nvl72").num_nodes == 2


def test_world_size_mismatch_shows_the_arithmetic():
    with pytest.raises(ValueError, match=r"320 nodes × 8 gpus = 2560 != world size 2048"):
        Topology(320, 8).check_world_size(2048)
    with pytest.raises(ValueError, match=r"2050 = 256 × 8 \+ 2"):
        Topology.for_world_size(2050)


@pytest.mark.parametrize("field", ["intra_node_bw_bytes_per_s", "inter_node_bw_bytes_per_s"])
@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf")])
def test_bandwidths_must_be_positive_and_finite(field, value):
    with pytest.raises(ValueError, match=f"`{field}` must be finite and > 0"):
        Topology(2, 8, **{field: value})


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(num_nodes=0, gpus_per_node=8), ValueError, "`num_nodes` must be >= 1"),
    (dict(num_nodes=2, gpus_per_node=-8), ValueError, "`gpus_per_node` must be >= 1"),
    (dict(num_nodes=2.0, gpus_per_node=8), TypeError, "`num_nodes` must be an int"),
    (dict(num_nodes=2, gpus_per_node=8, latency_s=-1e-6), ValueError, "`latency_s` must be finite and >= 0"),
])
def test_bad_sizes_are_rejected(kwargs, error, message):
    with pytest.raises(error, match=message):
        Topology(**kwargs)


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown topology preset 'tpu'.*h100"):
        Topology.preset("tpu", num_nodes=1)


def test_node_of_rejects_ranks_outside_the_cluster():
    with pytest.raises(ValueError, match=r"`ranks` must be in \[0, 8\)"):
        Topology(2, 4).node_of([8])


def test_traffic_hand_computed():
    # 2 nodes × 2 gpus: ranks 0,1 on node 0 and 2,3 on node 1.
    topology = Topology(2, 2)
    sources = [0, 0, 1, 2, 3]
    destinations = [0, 1, 2, 3, 0]
    item_bytes = [1, 2, 4, 8, 16]
    move = traffic(sources, destinations, item_bytes, topology)
    assert move.bytes_total == 31
    assert move.bytes_kept == 1  # item 0 stays on rank 0
    assert move.bytes_intra_node == 2 + 8  # 0->1 and 2->3
    assert move.bytes_inter_node == 4 + 16  # 1->2 and 3->0
    assert move.rank_send.tolist() == [2, 4, 8, 16]
    assert move.rank_recv.tolist() == [16, 2, 4, 8]
    assert move.rank_send_inter.tolist() == [0, 4, 0, 16]
    assert move.node_send_inter.tolist() == [4, 16]
    assert move.node_recv_inter.tolist() == [16, 4]
    assert move.busiest_node_inter_bytes == 16
    assert move.inter_node_fraction == pytest.approx(20 / 31)


@given(st.integers(1, 3), st.integers(1, 3), st.integers(0, 30), st.randoms(use_true_random=False))
def test_traffic_partitions_the_bytes(num_nodes, gpus, num_items, random):
    topology = Topology(num_nodes, gpus)
    ranks = topology.world_size
    sources = [random.randrange(ranks) for _ in range(num_items)]
    destinations = [random.randrange(ranks) for _ in range(num_items)]
    item_bytes = [random.randrange(100) for _ in range(num_items)]
    move = traffic(sources, destinations, item_bytes, topology)
    assert move.bytes_kept + move.bytes_intra_node + move.bytes_inter_node == move.bytes_total == sum(item_bytes)
    assert move.node_send_inter.sum() == move.node_recv_inter.sum() == move.bytes_inter_node
    assert move.rank_send.sum() == move.rank_recv.sum() == move.bytes_moved


@pytest.mark.parametrize("sources, destinations, item_bytes, error, message", [
    ([0, 4], [0, 1], [1, 1], ValueError, r"`sources` must be ranks in \[0, 4\); got 4 at index 1"),
    ([0, 1], [0, -1], [1, 1], ValueError, r"`destinations` must be ranks in \[0, 4\); got -1 at index 1"),
    ([0, 1], [0, 1, 2], [1, 1], ValueError, r"`destinations` must have one rank per item: 3 entries != 2 items"),
    ([0, 1], [0, 1], [1, -2], ValueError, "`item_bytes` must be finite and non-negative; got -2.0 at index 1"),
    ([0, 1], [0, 1], [1, float("nan")], ValueError, "`item_bytes` must be finite and non-negative; got nan"),
    ([0, 1], [0, 1], [1], ValueError, "`item_bytes` must have one entry per item: 1 entries != 2 items"),
    ([0.5, 1], [0, 1], [1, 1], TypeError, "`sources` must hold integer ranks"),
    ([[0, 1]], [0, 1], [1, 1], ValueError, "`sources` must be 1-D"),
])
def test_traffic_rejects_bad_input(sources, destinations, item_bytes, error, message):
    with pytest.raises(error, match=message):
        traffic(sources, destinations, item_bytes, Topology(2, 2))


def test_traffic_needs_a_topology():
    with pytest.raises(TypeError, match="`topology` must be a Topology"):
        traffic([0], [0], [1], topology=8)


def test_traffic_arrays_are_read_only():
    move = traffic(np.array([0, 1]), np.array([1, 0]), np.array([3.0, 4.0]), Topology(1, 2))
    with pytest.raises(ValueError):
        move.rank_send[0] = 0

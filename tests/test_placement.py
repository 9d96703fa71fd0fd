"""Placement of balanced groups onto ranks: bijections, exactness against brute force."""

import itertools

import numpy as np
import pytest

from orchmllm.balancers import Status, balance
from orchmllm.balancers.validation import SizeLimitError
from orchmllm.topology import PLACEMENTS, Topology, nodewise_ilp, place, traffic


def _instance(topology, seed, num_items=None):
    rng = np.random.default_rng(seed)
    num_items = num_items or 3 * topology.world_size
    groups = rng.integers(0, topology.world_size, num_items)
    sources = rng.integers(0, topology.world_size, num_items)
    return groups, sources, rng.integers(0, 20, num_items).astype(float)


def _volumes(rank_of_group, groups, sources, item_bytes, topology):
    move = traffic(sources, np.asarray(rank_of_group)[groups], item_bytes, topology)
    return move


def test_regression_the_ilp_refuses_a_model_past_its_size():
    """probe22 P22-13: at 2560 ranks on 320 nodes (819 200 binaries) placement 'ilp' ran 84 CPU s past its 10 s
    limit (the model is built in Python) and returned lap_node's placement."""
    topology = Topology(128, 8)
    lengths = np.random.default_rng(1).integers(100, 4000, 1024 * 2)
    groups, sources = balance(lengths, 1024, algorithm="lpt").assignment, np.repeat(np.arange(1024), 2)
    with pytest.raises(SizeLimitError, match=r"^placement 'ilp' needs 131072 binaries for 1024 ranks × 128 nodes, "
                                             r"over MAX_BINARIES=65536; use 'lap_node'"):
        place(groups, sources, lengths, topology, "ilp")


def test_regression_a_model_whose_build_used_the_time_limit_is_not_solved(monkeypatch):
    solves = []
    monkeypatch.setattr(nodewise_ilp, "run_cbc", lambda *args, **kwargs: solves.append(args))
    topology = Topology(4, 4)
    lengths = np.random.default_rng(5).integers(100, 4000, 16 * 8)
    groups, sources = balance(lengths, 16, algorithm="lpt").assignment, np.repeat(np.arange(16), 8)
    ilp = place(groups, sources, lengths, topology, "ilp", time_limit=1e-9)
    assert solves == [] and ilp.status is Status.TIME_LIMIT
    np.testing.assert_array_equal(ilp.rank_of_group,
                                  place(groups, sources, lengths, topology, "lap_node").rank_of_group)


@pytest.mark.parametrize("method", sorted(PLACEMENTS), ids=sorted(PLACEMENTS))
def test_every_method_is_a_bijection_with_consistent_traffic(method):
    topology = Topology(4, 2)
    groups, sources, item_bytes = _instance(topology, seed=0)
    placement = place(groups, sources, item_bytes, topology, method=method, time_limit=5)
    assert sorted(placement.rank_of_group.tolist()) == list(range(topology.world_size))
    assert placement.destinations.tolist() == placement.rank_of_group[groups].tolist()
    expected = traffic(sources, placement.destinations, item_bytes, topology)
    assert placement.traffic.bytes_inter_node == expected.bytes_inter_node
    assert placement.traffic.bytes_kept == expected.bytes_kept
    assert placement.method == method


def test_identity_runs_group_g_on_rank_g():
    topology = Topology(2, 2)
    groups, sources, item_bytes = _instance(topology, seed=1)
    assert place(groups, sources, item_bytes, topology, "identity").rank_of_group.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("seed", range(6))
def test_lap_keeps_the_most_bytes_on_their_rank(seed):
    topology = Topology(3, 2)
    groups, sources, item_bytes = _instance(topology, seed, num_items=int(2 + 3 * seed))
    placement = place(groups, sources, item_bytes, topology, "lap")
    best = max(_volumes(perm, groups, sources, item_bytes, topology).bytes_kept
               for perm in itertools.permutations(range(6)))
    assert placement.traffic.bytes_kept == best
    assert placement.status is Status.OPTIMAL


@pytest.mark.parametrize("seed", range(6))
def test_lap_node_keeps_the_most_bytes_on_their_node_then_rank(seed):
    topology = Topology(3, 2)
    groups, sources, item_bytes = _instance(topology, seed, num_items=int(2 + 3 * seed))
    placement = place(groups, sources, item_bytes, topology, "lap_node")
    moves = {perm: _volumes(perm, groups, sources, item_bytes, topology) for perm in itertools.permutations(range(6))}
    assert placement.traffic.bytes_inter_node == min(move.bytes_inter_node for move in moves.values())
    nodes = placement.rank_of_group // 2
    same_nodes = [move.bytes_kept for perm, move in moves.items() if np.array_equal(np.array(perm) // 2, nodes)]
    assert placement.traffic.bytes_kept == max(same_nodes)


def _dense_best_kept(groups, sources, item_bytes, size):
    """Most bytes kept on their rank over every bijection: scipy's dense assignment."""
    from scipy.optimize import linear_sum_assignment

    kept = np.zeros((size, size))
    np.add.at(kept, (groups, sources), item_bytes)
    rows, cols = linear_sum_assignment(kept, maximize=True)
    return kept[rows, cols].sum()


def _star(size):
    """Every group draws only from ranks 0 and 1: all but two groups stay out of the matching."""
    rng = np.random.default_rng(size)
    groups = np.repeat(np.arange(size), 2)
    return groups, np.tile([0, 1], size), rng.integers(1, 50, 2 * size).astype(float)


def _paths(size):
    """Pairs (2k, 2k+1): group 2k keeps 1 on rank 2k or 10 on rank 2k+1, group 2k+1 only 1 on
    rank 2k+1: the best plan leaves half the groups out although a perfect matching exists."""
    even = np.arange(0, size, 2)
    groups = np.concatenate([even, even, even + 1])
    sources = np.concatenate([even, even + 1, even + 1])
    return groups, sources, np.concatenate([np.ones(even.size), np.full(even.size, 10.0), np.ones(even.size)])


def _sparse(size):
    rng = np.random.default_rng(size)
    return rng.integers(0, size, 3 * size), rng.integers(0, size, 3 * size), rng.integers(0, 30, 3 * size) * 1.0


@pytest.mark.parametrize("make", [_star, _paths, _sparse], ids=["star", "paths", "sparse"])
@pytest.mark.parametrize("size", [6, 18, 40])
def test_lap_matches_the_dense_assignment_however_many_groups_stay_out(make, size):
    """The sparse LAP lists only pairs that keep bytes; it must still reach the dense optimum
    when many groups keep nothing (they take the ranks left over)."""
    groups, sources, item_bytes = make(size)
    placement = place(groups, sources, item_bytes, Topology(1, size), "lap")
    assert sorted(placement.rank_of_group.tolist()) == list(range(size))
    assert placement.traffic.bytes_kept == pytest.approx(_dense_best_kept(groups, sources, item_bytes, size))


@pytest.mark.parametrize("seed", [10, 11, 15, 18])  # 10, 15 and 18: lap_node's busiest node is not optimal
def test_ilp_minimises_the_busiest_node_then_the_total(seed):
    topology = Topology(3, 2)
    groups, sources, item_bytes = _instance(topology, seed, num_items=10)
    placement = place(groups, sources, item_bytes, topology, "ilp", time_limit=20)
    best = min((move.busiest_node_inter_bytes, move.bytes_inter_node)
               for move in (_volumes(perm, groups, sources, item_bytes, topology)
                            for perm in itertools.permutations(range(6))))
    found = (placement.traffic.busiest_node_inter_bytes, placement.traffic.bytes_inter_node)
    assert found == best
    assert placement.status is Status.OPTIMAL


def test_ilp_is_never_worse_than_its_lap_node_warm_start():
    topology = Topology(4, 4)
    lengths = np.random.default_rng(5).integers(100, 4000, 16 * 8)
    sources = np.repeat(np.arange(16), 8)
    groups = balance(lengths, 16, algorithm="lpt").assignment
    ilp = place(groups, sources, lengths, topology, "ilp", time_limit=2)
    lap = place(groups, sources, lengths, topology, "lap_node")
    assert (ilp.traffic.busiest_node_inter_bytes, ilp.traffic.bytes_inter_node) <= (
        lap.traffic.busiest_node_inter_bytes, lap.traffic.bytes_inter_node)
    assert ilp.status in (Status.OPTIMAL, Status.TIME_LIMIT)
    assert ilp.solve_seconds < 2 + 3  # its limit plus CBC start-up and model building


@pytest.mark.parametrize("method", sorted(PLACEMENTS), ids=sorted(PLACEMENTS))
def test_same_input_same_placement(method):
    topology = Topology(2, 4)
    groups, sources, item_bytes = _instance(topology, seed=7)
    first = place(groups, sources, item_bytes, topology, method, time_limit=5)
    again = place(groups.copy(), sources.copy(), item_bytes.copy(), topology, method, time_limit=5)
    assert first.rank_of_group.tolist() == again.rank_of_group.tolist()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(method="hungarian"), ValueError, r"unknown placement `method` 'hungarian'; choose one of \["),
    (dict(group_of_item=[0, 4]), ValueError, r"`group_of_item` must be ranks in \[0, 4\); got 4 at index 1"),
    (dict(sources=[-1, 0]), ValueError, r"`sources` must be ranks in \[0, 4\); got -1 at index 0"),
    (dict(item_bytes=[1.0, float("nan")]), ValueError, "`item_bytes` must be finite and non-negative"),
    (dict(item_bytes=[1.0]), ValueError, "`item_bytes` must have one entry per item"),
    (dict(time_limit=-1), ValueError, "`time_limit` must be a positive finite number"),
    (dict(topology=4), TypeError, "`topology` must be a Topology"),
])
def test_bad_input_is_rejected(kwargs, error, message):
    arguments = dict(group_of_item=[0, 1], sources=[1, 0], item_bytes=[1.0, 2.0], topology=Topology(2, 2))
    arguments.update(kwargs)
    with pytest.raises(error, match=message):
        place(**arguments)


@pytest.mark.parametrize("bytes_per_item", [3.0, 2.0**60])
def test_groups_keep_their_bytes_whatever_the_bytes_scale(bytes_per_item):
    """Costs of the assignment are top - bytes: at 2**60 bytes `top` was bytes + 1.0, rounded to the
    bytes, so the best pairs cost 0 and scipy dropped them as absent edges: the placement kept no
    byte in place instead of all."""
    from orchmllm.balancers.locality.lap import assign_groups, ranks_within_nodes

    item_bytes = np.full(4, bytes_per_item)
    assert assign_groups(np.array([0, 0, 1, 1]), np.array([1, 1, 0, 0]), item_bytes, 2).tolist() == [1, 0]
    node_of_group, group_of_item, sources = np.array([0, 0]), np.array([0, 1]), np.array([1, 0])
    assert ranks_within_nodes(node_of_group, group_of_item, sources, item_bytes[:2], 2).tolist() == [1, 0]

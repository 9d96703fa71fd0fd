"""The communication-aware balancer's group placement when every group draws from many source nodes.

Length-grouped sampling (rank r holds the r-th run of sorted lengths) makes every plain group take
its items from as many nodes as it has items: the node-level LAP of `balance_locally`'s fallback was
dense and took 1-2 s at 2560 x 32 (probe22 P22-02); such groups now go on nodes greedily by bytes.
"""

import numpy as np
import pytest

from orchmllm import Topology, balance
from orchmllm.balancers.locality import lap
from orchmllm.balancers.locality.lap import assign_groups, assign_groups_greedily
from orchmllm.study.models import MODELS

COST = MODELS["84b"].stages()[-1].cost


def _lap_sizes(monkeypatch):
    """The (group, column) pairs listed in each LAP solved from now on."""
    sizes, solve = [], lap._max_weight_bijection
    monkeypatch.setattr(lap, "_max_weight_bijection", lambda rows, *args, **kw: sizes.append(rows.size)
                        or solve(rows, *args, **kw))
    return sizes


def test_regression_length_grouped_sources_solved_a_dense_node_level_lap(monkeypatch):
    """A ramp 3..3n, rank r holding the r-th run of 32, at 1024 ranks (128 nodes x 8): the deal misses and the
    fallback's node-level LAP listed 262 128 (group, slot) pairs (every group from 32 nodes; 0.2-0.3 s, ~D^2.5);
    now no LAP lists more than LAP_MAX_ENTRIES, and the plan still meets the plain makespan."""
    num_ranks, per_rank = 1024, 32
    lengths = np.arange(1, num_ranks * per_rank + 1) * 3
    sources = np.repeat(np.arange(num_ranks), per_rank)
    sizes = _lap_sizes(monkeypatch)
    plan = balance(lengths, num_ranks, cost=COST, sources=sources, topology=Topology(num_ranks // 8, 8))
    assert sizes and max(sizes) <= lap.LAP_MAX_ENTRIES
    assert plan.makespan <= balance(lengths, num_ranks, cost=COST).makespan * 1.002


def _dense_instance(seed, num_ranks=64, per_rank=6, gpus_per_node=4):
    """Groups of `per_rank` items drawn at random: each from up to `per_rank` nodes."""
    rng = np.random.default_rng(seed)
    group_of_item = np.repeat(rng.permutation(num_ranks), per_rank)
    sources = rng.integers(0, num_ranks, group_of_item.size)
    return group_of_item, sources, rng.integers(1, 100, group_of_item.size).astype(float), num_ranks, gpus_per_node


@pytest.mark.parametrize("seed", range(4))
def test_assign_groups_over_max_entries_places_dense_groups_greedily(seed):
    """Over `max_entries`, groups drawing from more than DENSE_NODES_PER_GROUP nodes on average are placed as
    `assign_groups_greedily` places them; at or under it, exactly as without the limit."""
    args = _dense_instance(seed)
    pairs = lap._pair_bytes(args[0], args[1] // args[4], args[2], args[3] // args[4])[0].size
    assert pairs > lap.DENSE_NODES_PER_GROUP * args[3]
    greedy = assign_groups_greedily(*args)
    assert np.array_equal(assign_groups(*args, max_entries=pairs * args[4] - 1), greedy)
    assert np.array_equal(assign_groups(*args, max_entries=pairs * args[4]), assign_groups(*args))


@pytest.mark.parametrize("seed", range(4))
def test_assign_groups_keeps_sparse_groups_exact_over_max_entries(seed):
    """Groups drawing from at most DENSE_NODES_PER_GROUP nodes on average (padded plans: neighbours together)
    stay with the exact LAP whatever `max_entries`."""
    rng = np.random.default_rng(seed)
    num_ranks, gpus_per_node = 64, 4
    group_of_item = np.repeat(np.arange(num_ranks), 6)
    sources = (group_of_item + rng.integers(0, 2, group_of_item.size) * gpus_per_node) % num_ranks
    item_bytes = rng.integers(1, 100, group_of_item.size).astype(float)
    args = (rng.permutation(num_ranks)[group_of_item], sources, item_bytes, num_ranks, gpus_per_node)
    assert np.array_equal(assign_groups(*args, max_entries=0), assign_groups(*args))

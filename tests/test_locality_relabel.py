"""Relabelling the ranks of a symmetric topology does not change the bytes the communication-aware plan moves (probe25
P25-08).

A relabelling permutes whole nodes and the ranks inside each node, and maps the sources alike (what another launcher
rank order gives).  The deal broke ties by rank index (least-loaded ranks, repair partners), so the relabelled
problem's plan moved up to 1.34x the bytes across nodes at the same makespan; it now runs under labels read from the
items (`canonical_ranks`), so the plan is the same one, relabelled.
"""

import numpy as np
import pytest

from orchmllm.balancers import CostModel, balance, balance_microbatches
from orchmllm.balancers.locality.balance import canonical_ranks, deal_locally
from orchmllm.balancers.origins import Origins
from orchmllm.balancers.problem import make_problem
from orchmllm.topology import Topology

COST = CostModel(linear=1.0, quadratic=1e-4)


def _relabelling(rng, num_nodes, gpus_per_node):
    """pi[r]: rank r's new label, whole nodes permuted and the ranks inside each node permuted."""
    nodes = rng.permutation(num_nodes)
    return np.concatenate([nodes[node] * gpus_per_node + rng.permutation(gpus_per_node)
                           for node in range(num_nodes)])


def _instance(seed, wide=None):
    """probe25 c21's generator: uniform lengths, sources rank by rank, and a relabelling (up to 8 nodes where
    `wide`, seed 0 by default as c22's, else up to 4)."""
    rng = np.random.default_rng(seed)
    wide = seed == 0 if wide is None else wide
    gpus_per_node, num_nodes = int(rng.choice([2, 4, 8])), int(rng.choice([2, 4, 8] if wide else [2, 4]))
    num_ranks = gpus_per_node * num_nodes
    n = num_ranks * int(rng.choice([4, 8, 16]))
    lengths = rng.integers(1, 8000, n)
    sources = np.repeat(np.arange(num_ranks), n // num_ranks)
    return lengths, sources, Topology(num_nodes, gpus_per_node), _relabelling(rng, num_nodes, gpus_per_node)


def _moved(assignment, sources, lengths, gpus_per_node):
    """(tokens off their node, tokens off their rank)."""
    return (int(lengths[assignment // gpus_per_node != sources // gpus_per_node].sum()),
            int(lengths[assignment != sources].sum()))


@pytest.mark.parametrize("seed", [0, 46, 58], ids=["c22_seed0_1.20x", "c21_seed46_1.36x", "c21_seed58_1.16x"])
def test_relabelled_ranks_move_the_same_bytes(seed):
    """probe25 c22 seed 0 (D = 32 = 4 x 8: 93 750 vs 112 650 tokens across nodes) and c21 seeds 46 and 58 (D 16
    and 8): the repair's searches picked partners by rank index.  Now the relabelled plan is the plan relabelled."""
    lengths, sources, topology, pi = _instance(seed)
    gpus = topology.gpus_per_node
    plan = balance(lengths, topology.world_size, cost=COST, sources=sources, topology=topology)
    relabelled = balance(lengths, topology.world_size, cost=COST, sources=pi[sources], topology=topology)
    assert relabelled.makespan == plan.makespan
    assert _moved(relabelled.assignment, pi[sources], lengths, gpus) == _moved(plan.assignment, sources, lengths, gpus)
    assert relabelled.assignment.tolist() == pi[plan.assignment].tolist()


@pytest.mark.parametrize("seed", [102, 105, 116])
def test_the_deal_is_the_same_under_any_relabelling_of_scattered_sources(seed):
    """`deal_locally` on sources scattered at random (not rank by rank): the deal under any relabelling is the deal
    under the first, relabelled (the repair runs: few items a rank, a tight target; before, every relabelling of
    these seeds dealt another plan)."""
    rng = np.random.default_rng(seed)
    num_nodes, gpus_per_node = 4, 4
    lengths = rng.integers(1, 8000, 96)
    sources = rng.integers(0, 16, lengths.size)
    problem = make_problem(lengths, 16, cost=COST)
    target = float(balance(lengths, 16, cost=COST).makespan) * 1.002
    first = deal_locally(problem, target, Origins(sources, lengths.astype(float), gpus_per_node))
    assert first is not None
    for _ in range(3):
        pi = _relabelling(rng, num_nodes, gpus_per_node)
        again = deal_locally(problem, target, Origins(pi[sources], lengths.astype(float), gpus_per_node))
        assert again.tolist() == pi[first].tolist()


def test_canonical_labels_follow_the_items():
    """The labels of relabelled sources are the first labels, relabelled; nodes stay whole; sources rank by rank
    (every rank holding items) keep their labels (None: plans of that layout unchanged)."""
    rng = np.random.default_rng(7)
    sources = rng.integers(0, 12, 60)
    labels = canonical_ranks(sources, 12, 3)
    assert sorted(labels.tolist()) == list(range(12))
    assert np.all(np.ptp((labels // 3).reshape(4, 3), axis=1) == 0)  # a node's ranks share one node
    for _ in range(3):
        pi = _relabelling(rng, 4, 3)
        assert canonical_ranks(pi[sources], 12, 3)[pi].tolist() == labels.tolist()
    assert canonical_ranks(np.repeat(np.arange(12), 5), 12, 3) is None


@pytest.mark.parametrize("seed", [1, 9, 53], ids=["c22_seed1_1.34x", "c21_seed9_2.26x", "c21_seed53_1.53x"])
def test_relabelled_ranks_move_the_same_bytes_in_micro_batches(seed):
    """probe25 c22 seed 1 (D = 16 = 4 x 4: 216 092 vs 290 343 tokens across nodes) and c21 seeds 9 and 53: the cells
    deal's first fit inside a node and its least-loaded cells broke ties by cell index (`keep_cells_local` now runs
    under `canonical_ranks`)."""
    lengths, sources, topology, pi = _instance(seed, wide=seed == 1)
    budget = int(max(lengths.max(), lengths.sum() / topology.world_size / 2))
    plans = [balance_microbatches(lengths, topology.world_size, cost=COST, max_tokens_per_microbatch=budget,
                                  sources=where, topology=topology) for where in (sources, pi[sources])]
    assert plans[1].step_cost == plans[0].step_cost
    assert _moved(plans[1].rank, pi[sources], lengths, topology.gpus_per_node) == _moved(
        plans[0].rank, sources, lengths, topology.gpus_per_node)

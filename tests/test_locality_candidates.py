"""The communication-aware pass never moves more bytes than a labelling of the plain plan's groups (probe20 P20-08).

Its objective is lexicographic: bytes that leave their node, then bytes that leave their rank.  The deal's plan
stands only where a relaxation proves no labelling of the plain groups beats it; else the exact labelling (`lap`)
and the plain plan itself are candidates too.
"""

import itertools

import numpy as np
import pytest

from orchmllm.balancers import CostModel, balance
from orchmllm.topology import Topology

QUADRATIC = CostModel(linear=1.0, quadratic=1e-3)


def _moved(assignment, sources, item_bytes, gpus_per_node):
    """(bytes off their node, bytes off their rank)."""
    assignment, sources = np.asarray(assignment), np.asarray(sources)
    off_node = assignment // gpus_per_node != sources // gpus_per_node
    return float(item_bytes[off_node].sum()), float(item_bytes[assignment != sources].sum())


@pytest.mark.parametrize("algorithm, lengths, sources, gpus_per_node", [
    ("auto", [1696, 211, 2812, 119, 57, 224, 2597], [1, 1, 1, 1, 0, 1, 1], 1),
    ("lpt", [1696, 211, 2812, 119, 57, 224, 2597], [1, 1, 1, 1, 0, 1, 1], 1),
    ("karmarkar_karp", [1130, 166, 1815, 2476, 1866], [1, 0, 0, 0, 0], 2),
], ids=["auto", "lpt", "karmarkar_karp_one_node"])
def test_the_deal_does_not_swap_the_plain_groups_the_wrong_way(algorithm, lengths, sources, gpus_per_node):
    """probe20 c37: the deal returned the plain plan's two groups with their labels swapped, moving 29 % (2.0x
    within one node) more bytes at the same makespan; the plain plan's own labelling is kept now."""
    lengths = np.array(lengths)
    item_bytes = 3.0 * lengths
    topology = Topology(num_nodes=2 // gpus_per_node, gpus_per_node=gpus_per_node)
    plain = balance(lengths, 2, cost=QUADRATIC, algorithm=algorithm)
    plan = balance(lengths, 2, cost=QUADRATIC, algorithm=algorithm, sources=sources, topology=topology,
                   item_bytes=item_bytes)
    assert plan.makespan <= plain.makespan
    assert plan.assignment.tolist() == plain.assignment.tolist()
    assert _moved(plan.assignment, sources, item_bytes, gpus_per_node) == _moved(plain.assignment, sources,
                                                                                 item_bytes, gpus_per_node)


ALGORITHMS = ["auto", "lpt", "karmarkar_karp", "multifit", "padded"]


@pytest.mark.parametrize("algorithm", ALGORITHMS, ids=ALGORITHMS)
@pytest.mark.parametrize("seed", range(6))
def test_never_worse_than_the_best_labelling_of_the_plain_groups(algorithm, seed):
    """Every labelling of the plain groups (all D! of them) moves no fewer bytes off their node; the plain
    plan itself no fewer lexicographically; the makespan stays within the slack."""
    rng = np.random.default_rng(seed)
    num_ranks = int(rng.choice([2, 3, 4]))
    gpus_per_node = int(rng.choice([g for g in (1, 2, 4) if num_ranks % g == 0]))
    n = int(rng.integers(2, 7 * num_ranks))
    lengths = rng.integers(1, 3000, n)
    sources = rng.integers(0, num_ranks, n)
    sources[: n // 2] = sources[0]  # half the items on one rank: the deal must move some
    item_bytes = lengths * float(rng.choice([1.0, 3.0]))
    topology = Topology(num_nodes=num_ranks // gpus_per_node, gpus_per_node=gpus_per_node)
    padded = algorithm == "padded"
    plain = balance(lengths, num_ranks, cost=QUADRATIC, algorithm=algorithm, padded=padded)
    plan = balance(lengths, num_ranks, cost=QUADRATIC, algorithm=algorithm, padded=padded, sources=sources,
                   topology=topology, item_bytes=item_bytes)
    assert plan.makespan <= plain.makespan * 1.002
    moved = _moved(plan.assignment, sources, item_bytes, gpus_per_node)
    assert moved <= _moved(plain.assignment, sources, item_bytes, gpus_per_node)
    labellings = [_moved(np.array(rank_of_group)[plain.assignment], sources, item_bytes, gpus_per_node)
                  for rank_of_group in itertools.permutations(range(num_ranks))]
    assert moved[0] <= min(labellings)[0]
    if gpus_per_node in (1, num_ranks):  # one level of places: the labelling is one exact assignment
        assert moved <= min(labellings)

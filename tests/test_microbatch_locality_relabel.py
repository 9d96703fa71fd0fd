"""Relabelling the ranks of a symmetric topology does not change the bytes the communication-aware micro-batch plan
moves (probe25 P25-08): the cells deal (`keep_cells_local`) runs under `canonical_ranks`, as `deal_locally` does."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel, balance_microbatches
from orchmllm.topology import Topology

COST = CostModel(linear=1.0, quadratic=1e-4)


@pytest.mark.parametrize("seed", [1, 9, 53], ids=["c22_seed1_1.34x", "c21_seed9_2.26x", "c21_seed53_1.53x"])
def test_relabelled_ranks_move_the_same_bytes(seed):
    """probe25 c22 seed 1 (D = 16 = 4 x 4: 216 092 vs 290 343 tokens across nodes) and c21 seeds 9 and 53: the cells
    deal's first fit inside a node and its least-loaded cells broke ties by cell index."""
    rng = np.random.default_rng(seed)
    gpus_per_node, num_nodes = int(rng.choice([2, 4, 8])), int(rng.choice([2, 4, 8] if seed == 1 else [2, 4]))
    num_ranks = gpus_per_node * num_nodes
    n = num_ranks * int(rng.choice([4, 8, 16]))
    lengths = rng.integers(1, 8000, n)
    sources = np.repeat(np.arange(num_ranks), n // num_ranks)
    nodes = rng.permutation(num_nodes)
    pi = np.concatenate([nodes[node] * gpus_per_node + rng.permutation(gpus_per_node) for node in range(num_nodes)])
    topology = Topology(num_nodes, gpus_per_node)
    budget = int(max(lengths.max(), lengths.sum() / num_ranks / 2))
    plans = [balance_microbatches(lengths, num_ranks, cost=COST, max_tokens_per_microbatch=budget, sources=where,
                                  topology=topology) for where in (sources, pi[sources])]
    moved = [(int(lengths[plan.rank // gpus_per_node != where // gpus_per_node].sum()),
              int(lengths[plan.rank != where].sum())) for plan, where in zip(plans, (sources, pi[sources]))]
    assert plans[1].step_cost == plans[0].step_cost
    assert moved[1] == moved[0]

"""A relabelling of a symmetric topology's ranks (whole nodes permuted, ranks permuted inside nodes, sources mapped
alike, every rank holding an item) relabels the communication-aware plan: the same bytes move, on tied lengths too.

probe27 P27-03: where the deal missed, `balance`'s plain plan's groups were placed (LAP) and re-dealt by equal
lengths under the ranks' own labels: 3100 or 3500 tokens across nodes (D 16), by the labels alone; and the micro-batch
cells' own deal and placement (`microbatch.api._keep_local`) likewise.  Both now run under the labels read from the
items (`locality.balance.canonical_ranks`).  (Not covered: `balance_microbatches` keeps the plain cells as labelled
where they move fewer bytes, probe27's D 8, M = 2 case: 1400 or 900.)
"""

import numpy as np
import pytest

from orchmllm import CostModel, balance
from orchmllm.balancers.microbatch.api import _keep_local, make_microbatch_problem
from orchmllm.balancers.microbatch.auto import solve
from orchmllm.balancers.origins import Origins
from orchmllm.topology import Topology


def relabelled_instance(seed):
    """probe27's f06 generator, its ties family (lengths 100 / 200 / 400)."""
    rng = np.random.default_rng(seed)
    gpus, nodes = int(rng.choice([2, 4, 8])), int(rng.choice([2, 3, 4]))
    num_ranks = gpus * nodes
    n = num_ranks * int(rng.choice([2, 4, 8]))
    rng.integers(0, 4)
    lengths = rng.choice([100, 200, 400], n)
    sources = np.concatenate([np.arange(num_ranks), rng.integers(0, num_ranks, n - num_ranks)])
    rng.shuffle(sources)
    cost = CostModel(linear=1.0, quadratic=float(rng.choice([0, 1e-4])))
    order = rng.permutation(nodes)
    relabel = np.concatenate([order[k] * gpus + rng.permutation(gpus) for k in range(nodes)])
    return lengths, sources, cost, Topology(nodes, gpus), relabel


def test_balance_relabelled_ranks_relabel_the_plan():
    lengths, sources, cost, topology, relabel = relabelled_instance(223)
    plan = balance(lengths, topology.world_size, cost=cost, sources=sources, topology=topology)
    relabelled = balance(lengths, topology.world_size, cost=cost, sources=relabel[sources], topology=topology)
    assert plan.makespan == relabelled.makespan
    assert np.array_equal(relabel[plan.assignment], relabelled.assignment)


@pytest.mark.parametrize("seed", [302, 303])
def test_micro_batch_cells_kept_local_relabel(seed):
    lengths, sources, cost, topology, relabel = relabelled_instance(seed)
    problem = make_microbatch_problem(lengths, topology.world_size, max_tokens_per_microbatch=400, cost=cost)
    m = problem.min_microbatches + 1
    result = solve(problem, m)
    gpus = topology.gpus_per_node
    local = _keep_local(problem, result, m, Origins(sources, lengths.astype(float), gpus))
    relabelled = _keep_local(problem, result, m, Origins(relabel[sources], lengths.astype(float), gpus))
    assert np.array_equal(relabel[local.rank], relabelled.rank)
    assert np.array_equal(local.microbatch, relabelled.microbatch)

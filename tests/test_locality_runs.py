"""Shortcuts of the locality pass that read runs instead of whole-array passes (issue 26's long step: 144k-360k
items a stage): each gives the values of the whole-array pass it replaces."""

import numpy as np
import pytest

from orchmllm.balancers.locality.balance import canonical_ranks
from orchmllm.balancers.locality.fill import filler_items
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.problem import make_problem


def _first_items(sources: np.ndarray, num_ranks: int) -> np.ndarray:
    """Each rank's first item (sources.size where it holds none), item by item."""
    first = np.full(num_ranks, sources.size)
    for item in range(sources.size - 1, -1, -1):
        first[sources[item]] = item
    return first


@pytest.mark.parametrize("seed", range(12))
def test_canonical_ranks_in_one_pass_follow_the_first_items(seed):
    """The runs of equal sources give every rank's first item, sorted sources or not (the sorted case had its own
    binary search): nodes by their first item, ranks inside a node likewise."""
    rng = np.random.default_rng(seed)
    gpus_per_node = int(rng.choice([1, 2, 6, 8]))
    num_ranks = gpus_per_node * int(rng.integers(1, 5))
    sources = rng.integers(0, num_ranks, int(rng.integers(0, 40)))
    if seed % 2:
        sources = np.sort(sources)
    first = _first_items(sources, num_ranks).reshape(-1, gpus_per_node)
    nodes = np.argsort(first.min(axis=1), kind="stable")
    order = (nodes[:, None] * gpus_per_node + np.argsort(first[nodes], axis=1, kind="stable")).ravel()
    labels = canonical_ranks(sources, num_ranks, gpus_per_node)
    if labels is None:
        assert order.tolist() == list(range(num_ranks))
    else:
        assert labels[order].tolist() == list(range(num_ranks))


@pytest.mark.parametrize("count, share", [(1, 0.003), (700, 0.003), (5000, 0.01), (3, 1.0)])
def test_filler_of_one_cost_is_the_tail_of_the_indices(count, share):
    """`fill_locally` deals arange(n - f) and then arange(n - f, n) where every item costs the same and no cap
    binds: the filler (the tail of the cost order) is then those last indices, as the mask it replaced read."""
    state = PartialPlan(make_problem(np.full(count, 576), 8), 1.0)
    filler = filler_items(state, share)
    assert state.uniform
    assert filler.tolist() == list(range(count - filler.size, count))

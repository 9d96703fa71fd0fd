"""`canonical_ranks` on unsorted sources in runs (a micro-batch's segments anchored on their samples' LLM ranks): the
first item of each rank is read at the starts of the runs of equal sources only, and the labels are those of the
definition, written here as plain loops (nodes by the first item one of their ranks holds, ranks inside a node by
their first item, ranks holding none last by label)."""

import numpy as np
import pytest

from orchmllm.balancers.locality.balance import canonical_ranks


def _plain_labels(sources, num_ranks, gpus_per_node):
    first = [len(sources)] * num_ranks
    for index, rank in enumerate(sources.tolist()):
        first[rank] = min(first[rank], index)
    nodes = sorted(range(num_ranks // gpus_per_node),
                   key=lambda node: (min(first[node * gpus_per_node:(node + 1) * gpus_per_node]), node))
    order = [rank for node in nodes
             for rank in sorted(range(node * gpus_per_node, (node + 1) * gpus_per_node), key=lambda r: (first[r], r))]
    if order == list(range(num_ranks)):
        return None
    labels = [0] * num_ranks
    for label, rank in enumerate(order):
        labels[rank] = label
    return labels


@pytest.mark.parametrize("seed", range(40))
def test_labels_of_sources_in_runs_are_the_definitions(seed):
    rng = np.random.default_rng(seed)
    gpus_per_node = int(rng.choice([1, 2, 4, 8]))
    num_ranks = gpus_per_node * int(rng.integers(1, 5))
    runs = rng.integers(0, num_ranks, int(rng.integers(0, 3 * num_ranks)))
    sources = np.repeat(runs, rng.integers(1, 5, runs.size))  # runs of equal sources, some adjacent runs equal
    labels = canonical_ranks(sources, num_ranks, gpus_per_node)
    assert (None if labels is None else labels.tolist()) == _plain_labels(sources, num_ranks, gpus_per_node)

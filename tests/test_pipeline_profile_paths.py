"""The best shape's dual flow split into paths (`profile._Graph.paths`), walked over Python lists: the same paths and
weights, bit for bit, as the walk over arrays it replaced (its first call at the slot limit, interleaved 2 x 2 at
M = 256, spent ~1.7 s of ~2.5 there)."""

import numpy as np
import pytest

from orchmllm.balancers import Pipeline
from orchmllm.balancers.pipeline.profile import _Graph


def _paths_over_arrays(graph, flows):
    """The walk over arrays (before the lists): each end's heaviest incoming row followed to a start."""
    edges, starts = graph.tail.size, graph.start.size
    flow = flows.copy()
    start_row = np.full(graph.slot.size, -1)
    start_row[graph.start] = edges + np.arange(starts)
    end_rows = edges + starts + np.arange(graph.slot.size)
    coefficients, weights = [], []
    for _ in range(max(4 * graph.m, 64)):
        op = int(np.argmax(flow[end_rows]))
        amount, used, path = flow[end_rows[op]], [end_rows[op]], np.zeros(graph.m)
        if amount <= 1e-12:
            break
        first = end_rows[op]
        while op >= 0:
            path[graph.slot[op]] += graph.weight[op]
            choices = [(flow[row], row, before) for row, before in
                       ((graph.edge[0, op], graph.before[0, op]), (graph.edge[1, op], graph.before[1, op]),
                        (start_row[op], -1)) if row >= 0]
            got, row, op = max(choices)
            amount, used = min(amount, got), used + [row]
        if amount <= 1e-12:
            flow[first] = 0.0
            continue
        flow[used] -= amount
        coefficients.append(path)
        weights.append(max(amount, 0.0))
    return np.array(coefficients).reshape(-1, graph.m), np.array(weights)


@pytest.mark.parametrize("pipeline, m", [
    (Pipeline(stages=8), 16), (Pipeline(stages=8), 32), (Pipeline(stages=4, backward_factor=3.0), 7),
    (Pipeline(stages=8, schedule="interleaved", virtual_stages=2), 32),
    (Pipeline(stages=2, schedule="interleaved", virtual_stages=4), 24), (Pipeline(stages=3), 1)])
def test_paths_over_lists_are_the_walk_over_arrays(pipeline, m):
    graph = _Graph(pipeline, m)
    flows = graph.solve()[1]
    for rng in (None, np.random.default_rng(m)):  # the program's duals, and rows of random flow (ties broken alike)
        flow = flows if rng is None else rng.integers(0, 4, flows.size) / 4.0
        found, expected = graph.paths(flow), _paths_over_arrays(graph, flow)
        assert found[0].shape == expected[0].shape
        assert found[0].tobytes() == expected[0].tobytes() and found[1].tobytes() == expected[1].tobytes()

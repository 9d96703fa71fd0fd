"""The CP local search's item times (`search._State._time`, `_times`): made once per search for an item at every
split degree, inside a node and across, in one array; bit for bit `ContextParallel.item_times` of the item alone."""

from dataclasses import replace

import numpy as np

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel import search
from orchmllm.balancers.problem import make_problem
from orchmllm.tests.test_cp_layout_structures import COST, GPUS


def test_search_times_are_the_items_own_and_made_once(monkeypatch):
    lengths = np.random.default_rng(5).integers(0, 90_000, 200)
    problem = replace(make_problem(lengths, 32, cost=COST), max_tokens_per_rank=32_768)
    spec = ContextParallel(gpus_per_node=GPUS)
    state = search._State(problem, spec, GPUS, np.arange(200) % 32, np.ones(200, dtype=np.int64), 0.0)
    made, item_times = [], spec.item_times
    monkeypatch.setattr(ContextParallel, "item_times", lambda self, cost, length, *args:
                        made.append(length.shape[0]) or item_times(cost, length, *args))
    items = np.array([5, 17, 3, 150, 99])
    first = state._time(17, 4)
    for c in state.split_degrees:
        times = state._times(items, c)
        for item, row in zip(items.tolist(), times):
            alone = item_times(COST, np.full(2, lengths[item]), np.full(2, c), np.array([True, False]))
            assert np.array_equal(row, alone) and np.array_equal(state._time(item, c), alone)
    assert np.array_equal(first, state._time(17, 4)) and made == [1, 4]  # item 17 first, the other 4 once

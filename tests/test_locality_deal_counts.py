"""`take_anywhere`'s deal of one exact cost in counts (`token_bound._deal` with `most`): the same kept items and
ranks as the running sums of the items' costs."""

import numpy as np
import pytest

from orchmllm.balancers.cost import CostModel
from orchmllm.balancers.locality.deal import DEAL_WINDOW, _last_multiple
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.locality.token_bound import _deal
from orchmllm.balancers.problem import make_problem


@pytest.mark.parametrize("cost", [1.0, 3.0, 0.375, 7 * 2.0**-20])
@pytest.mark.parametrize("seed", range(10))
def test_deal_of_one_exact_cost_in_counts_is_the_deal_by_running_sums(seed, cost):
    rng = np.random.default_rng(seed)
    num_ranks, num_items = int(rng.integers(1, 40)), int(rng.integers(1, 400))
    problem = make_problem(np.full(num_items, 5), num_ranks, cost=CostModel(per_item=cost, linear=0.0))
    placed = rng.integers(0, num_items // 2 + 1)  # some items already on ranks, as earlier phases leave them
    state = PartialPlan(problem, target=float(rng.integers(1, 3 * num_items // num_ranks + 3)) * cost
                        + float(rng.choice([0.0, cost / 2, -cost * 1e-17])))  # whole costs, between, a hair below
    assert state.exact_cost == cost
    state.put_runs(np.arange(placed), rng.integers(0, num_ranks, placed))
    waiting = np.arange(placed, num_items)
    margin = DEAL_WINDOW * np.finfo(np.float64).eps * state.target
    most = int(_last_multiple(cost, np.array([state.target - margin]), 2**62)[0])
    count = min(waiting.size, DEAL_WINDOW * num_ranks)
    width = int(rng.integers(1, num_ranks + 1))
    if not count:
        return
    width = min(width, count)
    keeping = np.sort(rng.choice(width, int(rng.integers(1, width + 1)), replace=False))
    ranks = rng.permutation(num_ranks)[:width][keeping]
    by_sums = _deal(state, waiting, count, width, keeping, ranks, margin)
    in_counts = _deal(state, waiting, count, width, keeping, ranks, margin, most)
    for expected, got in zip(by_sums, in_counts):
        np.testing.assert_array_equal(got, expected)

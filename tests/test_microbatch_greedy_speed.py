"""The joint greedy's sorted search (`greedy._sorted_greedy`, padded or not) makes the plain scan's choices
(`_scan_greedy`, every cell weighed for every item) cell for cell, and weighs no cell array per item."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.microbatch import greedy
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.problem import sorted_order

COSTS = {"linear": CostModel(linear=1.0), "quadratic": CostModel(linear=1.0, quadratic=1e-4),
         "per_item": CostModel(per_item=3.0, linear=0.1, quadratic=1e-3), "given": None}


def _problem(seed: int, cost: str, padded: bool = False):
    """Lengths of one of four shapes (few values: ties in load; Pareto; narrow), a budget from one item to the
    whole rank's share, D from 1 to 32."""
    rng = np.random.default_rng(seed)
    num_ranks = int(rng.choice([1, 2, 3, 8, 32]))
    size = int(rng.integers(1, 40)) * num_ranks
    lengths = [rng.integers(1, int(rng.choice([3, 10, 5000])), size),
               np.minimum((rng.pareto(0.8, size) * 50).astype(np.int64) + 1, 4096),
               rng.choice([1, 2, 4, 8, 100], size), rng.integers(100, 200, size)][seed % 4]
    budget = int(max(lengths.max(), lengths.sum() / num_ranks / rng.uniform(1, 6) + 1))
    # "given": costs per item, not a function of the lengths (lengths grow along the order: the scan itself)
    given = dict(costs=rng.random(size) * 7.0) if cost == "given" else dict(cost=COSTS[cost])
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget, padded=padded, **given)
    return problem, int(rng.integers(1, 6))


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("cost", sorted(COSTS))
@pytest.mark.parametrize("seed", range(40))
def test_sorted_search_makes_the_scans_choices(seed, cost, padded):
    problem, num_microbatches = _problem(seed, cost, padded)
    order = sorted_order(problem.item_costs)
    expected = greedy._scan_greedy(problem, num_microbatches, order)
    found = greedy.greedy_cells(problem, num_microbatches)
    assert (found is None) == (expected is None)
    if expected is not None:
        np.testing.assert_array_equal(found, expected)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_regression_greedy_weighed_every_cell_for_every_item(monkeypatch, padded):
    """Cause of probe20 P20-15 (balance_microbatches(algorithm="greedy") 48 s at 2560 x 32, time ~ n·D): each item
    weighed every one of the M·D cells (n·M·D in all; padded `auto`, which runs it, 21.7 s).  Now no cell array is
    weighed (a binary search per micro-batch), and the cells are the scan's."""
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 64 * 32) * 200).astype(np.int64) + 1, 16384)
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=16384, cost=COSTS["quadratic"],
                                      padded=padded)
    num_microbatches = 6 if padded else 3  # the fewest where each greedy places every item
    weighed = []
    offer = greedy.Cells.offer
    monkeypatch.setattr(greedy.Cells, "offer", lambda cells, *item: (weighed.append(cells.loads.size),
                                                                     offer(cells, *item))[1])
    found = greedy.greedy_cells(problem, num_microbatches)
    assert found is not None and sum(weighed) == 0
    np.testing.assert_array_equal(found, greedy._scan_greedy(problem, num_microbatches,
                                                             sorted_order(problem.item_costs)))
    assert sum(weighed) == lengths.size * num_microbatches * 64  # the scan weighs every cell for every item

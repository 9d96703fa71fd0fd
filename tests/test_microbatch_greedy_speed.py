"""The joint greedy's sorted search (`greedy._sorted_greedy`, padded or not) makes the plain scan's choices
(`_scan_greedy`, every cell weighed for every item) cell for cell, and weighs no cell array per item; a run kept
for the next M (`greedy._Run`) answers it with the cells a run of its own makes."""

import numpy as np
import pytest

from orchmllm import balance_microbatches
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


def check_the_scans_choices(problem, num_microbatches, padded, fresh=False):
    """`greedy_cells` places every item where the scan does (or neither places them all); on a `fresh` problem
    the run it keeps records whether an empty micro-batch's cell won, as the scan says."""
    expected = greedy._scan_greedy(problem, num_microbatches, sorted_order(problem.item_costs))
    found = greedy.greedy_cells(problem, num_microbatches)
    assert (found is None) == (expected is None)
    if expected is not None:
        np.testing.assert_array_equal(found, expected[0])
        if fresh:
            kept = problem.packings[("greedy", problem.num_ranks, problem.max_tokens_per_microbatch, padded)]
            assert kept.fresh_won == expected[1]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("cost", sorted(COSTS))
@pytest.mark.parametrize("seed", range(20, 40))  # seeds 0-19: the first M of `test_a_kept_run_answers_each_m_...`
def test_sorted_search_makes_the_scans_choices(seed, cost, padded):
    check_the_scans_choices(*_problem(seed, cost, padded), padded, fresh=True)


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
                                                             sorted_order(problem.item_costs))[0])
    assert sum(weighed) == lengths.size * num_microbatches * 64  # the scan weighs every cell for every item


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("cost", sorted(COSTS))
@pytest.mark.parametrize("seed", range(20))
def test_a_kept_run_answers_each_m_as_a_run_of_its_own(seed, cost, padded):
    """M up and down on one problem: whatever `greedy_cells` takes from a kept run is the scan's run for that M."""
    problem, first = _problem(seed, cost, padded)
    check_the_scans_choices(problem, first, padded, fresh=True)
    for num_microbatches in (first + 1, first + 2, first + 5, max(1, first - 1), 1, first + 1):
        check_the_scans_choices(problem, num_microbatches, padded)


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("costs,lengths,num_ranks,budget,one,two", [
    ([1.0, 0.0], [5, 5], 2, 5, [0, 1], [0, 2]),  # the free item: an exact fit (excess 0) in an empty micro-batch
    ([1.0, 1.5e-16], [1, 1], 1, 10, [0, 0], [0, 1]),  # 1 + 1.5e-16 rounds to 1 + 2.2e-16: a rise above its cost
], ids=["free_item", "rounding"])
def test_a_run_where_an_empty_micro_batch_would_have_won_answers_no_more_micro_batches(costs, lengths, num_ranks,
                                                                                      budget, one, two, padded):
    """With one micro-batch the second item takes a cell (`one`) that a cell of an empty micro-batch would beat,
    so that run must not answer M = 2, where the item takes that cell (`two`, the scan's)."""
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget, costs=costs,
                                      padded=padded)
    assert greedy.greedy_cells(problem, 1).tolist() == one
    assert greedy.greedy_cells(problem, 2).tolist() == two
    assert greedy._scan_greedy(problem, 2, sorted_order(problem.item_costs))[0].tolist() == two


def test_regression_greedy_ran_once_for_each_m_tried(monkeypatch):
    """Cause of the rest of probe20 P20-15 (balance_microbatches(algorithm="greedy") 1.0 CPU s at 2560 x 32 on capped
    Pareto lengths): `_solve` tries the fewest M and two more, and the greedy ran for each, though there its first
    run leaves every item where the others put it.  Now the others take its cells (one run, not three)."""
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 64 * 32) * 200).astype(np.int64) + 1, 16384)
    runs = []
    sorted_greedy = greedy._sorted_greedy
    monkeypatch.setattr(greedy, "_sorted_greedy", lambda *args: (runs.append(args[1]), sorted_greedy(*args))[1])
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=16384, cost=COSTS["quadratic"],
                                algorithm="greedy")
    assert plan.num_microbatches == 3 and runs == [3]

"""The unpadded joint greedy's passes over one sorted row within a run of equal items (`greedy_sweep`): the fits best
first (`descend`), the rises' followers up the least loaded cells (`climb`); the cells stay the plain scan's
(`_scan_greedy`), float rounding included."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.microbatch import greedy
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.tests.test_microbatch_greedy_fit_runs import assert_scans_choices, scanned_cells

QUADRATIC = CostModel(linear=1.0, quadratic=1e-4)


def _all_rises(problem, cells, num_microbatches) -> int:
    """How many items raised their micro-batch's level, replayed from the cells."""
    d, loads, level, rises = problem.num_ranks, np.zeros(num_microbatches * problem.num_ranks), np.zeros(
        num_microbatches), 0
    for item in problem.cost_order.tolist():
        cell = int(cells[item])
        loads[cell] += problem.item_costs[item]
        if loads[cell] > level[cell // d]:
            level[cell // d], rises = loads[cell], rises + 1
    return rises


def test_regression_each_rise_in_a_run_of_equal_items_took_a_search(monkeypatch):
    """Cause of much of `algorithm="greedy"` at 2560 x 32 on capped Pareto lengths (issue 24): once no cell fits a
    run's item, each item rose its micro-batch through `_best_fit` (M binary searches, a del and an insort), though
    the next equal ones go to that micro-batch's least loaded cells in turn.  Now they climb the row in one pass
    (capped Pareto 64 x 32, M 3: 462 of 462 rises searched before, 278 now)."""
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 64 * 32) * 200).astype(np.int64) + 1, 16384)
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=16384, cost=QUADRATIC)
    searched = []
    place = greedy._Rows.place
    monkeypatch.setattr(greedy._Rows, "place", lambda self, found, *args: (searched.append(found[1] > 0.0),
                                                                          place(self, found, *args))[1])
    found = greedy.greedy_cells(problem, 3)
    np.testing.assert_array_equal(found, scanned_cells(problem, 3))
    assert sum(searched) < 0.7 * _all_rises(problem, found, 3)


@pytest.mark.parametrize("seed", range(12))
def test_sweeps_make_the_scans_choices_where_rounding_ties_loads(seed):
    """Loads of items costing 1 + 1e-9 l (sums tie by rounding: 7.000000604999999, 7.000000605 and 7.000000605000001
    plus one give one float), of tenths, and of near-equal costs; lengths growing with the costs (the sorted
    search): the scan's cells for each M (seed 0 is the instance where `climb` once took a lower load's cell ahead
    of a tied one further up the row)."""
    assert_scans_choices(rounding_tie_problem(np.random.default_rng(513 + seed), seed % 3))


def rounding_tie_problem(rng: np.random.Generator, family: int):
    """A problem whose loads' sums tie by rounding: items costing 1 + 1e-9 l (`family` 0), of tenths (1), of
    near-equal costs (2); lengths growing with the costs (the sorted search)."""
    num_ranks = int(rng.choice([3, 8, 40]))
    n = int(rng.integers(4, 16)) * num_ranks
    if family == 0:
        lengths = np.minimum((rng.pareto(0.7, n) * 20).astype(np.int64) + 1, 2000)
        given = dict(cost=CostModel(per_item=1.0, linear=1e-9))
    else:
        costs = rng.choice([0.1, 0.2, 0.3, 1 / 3, 0.7], n) if family == 1 else rng.uniform(0.999, 1.001, n)
        lengths = np.searchsorted(np.unique(costs), costs) + 1
        given = dict(costs=costs)
    budget = int(max(lengths.max(), lengths.sum() / num_ranks / rng.uniform(1, 6) + 1))
    return make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget, **given)

"""The unpadded joint greedy's work within a run of equal items (`greedy._Rows.run`): a cell that fits an item below
its level takes as many of the run as it fits at once (`_Rows.place`), and a rise where no cell fits skips the search
for fits; the cells stay the plain scan's (`_scan_greedy`)."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.microbatch import greedy
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.problem import sorted_order

QUADRATIC = CostModel(linear=1.0, quadratic=1e-4)


def scanned_cells(problem, num_microbatches):
    found = greedy._scan_greedy(problem, num_microbatches, sorted_order(problem.item_costs))
    return None if found is None else found[0]


def _counted(monkeypatch, name):
    calls, original = [], getattr(greedy, name)
    monkeypatch.setattr(greedy, name, lambda *args: (calls.append(1), original(*args))[1])
    return calls


@pytest.mark.parametrize("budget, num_microbatches", [(10**6, 1), (10**6, 2), (130, 2), (60, 3)])
def test_regression_a_deep_fit_took_one_search_an_item(monkeypatch, budget, num_microbatches):
    """Cause: a cell far below its level (excess <= -cost) took a run's items one `_best_fit` each, though it stays
    the best while it fits (its excess grows, the others' do not; an equal one's cell is higher).  Now it takes as
    many as fit below the level and in its tokens at once (3 items of 100 and 800 of 1 on D 8: 534 searches before,
    44 now; under T 60 the tokens stop it)."""
    lengths = np.minimum(np.array([100] * 3 + [1] * 800), budget)
    problem = make_microbatch_problem(lengths, 8, max_tokens_per_microbatch=budget, cost=CostModel(linear=1.0))
    searches = _counted(monkeypatch, "_best_fit")
    found = greedy.greedy_cells(problem, num_microbatches)
    assert len(searches) < 0.15 * lengths.size
    np.testing.assert_array_equal(found, scanned_cells(problem, num_microbatches))


def test_regression_rises_searched_every_micro_batch_for_fits(monkeypatch):
    """Cause: a rise (no cell fits the item) searched each micro-batch for fits first, two binary searches each, and
    each run searched the micro-batches whose least load does not fit.  Now a run's fits skip those rows, and
    `_best_fit(..., fitless=True)` looks for the least rise only (capped Pareto 64 x 32, M 3: 6623 searches before,
    3806 now)."""
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 64 * 32) * 200).astype(np.int64) + 1, 16384)
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=16384, cost=QUADRATIC)
    searches = _counted(monkeypatch, "_first_above")
    found = greedy.greedy_cells(problem, 3)
    assert len(searches) < 2.1 * lengths.size
    np.testing.assert_array_equal(found, scanned_cells(problem, 3))


@pytest.mark.parametrize("seed", range(24))
def test_fit_runs_make_the_scans_choices(seed):
    """Small random instances with deep fits (a few long items set the levels, many short ones follow), runs, ties
    and float rounding, each M asked in a row (a run resumes from the one before): the scan's cells."""
    rng = np.random.default_rng(5500 + seed)
    num_ranks = int(rng.choice([2, 5, 8, 16]))
    n = int(rng.integers(2, 40)) * num_ranks
    lengths = np.concatenate([rng.integers(50, 200, max(1, n // 20)), [rng.integers(1, 4, n), rng.choice(
        [1, 1, 2, 9], n), rng.integers(1, 30, n)][seed % 3]])
    cost = [dict(cost=CostModel(linear=1.0)), dict(cost=QUADRATIC), dict(cost=CostModel(per_item=1e16, linear=1.0)),
            dict(costs=rng.choice([1.0, 1.0 + 2**-52, 1e-17, 3.0, 0.0], lengths.size))][seed // 3 % 4]
    budget = int(max(lengths.max(), lengths.sum() / num_ranks / rng.uniform(1, 4) + 1))
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget, **cost)
    assert_scans_choices(problem)


def assert_scans_choices(problem) -> None:
    """Every M asked in a row (a run resumes from the one before): the scan's cells, or no room where it finds none."""
    first = problem.min_microbatches
    for num_microbatches in (first, first + 1, first + 3, max(1, first - 1)):
        found, expected = greedy.greedy_cells(problem, num_microbatches), scanned_cells(problem, num_microbatches)
        assert (found is None) == (expected is None)
        if found is not None:
            np.testing.assert_array_equal(found, expected)

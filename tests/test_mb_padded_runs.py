"""The padded joint greedy's rises and their fits taken a run of equal loads at a time (`microbatch.greedy_filled`):
the same cells as the scan (`greedy_scan`), item by item."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.microbatch import greedy
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload

from .test_microbatch_greedy_fit_runs import assert_scans_choices, scanned_cells

COST_84B = MODELS["84b"].llm.cost(causal=True)


def _counted_runs(monkeypatch) -> list:
    """The items each `take_runs` call places, as `greedy` calls it."""
    placed, take_runs = [], greedy.take_runs
    monkeypatch.setattr(greedy, "take_runs", lambda state, costs, at, positive: placed.append(
        take_runs(state, costs, at, positive) - at) or at + placed[-1])
    return placed


def test_regression_padded_rises_and_their_fits_placed_item_by_item(monkeypatch):
    """Cause of padded `auto` at 2560 x 32 taking 16-26x the unpadded plan of the same items: once no cell fits, each
    rise took a `_best_fit` search and its micro-batch's new fits a `_take_fits` sort (~14 items each, ~7k times),
    Python work per item, though a filled cell's loads to come are its own progression, whatever the items.  Now the
    runs of equal loads take them from numpy-sorted progressions (default mix, 64 x 16, T 8k: 74 % of the items)."""
    lengths = np.minimum(sample_workload("default", 64, 16, seed=3).sample_llm_length, 8192)
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=8192, cost=COST_84B, padded=True)
    placed = _counted_runs(monkeypatch)
    num_microbatches = problem.min_microbatches + 1
    found = greedy.greedy_cells(problem, num_microbatches)
    assert sum(placed) > 0.6 * lengths.size  # 759 of 1024
    np.testing.assert_array_equal(found, scanned_cells(problem, num_microbatches))


def _instance(seed: int):
    """Many items a cell (the runs' case), few cells or micro-batches of >= `greedy.EMPTY_RUN` cells (the empty
    cells' runs before), lengths and costs with runs, ties and float rounding."""
    rng = np.random.default_rng(8800 + seed)
    num_ranks = int(rng.choice([2, 3, 5, 16, greedy.EMPTY_RUN, 40]))
    n = int(rng.integers(4, 40)) * num_ranks
    lengths = [rng.integers(1, 4, n), rng.choice([5, 5, 5, 9, 20], n), rng.integers(1, 100, n),
               np.minimum((rng.pareto(0.7, n) * 20).astype(np.int64) + 1, 2000), rng.integers(0, 3, n)][seed % 5]
    cost = [dict(cost=CostModel(linear=1.0)), dict(cost=CostModel(per_item=1e16, linear=1.0)), dict(cost=COST_84B),
            dict(costs=rng.choice([1.0, 1.0 + 2**-52, 1e-17, 3.0, 0.0], n)),
            dict(costs=rng.choice([0.1, 1.0 / 3.0, 1e16, 1e16 + 2, 2.0**53], n)),
            dict(cost=CostModel(per_item=1.0, linear=1e-9))][seed // 5 % 6]
    budget = int(max(lengths.max(), 1, lengths.sum() / num_ranks / rng.uniform(1, 6) + 1))
    return make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget, padded=True, **cost)


@pytest.mark.parametrize("seed", range(30))
def test_padded_runs_make_the_scans_choices(seed):
    """Every M asked in a row (a run resumes from the one before, its snapshot taken before the runs' stop): the
    scan's cells, or no room where it finds none."""
    assert_scans_choices(_instance(seed))


def test_stream_counts_the_loads_below_a_bound_in_float_products():
    """`_Stream._below`: the largest j with j · cost < bound as the greedy multiplies, where the division rounds."""
    from orchmllm.balancers.microbatch.greedy_filled import _Stream

    rng = np.random.default_rng(5)
    costs = np.concatenate([rng.uniform(1e-3, 1e3, 200), [0.1, 1.0 / 3.0, 0.7, 1e16, 2.0**-30]])
    stream = _Stream([(float(c), cell) for cell, c in enumerate(costs)], np.zeros(costs.size, dtype=np.int64), costs,
                     np.ones(costs.size, dtype=np.int64), 10**9, 10**9)
    for bound in [1.0, 2.1, 3.0, 1e3 + 1e-9, 7.000000000000001, 1e17]:
        j = stream._below(bound)
        assert np.all((j.astype(np.float64) * costs < bound) | (j == 0))
        assert np.all(((j + 1).astype(np.float64) * costs >= bound) | (j == 10**9))  # or count + room


@pytest.mark.timeout(60)
@pytest.mark.parametrize("costs", [[5e-324, 1e-320], [5e-324, 1.0], [1e-300, 1e-305]],
                         ids=["subnormal", "mixed", "tiny"])
def test_regression_subnormal_costs_hung_the_progressions(costs):
    """Cause: `_Stream.extend` sized its chunk by the sum of the cells' inverse costs, which overflows for subnormal
    costs (1 / 5e-324 = inf): a span of 0 doubled to 0 for ever (a hang).  Now a span of 0 falls back to the largest
    cost; the scan's cells."""
    rng = np.random.default_rng(1)
    item_costs = rng.choice(costs, 200)
    item_costs[:4] = max(costs)
    problem = make_microbatch_problem(np.ones(200, dtype=np.int64), 4, max_tokens_per_microbatch=1000, padded=True,
                                      costs=item_costs)
    np.testing.assert_array_equal(greedy.greedy_cells(problem, 2), scanned_cells(problem, 2))


def test_regression_many_micro_batches_paid_every_row_per_item(monkeypatch):
    """Cause (review rev46): `take_runs` built every micro-batch's progressions on each call, and the greedy called
    it again after nearly every item: 420 micro-batches of D = 3 took 453 calls making 190 260 streams (5-60x the
    plan's time before the runs).  Streams are made for the micro-batches that reach the heap's top, and after a call
    that placed fewer than `RUNS_BACKOFF` items the next `RUNS_BACKOFF` go one by one: the same cells (the scan)."""
    from orchmllm.balancers.microbatch import greedy_filled
    made, make = [], greedy_filled._Stream.__init__
    monkeypatch.setattr(greedy_filled._Stream, "__init__", lambda self, *args: made.append(1) or make(self, *args))
    placed = _counted_runs(monkeypatch)
    rng = np.random.default_rng(21)
    problem = make_microbatch_problem(np.minimum(rng.integers(1, 200, 1500), 100), 3, max_tokens_per_microbatch=100,
                                      cost=CostModel(linear=1.0, quadratic=1e-4), padded=True)
    cells = greedy.greedy_cells(problem, 420)
    assert len(placed) <= 32 and len(made) <= 4 * len(placed) + 420  # 23 calls, 10 streams
    assert cells is not None and np.array_equal(cells, scanned_cells(problem, 420))

"""The joint greedy's items placed without its search (`greedy_direct`): runs into one micro-batch's empty cells,
many runs at once (`take_empties`), and items to the fullest cell that fits (`take_tops`).  The cells stay the plain
scan's (`_scan_greedy`), item for item, also where other micro-batches' cells fit, waiting cells come back and
excesses tie by rounding."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.microbatch import greedy, greedy_direct
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.problem import sorted_order

QUADRATIC = CostModel(linear=1.0, quadratic=1e-4)
COSTS = (QUADRATIC, CostModel(linear=1.0), CostModel(per_item=0.1, linear=1e-3, quadratic=1e-7),
         CostModel(linear=1.0, quadratic=1e-9))


def _counted(monkeypatch, name: str = "take_empties") -> list:
    """The items `greedy.<name>` places, appended per call."""
    placed, take = [], getattr(greedy, name)

    def counted(rows, *args):
        before = len(rows.chosen)
        taken = take(rows, *args)
        placed.append(len(rows.chosen) - before)
        return taken

    monkeypatch.setattr(greedy, name, counted)
    return placed


def _mix(seed: int) -> tuple[np.ndarray, int, int]:
    """Lengths, ranks and T of a capped mix: long tails, uniform."""
    rng = np.random.default_rng(seed)
    num_ranks, budget = int(rng.choice([4, 8, 16, 32])), int(rng.choice([256, 1024, 4096, 16384]))
    n = num_ranks * int(rng.integers(4, 33))
    lengths = [(rng.pareto(0.8, n) * 200).astype(np.int64) + 1, rng.lognormal(6, 1.5, n).astype(np.int64) + 1,
               rng.integers(1, budget + 1, n)][seed % 3]
    return np.minimum(lengths, budget), num_ranks, budget


def test_regression_runs_to_empty_cells_took_the_search_an_item_each(monkeypatch):
    """Cause of ~15 % of `algorithm="greedy"`'s CPU at 2560 x 32 on capped Pareto lengths (T 16k): items 2.4k-4.2k
    and 8.7k-10.3k go one each to the lowest empty cell of one micro-batch (~2.2k runs, most of one item), each by
    the search (~6.5 us an item).  Now such runs are checked and placed many at once in numpy."""
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 64 * 32) * 200).astype(np.int64) + 1, 16384)
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=16384, cost=QUADRATIC)
    placed = _counted(monkeypatch)
    found = greedy.greedy_cells(problem, 3)
    assert sum(placed) > 100  # 108 of 2048 (none before)
    np.testing.assert_array_equal(found, greedy._scan_greedy(problem, 3, sorted_order(problem.item_costs))[0])


def test_regression_best_fit_decreasing_took_the_search_an_item_each(monkeypatch):
    """Cause of ~10 % of the same: items 4.2k-8.2k are distinct (a run of one item each) and each goes to the fullest
    cell of micro-batch 1 with room, by the search.  Now while only one micro-batch has fits and its fullest cell
    fits, the item goes there without the search."""
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 64 * 32) * 200).astype(np.int64) + 1, 16384)
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=16384, cost=QUADRATIC)
    placed = _counted(monkeypatch, "take_tops")
    found = greedy.greedy_cells(problem, 3)
    assert sum(placed) > 50
    np.testing.assert_array_equal(found, greedy._scan_greedy(problem, 3, sorted_order(problem.item_costs))[0])


@pytest.mark.parametrize("seed", range(36))
def test_the_runs_to_empty_cells_place_as_the_scan(monkeypatch, seed):
    """Windows wherever they apply (from one item), several M (the run for more micro-batches resumes a snapshot)."""
    monkeypatch.setattr(greedy_direct, "FEWEST", 1)
    lengths, num_ranks, budget = _mix(seed)
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget,
                                      cost=COSTS[seed // 3 % len(COSTS)])
    placed = _counted(monkeypatch)
    first = problem.min_microbatches
    for num_microbatches in (first, first + 1, first + 3):
        found = greedy.greedy_cells(problem, num_microbatches)
        expected = greedy._scan_greedy(problem, num_microbatches, sorted_order(problem.item_costs))
        assert (found is None) == (expected is None)
        if found is not None:
            np.testing.assert_array_equal(found, expected[0])
    assert sum(placed) > 0

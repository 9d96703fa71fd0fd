"""The joint greedy's work across runs of equal items and across M: a run of equal items takes its cells in one
sort (`greedy._Rows.run`), a run for more micro-batches starts where the one before would first have lost an item
to an empty micro-batch (`greedy._Run.start`), and `auto` keeps those runs for every M it tries (`auto._canonical`);
the cells stay the plain scan's (`_scan_greedy`)."""

import bisect
import types

import numpy as np
import pytest

from orchmllm import balance_microbatches
from orchmllm.balancers import CostModel
from orchmllm.balancers.microbatch import greedy, greedy_sweep
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.problem import sorted_order

QUADRATIC = CostModel(linear=1.0, quadratic=1e-4)


def _pareto(num_ranks: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.minimum((rng.pareto(0.8, num_ranks * 32) * 200).astype(np.int64) + 1, 16384)


def test_regression_the_sorted_search_weighed_each_item_alone(monkeypatch):
    """Cause of the rest of probe20 P20-15 (`algorithm="greedy"` 0.3 CPU s at 2560 x 32, 23x `auto`): every item
    took its own best-fit search (M binary searches), though items of equal cost and length that fit below the
    level take the cells of excess in (-cost, 0] in turn, one each.  Now those runs take them best first in one pass
    (`greedy_sweep.descend`); the search (`_best_fit`) runs for single items, rises and ties by rounding only."""
    lengths = _pareto(64)
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=16384, cost=QUADRATIC)
    calls = []
    best_fit = greedy._best_fit
    monkeypatch.setattr(greedy, "_best_fit", lambda *args: (calls.append(1), best_fit(*args))[1])
    found = greedy.greedy_cells(problem, 3)
    assert len(calls) < lengths.size / 2  # 768 of 2048 (one an item before)
    np.testing.assert_array_equal(found, greedy._scan_greedy(problem, 3, sorted_order(problem.item_costs))[0])


def test_regression_a_run_put_its_cells_back_one_binary_insertion_each(monkeypatch):
    """A run's cells, each one item fuller, went back into their rows one `insort` each (a binary search over
    (load, cell) pairs and a move of the row above, ~1-2 us at D = 2560).  Now they leave their rows in slices and
    come back in one rebuild of the row from its slices (`greedy_sweep.merge`)."""
    lengths = _pareto(64)
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=16384, cost=QUADRATIC)
    calls = []
    counted = types.SimpleNamespace(bisect_left=bisect.bisect_left, bisect_right=bisect.bisect_right,
                                    insort=lambda *args: (calls.append(1), bisect.insort(*args))[1])
    monkeypatch.setattr(greedy, "bisect", counted)
    monkeypatch.setattr(greedy_sweep, "bisect", counted)
    found = greedy.greedy_cells(problem, 3)
    assert len(calls) < 0.8 * lengths.size  # 1171 of 2048 (1951 before; 1398 with the zones' merges)
    np.testing.assert_array_equal(found, greedy._scan_greedy(problem, 3, sorted_order(problem.item_costs))[0])


def test_regression_padded_fits_weighed_each_item_alone(monkeypatch):
    """Cause of the rest of padded `auto` at 2560 x 32 (0.42 s after the runs were kept): every item took its own
    best-fit search, though once no micro-batch has an empty cell a filled cell's load with one more item is its own
    (count + 1) · max cost, whatever the item: the fits take the items in turn, best first, each while it fits.  Now
    they take them a sort at a time (`_PaddedRows._take_fits`); the search runs for the rest only."""
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 16 * 64) * 200).astype(np.int64) + 1, 16384)
    problem = make_microbatch_problem(lengths, 16, max_tokens_per_microbatch=16384, cost=QUADRATIC, padded=True)
    calls, batched = [], []
    best_fit, take_fits = greedy._best_fit, greedy._PaddedRows._take_fits
    monkeypatch.setattr(greedy, "_best_fit", lambda *args: (calls.append(1), best_fit(*args))[1])
    monkeypatch.setattr(greedy._PaddedRows, "_take_fits", lambda self, left: batched.append(take_fits(self, left))
                        or batched[-1])
    take_runs = greedy.take_runs  # the rises and their fits a run of equal loads at a time (`greedy_filled`)
    monkeypatch.setattr(greedy, "take_runs", lambda self, costs, at, positive: batched.append(
        take_runs(self, costs, at, positive) - at) or at + batched[-1])
    found = greedy.greedy_cells(problem, 8)
    # 895 of 1024 (166 before the runs)
    assert sum(batched) > 0.15 * lengths.size and len(calls) == lengths.size - sum(batched)
    np.testing.assert_array_equal(found, greedy._scan_greedy(problem, 8, sorted_order(problem.item_costs))[0])


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("seed", range(6))
def test_regression_a_run_for_more_micro_batches_placed_every_item_afresh(monkeypatch, seed, padded):
    """Cause of padded `auto` at 2560 x 32 taking 0.96 CPU s: each M tried placed every item, though with one more
    micro-batch (empty, level 0) every item goes where it went until the first that an empty micro-batch would
    have won, or that found no room.  Now the run for M + 1 starts from the state before that item and places the
    items from there on (padded: Pareto lengths, where an empty micro-batch would have won one; unpadded: lengths
    100-199 under T = 450, where the fewest M finds no room): the scan's cells for M + 1."""
    rng = np.random.default_rng(seed)
    lengths, budget = (_pareto(16, seed), 16384) if padded else (rng.integers(100, 200, 16 * 32), 450)
    problem = make_microbatch_problem(lengths, 16, max_tokens_per_microbatch=budget, cost=QUADRATIC, padded=padded)
    first = problem.min_microbatches
    greedy.greedy_cells(problem, first)
    kept = problem.packings[("greedy", 16, budget, padded)]
    assert kept.snapshot is not None and 0 < len(kept.snapshot.chosen) < lengths.size
    placed = []
    state = greedy._PaddedRows if padded else greedy._Rows
    run = state.run
    monkeypatch.setattr(state, "run", lambda self, *args: (placed.append(len(args[0]) if padded else args[-1]),
                                                            run(self, *args))[1])
    for name in ("take_empties", "take_tops"):  # the runs to empty cells, and the items to the tops, without `run`
        monkeypatch.setattr(greedy, name, _counting(getattr(greedy, name), placed))
    found = greedy.greedy_cells(problem, first + 1)
    expected = greedy._scan_greedy(problem, first + 1, sorted_order(problem.item_costs))
    assert (found is None) == (expected is None)
    if found is not None:
        np.testing.assert_array_equal(found, expected[0])
        assert sum(placed) == lengths.size - len(kept.snapshot.chosen)


def _counting(take, placed: list):
    """`take` (a `greedy_direct` placement), appending the items it placed to `placed`."""
    def counted(rows, *args):
        before = len(rows.chosen)
        taken = take(rows, *args)
        placed.append(len(rows.chosen) - before)
        return taken
    return counted


def test_regression_auto_planned_each_m_on_a_fresh_copy_of_the_items(monkeypatch):
    """Cause of the same: `auto` plans the items in canonical order, and each call reordered them into a problem of
    its own (empty `packings`), so no run was kept for the next M.  Now every call on the same items shares them."""
    lengths = _pareto(64)[::-1].copy()  # not in canonical order
    seen = []
    greedy_cells = greedy.greedy_cells
    monkeypatch.setattr(greedy, "greedy_cells", lambda problem, m: (seen.append(problem.packings),
                                                                    greedy_cells(problem, m))[1])
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=16384, cost=QUADRATIC, padded=True)
    assert len(seen) >= 3 and all(packings is seen[0] for packings in seen)
    assert plan.num_microbatches == 4  # the sorted runs' (probe23 P23-04); the greedy's own fewest is 5

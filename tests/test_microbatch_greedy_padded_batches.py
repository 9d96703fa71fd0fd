"""The padded joint greedy's batches before the last empty cell is opened (`greedy._PaddedRows.run`): the fits take
the items a sort at a time while every empty cell is a rise for them, a micro-batch's empty cells take a run of items
in turn (`_take_empties`), and a rise where no cell fits skips the search for fits; the cells stay the plain scan's
(`_scan_greedy`)."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.microbatch import greedy
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.problem import sorted_order
from orchmllm.study.workloads import sample_workload

COST_84B = CostModel(linear=426233561088.0, quadratic=3932160.0)  # the 84B model's LLM FLOPs, as the bench's


def _default_mix(seed: int):
    lengths = sample_workload("default", 64, 16, seed=seed).sample_llm_length
    return make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=16384, cost=COST_84B, padded=True)


def _scan(problem, num_microbatches):
    return greedy._scan_greedy(problem, num_microbatches, sorted_order(problem.item_costs))[0]


def _counted(monkeypatch, name):
    calls, original = [], getattr(greedy, name)
    monkeypatch.setattr(greedy, name, lambda *args: (calls.append(args), original(*args))[1])
    return calls


@pytest.mark.parametrize("seed", [0, 1])
def test_regression_padded_rises_searched_every_micro_batch_for_fits(monkeypatch, seed):
    """Cause of padded `auto` at 2560 x 32 spending ~0.1 s a greedy run in `_best_fit`: before the last empty cell was
    opened every item searched each micro-batch for fits (a binary search each), also the rises after the fits ran
    out, and each rise reset the knowledge that none is left.  Now a rise only changes its own micro-batch, so no fit
    is left unless that row's least load fits: the rise takes `_best_fit(..., fitless=True)` (default mix, D 64 x 16,
    T 16k, M 3: 3159 searches before, 118 now)."""
    problem = _default_mix(seed)
    searches = _counted(monkeypatch, "_first_above")
    found = greedy.greedy_cells(problem, 3)
    assert len(searches) < 0.2 * problem.num_items
    np.testing.assert_array_equal(found, _scan(problem, 3))


@pytest.mark.parametrize("seed", [0, 1])
def test_regression_padded_empty_cells_took_one_search_an_item(monkeypatch, seed):
    """A micro-batch just opened (its level the first item's cost) takes the next items into its empty cells in turn
    while the other micro-batches are empty (a rise), and the filled ones do not fit; each took its own `_best_fit`.
    Now `_take_empties` weighs the fits once for the run (default mix, D 64 x 16, M 3: 945 searches before)."""
    problem = _default_mix(seed)
    searches = _counted(monkeypatch, "_best_fit")
    taken, take_empties = [], greedy._PaddedRows._take_empties
    monkeypatch.setattr(greedy._PaddedRows, "_take_empties",
                        lambda self, *args: taken.append(take_empties(self, *args)) or taken[-1])
    found = greedy.greedy_cells(problem, 3)
    assert sum(taken) >= 3 * 63 and len(searches) < 0.75 * problem.num_items  # 714 searches now
    np.testing.assert_array_equal(found, _scan(problem, 3))


def test_regression_padded_fits_waited_for_the_last_empty_cell(monkeypatch):
    """`_take_fits` ran only once no micro-batch held an empty cell, though an empty cell whose level is below the
    item's cost is a rise, which any fit beats.  Now the items of cost above every such level go to the fits a sort
    at a time whatever the empty cells (or with the rises, a run of equal loads at a time: `greedy_filled`)."""
    problem = _default_mix(0)
    batched, take_fits, take_runs = [], greedy._PaddedRows._take_fits, greedy.take_runs
    monkeypatch.setattr(greedy._PaddedRows, "_take_fits", lambda self, left: batched.append(
        (take_fits(self, left), max(self.empty) >= 0)) or batched[-1][0])
    monkeypatch.setattr(greedy, "take_runs", lambda self, costs, at, positive: batched.append(
        (take_runs(self, costs, at, positive) - at, max(self.empty) >= 0)) or at + batched[-1][0])
    found = greedy.greedy_cells(problem, 3)
    assert sum(placed for placed, opened in batched if opened) > 0
    np.testing.assert_array_equal(found, _scan(problem, 3))


@pytest.mark.parametrize("seed", range(24))
def test_padded_batches_make_the_scans_choices(seed):
    """Small random instances with micro-batches of >= EMPTY_RUN cells (the empty-cell runs apply), families with
    runs, ties and float rounding, each M asked in a row (a run resumes from the one before): the scan's cells."""
    rng = np.random.default_rng(4400 + seed)
    num_ranks = int(rng.choice([greedy.EMPTY_RUN, 40, 64]))
    n = int(rng.integers(1, 10)) * num_ranks
    lengths = [rng.integers(1, 4, n), rng.choice([5, 5, 5, 9, 20], n), rng.integers(1, 100, n),
               np.minimum((rng.pareto(0.7, n) * 20).astype(np.int64) + 1, 2000)][seed % 4]
    cost = [dict(cost=CostModel(linear=1.0)), dict(cost=CostModel(per_item=1e16, linear=1.0)), dict(cost=COST_84B),
            dict(costs=rng.choice([1.0, 1.0 + 2**-52, 1e-17, 3.0, 0.0], n))][seed // 4 % 4]
    budget = int(max(lengths.max(), lengths.sum() / num_ranks / rng.uniform(1, 6) + 1))
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget, padded=True, **cost)
    first = problem.min_microbatches
    for num_microbatches in (first, first + 1, first + 3, max(1, first - 1)):
        scanned = greedy._scan_greedy(problem, num_microbatches, sorted_order(problem.item_costs))
        found = greedy.greedy_cells(problem, num_microbatches)
        assert (found is None) == (scanned is None)
        if found is not None:
            np.testing.assert_array_equal(found, scanned[0])


@pytest.mark.parametrize("num_ranks, per_rank, seed, num_microbatches", [(64, 16, 0, 3), (16, 32, 2, 7)])
def test_regression_a_padded_run_without_room_placed_items_past_its_snapshot(monkeypatch, num_ranks, per_rank, seed,
                                                                            num_microbatches):
    """Cause of padded `auto` at 2560 × 32 placing 20k items (T 16k, M 3) and 15k (T 8k, M 5 and 6) it had no use
    for: a run that will find no room answers no M, only its snapshot (`_Run.start`) does, yet it went on to the item
    without room.  Once no cell is empty, every item takes a cell's room for one more, whatever the item, so the room
    left proves it (`_PaddedRows._short`): the run stops where it has its snapshot (default mix, T 8k: 562 and 507
    items placed before, 371 and 361 now); the next M's run starts there, the cells the scan's."""
    lengths = np.minimum(sample_workload("default", num_ranks, per_rank, seed=seed).sample_llm_length, 8192)
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=8192, cost=COST_84B, padded=True)
    placed, run = [], greedy._PaddedRows.run
    monkeypatch.setattr(greedy._PaddedRows, "run", lambda self, *args: (run(self, *args), placed.append(
        (len(self.chosen), self.snapshot and len(self.snapshot.chosen))))[0])
    assert greedy.greedy_cells(problem, num_microbatches) is None
    assert greedy._scan_greedy(problem, num_microbatches, sorted_order(problem.item_costs)) is None
    (stopped, snapshot), = placed
    assert stopped == snapshot + 1 < problem.num_items
    np.testing.assert_array_equal(greedy.greedy_cells(problem, num_microbatches + 1), _scan(problem,
                                                                                          num_microbatches + 1))

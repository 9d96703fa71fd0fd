"""Items of cost 0 take no part in the pipeline planner's starts and search; they are dealt after it where their tokens
fit (`pipeline.free`)."""

import numpy as np
import pytest

from orchmllm import balance_microbatches
from orchmllm.balancers import Pipeline
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.pipeline import search
from orchmllm.balancers.pipeline.planner import plan_for_pipeline
from orchmllm.study.models import MODELS

COST = MODELS["84b"].llm.cost(causal=True)


def _mostly_empty(ranks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.where(rng.random(ranks * 32) < 0.9, 0, rng.integers(1, 8000, ranks * 32))


@pytest.mark.parametrize("ranks, first_stage", [(32, False), (64, False), (32, True)])
def test_regression_the_search_moved_and_timed_the_empty_items(monkeypatch, ranks, first_stage):
    """Regression (probe23 P23-08): with 90 % empty items (length 0: cost 0 under the LLM cost), 1F1B P 8, M 16, the
    search timed every empty item's moves like a costly item's (62 089 rows evaluated at D = 32 against 2 159 for
    the non-empty items alone; 0.78 CPU s against 0.10 at D = 512) and ended its budget 1.9 % above their step at
    D = 512.  Now the planner runs on the other items: from the same plain cells, the same rows, step and replica
    times as theirs alone, and the empty items dealt after."""
    rows, timed = [], search.CellSearch.evaluate
    monkeypatch.setattr(search.CellSearch, "evaluate", lambda self, cells: rows.append(len(cells[0])) or
                        timed(self, cells))
    lengths = _mostly_empty(ranks, 5)
    costs = COST.item_costs(lengths)
    plain = balance_microbatches(lengths, ranks, max_tokens_per_microbatch=16384, costs=costs, num_microbatches=16)
    steps, counts = [], []
    for kept in (np.arange(lengths.size), np.flatnonzero(lengths > 0)):
        rows.clear()
        problem = make_microbatch_problem(lengths[kept], ranks, max_tokens_per_microbatch=16384, costs=costs[kept])
        steps.append(plan_for_pipeline(problem, plain.rank[kept], plain.microbatch[kept], 16, Pipeline(8),
                                       first_stage=0.25 * costs[kept] if first_stage else None))
        counts.append(sum(rows))
    (replica, slot, every, _), (costly_replica, costly_slot, costly, _) = steps
    assert counts[0] == counts[1] > 0
    assert every.step_time == costly.step_time and np.array_equal(every.replica_times, costly.replica_times)
    empty = lengths == 0
    assert np.array_equal(replica[~empty], costly_replica) and np.array_equal(slot[~empty], costly_slot)
    assert (np.bincount(slot[empty] * ranks + replica[empty], minlength=16 * ranks).max()
            <= 1 + empty.sum() // (16 * ranks))


def test_regression_items_of_cost_0_holding_tokens_ran_the_capped_lpt(monkeypatch, fewer_start_off):
    """Regression (probe23 P23-08, costs= 0 on items holding tokens): the shaped start's LPT over every item overflowed
    the budget and its capped LPT ran a round per item (25 CPU s at D = 512 x 32, 90 % such items, against 0.12 s for
    the others alone).  Now they are dealt after the planning of the others: the same rows evaluated, the same step,
    every cell within the budget."""
    fewer_start_off()
    rows, timed = [], search.CellSearch.evaluate
    monkeypatch.setattr(search.CellSearch, "evaluate", lambda self, cells: rows.append(len(cells[0])) or
                        timed(self, cells))
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 8000, 32 * 32)
    free = rng.random(lengths.size) < 0.9
    lengths[free] = rng.integers(0, 200, free.sum())
    costs = np.where(free, 0.0, COST.item_costs(lengths))
    plain = balance_microbatches(lengths, 32, max_tokens_per_microbatch=16384, costs=costs, num_microbatches=16)
    steps, counts = [], []
    for kept in (np.arange(lengths.size), np.flatnonzero(~free)):
        rows.clear()
        problem = make_microbatch_problem(lengths[kept], 32, max_tokens_per_microbatch=16384, costs=costs[kept])
        steps.append(plan_for_pipeline(problem, plain.rank[kept], plain.microbatch[kept], 16, Pipeline(8)))
        counts.append(sum(rows))
    (replica, slot, every, accounts), (_, _, costly, _) = steps
    assert counts[0] == counts[1] > 0 and every.step_time == costly.step_time
    tokens = np.bincount(slot * 32 + replica, weights=lengths, minlength=16 * 32)
    assert tokens.max() <= 16384 and np.array_equal(accounts[1].ravel(), tokens)


def test_free_items_without_room_plan_every_item_as_before():
    """Where a free item finds no room after the others are planned (two cells of room 5, an item of 6 tokens), every
    item is planned together: the plan holds them all within the budget."""
    from orchmllm.balancers.pipeline.free import dealt

    problem = make_microbatch_problem([5, 5, 6, 4], 1, max_tokens_per_microbatch=10, costs=[1.0, 1.0, 0.0, 0.0])
    assert dealt(problem, np.array([0, 1]), np.array([0, 0]), np.array([0, 1]), 2) is None
    plan = balance_microbatches([5, 5, 6, 4], 1, max_tokens_per_microbatch=10, costs=[1.0, 1.0, 0.0, 0.0],
                                num_microbatches=2, pipeline=Pipeline(2))
    assert plan.cell_tokens.max() <= 10 and plan.pipeline.step_time > 0

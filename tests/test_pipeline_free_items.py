"""Items that cost nothing and hold no tokens take no part in the pipeline planner's search (`pipeline.free`)."""

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
    times as theirs alone, and every empty item in its plain cell."""
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
    assert np.array_equal(replica[empty], plain.rank[empty]) and np.array_equal(slot[empty], plain.microbatch[empty])


def test_items_of_cost_0_that_hold_tokens_stay_within_the_budget():
    """Items of cost 0 holding tokens stay in the search (they weigh on the budget): every cell within it, and the
    items of neither cost nor tokens are left out alongside."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 6000, 32 * 32)
    costs = np.where(rng.random(lengths.size) < 0.6, 0.0, COST.item_costs(lengths))
    lengths[rng.random(lengths.size) < 0.2] = 0
    costs[lengths == 0] = 0.0
    plan = balance_microbatches(lengths, 32, max_tokens_per_microbatch=16384, costs=costs, num_microbatches=16,
                                pipeline=Pipeline(8))
    tokens = np.bincount(plan.microbatch * 32 + plan.rank, weights=lengths, minlength=16 * 32)
    assert tokens.max() <= 16384
    assert np.array_equal(plan.cell_tokens.ravel(), tokens)

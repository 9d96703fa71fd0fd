"""A search's `run` makes no step where the most steps its budget buys can gain little (`CellSearch._little_left`
before the first step, `search.steps_bought`): D = 2560 x 32, M = 32, interleaved, the first step of seeds 7 and 29
(issue 28: ~4 ms, 0.2 of the plain planning) gained less than 1e-4 of the step."""

import numpy as np
import pytest

from orchmllm.balancers import Pipeline, balance_microbatches
from orchmllm.balancers.pipeline import search
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload

COST = MODELS["84b"].llm.cost(causal=True)


@pytest.mark.parametrize("below, little", [(0.5, True), (2.0, False)])
def test_before_the_first_step_the_most_steps_the_budget_buys_bound_what_they_gain(below, little):
    """The budget buys at most 9 steps of its swaps' rows: the 10th largest time bounds the step after them."""
    ranks, pipeline = 100, Pipeline(2, "1f1b")
    cells, tokens = np.zeros((ranks, 2)), np.zeros((ranks, 2), dtype=np.int64)
    times = np.full(ranks, 0.5)
    found = search.CellSearch(pipeline, np.ones(0), np.ones(0, dtype=np.int64), False, cells, tokens,
                              np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 10, 10**9, times)
    found.work = 9 * len(found.swaps) * found.row_work
    assert search.steps_bought(found.work, len(found.swaps), found.row_work) == 9
    found.times[0], found.times[1:10] = 1.0, 1 - below * 9 * search.LEFT_RATE
    assert found._little_left(0, found.work) is little


def test_regression_a_run_made_a_step_whose_budget_could_gain_little(monkeypatch, fewer_start_off):
    """D = 2560 x 32, M = 32, interleaved, seed 7: `run` made 1 step (the parent), now none; the plan within
    STOP_GAP of the one made with the step."""
    fewer_start_off()
    steps, step, left = [], search.CellSearch._step, search.CellSearch._little_left
    monkeypatch.setattr(search.CellSearch, "_step", lambda self, r: steps.append(r) or step(self, r))
    lengths = sample_workload("default", 2560, 32, 7).sample_llm_length
    kwargs = dict(max_tokens_per_microbatch=16384, cost=COST, num_microbatches=32,
                  pipeline=Pipeline(8, "interleaved", 2))
    plan = balance_microbatches(lengths, 2560, **kwargs).pipeline
    assert not steps
    monkeypatch.setattr(search.CellSearch, "_little_left", lambda self, made, begun: made and left(self, made, begun))
    stepped = balance_microbatches(lengths, 2560, **kwargs).pipeline
    assert steps
    assert stepped.step_time <= plan.step_time <= stepped.step_time * (1 + search.STOP_GAP)

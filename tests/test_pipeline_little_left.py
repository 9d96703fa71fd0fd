"""A search's `run` ends after a step where the steps its budget left buys can gain little (`CellSearch._little_left`):
at D = 2560 x 32 many replicas lie near-tied at the top and a step lowers one of them (issue 28: M = 16, 1F1B, seed
309 ran 32 steps, 37 ms, for 0.27 %, 3.5-4x the plain planning)."""

import numpy as np
import pytest

from orchmllm.balancers import Pipeline, balance_microbatches
from orchmllm.balancers.pipeline import search
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload

COST = MODELS["84b"].llm.cost(causal=True)


def _search(times: np.ndarray, work: int) -> search.CellSearch:
    """A search over len(times) replicas of two empty cells each, its times and budget as given."""
    ranks, pipeline = times.size, Pipeline(2, "1f1b")
    cells, tokens = np.zeros((ranks, 2)), np.zeros((ranks, 2), dtype=np.int64)
    found = search.CellSearch(pipeline, np.ones(0), np.ones(0, dtype=np.int64), False, cells, tokens,
                              np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 10, 10**9, times)
    found.work = work
    return found


@pytest.mark.parametrize("tenth, little", [(1 - 5e-4, True), (1 - 1e-3, False)])
def test_the_steps_the_budget_left_buys_bound_what_they_gain(tenth, little):
    """9 steps left (a step made charged 100, 900 left): the 10th largest time bounds the step after them, so they
    gain 1 - tenth at most; little where that is at most 9·LEFT_RATE (and STOP_GAP)."""
    times = np.full(100, 0.5)
    times[0], times[1:10] = 1.0, tenth
    assert 9 * search.LEFT_RATE < search.STOP_GAP
    assert _search(times, 900)._little_left(1, 1000) is little


def test_a_budget_that_buys_a_step_for_every_replica_is_never_little():
    times = np.full(10, 1.0)
    assert not _search(times, 1000)._little_left(1, 1100)


def test_regression_a_run_near_tied_at_the_top_spent_its_budget_on_them(monkeypatch, fewer_start_off):
    """D = 2560 x 32, M = 16, 1F1B, seed 309: `run` made 32 steps (the parent), now 1; the plan within STOP_GAP of the
    one made with every step."""
    fewer_start_off()
    steps, step = [], search.CellSearch._step
    monkeypatch.setattr(search.CellSearch, "_step", lambda self, r: steps.append(r) or step(self, r))
    lengths = sample_workload("default", 2560, 32, 309).sample_llm_length
    kwargs = dict(max_tokens_per_microbatch=16384, cost=COST, num_microbatches=16, pipeline=Pipeline(8, "1f1b"))
    plan = balance_microbatches(lengths, 2560, **kwargs).pipeline
    assert len(steps) == 1
    monkeypatch.setattr(search.CellSearch, "_little_left", lambda self, steps, begun: False)
    every = balance_microbatches(lengths, 2560, **kwargs).pipeline
    assert len(steps) > 8
    assert every.step_time <= plan.step_time <= every.step_time * (1 + search.STOP_GAP)

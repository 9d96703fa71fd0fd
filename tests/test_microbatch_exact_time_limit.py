"""`algorithm="exact"` under a `time_limit` keeps to it: the joint greedy start (n · M item-cell pairs) runs only
where the limit buys them (probe22 P22-11: time_limit=0.1 ran 2.9 CPU s at 2560 × 32, M = 64, in the start)."""

import numpy as np
import pytest

from orchmllm import CostModel, balance_microbatches
from orchmllm.balancers.microbatch import exact, greedy
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import llm_stage_lengths

COST = MODELS["84b"].stages()[-1].cost


def greedy_starts(monkeypatch) -> list:
    calls, solve = [], greedy.solve
    monkeypatch.setattr(greedy, "solve", lambda *args: calls.append(1) or solve(*args))
    return calls


@pytest.mark.parametrize("time_limit, started", [(0.001, False), (None, True), (10.0, True)])
def test_regression_the_greedy_start_runs_only_where_the_time_limit_buys_it(monkeypatch, time_limit, started):
    lengths = llm_stage_lengths(64, 32, 0)[0]  # n · M = 2048 · 16 pairs: 1 ms buys 2000
    starts = greedy_starts(monkeypatch)
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=16384, cost=COST, num_microbatches=16,
                                algorithm="exact", time_limit=time_limit)
    assert bool(starts) is started
    assert np.bincount(plan.rank * 16 + plan.microbatch, weights=lengths, minlength=64 * 16).max() <= 16384
    assert plan.lower_bound <= plan.step_cost


def test_without_an_incumbent_the_greedy_start_always_runs(monkeypatch):
    """Few items: `auto` passes no incumbent (it searches exactly), so the start is the only plan."""
    starts = greedy_starts(monkeypatch)
    plan = balance_microbatches([5, 4, 3, 3, 2], 2, max_tokens_per_microbatch=9, num_microbatches=2,
                                algorithm="exact", time_limit=1e-9)
    assert starts and plan.step_cost >= plan.lower_bound
    assert exact.GREEDY_CELLS_PER_SECOND * 1e-9 < 5 * 2


def test_regression_a_scanning_start_is_charged_its_cells(monkeypatch):
    """rev15 R15-04: costs that do not follow the lengths take the greedy's scan (n · M · D pairs); charged n · M, it
    ran 0.94 CPU s under time_limit=0.1 at D 1024 x 32, M 4."""
    rng = np.random.default_rng(11)
    lengths, costs = rng.integers(1, 4000, 64 * 32), rng.random(64 * 32) * 1000
    budget = int(lengths.sum() / (64 * 4) * 1.5)
    starts = greedy_starts(monkeypatch)
    # 2048 items x 4 micro-batches = 8192 pairs searched, x 64 cells = 524 288 scanned: 0.01 s buys 20 000
    balance_microbatches(lengths, 64, costs=costs, max_tokens_per_microbatch=budget, num_microbatches=4,
                         algorithm="exact", time_limit=0.01)
    assert starts == []
    assert greedy.scans(make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=budget, costs=costs))


@pytest.mark.parametrize("time_limit, status", [(0.001, "time_limit"), (None, "optimal")])
def test_regression_a_search_stopped_by_its_time_limit_says_time_limit(time_limit, status):
    """Cause (fix61): the search's stop at a time limit's budget returned the incumbent as `feasible`, so
    `check_microbatch_conformance("exact", time_limit=0.001)` refused the registry's own exact kernel (an exact kernel
    may only stop at its limit); without a limit the same instance is proven."""
    plan = balance_microbatches([3, 1, 2, 3, 2, 2, 1, 1, 3, 1], 2, max_tokens_per_microbatch=3, num_microbatches=4,
                                cost=CostModel(per_item=0.0, linear=1.0, quadratic=0.37), microbatch_overhead=1.0,
                                algorithm="exact", time_limit=time_limit)
    assert plan.status.value == status and plan.lower_bound <= plan.step_cost

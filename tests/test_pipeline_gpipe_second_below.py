"""GPipe's second shaped start (the D largest items pinned) where more than D items overflow a cell alone: bounded
from below by its LPT's first SECOND_PREFIX·D choices (`shaped.first_from_below(most=True)`), and not made where that
bound already runs longer than the first start's step (issue 28: its LPT over every item and its search were ~0.4 of
the planning time at D = 2560 x 32, M = 16).  GPipe makes these starts only where its start by heights is not made
(`heights`: no item heavy at the bound, costs off LPT's integer keys, a cell over the token budget); here it is
left out (`_plans`) to test them."""

import numpy as np
import pytest

from orchmllm import balance_microbatches
from orchmllm.balancers import Pipeline
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload

COST = MODELS["84b"].llm.cost(causal=True)


def _plans(monkeypatch, workload, ranks, microbatches, seed, samples=32):
    """(plan, lpt_shaped's `most` per call) with the planner as is and without any bound (both starts made), `samples`
    per replica; GPipe's start by heights not made."""
    from orchmllm.balancers.pipeline import planner

    monkeypatch.setattr(planner, "heights_start", lambda *args: None)
    lengths = sample_workload(workload, ranks, samples, seed).sample_llm_length
    made, shaped = [], planner.lpt_shaped
    monkeypatch.setattr(planner, "lpt_shaped", lambda *args, **kwargs: made.append(args[-1]) or shaped(*args))
    out = []
    for below in (planner.first_from_below, lambda *args, **kwargs: None):
        monkeypatch.setattr(planner, "first_from_below", below)
        made.clear()
        out.append((balance_microbatches(lengths, ranks, max_tokens_per_microbatch=max(16384, int(lengths.max())),
                                         cost=COST, num_microbatches=microbatches,
                                         pipeline=Pipeline(8, "gpipe")), list(made)))
    return out


def test_regression_gpipe_made_the_second_shaped_start_where_it_starts_slower(monkeypatch):
    """Regression (issue 28, M 16 GPipe 2.1-2.2x a plain plan at D = 2560 x 32): GPipe made both shaped starts and
    searched both, the second (pinned) starting 1.07x the first's step there and searched to 1.19x its end, then
    dropped.  Its cells from below now show it slower at its start: one `lpt_shaped` call (the first), not two, and
    the plan is never slower than the plain cells it started from."""
    from orchmllm.balancers.pipeline.shaped import PINNED_SHARE

    (plan, made), (_, made_without) = _plans(monkeypatch, "default", 512, 16, 7)
    costs = np.sort(COST.item_costs(sample_workload("default", 512, 32, 7).sample_llm_length))[::-1]
    assert costs[:512].sum() < PINNED_SHARE * costs.sum()  # 0.13: the second is not made for its share alone
    assert made_without == [False, True]  # both, as before the bound
    assert made == [False]
    assert plan.pipeline.step_time <= plan.pipeline.unaware_step_time


@pytest.mark.parametrize("workload, ranks, microbatches, seed, samples", [
    ("speech", 512, 12, 105, 32), ("vision", 512, 12, 106, 32), ("long", 64, 16, 1, 128)])
def test_gpipe_makes_and_searches_the_second_start_where_it_may_end_faster(monkeypatch, workload, ranks, microbatches,
                                                                            seed, samples):
    """Where the second start's cells from below do not run longer than the first's step (review12 R12-02/04's rows,
    where its search ended up to 10 % faster) or the D largest items hold PINNED_SHARE of the work or more (the long
    mix, bench_pipeline's 8·M samples a replica: 1.147x the bound, 1.225x from the first alone, whose step the
    second's cells from below exceed), both are made and searched: the plan of no bound, bit for bit."""
    (plan, made), (plan_without, made_without) = _plans(monkeypatch, workload, ranks, microbatches, seed, samples)
    assert made == [False, True] and made_without == [False, True]
    assert plan.digest() == plan_without.digest() and plan.pipeline.step_time == plan_without.pipeline.step_time
    assert np.array_equal(plan.pipeline.replica_times, plan_without.pipeline.replica_times)


@pytest.mark.parametrize("ranks, seed", [(64, 3), (256, 5)])
def test_the_second_shaped_start_from_below_is_at_most_its_cells(ranks, seed):
    """`first_from_below(most=True)` is at most the second shaped start's cells (`lpt_shaped(most=True)`, uncapped
    here) in every cell, and its replicas' GPipe times at most the start's."""
    from orchmllm.balancers.pipeline.planner import cell_costs
    from orchmllm.balancers.pipeline.schedules import replica_times
    from orchmllm.balancers.pipeline.shaped import first_from_below, lpt_shaped, overflowing

    lengths = sample_workload("long", ranks, 32, seed).sample_llm_length
    problem = make_microbatch_problem(lengths, ranks, costs=COST.item_costs(lengths),
                                      max_tokens_per_microbatch=max(16384, int(lengths.max())))
    pipeline, m = Pipeline(8, "gpipe"), 16
    mean = float(problem.item_costs.sum()) / ranks + m * problem.microbatch_overhead
    assert overflowing(problem, pipeline, m, mean) > ranks
    below, (replica, slot, accounts) = first_from_below(problem, m, pipeline, mean, most=True), \
        lpt_shaped(problem, m, pipeline, mean, True)
    assert accounts is not None and below is not None
    cells = cell_costs(problem, replica, slot, m, accounts)[0]
    assert np.all(below <= cells)
    assert np.all(replica_times(pipeline, *pipeline.stage_times(below))
                  <= replica_times(pipeline, *pipeline.stage_times(cells)))

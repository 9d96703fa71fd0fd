"""The start on fewer micro-batches (`pipeline.fewer`): where the largest item's chain holds the bound (1F1B,
interleaved), the items shaped for k < M cells in the first k slots; returned at once where it meets the bound
(optimal), else dropped (the plan unchanged)."""

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers import Pipeline, Status, balance_microbatches
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.pipeline.profile import best_profile
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload
from orchmllm.testing.pipeline import brute_force_pipeline, replica_step

COST = MODELS["84b"].llm.cost(causal=True)
RELATIVE = 1e-9


@pytest.mark.parametrize("schedule, virtual", [("1f1b", 1), ("interleaved", 2)])
def test_regression_one_item_a_cell_at_2560_replicas_meets_the_bound(schedule, virtual):
    """bench_pipeline's planning-time instance (D = 2560 x 32, seed 7) at M = 32, P = 8: every replica of the plan of
    M-shaped cells held a cell of 0.97-1.0 of the largest item, the step 1.274x (1F1B) the bound, the largest item's
    chain; the start on 11 (1F1B) / 8 (interleaved) cells meets it.  Fails on the parent (status feasible)."""
    lengths = sample_workload("default", 2560, 32, 7).sample_llm_length
    plan = balance_microbatches(lengths, 2560, max_tokens_per_microbatch=16384, cost=COST, num_microbatches=32,
                                pipeline=Pipeline(stages=8, schedule=schedule, virtual_stages=virtual))
    step = plan.pipeline
    assert step.status is Status.OPTIMAL and step.step_time == step.lower_bound
    assert step.lower_bound == float(COST.item_costs(lengths).max())  # the largest item's chain
    assert step.step_time < 0.8 * step.unaware_step_time
    assert int(plan.microbatch.max()) < 32  # the last slots empty


def test_a_start_that_misses_the_bound_changes_no_plan(monkeypatch, fewer_start_off):
    """The long_tail mix at D = 512 x 32, M = 32, P = 8, 1F1B: the start is made (the chain holds the bound) and
    runs above the bound, so it is dropped: the plan is the one made without it, bit for bit."""
    lengths = sample_workload("long_tail", 512, 32, 410).sample_llm_length
    made = []
    real = importlib.import_module("orchmllm.balancers.pipeline.fewer").fewer_start  # new: imported here

    def spy(*args):
        made.append(real(*args))
        return made[-1]

    def plan():
        return balance_microbatches(lengths, 512, max_tokens_per_microbatch=16384, cost=COST, num_microbatches=32,
                                    pipeline=Pipeline(stages=8))
    monkeypatch.setattr("orchmllm.balancers.pipeline.fewer.fewer_start", spy)
    ours = plan()
    assert len(made) == 1 and made[0] is not None and ours.pipeline.status is Status.FEASIBLE
    fewer_start_off()
    without = plan()
    for name in ("rank", "microbatch"):
        np.testing.assert_array_equal(getattr(ours, name), getattr(without, name))
    np.testing.assert_array_equal(ours.pipeline.replica_times, without.pipeline.replica_times)


def test_fewer_count_is_the_fewest_runnable_count_low_enough():
    """k: the fewest runnable counts below M whose τ_k·X̄_k is at most FEWER_LEVEL of the bound (interleaved: whole
    groups of P); None where none is."""
    from orchmllm.balancers.pipeline import fewer  # new: the other tests' outcomes on the parent are their own

    lengths = sample_workload("default", 64, 32, 3).sample_llm_length
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=16384, cost=COST)
    mean = problem.total_cost / problem.num_ranks
    for pipeline in (Pipeline(stages=4), Pipeline(stages=4, schedule="interleaved", virtual_stages=2)):
        bound = 0.9 * mean
        count = fewer.fewer_count(problem, pipeline, 32, bound)
        runnable = [k for k in range(1, 32) if pipeline.runnable(k) == k]
        low = [k for k in runnable if best_profile(pipeline, k)[0] * mean <= fewer.FEWER_LEVEL * bound]
        assert count == low[0] and pipeline.runnable(count) == count
        assert fewer.fewer_count(problem, pipeline, 32, 0.1 * mean) is None


@st.composite
def giant_steps(draw):
    """One item much larger than the rest (its chain the bound), 1F1B or interleaved, a few cells."""
    if draw(st.booleans()):
        pipeline, ranks, microbatches = Pipeline(stages=2, schedule="interleaved", virtual_stages=2), 1, 4
    else:
        pipeline = Pipeline(stages=draw(st.integers(2, 3)))
        ranks, microbatches = draw(st.sampled_from([(1, 3), (1, 4), (2, 2), (2, 3)]))
    small = draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))
    lengths = [draw(st.integers(8, 12))] + small
    overhead = draw(st.sampled_from([0.0, 0.25]))
    return pipeline, lengths, ranks, microbatches, max(lengths) + draw(st.integers(0, 4)), overhead


@settings(max_examples=40, deadline=None)
@given(giant_steps())
def test_the_fewer_start_is_simulated_and_optimal_only_when_proven(case):
    """Brute force over every assignment: the step is the event simulation's, bound <= optimum <= plan, and where
    the plan is optimal its step is the optimum (the start on fewer micro-batches returned)."""
    pipeline, lengths, ranks, microbatches, budget, overhead = case
    costs = [float(length) ** 1.5 for length in lengths]
    optimum = brute_force_pipeline(pipeline, costs, lengths, ranks, microbatches, budget, overhead).step_time
    plan = balance_microbatches(lengths, ranks, max_tokens_per_microbatch=budget, costs=costs,
                                num_microbatches=microbatches, microbatch_overhead=overhead, pipeline=pipeline)
    step = plan.pipeline
    cells = plan.cell_loads.T + plan.microbatch_overhead
    assert step.step_time == max(replica_step(pipeline, row) for row in cells)
    assert step.lower_bound <= optimum * (1 + RELATIVE) and optimum <= step.step_time * (1 + RELATIVE)
    if step.status is Status.OPTIMAL:
        assert step.step_time == pytest.approx(optimum, rel=RELATIVE)


def test_the_fewer_start_fires_on_a_tiny_giant():
    """A giant among small items on 2 replicas, 1F1B over 2 stages, 4 micro-batches: the start on fewer cells is
    made and the plan meets the bound (the brute-force optimum, the giant's chain)."""
    pipeline, lengths = Pipeline(stages=2), [10, 1, 1, 2]
    costs = [float(length) ** 1.5 for length in lengths]
    made = []
    real = importlib.import_module("orchmllm.balancers.pipeline.fewer").fewer_start  # new: imported here

    def spy(*args):
        made.append(real(*args))
        return made[-1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("orchmllm.balancers.pipeline.fewer.fewer_start", spy)
        plan = balance_microbatches(lengths, 2, max_tokens_per_microbatch=12, costs=costs, num_microbatches=4,
                                    pipeline=pipeline)
    assert made and made[0] is not None
    assert plan.pipeline.status is Status.OPTIMAL
    optimum = brute_force_pipeline(pipeline, costs, lengths, 2, 4, 12).step_time
    assert plan.pipeline.step_time == pytest.approx(optimum, rel=RELATIVE) == costs[0]

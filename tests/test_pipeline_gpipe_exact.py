"""`schedules.replica_times` takes GPipe's closed form where every sum is exact (`schedules._exact_times`): the same
floats as the walk, without it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers import Pipeline, balance_microbatches
from orchmllm.balancers.cost import CostModel
from orchmllm.balancers.pipeline import schedules
from orchmllm.study.workloads import sample_workload

BENCH_COST = CostModel(per_item=0.0, linear=426233561088.0, quadratic=3932160.0)  # bench_pipeline's


def _walked(monkeypatch, pipeline, forward, backward):
    """The walk's times of these rows (the closed form turned off)."""
    with monkeypatch.context() as patched:
        patched.setattr(schedules, "_exact_times", lambda *args: None)
        return schedules.replica_times(pipeline, forward, backward)


def test_regression_gpipe_rows_of_exact_sums_were_walked(monkeypatch):
    """Regression (planning time at D = 2560 x 32, a fixed M, issue 28): GPipe's start cells were walked operation by
    operation (7680 rows at M = 16: 2.4-4 ms, the closed form 0.9), though with bench_pipeline's cost model every
    duration is a whole multiple of one power of two and every sum exact, where the walk and the closed form give the
    same floats.  Those rows walk no operation now (no duration rows made), the times bit for bit the walk's."""
    pipeline = Pipeline(8, "gpipe")
    lengths = sample_workload("default", 256, 32, seed=3).sample_llm_length
    plan = balance_microbatches(lengths, 256, max_tokens_per_microbatch=16384, cost=BENCH_COST, num_microbatches=16)
    cells = np.zeros((256, 16))
    np.add.at(cells, (plan.rank, plan.microbatch), BENCH_COST.item_costs(lengths))
    forward, backward = pipeline.stage_times(cells)
    made = []
    durations = schedules._durations
    monkeypatch.setattr(schedules, "_durations", lambda *args: made.append(1) or durations(*args))
    times = schedules.replica_times(pipeline, forward, backward)
    assert made == []
    assert np.array_equal(times.view(np.int64), _walked(monkeypatch, pipeline, forward, backward).view(np.int64))
    assert len(made) == 1


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 8), st.integers(1, 24), st.integers(1, 12), st.sampled_from([0.5, 1.0, 2.0, 3.0]),
       st.integers(-40, 40), st.sampled_from([2, 2**20, 2**45, 2**53]), st.integers(0, 2**32 - 1))
def test_the_closed_form_is_taken_only_with_the_walks_floats(stages, m, rows, factor, exponent, top, seed):
    """Durations of whole multiples of 2**exponent (up to `top` of them, the cells' costs times P·(1 + k) so that the
    shares stay whole, or not): wherever the closed form is taken, its times are the walk's bit for bit, -0.0 rows
    too; durations of no common unit (random floats over a third) or sums past 2**53 units are walked."""
    pipeline = Pipeline(stages, "gpipe", backward_factor=factor)
    rng = np.random.default_rng(seed)
    cost = rng.integers(0, top, (rows, m)).astype(np.float64) * 2.0**exponent * stages * (1 + factor) * 2
    cost[0] = -0.0 if seed % 3 == 0 else cost[0]
    forward, backward = pipeline.stage_times(cost)
    with pytest.MonkeyPatch.context() as patched:
        times = schedules.replica_times(pipeline, forward, backward)
        exact = schedules._exact_times(forward, backward, stages) is not None
        assert np.array_equal(times.view(np.int64), _walked(patched, pipeline, forward, backward).view(np.int64))
    assert exact or top > 2**40 or not cost.any()  # all 0: walked
    odd = rng.random((64, 16)) * 2.0**exponent / 3 + 2.0**(exponent - 1)  # of full mantissas: no common unit u
    assert schedules._exact_times(*pipeline.stage_times(odd), stages) is None


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_plans_are_those_of_the_walk(monkeypatch, schedule):
    """The plan, its step, PP-unaware step and replica times are those the walk alone gives (bench cost model, where
    the closed form is taken: every start and final cell of GPipe; 1F1B walks as before)."""
    lengths = sample_workload("long_tail", 512, 32, seed=11).sample_llm_length
    plans = []
    for exact in (schedules._exact_times, lambda *args: None):
        monkeypatch.setattr(schedules, "_exact_times", exact)
        plans.append(balance_microbatches(lengths, 512, max_tokens_per_microbatch=int(max(16384, lengths.max())),
                                          cost=BENCH_COST, num_microbatches=16, pipeline=Pipeline(4, schedule)))
    new, old = plans
    assert new.digest() == old.digest()
    assert np.array_equal(new.pipeline.replica_times.view(np.int64), old.pipeline.replica_times.view(np.int64))
    assert (new.pipeline.step_time, new.pipeline.unaware_step_time) == (old.pipeline.step_time,
                                                                          old.pipeline.unaware_step_time)

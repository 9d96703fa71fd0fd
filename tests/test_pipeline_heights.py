"""GPipe's start by heights (`balancers.pipeline.heights`): the heavy items dealt to replicas in runs whose cells
a replica's largest item sets, the light items filling what is left (issue 28: at D = 2560 x 32, M = 16, P = 8 the
shaped starts' search ended ~1.32x the bound and took ~1.6x a plain plan's time; this start is within ~1 % of it)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import balance_microbatches
from orchmllm.balancers import Pipeline
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.microbatch.plan import cell_accounts
from orchmllm.balancers.pipeline.bounds import step_bound
from orchmllm.balancers.pipeline.heights import _runs, heights_start
from orchmllm.balancers.pipeline.schedules import gpipe_time
from orchmllm.balancers.pipeline.step import pipeline_step
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload

COST = MODELS["84b"].llm.cost(causal=True)
GPIPE = Pipeline(stages=8, schedule="gpipe")


def _problem(lengths, ranks, budget=16384, cost=COST):
    return make_microbatch_problem(lengths, ranks, costs=cost.item_costs(lengths), max_tokens_per_microbatch=budget)


def _bound(problem, m):
    return step_bound(GPIPE, problem.item_costs, problem.num_ranks, np.array([m]), problem.microbatch_overhead)


def test_regression_gpipe_cells_far_above_the_bound_where_many_items_overflow_a_cell():
    """Regression: at D = 512 x 32, M = 16 (default mix, seed 7) GPipe's plan was 0.922x the plain cells' step and
    1.43x the bound (the shaped starts and their search); from its start by heights 0.72x and 1.12x (its runs fit
    no step below ~1.11x the bound there)."""
    lengths = sample_workload("default", 512, 32, 7).sample_llm_length
    plan = balance_microbatches(lengths, 512, max_tokens_per_microbatch=16384, cost=COST, num_microbatches=16,
                                pipeline=GPIPE)
    assert plan.pipeline.step_time <= 0.75 * plan.pipeline.unaware_step_time
    assert plan.pipeline.step_time <= 1.15 * plan.pipeline.lower_bound
    fresh = pipeline_step(_problem(lengths, 512), plan.rank, plan.microbatch, 16, GPIPE, 0.0)
    assert plan.pipeline.step_time == fresh.step_time
    assert np.array_equal(plan.pipeline.replica_times, fresh.replica_times)


def test_the_start_is_a_plan_with_its_accounts_and_its_runs_fit_their_step():
    """Every item in one cell (replica < D, slot < M) within the token budget, the accounts `cell_accounts`' own bit
    for bit, and each heavy run within its step: Σ its items + (P - 1)·its first <= S."""
    lengths = sample_workload("default", 256, 32, 11).sample_llm_length
    problem, m = _problem(lengths, 256), 16
    bound = _bound(problem, m)
    replica, slot, accounts = heights_start(problem, m, GPIPE, bound)
    assert replica.min() >= 0 and replica.max() < 256 and slot.min() >= 0 and slot.max() < m
    loads, tokens = cell_accounts(problem, replica, slot, m)
    assert np.array_equal(loads, accounts[0]) and np.array_equal(tokens, accounts[1]) and tokens.max() <= 16384
    costs = problem.sorted_costs
    firsts, need, budget, heavy = _runs((costs, -costs, np.concatenate(([0.0], np.cumsum(costs)))), 8 * bound, m, 8)
    assert need > 256  # the bound's step does not fit here: the start's is higher
    ends = np.append(firsts, heavy)
    assert all(costs[a:b].sum() + 7 * costs[a] <= budget for a, b in zip(ends[:-1], ends[1:]))
    assert np.all(costs[:heavy] > budget / (m + 7)) and costs[heavy] <= budget / (m + 7)
    step = float(gpipe_time(*GPIPE.stage_times(accounts[0].T), 8).max())
    assert bound < step <= 1.2 * bound


def test_no_start_where_no_item_is_heavy_at_the_bound():
    """Items all alike and light (flat cells are GPipe's best shape and the bound's): no start by heights."""
    problem = _problem(np.full(64 * 32, 1000), 64)
    assert heights_start(problem, 16, GPIPE, _bound(problem, 16)) is None


@settings(max_examples=25, deadline=None)
@given(st.integers(4, 8), st.sampled_from([8, 12]), st.lists(st.integers(1, 4000), min_size=40, max_size=160),
       st.lists(st.integers(6000, 16000), min_size=0, max_size=6))
def test_plans_from_the_start_by_heights_are_never_slower_than_the_plain_cells(ranks, m, short, giants):
    """Small instances with a few giants: the start (where made) places every item once within the budget; the
    plan is timed as `pipeline_step` times it, never slower than the plain cells, and at least the bound."""
    lengths = np.array(short + giants, dtype=np.int64)
    problem = _problem(lengths, ranks)
    made = heights_start(problem, m, GPIPE, _bound(problem, m))
    if made is not None:
        assert np.array_equal(cell_accounts(problem, made[0], made[1], m)[1], made[2][1])
        assert made[2][1].max() <= 16384 and made[2][0].sum() == problem.item_costs.sum()
    plan = balance_microbatches(lengths, ranks, max_tokens_per_microbatch=16384, cost=COST, num_microbatches=m,
                                pipeline=GPIPE)
    fresh = pipeline_step(problem, plan.rank, plan.microbatch, m, GPIPE, 0.0)
    assert plan.pipeline.step_time == fresh.step_time <= plan.pipeline.unaware_step_time
    assert plan.pipeline.lower_bound <= plan.pipeline.step_time


def test_a_gpipe_move_lands_in_its_least_cell_that_fits():
    """GPipe's closed form, (Σ x + (P - 1)·max x) / P, rises with the cell an item joins: of every cell of a replica,
    the least gives its least time (`search.CellSearch._move_rows` offers that one alone)."""
    rng = np.random.default_rng(5)
    rows = rng.integers(1, 1000, size=(200, 16)).astype(float)
    item = rng.integers(1, 2000, size=200).astype(float)
    added = np.repeat(rows[:, None, :], 16, axis=1)
    added[:, np.arange(16), np.arange(16)] += item[:, None]
    times = gpipe_time(*GPIPE.stage_times(added.reshape(-1, 16)), 8).reshape(200, 16)
    least = times[np.arange(200), np.argmin(rows, axis=1)]
    assert np.all(least <= times.min(axis=1) * (1 + 1e-12))


def test_regression_no_heavy_item_at_the_step_found_read_an_empty_run():
    """Regression (de8752a, Hypothesis): three items of cost 1 on 2 replicas, M 2, P 2: the item is heavy at the
    bound, none at the step the runs fit, and the start read the max of no runs (ValueError); now None."""
    pipeline = Pipeline(stages=2, schedule="gpipe")
    problem = make_microbatch_problem(np.ones(3, dtype=np.int64), 2, costs=np.ones(3), max_tokens_per_microbatch=2)
    bound = step_bound(pipeline, problem.item_costs, 2, np.array([2]), 0.0)
    assert heights_start(problem, 2, pipeline, bound) is None

"""CP micro-batches return today's plan unplanned where the split bound shows no split plan beats it by min_gain
(probe25 P25-05, issue 24: items just over half a micro-batch's budget planned ~60 split passes for today's plan)."""

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel, balance_microbatches

T = 32768
COST_84B = CostModel(linear=426233561088.0, quadratic=3932160.0)  # study.models MODELS['84b'].llm, causal


@pytest.mark.parametrize("num_ranks", [8, 64])
def test_regression_items_just_over_half_the_budget_planned_split_passes_for_todays_plan(planned_passes,
                                                                                        num_ranks):
    """P25-05 (seed 11, 16 items a rank of 51-60 % of T): 58-63 split passes were planned and today's plan of
    16 micro-batches, one item a rank, returned; the split bound is within min_gain of it, so none is planned."""
    lengths = np.random.default_rng(11).integers(int(T * 0.51), int(T * 0.6), num_ranks * 16)
    calls = planned_passes
    spec = ContextParallel()
    plan = balance_microbatches(lengths, num_ranks, cost=COST_84B, max_tokens_per_microbatch=T, context_parallel=spec)
    today = balance_microbatches(lengths, num_ranks, cost=COST_84B, max_tokens_per_microbatch=T)
    assert calls == []
    assert plan.digest() == today.digest() and not plan.split_items.size
    assert plan.lower_bound * (1 + spec.min_gain) >= today.step_cost > plan.lower_bound


def test_a_split_plan_within_reach_is_still_planned(planned_passes):
    """Where the bound leaves room for a split plan min_gain below today's (a few items of 2-3 budgets among
    short ones), the passes are planned and the plan splits."""
    rng = np.random.default_rng(5)
    lengths = np.where(rng.random(512) < 0.05, rng.integers(2 * T, 3 * T, 512), rng.integers(500, 4000, 512))
    calls = planned_passes
    plan = balance_microbatches(lengths, 64, cost=COST_84B, max_tokens_per_microbatch=T,
                                context_parallel=ContextParallel())
    assert calls and plan.split_items.size

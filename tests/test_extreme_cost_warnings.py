"""Costs at float64's ends plan without a numpy warning (probe58 W1, O1 and the pipeline's shaped start): under
warnings-as-errors (`pytest -W error`, `filterwarnings = error`) a warning is a raw exception from an accepted input."""

import warnings

import numpy as np

from orchmllm import ContextParallel, CostModel, Pipeline, balance, balance_microbatches


def test_regression_subnormal_costs_shape_an_interleaved_start_without_dividing_by_zero():
    """Cause: two items of cost 5e-324 over 4 ranks: the mean cost a rank holds underflows to 0, and the shaped start
    divided the pinned items' costs by it ('divide by zero encountered in divide')."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = balance_microbatches(np.array([0, 0]), 4, cost=CostModel(per_item=5e-324, linear=0.0),
                                    max_tokens_per_microbatch=1, num_microbatches=4,
                                    pipeline=Pipeline(stages=2, schedule="interleaved", virtual_stages=2))
    assert plan.num_items == 2 and np.all(plan.rank >= 0) and plan.step_cost >= plan.lower_bound


def test_regression_costs_near_float64s_top_split_without_an_overflow_warning():
    """Cause (probe58 W1): per-item costs of 1e307 over a split's per-rank share (< 1 at degree 1's efficiency)
    overflowed in `ContextParallel.item_times` ('overflow encountered in divide'); the plan (unsplit) was right."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = balance(np.array([7, 3, 5, 2, 9, 1]), 2, cost=CostModel(per_item=1e307, linear=0.0),
                       context_parallel=ContextParallel(degrees=(1, 2)))
    assert plan.makespan == 3e307 and not np.any(plan.degree > 1)


def test_regression_costs_far_below_the_split_communication_bound_the_micro_batches():
    """Cause (probe58 O1): item costs of 1e-300 beside split items' communication (~1e10 in cost units): the packing
    bound's count of pieces a rank holds, level / time, overflowed to inf and `int()` raised OverflowError."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = balance_microbatches(np.array([7, 3, 5, 2, 9, 1]), 4, cost=CostModel(per_item=1e-300, linear=0.0),
                                    max_tokens_per_microbatch=4, context_parallel=ContextParallel(degrees=(1, 2, 4)))
    assert plan.lower_bound <= plan.step_cost

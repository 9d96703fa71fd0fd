"""Costs at float64's ends plan without a numpy warning (probe58 W1, O1 and the pipeline's shaped start): under
warnings-as-errors (`pytest -W error`, `filterwarnings = error`) a warning is a raw exception from an accepted input."""

import warnings

import numpy as np

from orchmllm import CostModel, Pipeline, balance_microbatches


def test_regression_subnormal_costs_shape_an_interleaved_start_without_dividing_by_zero():
    """Cause: two items of cost 5e-324 over 4 ranks: the mean cost a rank holds underflows to 0, and the shaped start
    divided the pinned items' costs by it ('divide by zero encountered in divide')."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = balance_microbatches(np.array([0, 0]), 4, cost=CostModel(per_item=5e-324, linear=0.0),
                                    max_tokens_per_microbatch=1, num_microbatches=4,
                                    pipeline=Pipeline(stages=2, schedule="interleaved", virtual_stages=2))
    assert plan.num_items == 2 and np.all(plan.rank >= 0) and plan.step_cost >= plan.lower_bound

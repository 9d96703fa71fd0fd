"""Pipeline plans of subnormal costs (probe53 N2): the offsets' rounding unit stays a positive float, so planning
leaks no numpy RuntimeWarning (it underflowed to 0 and divided by it); and of costs ~1e300 below the micro-batch
overhead (probe59 P1), where the offsets count more units than float64 holds."""

import warnings

import numpy as np
import pytest

from orchmllm import Pipeline, balance_microbatches
from orchmllm.balancers.sums import rounding_unit
from orchmllm.testing import check_microbatch_plan


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_subnormal_costs_plan_without_warnings(schedule):
    lengths = list(range(10, 250, 10))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = balance_microbatches(lengths, 2, costs=[5e-324] * len(lengths), max_tokens_per_microbatch=400,
                                    num_microbatches=4, pipeline=Pipeline(stages=2, schedule=schedule,
                                                               virtual_stages=1 if schedule == "1f1b" else 2))
    check_microbatch_plan(plan, lengths, 2, 400, costs=[5e-324] * len(lengths))


@pytest.mark.parametrize("schedule, m", [("1f1b", 4), ("interleaved", 8)])
def test_regression_costs_far_below_the_overhead_plan_without_a_numpy_error(schedule, m):
    """probe59 P1: costs 1e-300 beside an overhead of 1 made the shaped start's offsets / unit inf, NaN slot counts
    in the LPT runs and numpy's "negative dimensions are not allowed" (interleaved at M 8: an overflow warning); that
    start is now not made."""
    lengths = [1] * 30 + [5]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = balance_microbatches(lengths, 2, costs=[1e-300] * 31, max_tokens_per_microbatch=5, num_microbatches=m,
                                    microbatch_overhead=1.0, pipeline=Pipeline(
                                        stages=4, schedule=schedule, virtual_stages=1 if schedule == "1f1b" else 2))
    check_microbatch_plan(plan, lengths, 2, 5, costs=[1e-300] * 31)


def test_rounding_unit():
    assert rounding_unit(np.array([5e-324])) == 5e-324
    assert rounding_unit(np.array([3.0, 1.0])) == 1.0  # integers: never below 1
    assert rounding_unit(np.array([0.75, 0.5])) == 2.0 ** -30
    assert rounding_unit(np.array([2.0**40, 1.0])) == 2.0 ** 11

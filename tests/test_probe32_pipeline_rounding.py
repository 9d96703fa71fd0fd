"""probe32's P32-01: near 2**50 a pipeline's step and bound met by float rounding alone and the plan was labelled
optimal (at 2**52 the step read 2**52 - 0.5, below any true step: one replica runs a whole giant)."""

import pytest

from orchmllm import balance_microbatches
from orchmllm.balancers import Pipeline


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("exponent", [20, 50, 52])
def test_a_step_within_its_rounding_of_the_bound_is_not_optimal(schedule, exponent):
    lengths = [2**exponent, 2**exponent, 1, 1]  # the true step is 2**e + 1/12 (1F1B) at every e, the bound 2**e
    step = balance_microbatches(lengths, 2, max_tokens_per_microbatch=2**exponent,
                                pipeline=Pipeline(stages=4, schedule=schedule)).pipeline
    assert str(step.status) == "feasible"


def test_three_stages_at_2_to_the_52_are_not_optimal():
    step = balance_microbatches([2**52, 2**52, 1, 1, 1, 1], 2, max_tokens_per_microbatch=2**52,
                                pipeline=Pipeline(stages=3)).pipeline
    assert str(step.status) == "feasible"


def test_exact_small_plans_stay_optimal():
    step = balance_microbatches([4, 4], 2, max_tokens_per_microbatch=4, pipeline=Pipeline(stages=4)).pipeline
    assert str(step.status) == "optimal" and step.step_time == step.lower_bound

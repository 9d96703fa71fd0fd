"""probe53 F11, F12: the toolkit's strategies and oracles refuse bad arguments at the call, naming them."""

import pytest

from orchmllm.testing import microbatch_cases, problems


@pytest.mark.parametrize("make, name", [(lambda: problems(max_items=10**6), "max_items"),
                                        (lambda: microbatch_cases(max_items=10**5), "max_items")])
def test_regression_strategy_sizes_beyond_hypothesis_failed_only_when_drawn(make, name):
    """Cause (probe53 F11): `problems(max_items=10**6)` was accepted and failed at a draw with Hypothesis's own
    InvalidArgument (a list of min_size=8_193); the size is now refused at the call, naming the limit."""
    with pytest.raises(ValueError, match=rf"`{name}` must be at most MAX_DRAWN_ITEMS = 8192"):
        make()
    problems(max_items=8192)  # the limit itself is taken


def test_regression_replica_step_blamed_forward_the_caller_never_passed():
    """Cause (probe53 F12): `replica_step(pipeline, [1, 1], first_stage=[0.5, 2])` failed with "`forward` must hold
    finite non-negative numbers", an argument of `simulate_pipeline` the caller never passed."""
    from orchmllm import Pipeline
    from orchmllm.testing import replica_step

    with pytest.raises(ValueError, match=r"`first_stage` must be at most `cell_costs` .*; got 2.0 > 1.0 at \[1\]"):
        replica_step(Pipeline(stages=2), [1.0, 1.0], first_stage=[0.5, 2.0])
    assert replica_step(Pipeline(stages=2), [1.0, 1.0], first_stage=[1.0, 1.0]) > 0

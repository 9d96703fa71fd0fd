"""The pipeline step's busy and bubble shares stay within [0, 1] whatever the float sums round to."""

import numpy as np

from orchmllm.balancers import Pipeline, balance_microbatches


def test_regression_bubble_never_negative_where_one_replica_and_stage_run_busy_all_the_step():
    """GPipe, P = 1, D = 1: the step is the replica's whole work, but the busy share's sums may round to 1 + 2**-52
    (the bubble then read -2.2e-16, these lengths at M = 3)."""
    lengths = np.array([1308, 547, 1493, 2069, 4071, 2256, 460, 1675, 3000, 4066, 3643, 4964, 940, 4401, 276, 2791,
                        1375, 1007, 3287, 1529, 2811, 1301, 751, 3746, 2163, 3393, 3346, 4726, 2114, 1099, 3166, 4674,
                        4837])
    for count in (1, 2, 3, 4):
        step = balance_microbatches(lengths, 1, max_tokens_per_microbatch=200_000, num_microbatches=count,
                                    pipeline=Pipeline(stages=1, schedule="gpipe")).pipeline
        assert 0.0 <= step.bubble_fraction <= 1.0 and 0.0 <= step.busy_fraction <= 1.0, count
        assert step.bubble_fraction == 1.0 - step.busy_fraction

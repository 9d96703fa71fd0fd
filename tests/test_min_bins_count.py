"""`min_bins`' count bound (probe22 P22-03): a bin holds at most as many items as the shortest fit in it.  Without
it 81 920 lengths of 2000-2002 in cells of 5004 (two a cell) read 13 micro-batches at 2560 ranks, and `auto` searched
M = 13, 14, 15 in vain: 1.6 CPU s where 16 took 6 ms."""

import itertools

import numpy as np
from hypothesis import given, settings, strategies as st

from orchmllm import balance_microbatches
from orchmllm.balancers.microbatch.bounds import min_bins


def least_bins(lengths, capacity) -> int:
    """Brute force: the fewest bins of `capacity` that hold every item."""
    for bins in range(1, len(lengths) + 1):
        for assignment in itertools.product(range(bins), repeat=len(lengths)):
            if np.bincount(assignment, weights=lengths, minlength=bins).max() <= capacity:
                return bins
    raise AssertionError("unreachable: one item a bin fits")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=7), st.integers(30, 60))
def test_the_bound_never_exceeds_the_fewest_bins(lengths, capacity):
    assert min_bins(np.array(lengths), capacity) <= least_bins(np.array(lengths), capacity)


def test_regression_near_equal_lengths_need_their_count_of_bins():
    lengths = 2000 + np.random.default_rng(7).integers(0, 3, 64 * 32)
    assert min_bins(lengths, 5004) == 64 * 16
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=5004)
    assert plan.num_microbatches == 16

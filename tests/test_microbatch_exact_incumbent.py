"""The micro-batch 'exact' algorithm starts from auto's plan and never recurses past Python's stack
(probe20 P20-27 and what its repro showed beside it)."""

import numpy as np
import pytest

from orchmllm import CostModel, balance_microbatches

COST = CostModel(linear=1.0, quadratic=1e-4)


def long_tailed(num_ranks: int) -> np.ndarray:
    return np.minimum((np.random.default_rng(0).pareto(0.8, num_ranks * 32) * 200).astype(np.int64) + 1, 16384)


@pytest.mark.parametrize("num_ranks", [32, 64])
def test_regression_exact_returned_a_plan_worse_than_auto_or_a_recursion_error(num_ranks):
    """D 32 x 32: 'exact' kept the joint greedy's plan (M 3, 3.8 % above auto's M 4); D 64 x 32 (2048 items):
    its branch and bound recursed once per item and raised RecursionError (a RuntimeError naming the kernel)."""
    lengths = long_tailed(num_ranks)
    auto = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=16384, cost=COST)
    exact = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=16384, cost=COST, algorithm="exact")
    assert exact.step_cost <= auto.step_cost and exact.lower_bound <= exact.step_cost

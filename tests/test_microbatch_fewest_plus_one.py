"""Micro-batch `auto` at a given M also weighs the plan of one micro-batch more than the fewest, where neither M's
nor the fewest's plan is within GREEDY_GAP of the bound (probe23 P23-03 at D 512: 75 %-empty batches fill ~2.7
items a cell in the fewest, 3, micro-batches, which the cell LPT balances 3 % above the bound; 2 a cell, in 4,
0.3-0.5 %; the joint greedy, 10-20x the time, 0.4-2.6 %)."""

import numpy as np
import pytest

from orchmllm import balance_microbatches
from orchmllm.study.models import MODELS

COST = MODELS["84b"].stages()[-1].cost


def mostly_empty(seed: int, num_ranks: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = num_ranks * 32
    return np.where(rng.random(n) < 0.75, 0, rng.integers(1, 8000, n))


@pytest.mark.parametrize("seed", [2, 7])
def test_regression_a_given_m_takes_the_plan_of_one_more_than_the_fewest(seed):
    lengths = mostly_empty(seed, 512)
    plan = balance_microbatches(lengths, 512, max_tokens_per_microbatch=16384, cost=COST, num_microbatches=12)
    assert plan.gap < 0.006  # 0.031 on the parent for both (the plan of its fewest, 3, micro-batches)
    assert int(np.count_nonzero(np.bincount(plan.microbatch[lengths > 0], minlength=12))) == 4


"""probe25 P25-02: a cap met by the plan made without it never makes the plan worse, nor is it refused."""
import numpy as np
import pytest

from orchmllm import CostModel, balance

ZERO_COSTS = ([868, 2682, 4549, 3194, 925, 3313, 4063, 1552, 1844, 4221, 4383, 584], 3,
              [3316, 3310, 18, 0, 3899, 0, 2300, 0, 0, 3153, 0, 0])  # capped: 10368 against 6463 (x1.604)
FREE_TOKENS = ([0, 0, 0, 2067, 0, 4471, 0, 3864, 1595, 3272, 1010, 3518, 3873, 0, 0, 0, 1603, 107, 0, 3008, 41, 1763,
                0, 0], 4, [2606, 2732, 3427, 0, 4919, 3002, 0, 2650, 0, 4493, 4516, 98, 0, 2255, 849, 4991, 0, 3217, 0,
                           4580, 0, 0, 0, 0])  # refused: "auto falls back to lpt under a cap its own plan overflows"


@pytest.mark.parametrize("lengths, ranks, costs", [ZERO_COSTS, FREE_TOKENS])
def test_regression_auto_under_its_own_plans_tokens_keeps_that_plan(lengths, ranks, costs):
    free = balance(lengths, ranks, costs=costs)
    capped = balance(lengths, ranks, costs=costs, max_tokens_per_rank=int(free.tokens.max()))
    assert capped.makespan == free.makespan and capped.tokens.max() <= free.tokens.max()


def test_regression_equal_counts_under_its_own_plans_tokens_keeps_that_plan():
    lengths, cost = [2439, 1313, 1252, 4512, 851, 3353, 305, 1592], CostModel(linear=1.0, quadratic=1e-4)
    free = balance(lengths, 3, cost=cost, equal_counts=True)  # 6862.12; capped at its 5456 tokens: 7471.23
    capped = balance(lengths, 3, cost=cost, equal_counts=True, max_tokens_per_rank=int(free.tokens.max()))
    assert capped.makespan == free.makespan


def test_auto_under_its_own_plans_tokens_is_never_worse_on_random_instances():
    rng, cost = np.random.default_rng(2512), CostModel(linear=1.0, quadratic=1e-4)
    for _ in range(40):
        ranks = int(rng.choice([2, 3, 4, 8]))
        lengths = rng.integers(1, 5000, int(rng.integers(ranks, 6 * ranks + 1)))
        costs = np.where(rng.random(lengths.size) < 0.4, 0.0, cost.item_costs(lengths))
        free = balance(lengths, ranks, costs=costs)
        assert balance(lengths, ranks, costs=costs, max_tokens_per_rank=int(free.tokens.max())).makespan \
            <= free.makespan

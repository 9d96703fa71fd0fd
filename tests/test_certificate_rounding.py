"""probe25 P25-03: a kernel's proof of its optimum, summed in its own item order, may lie an ulp below the plan's
cost as the plan's cells sum it; that is the optimum, not a false claim (it raised RuntimeError on 8 of 300 small
instances since auto's canonical item order)."""
import numpy as np
import pytest

from orchmllm import CostModel, balance_microbatches

LENGTHS = [3267, 1805, 444, 3513, 1741, 4300, 1692, 3206, 914, 2742, 367]


@pytest.mark.parametrize("num_microbatches", [1, 2])
def test_regression_an_optimum_proven_in_another_summation_order_is_optimal(num_microbatches):
    plan = balance_microbatches(LENGTHS, 2, cost=CostModel(linear=1, quadratic=1e-4), max_tokens_per_microbatch=30000,
                                num_microbatches=num_microbatches)
    assert str(plan.status) == "optimal" and plan.lower_bound == plan.step_cost


def test_no_small_instance_raises_on_the_rounding_of_its_certificate():
    rng, cost = np.random.default_rng(11), CostModel(linear=1.0, quadratic=1e-4)
    for _ in range(60):
        ranks = int(rng.choice([2, 3, 4]))
        lengths = rng.integers(1, 5000, int(rng.integers(ranks, 6 * ranks + 1)))
        plan = balance_microbatches(lengths, ranks, cost=cost, max_tokens_per_microbatch=30000, num_microbatches=1)
        assert plan.lower_bound <= plan.step_cost

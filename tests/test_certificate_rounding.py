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


@pytest.mark.parametrize("lengths, ranks, costs, budget", [
    ([11, 18, 35], 2, [3.6666666666666665, 5.0, 0.3333333333333333], 37),
    ([25, 26, 11, 3, 36], 1, [0.6666666666666666, 0.0, 3.3333333333333335, 2.0, 0.3333333333333333], 41)])
def test_regression_an_optimum_with_overheads_summed_in_another_rounding_raised(lengths, ranks, costs, budget):
    """probe26 P26-07: a kernel's proof of its cells' Σ_m max_r load plus the overheads, rounded twice, lay an ulp
    below the step cost rounded once (14.333333333333332 against 14.333333333333334) and raised RuntimeError."""
    for algorithm in ("auto", "exact"):
        plan = balance_microbatches(lengths, ranks, costs=costs, max_tokens_per_microbatch=budget, num_microbatches=3,
                                    microbatch_overhead=3.0, algorithm=algorithm)
        assert str(plan.status) == "optimal" and plan.lower_bound == plan.step_cost


def test_no_small_instance_with_overheads_raises_on_the_rounding_of_its_certificate():
    rng = np.random.default_rng(26)
    for _ in range(120):
        ranks, n = int(rng.integers(1, 4)), int(rng.integers(2, 7))
        lengths, costs = rng.integers(1, 40, n), rng.integers(0, 12, n) / 3.0
        budget = int(lengths.max() + rng.integers(0, 20))
        count = n if rng.random() < 0.5 else None  # a fixed M every instance can fill, or M free
        plan = balance_microbatches(lengths, ranks, costs=costs, max_tokens_per_microbatch=budget,
                                    num_microbatches=count, microbatch_overhead=3.0)
        assert plan.lower_bound <= plan.step_cost

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


@pytest.mark.parametrize("equal_counts", [False, True])
def test_regression_a_cap_the_uncapped_plan_meets_changes_nothing_and_solves_once(equal_counts, monkeypatch):
    """probe26 P26-04: under a cap its plan without the cap meets (the default mix, the cap 1.5x the mean), auto and
    equal counts solved under the cap, then again without it: 2x the CPU for the same plan.  Now the plan made
    without the cap is the answer wherever it meets the cap: the same plan and digest, one search."""
    from orchmllm.balancers.constraints import equal_counts as equal_counts_module
    from orchmllm.balancers.kernels import auto
    from orchmllm.study.workloads import llm_stage_lengths

    lengths = np.asarray(llm_stage_lengths(64, 8, 5)[0])
    cost, cap = CostModel(linear=1.0, quadratic=1e-4), int(1.5 * lengths.sum() / 64)
    free = balance(lengths, 64, cost=cost, equal_counts=equal_counts)
    assert free.tokens.max() <= cap and free.status.value == "feasible"  # not proven optimal: the search runs
    module, name = (equal_counts_module, "solve_lpt") if equal_counts else (auto, "_solve")
    searches, search = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda problem, *rest: searches.append(problem.max_tokens_per_rank)
                        or search(problem, *rest))
    capped = balance(lengths, 64, cost=cost, equal_counts=equal_counts, max_tokens_per_rank=cap)
    assert searches == [None] and capped.digest() == free.digest()

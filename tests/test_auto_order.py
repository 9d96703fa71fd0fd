"""`auto`'s plan quality does not depend on the order the items come in (probe20 P20-12).

`balance`'s `auto` and `balance_microbatches`' `auto` plan the items in one canonical order (by cost, least
first, then by length: `kernels.auto.in_canonical_order`) and map the plan back, so the same items in
another order get the same makespan (step cost), up to the rounding of loads summed in another item order.
Before, the searches' tie-breaks followed the item indices: 27 items on 7 ranks planned 42633.5 as given and
42547.2 permuted; 28 items micro-batched on 9 ranks 30709.2 and 30355.9."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import CostModel, balance, balance_microbatches
from orchmllm.balancers.kernels import auto
from orchmllm.balancers.problem import make_problem, sorted_order
from orchmllm.testing.checks import rounding_apart

QUADRATIC = CostModel(linear=1.0, quadratic=0.001)


def test_regression_the_probes_27_items_plan_the_same_permuted():
    lengths = np.array([61, 674, 3565, 2035, 3584, 4805, 3230, 3708, 3057, 1501, 369, 3066, 1232, 605, 2872, 3050,
                        1971, 3148, 4960, 3791, 4618, 340, 760, 1793, 2950, 3477, 3481])
    permutation = [22, 20, 25, 21, 16, 10, 1, 18, 14, 9, 23, 13, 11, 0, 12, 5, 4, 7, 8, 15, 3, 19, 2, 6, 24, 17, 26]
    plans = [balance(items, 7, cost=QUADRATIC) for items in (lengths, lengths[permutation], np.sort(lengths)[::-1])]
    assert not any(rounding_apart(plan.makespan, plans[0].makespan, lengths.size + 1) for plan in plans[1:])


def test_regression_the_probes_28_items_micro_batched_the_same_permuted():
    lengths = np.array([414, 1477, 1764, 3223, 2599, 4165, 2134, 4433, 204, 1625, 970, 1911, 4725, 676, 813, 2041,
                        4260, 41, 4110, 3897, 1957, 215, 2334, 3506, 4120, 793, 3403, 2774])
    permutation = [13, 26, 22, 11, 19, 6, 4, 9, 16, 2, 1, 27, 5, 14, 8, 18, 21, 0, 23, 25, 24, 3, 17, 20, 7, 10, 12, 15]
    plans = [balance_microbatches(items, 9, cost=QUADRATIC, max_tokens_per_microbatch=8558)
             for items in (lengths, lengths[permutation])]
    assert not rounding_apart(plans[1].step_cost, plans[0].step_cost, lengths.size + 1)


@st.composite
def permuted_items(draw, min_items=20, max_items=40):
    """Lengths (few distinct values or many: ties or none), ranks, a cost (a model, or costs given per item with
    ties among items of other lengths) and a permutation of the items."""
    count = draw(st.integers(min_items, max_items))
    top = draw(st.sampled_from([4, 60, 5000]))
    lengths = np.array(draw(st.lists(st.integers(1, top), min_size=count, max_size=count)))
    num_ranks = draw(st.integers(2, 12))
    model = draw(st.sampled_from([CostModel(), QUADRATIC, None]))  # None: costs given per item
    permutation = np.array(draw(st.permutations(range(count))))
    return lengths, num_ranks, model, permutation


def options(model, lengths) -> dict:
    """`balance`'s cost arguments: the model, or costs given per item (tied across lengths)."""
    return dict(cost=model) if model is not None else dict(costs=(lengths % 7 + 1).astype(float))


def per_rank_items(plan, lengths, costs):
    """Each rank's (cost, length) pairs, sorted, ranks in order: the plan up to equal items."""
    return [sorted(zip(costs[plan.assignment == rank].tolist(), lengths[plan.assignment == rank].tolist()))
            for rank in range(plan.num_ranks)]


@settings(max_examples=60, deadline=None)  # before the fix (0296a07^) example 18 of these fails
@given(permuted_items())
def test_property_auto_plans_the_same_items_alike_in_any_order(drawn):
    """The probe's sizes (20-40 items, 2-12 ranks): the same makespan permuted, indeed the same plan up to equal
    items (every rank holds the same costs and lengths), for cost models and for costs given per item."""
    lengths, num_ranks, model, permutation = drawn
    given_order, permuted = (balance(items, num_ranks, **options(model, items))
                             for items in (lengths, lengths[permutation]))
    assert not rounding_apart(permuted.makespan, given_order.makespan, lengths.size + 1)
    costs = make_problem(lengths, num_ranks, **options(model, lengths)).item_costs
    assert per_rank_items(permuted, lengths[permutation], costs[permutation]) == \
        per_rank_items(given_order, lengths, costs)


@settings(max_examples=60, deadline=None)
@given(permuted_items(), st.integers(0, 4000))
def test_property_auto_micro_batches_the_same_items_alike_in_any_order(drawn, room):
    lengths, num_ranks, model, permutation = drawn
    budget = int(lengths.max()) + room
    plans = [balance_microbatches(items, num_ranks, max_tokens_per_microbatch=budget, **options(model, items))
             for items in (lengths, lengths[permutation])]
    assert plans[1].num_microbatches == plans[0].num_microbatches
    assert not rounding_apart(plans[1].step_cost, plans[0].step_cost, lengths.size + 1)


def test_items_in_canonical_order_keep_their_plan():
    """Items by cost, least first (ties by length), are planned as given: no copy, the same plan as the kernel's
    search on them."""
    lengths = np.sort(np.random.default_rng(3).integers(1, 5000, 30))
    problem = make_problem(lengths, 7, cost=QUADRATIC)
    assert auto.in_canonical_order(problem) is None
    np.testing.assert_array_equal(auto.solve(problem).assignment, auto._solve(problem, None).assignment)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40))
def test_property_the_canonical_problems_cost_order_is_sorted_order(values):
    """The cost order the reordered problem is given (no sort) is the one it would compute."""
    problem = make_problem(np.array(values) + 1, 3, costs=np.array(values, dtype=float) / 2)
    canonical = auto.in_canonical_order(problem)
    reordered = problem if canonical is None else canonical[0]
    np.testing.assert_array_equal(reordered.cost_order, sorted_order(reordered.item_costs))
    assert np.all(np.diff(reordered.item_costs) >= 0)


def test_regression_groups_of_permuted_items_summed_to_other_floats():
    """probe20 P20-12 (recheck): with `groups`, a group's cost summed in the items' order differed by an ulp
    under a permutation, which sent auto's search elsewhere (74781.3 vs 75362.7, +0.78 %, the same groups); the
    makespans, of the items' loads summed in their own order, now differ by rounding at most."""
    rng = np.random.default_rng(5)
    for _ in range(150):
        num_ranks = int(rng.integers(2, 10))
        n = int(num_ranks * rng.integers(2, 8))
        lengths, perm = rng.integers(1, 5000, n), rng.permutation(n)
        cost = CostModel(linear=1.0, quadratic=float(rng.choice([0.0, 1e-3])))
        groups = rng.integers(0, max(1, n // 3), n)
        assert balance(lengths, num_ranks, cost=cost, groups=groups).makespan == pytest.approx(  # item loads: rounding
            balance(lengths[perm], num_ranks, cost=cost, groups=groups[perm]).makespan, rel=1e-12)

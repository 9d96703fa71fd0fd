"""The communication-aware deal where every item costs the same (a micro-batch of one video size's frames, issue
26's long workload): `PartialPlan.uniform` skips the gathers through the cost order (the index order then), and
the deal makes exactly the choices it makes through them."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmllm.balancers import CostModel, bounds
from orchmllm.balancers.kernels.reference import locality_first_phases
from orchmllm.balancers.locality import deal as deal_module
from orchmllm.balancers.locality.deal import DEAL_WINDOW, keep_home, take_anywhere, take_in_node
from orchmllm.balancers.locality.fill import fill_locally
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers import problem as problem_module
from orchmllm.balancers.problem import make_problem, sorted_order


@pytest.mark.parametrize("kwargs", [
    dict(lengths=[7] * 9),
    dict(lengths=[3, 9, 1, 4], cost=CostModel(per_item=2.5, linear=0.0)),  # one cost, lengths differ
    dict(lengths=[3, 70000, 1, 4], cost=CostModel(per_item=2.5, linear=0.0)),
    dict(lengths=[2, 1, 2, 1, 1, 2], cost=CostModel(per_item=2.5, linear=0.0)),  # the model asked of 0..longest
    dict(lengths=[5, 2, 8], costs=[0.1, 0.1, 0.1]),
    dict(lengths=[5, 2, 8, 1], costs=[0.0, -0.0, 0.0, -0.0]),
    dict(lengths=[4] * 6, cost=CostModel(per_item=0.3, linear=0.7, quadratic=1e-3)),
    dict(lengths=[70000] * 5),
])
def test_one_cost_orders_items_by_index(kwargs):
    """Where one cost is every item's, the cost order (ties by index) is the index order: the problem takes it
    without a sort (and the sorted costs are the costs), the deal's one-cost path without reading it; the
    sorts it skips give the same order."""
    problem = make_problem(kwargs.pop("lengths"), 3, **kwargs)
    state = PartialPlan(problem, 10.0)
    assert state.uniform
    lengths, costs = problem.lengths, problem.item_costs
    by_sort = (sorted_order(costs) if problem.cost is None else
               problem_module.cost_order(lengths, costs, problem.cost, sorted_order(lengths)))
    np.testing.assert_array_equal(problem.cost_order, by_sort)
    np.testing.assert_array_equal(problem.cost_order, np.arange(problem.num_items))
    assert problem.sorted_costs.tobytes() == problem.item_costs[by_sort].tobytes()
    np.testing.assert_array_equal(state.cost_rank, np.arange(problem.num_items))
    assert not PartialPlan(make_problem([2, 1, 2], 3), 10.0).uniform


@pytest.mark.parametrize("capped", [False, True], ids=["uncapped", "capped"])
@pytest.mark.parametrize("seed", range(12))
def test_first_three_phases_of_one_cost_match_their_plain_code(seed, capped):
    """Keep home, take in node and take anywhere on items of one cost: the plain loops' choices; odd seeds on
    a target of whole items, where a rank's room is often exactly one item's cost."""
    rng = np.random.default_rng(seed)
    gpus_per_node = int(rng.choice([1, 2, 4, 8]))
    num_ranks = gpus_per_node * int(rng.integers(1, 6))
    lengths = np.full(int(rng.integers(1, 60 * num_ranks)), int(rng.integers(1, 50)))
    sources = np.minimum(rng.geometric(0.3, lengths.size) - 1, num_ranks - 1)  # skewed: low ranks overflow
    target = float(rng.uniform(0.8, 1.2) * (lengths.sum() + lengths.size) / num_ranks)
    if seed % 2:
        target = float(max(round(target / (lengths[0] + 1)), 1) * (lengths[0] + 1))
    cap = int(lengths.sum() / num_ranks * 1.1) + int(lengths.max()) if capped else None
    problem = make_problem(lengths, num_ranks, cost=CostModel(per_item=1.0), max_tokens_per_rank=cap)
    state = PartialPlan(problem, target)
    assert state.uniform
    keep_home(state, sources)
    take_anywhere(state, take_in_node(state, sources, gpus_per_node))
    expected = locality_first_phases(problem.item_costs, lengths, sources, num_ranks, gpus_per_node, target,
                                     np.inf if cap is None else cap, DEAL_WINDOW * gpus_per_node)
    np.testing.assert_array_equal(state.destinations, expected)


@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 4, 8]), st.integers(1, 5), st.booleans(),
       st.sampled_from([1.0, 0.1, 3e11]))
def test_fill_deal_of_one_cost_is_the_deal_through_the_cost_order(seed, gpus_per_node, num_nodes, capped, unit):
    """`fill_locally` (tiers under a cap, the filler, the repair) on items of one cost, sampled in runs as a
    video's frames are: the same destinations, loads and tokens as with the one-cost path turned off (every
    cost read through the cost order and summed), on costs whose sums round (0.1) and are exact (counts times the
    cost: `PartialPlan.exact_cost`)."""
    rng = np.random.default_rng(seed)
    num_ranks = gpus_per_node * num_nodes
    runs = rng.integers(1, 40, int(rng.integers(1, 6 * num_ranks)))
    sources = np.repeat(rng.integers(0, num_ranks, runs.size), runs)  # a video's frames come from one rank
    length = int(rng.integers(1, 30))
    lengths = np.full(sources.size, length)
    cap = int(rng.integers(-(-lengths.sum() // num_ranks), lengths.sum() + 1)) if capped else None
    cap = None if cap is not None and cap < length else cap
    problem = make_problem(lengths, num_ranks, costs=np.full(lengths.size, unit * length), max_tokens_per_rank=cap)
    target = float(rng.uniform(0.95, 1.3) * problem.item_costs.sum() / num_ranks)
    dealt = []
    for uniform in (True, False):
        state = PartialPlan(problem, target)
        assert state.uniform and (unit == 0.1 or state.exact_cost is not None)
        if not uniform:  # off: the general path, which reads every cost and rank through the order and sums them
            state.uniform, state.exact_cost = False, None
        fill_locally(state, sources, lengths * 1.0, gpus_per_node, 0.003)
        dealt.append((state.destinations, state.loads, state.tokens))
    for one_cost, general in zip(*dealt):
        np.testing.assert_array_equal(one_cost, general)


@given(st.integers(1, 5000), st.integers(1, 300), st.sampled_from([0.1, 1.0, 3.0, 1 / 3, 2.5e-300, 7e300, 1e-3]),
       st.booleans())
def test_bound_of_one_cost_is_the_bound_through_its_prefix_sums(n, num_ranks, cost, exact_multiple):
    """`lower_bound` of items of one cost without passes over them (`_one_cost_bound`) is the float the prefix
    sums give, whether the mean passes every group (n a multiple of D) or the largest group passes it."""
    n = n - n % num_ranks if exact_multiple and n >= num_ranks else n
    problem = make_problem(np.ones(n, dtype=np.int64), num_ranks, costs=np.full(n, cost))
    shortcut = bounds.lower_bound(problem)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bounds, "ONE_COST_ITEMS", 0)  # every problem through the prefix sums
        general = bounds.lower_bound(problem)
    assert shortcut == general and type(shortcut) is float and math.copysign(1.0, shortcut) == 1.0


@given(st.integers(0, 2**32 - 1), st.integers(0, 400), st.sampled_from([1.0, 3 * 2.0**21, 0.75, 5 * 2.0**-30]))
def test_last_multiple_is_the_search_in_the_prefix_sums_of_one_cost(seed, most, cost):
    """keep_home's run ends without prefix sums of one exact cost: the binary search in them, bounds on the
    multiples themselves, a hair either side, below 0 and past the last."""
    rng = np.random.default_rng(seed)
    sums = np.zeros(most + 1)
    np.cumsum(np.full(most, cost), out=sums[1:])
    multiples = rng.integers(-2, most + 3, 50) * cost
    bounds = np.concatenate([multiples, np.nextafter(multiples, -np.inf), np.nextafter(multiples, np.inf),
                             rng.uniform(-2 * cost, (most + 2) * cost, 50)])
    expected = np.searchsorted(sums, bounds, side="right") - 1
    np.testing.assert_array_equal(deal_module._last_multiple(cost, bounds, most), expected)

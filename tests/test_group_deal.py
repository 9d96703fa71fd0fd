"""The group deal of the micro-batch cells: the vectorised turns make exactly the plain loop's choices."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.kernels.reference import group_deal as plain_group_deal
from orchmllm.balancers.locality import group_deal
from orchmllm.balancers.locality.group_deal import by_group, deal_in_groups
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.problem import make_problem


@st.composite
def deals(draw):
    """A partial plan of small integer costs (ties everywhere) on groups of cells, some cells
    already loaded, an optional token cap, and the items to deal."""
    num_groups, per_group = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    cells = num_groups * per_group
    lengths = np.array(draw(st.lists(st.integers(0, 12), min_size=1, max_size=40)))
    groups = np.array(draw(st.lists(st.integers(0, num_groups - 1), min_size=lengths.size, max_size=lengths.size)))
    limit = float(draw(st.integers(0, 30)))
    cap = draw(st.sampled_from([None, 10, 20]))
    state = PartialPlan(make_problem(lengths, cells), limit)
    if cap is not None:  # cells' token cap, below some items: those fit no cell
        state.cap = float(cap)
    state.loads[:] = draw(st.lists(st.integers(0, 12), min_size=cells, max_size=cells))
    state.tokens[:] = draw(st.lists(st.integers(0, 8), min_size=cells, max_size=cells))
    dealt = np.flatnonzero(np.array(draw(st.lists(st.booleans(), min_size=lengths.size, max_size=lengths.size))))
    return state, groups, per_group, dealt


@settings(max_examples=150, deadline=None)
@given(deals(), st.booleans())
def test_property_turns_make_the_plain_loops_choices(deal, least_loaded):
    state, groups, per_group, dealt = deal
    loads, tokens = state.loads.copy(), state.tokens.copy()
    expected = plain_group_deal(state.costs, state.lengths, groups, per_group, loads, tokens, state.target, state.cap,
                                dealt, least_loaded)
    left = deal_in_groups(state, *by_group(state, groups[dealt], dealt), per_group, state.target, least_loaded)
    np.testing.assert_array_equal(state.destinations, expected)
    assert sorted(left.tolist()) == [i for i in dealt.tolist() if expected[i] < 0]
    placed = expected >= 0
    np.testing.assert_array_equal(state.loads, loads + np.bincount(expected[placed], weights=state.costs[placed],
                                                                   minlength=loads.size))
    np.testing.assert_array_equal(state.tokens, tokens + np.bincount(expected[placed], weights=state.lengths[placed],
                                                                     minlength=loads.size))


@settings(max_examples=60, deadline=None)
@given(deals(), st.booleans())
def test_property_crowded_groups_take_windows_and_the_others_keep_the_plain_choices(deal, least_loaded):
    state, groups, per_group, dealt = deal
    counts = np.bincount(groups[dealt], minlength=groups.max() + 1)
    crowded_groups = counts > 3
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(group_deal, "MAX_TURNS", 3)
        loads, tokens = state.loads.copy(), state.tokens.copy()
        expected = plain_group_deal(state.costs, state.lengths, groups, per_group, loads, tokens, state.target,
                                    state.cap, dealt, least_loaded)
        left = deal_in_groups(state, *by_group(state, groups[dealt], dealt), per_group, state.target, least_loaded)
    crowded = crowded_groups[groups]
    calm = ~crowded
    np.testing.assert_array_equal(state.destinations[calm], expected[calm])
    assert sorted(left.tolist()) == [i for i in dealt.tolist() if state.destinations[i] < 0]
    placed = np.flatnonzero(state.destinations >= 0)
    assert np.all(np.isin(placed, dealt))
    assert np.all(state.destinations[placed] // per_group == groups[placed])  # never outside the item's group
    assert np.all(state.loads <= np.maximum(loads, state.target))  # the windows stay under the target too
    np.testing.assert_array_equal(state.loads, loads + np.bincount(state.destinations[placed],
                                                                   weights=state.costs[placed], minlength=loads.size))
    if state.cap < np.inf:
        assert np.all(state.tokens <= np.maximum(tokens, state.cap))


def test_least_loaded_levels_a_groups_cells_where_first_fit_fills_the_first():
    state = PartialPlan(make_problem([4, 4, 3, 3, 2, 2], 3), target=10.0)
    ordered, owner = by_group(state, np.zeros(6, dtype=np.int64), np.arange(6))
    deal_in_groups(state, ordered, owner, 3, 10.0, least_loaded=True)
    assert state.loads.tolist() == [6.0, 6.0, 6.0] and state.destinations.tolist() == [0, 1, 2, 2, 0, 1]
    state = PartialPlan(make_problem([4, 4, 3, 3, 2, 2], 3), target=10.0)
    deal_in_groups(state, ordered, owner, 3, 10.0, least_loaded=False)
    assert state.loads.tolist() == [10.0, 8.0, 0.0] and state.destinations.tolist() == [0, 0, 1, 1, 0, 1]


def test_by_group_orders_each_groups_items_largest_first_ties_by_index():
    state = PartialPlan(make_problem([3, 5, 3, 1, 5, 2], 2), target=0.0)
    ordered, owner = by_group(state, np.array([1, 0, 1, 1, 0, 0]), np.arange(6))
    assert ordered.tolist() == [1, 4, 5, 0, 2, 3] and owner.tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize("largest_group", [3, 2**28])
def test_group_keys_order_by_group_then_cost_rank_in_int32_where_they_fit_else_int64(largest_group):
    """Keys group << rank_bits | cost rank: int32 while every key fits 31 bits (groups up to 3, 6
    items: 3 bits of cost rank), int64 beyond (group 2**28 shifted by 3 bits passes 2**31); the same
    order either way."""
    state = PartialPlan(make_problem([3, 5, 3, 1, 5, 2], 2), target=0.0)
    groups = np.array([1, 0, 1, 1, 0, largest_group])
    keys = state.group_keys(groups, np.arange(6))
    assert keys.dtype == (np.int32 if largest_group == 3 else np.int64)
    assert (keys >> state.rank_bits).tolist() == sorted(groups.tolist())
    ordered = state.item_of_rank[keys & ((1 << state.rank_bits) - 1)]
    assert ordered.tolist() == [1, 4, 0, 2, 3, 5]

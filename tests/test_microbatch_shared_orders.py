"""The micro-batch problem's shared orders: the length order in the bin bound, the placeholders'
order of the cell LPT, built without a sort, agree with what the sorts give."""

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from orchmllm import CostModel
from orchmllm.balancers.kernels import lpt
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.microbatch.bounds import min_bins
from orchmllm.balancers.microbatch.cells import lpt_cells
from orchmllm.balancers.microbatch.plan import balancing_problem
from orchmllm.balancers.problem import make_problem, sorted_order


@given(st.lists(st.integers(0, 12), min_size=1, max_size=30), st.integers(12, 20))
def test_property_min_bins_from_the_length_order_is_the_sorted_bound(lengths, capacity):
    lengths = np.array(lengths)
    longest_first = lengths[sorted_order(lengths)]
    assert min_bins(lengths, capacity, longest_first) == min_bins(lengths, capacity)


@given(st.lists(st.integers(1, 12), min_size=1, max_size=40), st.integers(1, 4),
       st.lists(st.integers(0, 3), min_size=4, max_size=4), st.booleans())
def test_property_lpt_cells_orders_its_placeholders_as_sorted_order_does(lengths, num_ranks, levels, cost_model):
    """Offsets with ties (narrow integers): the cells LPT from the placeholders' order built per
    micro-batch is the LPT of the same placeholders ordered by `sorted_order`."""
    m = len(levels)
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=40,
                                      cost=CostModel(1.0, 0.05) if cost_model else None)
    offsets = np.maximum.accumulate(np.array(levels, dtype=np.float64))  # non-decreasing, as `levels` gives
    size = m * num_ranks
    placeholders = 2.0 * float(problem.item_costs.sum()) + 1.0 + np.repeat(offsets, num_ranks)
    costs = np.concatenate((placeholders, problem.item_costs))
    order = np.concatenate((sorted_order(placeholders), size + problem.cost_order))
    cells = balancing_problem(np.concatenate((np.zeros(size, dtype=np.int64), problem.lengths)), costs, size,
                              problem.max_tokens_per_microbatch, order)
    expected = lpt.solve(cells).assignment[size:]
    np.testing.assert_array_equal(lpt_cells(problem, m, offsets), expected)


def test_problems_are_built_with_their_items_orders_never_preset():
    problem = make_problem([3, 1, 2, 2], 2)
    order = problem.cost_order
    capped = dataclasses.replace(problem, max_tokens_per_rank=8)  # same items: the orders come with them
    assert capped.orders is problem.orders and capped.cost_order is order and "cost_order" not in vars(capped)
    given = balancing_problem(np.array([1, 5, 3]), np.array([9.0, 1.0, 5.0]), 2, 10, order=np.array([0, 2, 1]))
    assert given.cost is None and given.orders["cost_order"].tolist() == [0, 2, 1]
    own = balancing_problem(np.array([1, 5, 3]), np.array([9.0, 1.0, 5.0]), 2, 10)  # costs ordered by themselves
    assert own.cost_order.tolist() == [0, 2, 1] and not own.cost_order.flags.writeable

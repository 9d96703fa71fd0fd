"""`take_anywhere` keeps the ranks sorted through its rounds and runs token-bound rounds in place:
the choices are the plain loop's (`reference._PlainDeal`, which sorts every rank each round)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers import CostModel
from orchmllm.balancers.kernels.lpt import ranks_by_load
from orchmllm.balancers.kernels.reference import _PlainDeal
from orchmllm.balancers.locality.deal import DEAL_WINDOW, NoRoom, _resort, take_anywhere
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.problem import make_problem

# Costs and loads in halves: every sum is exact, so the plain loop's item-by-item sums and the
# kernel's per-round sums agree, and equal loads (ties by rank) are common.
COSTS = (CostModel(per_item=1.0), CostModel(per_item=1.0, linear=0.5), CostModel(per_item=0.5, quadratic=0.25))


@st.composite
def token_bound_deals(draw):
    """Ranks part-loaded (3 in 4 capped: some full of tokens, the others near their cap), items of a few
    lengths (ties in cost and load)."""
    num_ranks = draw(st.integers(1, 24))
    lengths = np.array(draw(st.lists(st.integers(1, 12), min_size=1, max_size=6 * num_ranks + 4)))
    cap = max(int(lengths.max()), -(-int(lengths.sum()) // num_ranks)) + draw(st.integers(0, 30))
    loads = np.array(draw(st.lists(st.integers(0, 16), min_size=num_ranks, max_size=num_ranks))) / 2
    room = np.array(draw(st.lists(st.sampled_from((0, 1, 3, 6, 12, 24)), min_size=num_ranks, max_size=num_ranks)))
    room[loads < draw(st.integers(0, 8))] = 0  # the least-loaded ranks full of tokens: token room binds
    target = float(loads.max()) + draw(st.integers(0, 20)) / 2
    capped = draw(st.integers(0, 3)) > 0  # without a cap: the kept order alone (no token-bound rounds)
    return lengths, draw(st.sampled_from(COSTS)), cap if capped else None, loads, np.maximum(cap - room, 0), target


@settings(max_examples=200, deadline=None)
@given(token_bound_deals())
def test_take_anywhere_makes_the_plain_loops_choices(deal):
    lengths, cost, cap, loads, tokens, target = deal
    problem = make_problem(lengths, loads.size, cost=cost, max_tokens_per_rank=cap)
    state = PartialPlan(problem, target)
    state.loads[:], state.tokens[:] = loads, tokens
    plain = _PlainDeal(problem.item_costs, lengths, loads.size, target, np.inf if cap is None else cap)
    plain.loads, plain.tokens = loads.tolist(), tokens.tolist()
    try:
        take_anywhere(state, np.arange(lengths.size))
        chosen = state.destinations.tolist()
    except NoRoom:
        chosen = "no rank with token room"
    try:
        plain.take_anywhere(problem.cost_order.tolist(), DEAL_WINDOW)
        expected = plain.destinations
    except ValueError:  # min() over no rank with token room
        expected = "no rank with token room"
    assert chosen == expected


@given(st.lists(st.integers(0, 6), min_size=1, max_size=40), st.data())
def test_resort_sorts_like_ranks_by_load(loads, data):
    """After some loads grow, `_resort` of the old order is the sort from scratch, ties by rank."""
    loads = np.array(loads, dtype=np.float64)
    order = ranks_by_load(loads, integer=False)
    grown = data.draw(st.lists(st.integers(0, 3), min_size=loads.size, max_size=loads.size))
    loads += np.array(grown)
    _resort(loads, order)
    np.testing.assert_array_equal(order, ranks_by_load(loads, integer=False))

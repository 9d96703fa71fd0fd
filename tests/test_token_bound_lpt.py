"""`token_lpt.token_bound_lpt` (the split planner's fill once token room binds) against its plain loops, item by item,
bit for bit, on nearly full instances shaped like the long workload's fills (a third of the ranks with little cost and
almost no token room, the rest near the target with token room), and `planner.fill`'s choice of it."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from orchmllm.balancers import CostModel
from orchmllm.balancers.context_parallel import planner
from orchmllm.balancers.locality import token_lpt
from orchmllm.balancers.locality.deal import DEAL_WINDOW, take_anywhere
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.problem import make_problem


def _nearly_full(seed: int, num_ranks: int, count: int):
    rng = np.random.default_rng(seed)
    lengths = rng.choice(np.array([8, 16, 24, 64, 96, 160, 256, 384]), count)
    cap = 4096.0
    problem = make_problem(lengths, num_ranks, cost=CostModel(linear=1.0, quadratic=0.002),
                           max_tokens_per_rank=int(lengths.sum()))  # the states' cap set apart
    target = float(problem.item_costs.sum()) / num_ranks * rng.uniform(0.2, 0.6)
    full = rng.random(num_ranks) < 1 / 3
    loads = np.where(full, rng.random(num_ranks) * target * 0.9, target * (1 + rng.uniform(-0.05, 0.05, num_ranks)))
    loads[rng.random(num_ranks) < 0.2] = target  # ties of loads
    tokens = np.where(full, cap - rng.integers(0, 300, num_ranks), rng.integers(0, 3000, num_ranks)).astype(float)
    return problem, loads, tokens, cap, target


def _state(problem, loads, tokens, cap, target):
    state = PartialPlan(problem, target)
    state.loads[:], state.tokens[:], state.cap = loads, tokens, cap
    return state


def _plain(state: PartialPlan, waiting: np.ndarray, margin: float) -> None:
    """The module's two loops, one rank and one item at a time."""
    left = list(waiting.tolist())
    tight = state.cap - state.tokens < state.lengths[waiting[0]]
    while True:
        cost_room, token_room = state.target - margin - state.loads, state.cap - state.tokens
        fitting = [(next(k for k, i in enumerate(left) if state.costs[i] <= cost_room[r]
                         and state.lengths[i] <= token_room[r]), float(state.loads[r]), r)
                   for r in range(state.loads.size) if tight[r] and left
                   and any(state.costs[i] <= cost_room[r] and state.lengths[i] <= token_room[r] for i in left)]
        if not fitting:
            break
        taken = set()
        for first, _, rank in sorted(fitting):
            k = next((k for k in range(first, len(left)) if k not in taken), None)
            if k is not None:  # else every item from its first fit on went to a rank before it
                taken.add(k)
                state.put_one(left[k], rank)
        left = [i for k, i in enumerate(left) if k not in taken]
    for item in left:
        roomy = [r for r in range(state.loads.size) if state.tokens[r] + state.lengths[item] <= state.cap]
        if not roomy:
            raise token_lpt.TokenRoomExhausted
        state.put_one(item, min(roomy, key=lambda r: (state.loads[r], r)))


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 24), st.integers(1, 160))
def test_rounds_make_the_plain_loops_choices(seed, num_ranks, count):
    problem, loads, tokens, cap, target = _nearly_full(seed, num_ranks, count)
    margin = DEAL_WINDOW * np.finfo(np.float64).eps * target
    made = []
    for place in (token_lpt.token_bound_lpt, _plain):
        state = _state(problem, loads, tokens, cap, target)
        try:
            place(state, problem.cost_order.copy(), margin)
            failed = False
        except token_lpt.TokenRoomExhausted:
            failed = True
        made.append((failed, state.destinations.tolist(), state.loads.tolist(), state.tokens.tolist()))
    assert made[0] == made[1]
    if not made[0][0]:
        assert (np.array(made[0][1]) >= 0).all() and max(made[0][3]) <= cap


@pytest.mark.parametrize("seed", range(4))
def test_fill_takes_the_rounds_only_where_token_room_binds(seed, monkeypatch):
    """`planner.fill` hands the items left at `take_anywhere`'s first LPT round to `token_bound_lpt` where that
    round's least-loaded rank has no token room for the largest, and is `take_anywhere`'s plan bit for bit where it
    has (token room everywhere)."""
    made, loads, tokens, cap, target = _nearly_full(seed, 16, 120)
    problem = make_problem(made.lengths, 16, cost=CostModel(linear=1.0, quadratic=0.002), max_tokens_per_rank=int(cap))
    calls, deals = [], []
    monkeypatch.setattr(planner, "token_bound_lpt",
                        lambda *args: calls.append(args) or token_lpt.token_bound_lpt(*args))
    monkeypatch.setattr(planner, "take_anywhere", lambda *args, **kw: deals.append(kw) or take_anywhere(*args, **kw))
    start = np.full(problem.num_items, -1)
    for held, bound in ((tokens, True), (0 * tokens, False)):
        calls.clear(), deals.clear()
        placed = planner.fill(problem, start, target, (loads.copy(), held.copy()))
        assert bool(calls) == bound and len(deals) == 2 - bound  # stopped at the first LPT round both times
        assert placed is not None and (placed >= 0).all()
        assert (held + np.bincount(placed, weights=problem.lengths, minlength=16)).max() <= cap
        if not bound:
            state = _state(problem, loads, held, cap, target)
            take_anywhere(state, np.arange(problem.num_items))
            assert placed.tolist() == state.destinations.tolist()

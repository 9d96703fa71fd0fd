"""`take_anywhere`'s token-bound rounds (`token_bound._token_bound_rounds`: pairs checked only from a
lower bound of the first round that may pair, runs of one-item rounds placed at once, deals made in
place) make the choices of the rounds made one by one from scratch (the deal of the ranks that keep
their first item, checked over all ranks, else an LPT round over all ranks): the same destinations,
loads, tokens and order of the ranks, bit for bit, and the same give-up (NoRoom)."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from orchmllm.balancers import CostModel
from orchmllm.balancers.kernels.lpt import ranks_by_load
from orchmllm.balancers.locality import deal, token_bound
from orchmllm.balancers.locality.deal import DEAL_WINDOW, NoRoom, take_anywhere
from orchmllm.balancers.locality.token_bound import STREAK_KEEPERS, _fitting, _token_bound_rounds
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.problem import make_problem

COSTS = (CostModel(linear=1.0, quadratic=0.37), CostModel(per_item=3.1, linear=0.7, quadratic=0.013),
         CostModel(per_item=1.0))  # the last: equal costs, so the lengths need not descend along them


@st.composite
def token_bound_deals(draw):
    """Ranks part-loaded (often tied), the least-loaded share of them short of token room, so LPT rounds
    place one item or a few; items of a few lengths (ties), float costs (rounding) from a cost model or
    given at random (lengths not descending along them); the target near the loads; sometimes a cap on
    LPT rounds."""
    num_ranks = draw(st.integers(2, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kinds = rng.integers(1, 60, draw(st.integers(1, 12)))  # many short items where the power is high
    uniform = rng.random(draw(st.integers(1, 10 * num_ranks)))
    lengths = kinds[(uniform ** draw(st.sampled_from((1, 3))) * kinds.size).astype(int)]
    given_costs = draw(st.booleans()) and draw(st.booleans())
    cost = draw(st.sampled_from(COSTS))
    costs = rng.random(lengths.size) * 100.0 if given_costs else cost.item_costs(lengths)
    share = float(costs.sum()) / num_ranks
    loads = rng.choice(rng.random(draw(st.integers(1, num_ranks))) * share * draw(st.sampled_from((0.5, 2.0, 8.0))),
                       num_ranks)
    cap = int(lengths.max()) * draw(st.integers(1, 6)) + draw(st.integers(0, 30))
    full = loads <= np.quantile(loads, draw(st.floats(0.0, 1.0)))  # the least loaded: little token room
    little = draw(st.sampled_from((int(lengths.min()) + 1, int(lengths.max()))))  # room for the shortest or longer
    roomy = (rng.integers(0, cap + 1, num_ranks) if draw(st.booleans())  # else room for about one item more
             else np.minimum(cap, int(lengths.max()) + rng.integers(0, 2 * int(lengths.min()) + 1, num_ranks)))
    room = np.where(full, rng.integers(0, little + 1, num_ranks), roomy)
    tokens = np.maximum(cap - room, 0).astype(np.float64)
    target = float(np.quantile(loads, draw(st.floats(0.0, 1.0)))) + share * draw(st.sampled_from((0.0, 0.1, 0.5, 2.0)))
    if draw(st.booleans()):  # as in a nearly full micro-batch: the ranks with token room a few items short of target
        short = rng.random(num_ranks) * float(costs.max()) * draw(st.sampled_from((1, 4)))
        loads = np.where(full, loads, target - short)
    max_lpt_rounds = draw(st.sampled_from((None, None, None, 1, 4, 30)))
    problem = make_problem(lengths, num_ranks, costs=costs if given_costs else None,
                           cost=None if given_costs else cost, max_tokens_per_rank=int(lengths.sum()))
    return problem, loads, tokens, float(cap), target, max_lpt_rounds


def _dealt(problem, loads, tokens, cap, target, max_lpt_rounds):
    state = PartialPlan(problem, target)
    state.loads[:], state.tokens[:], state.cap = loads, tokens, cap  # a cap tighter than the problem's checks allow
    try:
        take_anywhere(state, np.arange(problem.num_items), max_lpt_rounds)
    except NoRoom:
        return "NoRoom"
    return state.destinations.tolist(), state.loads.tolist(), state.tokens.tolist()


@settings(max_examples=300, deadline=None)
@given(token_bound_deals())
def test_token_bound_rounds_make_the_round_by_round_choices(instance):
    fast = _dealt(*instance)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(deal, "_token_bound_rounds", lambda state, waiting, *rest: (waiting, 0))
        assert fast == _dealt(*instance)


def _round_by_round(state, waiting, allowed, margin, order, window):
    """The rounds one by one from one in which the least-loaded rank has no token room for the largest item,
    while some rank has: the deal of the ranks that keep their first item (checked over all ranks), else an
    LPT round over all ranks; a round in which the least-loaded rank has token room only where 1 to
    STREAK_KEEPERS ranks keep."""
    rounds, first = 0, True
    while rounds < allowed and waiting.size:
        length = state.lengths[waiting[0]]
        least_has_room = state.tokens[order[0]] + length <= state.cap
        if (least_has_room and first) or not (state.tokens + length <= state.cap).any():
            break
        first = False
        roomy = int(np.count_nonzero(state.loads + state.costs[waiting[0]] <= state.target))
        count = min(waiting.size, window * roomy)
        keeping = np.flatnonzero(deal._first_kept(state, waiting[:min(roomy, count)], order[:min(roomy, count)],
                                                  margin))
        if least_has_room and not 0 < keeping.size <= STREAK_KEEPERS:
            break
        if keeping.size:
            items, ranks = deal._deal(state, waiting, count, min(roomy, count), keeping, order[keeping], margin)
            state.put_runs(waiting[items], ranks)
            waiting = np.delete(waiting, items)
            deal._resort(state.loads, order)
        else:
            rounds += 1
            waiting = deal._lpt_round(state, waiting, order)
    return waiting, rounds


@settings(max_examples=300, deadline=None)
@given(token_bound_deals())
def test_token_bound_rounds_from_any_sorted_ranks_make_the_round_by_round_choices(instance):
    """From ranks in any state (not only as the deals before leave them), mid-streak."""
    problem, loads, tokens, cap, target, max_lpt_rounds = instance
    made = []
    for rounds in (_token_bound_rounds, _round_by_round):
        state = PartialPlan(problem, target)
        state.loads[:], state.tokens[:], state.cap = loads, tokens, cap
        order = ranks_by_load(state.loads, integer=False)
        margin = DEAL_WINDOW * np.finfo(np.float64).eps * target
        allowed = problem.num_items if max_lpt_rounds is None else max_lpt_rounds
        waiting, done = rounds(state, problem.cost_order.copy(), allowed, margin, order, DEAL_WINDOW)
        made.append((waiting.tolist(), done, state.destinations.tolist(), state.loads.tolist(), state.tokens.tolist(),
                     order.tolist()))
    assert made[0] == made[1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e9), min_size=0, max_size=40), st.floats(0.0, 1e9), st.integers(-3, 3),
       st.integers(0, 5))
@example([199515443.9682133, 671994877.9563594, 942113110.5064979], 36511016.82448286, -1, 0)  # search too far
def test_fitting_counts_the_rounded_sums_within_the_limit(values, add, ulps, repeat):
    """`_fitting` (a binary search, then steps over equal values) counts as `np.count_nonzero(values + add <=
    limit)` over ascending values: limits a few ulps around some value's rounded sum (where the search in
    limit - add, rounded, can land a step off either way), values repeated (ties)."""
    values = np.sort(np.repeat(np.asarray(values, dtype=np.float64), repeat + 1))
    limit = float(values[len(values) // 2] + add) if values.size else add
    for _ in range(abs(ulps)):
        limit = float(np.nextafter(limit, np.inf if ulps > 0 else -np.inf))
    assert _fitting(values, add, limit) == int(np.count_nonzero(values + add <= limit))


def _alternating(seed):
    """Costs not along the lengths (short and long items mixed), half the ranks short of token room for the long
    ones: mid-streak, the least-loaded rank has token room for some largest items and not for others."""
    rng = np.random.default_rng(seed)
    num_ranks = int(rng.integers(4, 33))
    count = int(rng.integers(4 * num_ranks, 16 * num_ranks))
    lengths = np.where(rng.random(count) < 0.3, rng.integers(40, 61, count), rng.integers(4, 12, count))
    costs = rng.random(count) * 100.0
    problem = make_problem(lengths, num_ranks, costs=costs, max_tokens_per_rank=int(lengths.sum()))
    share = float(costs.sum()) / num_ranks
    loads = rng.random(num_ranks) * share
    cap = 60 * int(rng.integers(2, 5))
    tokens = np.where(rng.random(num_ranks) < 0.5, cap - rng.integers(12, 30, num_ranks),
                      rng.integers(0, cap // 2, num_ranks)).astype(np.float64)
    target = float(loads.max()) + share * float(rng.choice([0.05, 0.2, 1.0]))
    return problem, loads, tokens, float(cap), target, None


def test_streaks_make_the_deal_rounds_where_the_least_loaded_rank_has_token_room(monkeypatch):
    """A streak goes on through a deal round in which the least-loaded rank has token room and at most
    STREAK_KEEPERS ranks keep (`_Streak.first_kept`), as take_anywhere's own round would make it: the same
    destinations, loads and tokens, bit for bit (40 seeds, such rounds in them)."""
    made, first_kept = [], token_bound._Streak.first_kept
    monkeypatch.setattr(token_bound._Streak, "first_kept", lambda self, margin: made.append(
        first_kept(self, margin)) or made[-1])
    for seed in range(40):
        fast = _dealt(*_alternating(seed))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(deal, "_token_bound_rounds", lambda state, waiting, *rest: (waiting, 0))
            assert fast == _dealt(*_alternating(seed)), seed
    assert sum(0 < keeping.size <= STREAK_KEEPERS for _, keeping in made) >= 10

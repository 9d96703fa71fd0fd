"""A token-bound deal round in which one rank keeps its first item (`token_bound._Streak.deal`, most such rounds
where token room binds: the long workload's split micro-batch fills at T 16k) places that item alone, without
`_deal`'s passes, where `_deal` would keep no second item: the same destinations, loads and tokens."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.locality import token_bound
from orchmllm.balancers.locality.deal import NoRoom, take_anywhere
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.problem import make_problem


def _instance(seed: int):
    """A split micro-batch's fill in small: a share of the ranks holds laid-out groups (loaded, most of their token
    room taken), the others are empty; items of lognormal lengths (33 to 4052 tokens, the long workload's); the token
    room 1.2-2.4 times the items' tokens; the target a hair above the mean load."""
    rng = np.random.default_rng(seed)
    num_ranks = int(rng.integers(16, 96))
    lengths = np.clip(rng.lognormal(6.3, 0.9, int(rng.integers(8, 16)) * num_ranks), 33, 4052).astype(np.int64)
    cost = CostModel(linear=1.0, quadratic=rng.uniform(1e-4, 1e-3))
    costs = cost.item_costs(lengths)
    cap = int(rng.uniform(1.2, 1.8 if seed % 3 else 2.4) * lengths.sum() / num_ranks)
    laid = rng.random(num_ranks) < rng.uniform(0.25, 0.45)
    mean = float(costs.sum()) / num_ranks / (1 - laid.mean() * 0.9)
    loads = np.where(laid, mean * rng.uniform(0.8, 1.1, num_ranks), 0.0)
    tokens = np.floor(np.where(laid, cap * rng.uniform(0.6, 1.0, num_ranks), 0.0))
    target = (float(costs.sum()) + float(loads.sum())) / num_ranks * rng.uniform(1.0, 1.05)
    return (make_problem(lengths, num_ranks, cost=cost, max_tokens_per_rank=int(lengths.sum())),
            loads, tokens, cap, target)


def _dealt(problem, loads, tokens, cap, target):
    state = PartialPlan(problem, target)
    state.loads[:], state.tokens[:], state.cap = loads, tokens, float(cap)
    try:
        take_anywhere(state, np.arange(problem.num_items))
    except NoRoom:
        return "NoRoom"
    return state.destinations.tolist(), state.loads.tolist(), state.tokens.tolist()


@pytest.mark.parametrize("seed", range(150))
def test_one_keeper_deal_places_what_the_passes_keep(seed, monkeypatch):
    instance = _instance(seed)
    alone = _dealt(*instance)
    monkeypatch.setattr(token_bound._Streak, "_keeps_second", lambda *args: True)  # every deal through `_deal`
    assert alone == _dealt(*instance)


def test_regression_one_keeper_deals_made_the_passes(monkeypatch):
    """Cause of part of the T 16k step's fill cost (issue 24/26: ~870 deal rounds of one rank and one item in the
    fills of 35k items): each such round dealt DEAL_WINDOW passes (`_deal`: index, gathers, running sums over
    them) to learn that the rank keeps its first item only.  The second item's test alone tells."""
    deals, passes = [], []
    streak_deal, dealt = token_bound._Streak.deal, token_bound._deal
    monkeypatch.setattr(token_bound._Streak, "deal", lambda self, roomy, count, keeping, margin: deals.append(
        keeping.size) or streak_deal(self, roomy, count, keeping, margin))
    monkeypatch.setattr(token_bound, "_deal", lambda *args: passes.append(args[4].size) or dealt(*args))
    for seed in range(40):
        _dealt(*_instance(seed))
    assert deals.count(1) > 20 and passes.count(1) < deals.count(1) // 4

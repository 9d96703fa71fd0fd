"""The token-bound streak's shortcuts on a nearly full micro-batch (the shape of the long workload's fills: the
least-loaded ranks short of token room, the others near the target): a run's ranks re-sorted past the rest without
a sort where they all load more (`_Streak.resort`), the ranks' least tokens before `prefix` kept unless a rank that
held them takes an item (`_Streak.taken`), the deal's keepers checked over the roomy ranks alone (`_Streak.keeping`),
a run's length taken whole where its ranks' loads all stay below every load a rank of it reaches (`round_length`
skipped).
The rounds are those made one by one from scratch, bit for bit."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.kernels.lpt import ranks_by_load
from orchmllm.balancers.locality import token_bound
from orchmllm.balancers.locality.deal import DEAL_WINDOW
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.problem import make_problem

from .test_deal_token_bound import _round_by_round


def _nearly_full(seed: int):
    """Ranks of which a third hold little cost but almost no token room, the rest token room but loads near the
    target; many short items of a few lengths, costs of a causal attention model (rounded floats)."""
    rng = np.random.default_rng(seed)
    num_ranks, cap = 48, 4096.0
    lengths = rng.choice(np.array([64, 96, 160, 256, 384, 512, 700]), 400, p=[.3, .2, .15, .12, .1, .08, .05])
    problem = make_problem(lengths, num_ranks, cost=CostModel(linear=1.0, quadratic=0.002),
                           max_tokens_per_rank=int(lengths.sum()))
    target = float(problem.item_costs.sum()) / num_ranks * 0.35
    full = rng.random(num_ranks) < 1 / 3
    loads = np.where(full, rng.random(num_ranks) * target * 0.3, target - rng.random(num_ranks) * target * 0.05)
    tokens = np.where(full, cap - rng.integers(0, 400, num_ranks), rng.integers(0, 1024, num_ranks)).astype(float)
    return problem, loads, tokens, cap, target


@pytest.mark.parametrize("seed", range(6))
def test_the_streaks_shortcuts_make_the_round_by_round_choices(seed, monkeypatch):
    problem, loads, tokens, cap, target = _nearly_full(seed)
    made = []
    for rounds in (token_bound._token_bound_rounds, _round_by_round):
        state = PartialPlan(problem, target)
        state.loads[:], state.tokens[:], state.cap = loads, tokens, cap
        order = ranks_by_load(state.loads, integer=False)
        margin = DEAL_WINDOW * np.finfo(np.float64).eps * target
        waiting, done = rounds(state, problem.cost_order.copy(), problem.num_items, margin, order, DEAL_WINDOW)
        made.append((waiting.tolist(), done, state.destinations.tolist(), state.loads.tolist(), state.tokens.tolist(),
                     order.tolist()))
    assert made[0] == made[1]


def test_each_shortcut_is_taken(monkeypatch):
    """Over the instances above: runs re-sorted with and without a sort, runs whose length `round_length` checks and
    runs taken whole without it, and deals whose keepers were checked."""
    taken = {"sorted": 0, "resort": 0, "keeping": 0, "round_length": 0, "place_run": 0}

    def counted(name, function):
        return lambda *args: taken.__setitem__(name, taken[name] + 1) or function(*args)

    monkeypatch.setattr(token_bound, "_by_load", counted("sorted", token_bound._by_load))
    monkeypatch.setattr(token_bound, "round_length", counted("round_length", token_bound.round_length))
    for name in ("resort", "keeping", "place_run"):
        monkeypatch.setattr(token_bound._Streak, name, counted(name, getattr(token_bound._Streak, name)))
    for seed in range(6):
        problem, loads, tokens, cap, target = _nearly_full(seed)
        state = PartialPlan(problem, target)
        state.loads[:], state.tokens[:], state.cap = loads, tokens, cap
        order = ranks_by_load(state.loads, integer=False)
        token_bound._token_bound_rounds(state, problem.cost_order.copy(), problem.num_items,
                                        DEAL_WINDOW * np.finfo(np.float64).eps * target, order, DEAL_WINDOW)
    assert 0 < taken["sorted"] < taken["resort"] and 0 < taken["round_length"] < taken["place_run"]
    assert taken["keeping"] > 0

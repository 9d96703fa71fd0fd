"""Regressions of `take_anywhere`'s speed where token room binds (issue 26's long workload): the choices
stay those of the rounds made one by one from scratch."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.locality import deal
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.problem import make_problem


def test_regression_token_bound_deals_returned_to_take_anywhere_for_every_kept_item(monkeypatch):
    """Cause: a token-bound round whose deal keeps an item (a least-loaded rank, nearly full of tokens, takes
    a short item deep in the list) ended the token-bound rounds: take_anywhere then checked the deal over
    all ranks, made it, ran an LPT round over all ranks and re-sorted them, ~700 times in the `long`
    workload's 95 %-full micro-batch (D = 2560, T = 32k).  Now such deals are made in place: one LPT round
    from take_anywhere in all (23 here before)."""
    rng = np.random.default_rng(0)
    lengths = np.sort(rng.integers(1, 41, 400))[::-1]
    problem = make_problem(lengths, 48, cost=CostModel(linear=1.0), max_tokens_per_rank=int(lengths.sum()))
    full = np.arange(48) < 24  # the least loaded: token room for a short item only
    loads = np.where(full, rng.random(48) * 100, 940 + rng.random(48) * 20)
    tokens = np.where(full, 1000 - rng.integers(1, 12, 48), 0).astype(np.float64)

    def dealt():
        state = PartialPlan(problem, 1000.0)
        state.loads[:], state.tokens[:], state.cap = loads, tokens, 1000.0  # a cap the problem's checks refuse
        deal.take_anywhere(state, np.arange(lengths.size))
        return state.destinations

    lpt_rounds = []
    lpt_round = deal._lpt_round
    monkeypatch.setattr(deal, "_lpt_round", lambda *args: (lpt_rounds.append(1), lpt_round(*args))[1])
    fast = dealt()
    assert len(lpt_rounds) == 1
    assert np.bincount(fast[full[fast]], minlength=48)[:24].tolist() == [1] * 24  # each nearly full rank kept one
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(deal, "_token_bound_rounds", lambda state, waiting, *rest: (waiting, 0))
        np.testing.assert_array_equal(fast, dealt())

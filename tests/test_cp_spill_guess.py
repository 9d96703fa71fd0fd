"""The spill's certificate search (`repair._fewest_uncertified`) gallops from the count the spill before kept: the
same count as the bisection alone, with fewer certificates in a cascade of spills."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import ContextParallel, balance_microbatches
from orchmllm.balancers.context_parallel import microbatch, repair
from orchmllm.study.models import MODELS

COST = MODELS["84b"].llm.cost(causal=True)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300), st.data())
def test_property_the_guess_finds_the_count_the_bisection_finds(most, data):
    """A monotone certificate (true below some count, the counts' sets shrinking as the count grows): the same count
    with a guess anywhere as without one."""
    boundary = data.draw(st.integers(1, most + 1))  # most + 1: every count certified
    guess = data.draw(st.integers(-2, most + 2))
    calls = []

    def certified_none(count):
        calls.append(count)
        return count < boundary

    certificates = SimpleNamespace(certified_none=certified_none)
    alone = repair._fewest_uncertified(lambda count: count, most, certificates)
    assert repair._fewest_uncertified(lambda count: count, most, certificates, guess) == alone
    if 1 < boundary < most:
        calls.clear()
        repair._fewest_uncertified(lambda count: count, most, certificates, boundary)
        assert len(calls) <= 3  # the count itself, the one below it (and the widest first)


def test_regression_a_cascade_of_spills_bisected_every_certificate_from_one(monkeypatch):
    """allgiant (issue 24's family: 20-130k tokens, T = 32k), D = 64 x 16, seed 11: 550 certificates judged before
    (each spill of the cascade bisected from count 1), 443 now, the same plan (since the free M's grouping,
    `tests/test_cp_grouping_free.py`: 493 without the guess, 391 with it)."""
    rng = np.random.default_rng(11)
    lengths = rng.integers(20000, 130000, 64 * 16)
    judged, certify = [], microbatch.cannot_lay_out

    def counted(*args):
        judged.append(1)
        return certify(*args)

    monkeypatch.setattr(microbatch, "cannot_lay_out", counted)
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=32768, cost=COST,
                                context_parallel=ContextParallel())
    assert plan.digest().startswith("fb42586d35c3") and len(judged) <= 460

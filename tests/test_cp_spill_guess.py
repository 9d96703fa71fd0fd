"""The spill's certificate search (`repair._fewest_uncertified`) gallops from the count the spill before kept: the
same count as the bisection alone, with fewer certificates in a cascade of spills; where that count finds no layout,
the layout search (`repair._fewest_laid`) gallops from the count the spill before laid out."""

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


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 300), st.data())
def test_property_the_layout_guess_brackets_the_count_the_doubling_finds(most, data):
    """Plans failing below some count (monotone) and the certificate's count below it failing: from a guess anywhere
    above that count, `_fewest_laid` brackets the same fewest laid-out count as the doubling from one item (None
    where `most` fails too), each end as the caller reads it (failed: fails or 0; count: lays out)."""
    boundary = data.draw(st.integers(1, most + 1))  # most + 1: no count lays out
    above = data.draw(st.integers(0, boundary - 1))
    guess = data.draw(st.one_of(st.none(), st.integers(-2, most + 2)))

    def fails(count):
        return count < boundary

    def fewest(found):
        if found is None:
            return None
        failed, count = found
        assert (failed == 0 or fails(failed)) and not fails(count) and failed < count
        while count - failed > 1:  # the caller's bisection
            middle = (failed + count) // 2
            failed, count = (middle, count) if fails(middle) else (failed, middle)
        return count

    alone = fewest(repair._fewest_laid(fails, most, None, above))
    assert alone == (None if boundary > most else boundary)
    assert fewest(repair._fewest_laid(fails, most, guess, above)) == alone


def test_regression_a_spill_whose_certificate_count_failed_doubled_from_one(monkeypatch):
    """allgiant (20-130k tokens, T = 32k), D = 64 x 16, seed 11: the spills whose certificate's count found no
    layout searched by doubling from one item (83 layouts planned in all); from the count the spill before laid out
    69, the same plan."""
    rng = np.random.default_rng(11)
    lengths = rng.integers(20000, 130000, 64 * 16)
    planned, plan_pass = [], microbatch._plan_pass

    def counted(*args, **kwargs):
        planned.append(1)
        return plan_pass(*args, **kwargs)

    monkeypatch.setattr(microbatch, "_plan_pass", counted)
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=32768, cost=COST,
                                context_parallel=ContextParallel())
    assert plan.digest().startswith("fb42586d35c3") and len(planned) <= 75

"""The spill's searches (`context_parallel.repair`): where the certificate's count finds no layout, the fewest laid-out
count is searched from the count a tightened certificate leaves (`_tightened_count`); the refill doubles from none
(`_refill`).  The same counts as before, with fewer plans."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import ContextParallel, balance_microbatches
from orchmllm.balancers.context_parallel import microbatch, repair
from orchmllm.study.models import MODELS

COST = MODELS["84b"].llm.cost(causal=True)


def refill(limit: int, fitting: int):
    """`_refill` of micro-batch 0 from `limit` short items of micro-batch 1 (each of one token, room for all) where
    a prefix of at most `fitting` of them keeps the cost: (the items moved back, the prefixes planned)."""
    grouping = np.array([0] + [1] * limit, dtype=np.int64)
    lengths, times = np.ones(limit + 1, dtype=np.int64), np.arange(limit + 1, dtype=float)[::-1].copy()
    planned = []

    def plan_pass(items):
        planned.append(items.size - 1)
        return SimpleNamespace(loads=np.array([1.0 if items.size - 1 <= fitting else 2.0]))

    repair._refill(grouping, 0, np.array([0]), SimpleNamespace(loads=np.array([1.0])), np.arange(1, limit + 1),
                   limit, lengths, times, 10, plan_pass)
    return np.count_nonzero(grouping[1:] == 0), planned


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.data())
def test_property_the_refill_moves_back_the_longest_prefix_that_keeps_the_cost(limit, data):
    fitting = data.draw(st.integers(0, limit))
    moved, planned = refill(limit, fitting)
    assert moved == fitting
    assert len(planned) <= 2 * (fitting + 1).bit_length() + 1


def test_regression_a_refill_that_moves_back_nothing_bisected_from_the_middle():
    """Every refill of issue 24's giant families (D = 64 and 512, seeds 11 and 23) moved back none or one item, after
    up to 5 plans of a bisection from the middle of its prefixes; one plan now where none fits."""
    assert refill(45, 0) == (0, [1])
    assert refill(45, 1) == (1, [1, 3, 2])


def test_the_tightened_count_needs_the_certificates_context():
    """Without the ranks and spec the certificates judge with, no guess (the search doubles from one item)."""
    rest = lambda count: np.arange(count, 4)  # noqa: E731
    lengths = np.full(4, 100, dtype=np.int64)
    assert repair._tightened_count(rest, 4, lengths, 100, SimpleNamespace(certified_none=bool), 1) is None
    certificates = SimpleNamespace(context=(2, ContextParallel(degrees=(1, 2), gpus_per_node=2)))
    # 2 ranks of 100 tokens hold two items of 100 (2 moved out of 4), of ⌊0.97 · 100⌋ = 97 tokens one (3 moved out)
    assert repair._tightened_count(rest, 4, lengths, 100, certificates, 2) == 3


def test_regression_spills_without_layout_at_the_certificate_count_searched_from_one_item(monkeypatch):
    """allgiant (issue 24's family: 20-130k tokens, T = 32k), D = 64 x 16, seed 7: the spills whose certificate's
    count found no layout galloped from the count the spill before laid out, or doubled from one item, and the
    refills bisected from the middle (78 plans); from the count the certificate leaves at 0.97 T and doubling from
    none, 69, the same plan."""
    lengths = np.random.default_rng(7).integers(20000, 130000, 64 * 16)
    planned, plan_pass = [], microbatch._plan_pass

    def counted(*args, **kwargs):
        planned.append(1)
        return plan_pass(*args, **kwargs)

    monkeypatch.setattr(microbatch, "_plan_pass", counted)
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=32768, cost=COST,
                                context_parallel=ContextParallel())
    assert plan.digest().startswith("73334d42cda1") and len(planned) <= 72

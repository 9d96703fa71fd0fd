"""The spill's refill (`context_parallel.repair._refill`): the longest prefix of the next micro-batch's short items that
keeps the spilled micro-batch's cost, one item first, then bisection: the same prefix as the bisection from the middle
where prefixes keep the cost up to some length, with one plan where none does (most refills measured)."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.context_parallel import repair


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
    assert len(planned) <= (1 if fitting == 0 else limit.bit_length() + 1)


def test_regression_a_refill_that_moves_back_nothing_bisected_from_the_middle():
    """Most refills of issue 24's giant families (D = 64 and 512, seeds 11 and 23) moved back none, after up to 5
    plans of a bisection from the middle of their prefixes; one plan now."""
    assert refill(45, 0) == (0, [1])
    assert refill(45, 10)[0] == 10

"""LPT's rounds over many ranks: a round that places few items is redone as a heap only where that is cheaper
(`lpt._WIDE_ROUND`; `_WIDE_HEAP_SHARE` of float costs, `_WIDE_KEY_HEAP_SHARE` on integer keys); rounds and heap
make the heap loop's choices either way."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.kernels import lpt
from orchmllm.balancers.kernels.reference import heap_lpt


def counting_heap_rounds(monkeypatch) -> list:
    """The sizes of the heap rounds LPT runs from now on."""
    sizes = []
    heap_round = lpt._heap_round

    def counted(loads, costs, items, assignment):
        sizes.append(costs.size)
        heap_round(loads, costs, items, assignment)

    monkeypatch.setattr(lpt, "_heap_round", counted)
    return sizes


def one_short_round(num_ranks: int, few: int, integer: bool) -> np.ndarray:
    """Costs whose second LPT round places few + 1 of its num_ranks items: the first round's distinct costs leave
    distinct loads; the second's first `few` are large (placed in order), the rest 0, so the rank after them waits
    behind the last one topped up by 0 (the zeros then end the run).  Float costs, or integers (keys)."""
    first = num_ranks + np.arange(num_ranks, 0, -1) - (0.0 if integer else 0.5)
    second = np.concatenate((np.full(few, 10.0 * num_ranks), np.zeros(num_ranks - few)))
    return np.concatenate((first, second))


@pytest.mark.parametrize("num_ranks", [4160, 5000])
@pytest.mark.parametrize("integer, share", [(False, 10), (True, 20)], ids=["float", "keys"])
def test_a_wide_round_of_a_few_is_not_redone_as_a_heap(monkeypatch, num_ranks, integer, share):
    costs = one_short_round(num_ranks, num_ranks // share, integer)
    heaps = counting_heap_rounds(monkeypatch)
    assert (lpt._key_steps(costs, num_ranks) is not None) == integer
    assert np.array_equal(lpt.greedy_unpadded(costs, num_ranks), heap_lpt(costs, num_ranks))
    assert heaps == []


@pytest.mark.parametrize("integer", [False, True], ids=["float", "keys"])
def test_a_narrow_round_of_a_tenth_is_still_redone_as_a_heap(monkeypatch, integer):
    costs = one_short_round(1000, 100, integer)
    heaps = counting_heap_rounds(monkeypatch)
    assert np.array_equal(lpt.greedy_unpadded(costs, 1000), heap_lpt(costs, 1000))
    assert heaps == [1000]


@settings(max_examples=200, deadline=None)
@given(num_ranks=st.integers(32, 80), wide=st.sampled_from([0, 40, 4096]), share=st.sampled_from([1, 2, 16, 10**6]),
       data=st.data())
def test_any_heap_share_gives_the_heap_loop(num_ranks, wide, share, data):
    """Small instances (float and integer costs, ties and zeros included) under every threshold: the heap loop's
    plan."""
    values = st.sampled_from([0.0, 0.5, 1.0, 1.25, 3.0, 7.5]) | st.floats(0.0, 100.0) | st.integers(0, 50)
    costs = np.array(data.draw(st.lists(values, min_size=1, max_size=4 * num_ranks)), dtype=np.float64)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lpt, "_WIDE_ROUND", wide)
        patch.setattr(lpt, "_WIDE_HEAP_SHARE", share)
        patch.setattr(lpt, "_WIDE_KEY_HEAP_SHARE", share)
        assert np.array_equal(lpt.greedy_unpadded(costs, num_ranks), heap_lpt(costs, num_ranks))

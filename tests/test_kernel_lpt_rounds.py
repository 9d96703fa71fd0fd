"""One round of LPT (`kernels.lpt_rounds.round_length`, `lpt.round_length` to its callers): the items the heap
loop gives the ranks in order, ties of load decided by rank in numpy (no loop over the tied items), and runs of equal
costs that `lpt_runs` cannot place (float rounding) tried once, not at every heap round after (probe57 L2)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.kernels import lpt, lpt_capped
from orchmllm.balancers.kernels.reference import capped_lpt, heap_lpt
from orchmllm.balancers.microbatch.plan import balancing_problem


def textbook_round(loads: np.ndarray, ranks: np.ndarray, costs: np.ndarray) -> int:
    """Item k takes ranks[k] while (loads[k], ranks[k]) is below every (loads[j] + costs[j], ranks[j]), j < k."""
    least = None
    for k, (load, rank, cost) in enumerate(zip(loads.tolist(), ranks.tolist(), costs.tolist())):
        if least is not None and (load, rank) >= least:
            return k
        least = (load + cost, rank) if least is None else min(least, (load + cost, rank))
    return costs.size


@settings(max_examples=100, deadline=None)
@given(data=st.data(), size=st.integers(1, 40), unit=st.sampled_from([1.0, 0.5, 0.1, 3.0]),
       in_order=st.booleans(), integer=st.booleans())
def test_round_length_is_the_textbook_round(data, size, unit, in_order, integer):
    """Loads and costs on a coarse grid (ties of load everywhere, costs 0 included), ranks numbered any way, loads
    sorted or not; integer keys where the grid is whole."""
    grid = st.lists(st.integers(0, 4), min_size=size, max_size=size)
    loads = np.array(data.draw(grid), dtype=np.float64) * unit
    costs = np.array(data.draw(grid), dtype=np.float64) * unit
    if in_order:
        loads.sort()
        costs[::-1].sort()
    ranks = np.array(data.draw(st.permutations(range(size + 3)))[:size], dtype=np.int64)
    integer = integer and unit >= 1
    assert lpt.round_length(loads, ranks, costs, integer) == textbook_round(loads, ranks, costs)


def test_a_round_of_ties_decided_by_rank():
    """Equal loads: the round goes on while each next rank is below every rank topped up to that load."""
    loads, costs = np.array([0.0, 1.0, 1.0, 1.0]), np.ones(4)
    assert lpt.round_length(loads, np.array([5, 2, 3, 4]), costs) == 4  # 2, 3, 4 below 5 (topped to 1)
    assert lpt.round_length(loads, np.array([1, 2, 3, 4]), costs) == 1  # 2 above 1 (topped to 1)


def counted_place_run(monkeypatch) -> list:
    """The runs `place_run` is asked to place from now on (their item counts), uncapped and capped."""
    calls = []

    def counted(loads, ranks, cost, count, limits=None, after=None):
        calls.append(count)
        return place_run(loads, ranks, cost, count, limits, after)

    place_run = lpt.place_run
    monkeypatch.setattr(lpt, "place_run", counted)
    monkeypatch.setattr(lpt_capped, "place_run", counted)
    return calls


@pytest.mark.parametrize("capped", [False, True])
def test_regression_a_run_lost_in_the_loads_rounding_was_tried_at_every_heap_round(monkeypatch, capped):
    """Cause (probe57 L2): each 1.0 is lost in a load of 1e16 (1e16 + 1 rounds back), so `place_run` finds no level
    for the run; LPT then places it by heap rounds of D items, and asked `place_run` again before each (8 levels
    tried each time: 1.1-3x slower than before runs were placed at once).  One try per run now, the same plan."""
    num_ranks, count = 64, 2000
    costs = np.concatenate((np.full(num_ranks, 1e16), np.full(count, 1.0)))
    calls = counted_place_run(monkeypatch)
    if capped:
        lengths = np.concatenate((np.full(num_ranks, 10), np.ones(count, dtype=np.int64)))
        got = lpt.solve(balancing_problem(lengths, costs, num_ranks, 60)).assignment
        assert np.array_equal(got, capped_lpt(costs, lengths, num_ranks, 60))
    else:
        assert np.array_equal(lpt.greedy_unpadded(costs, num_ranks), heap_lpt(costs, num_ranks))
    assert len(calls) <= 2

"""LPT's runs of equal items placed at once (`kernels.lpt_runs`, probe56 F9: power-of-two lengths at 2560 x 32 spent
0.26 s in heap steps): the heap loop's choices, uncapped and capped, ties included."""

import heapq

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.kernels import lpt, lpt_capped, lpt_runs
from orchmllm.balancers.kernels.reference import capped_lpt, heap_lpt
from orchmllm.balancers.microbatch.plan import balancing_problem
from orchmllm.balancers.problem import InfeasibleError


def heap_steps(monkeypatch) -> list:
    """The items LPT places by heap steps from now on (uncapped heap rounds and capped heap runs)."""
    steps = []
    heap_round, heap_run = lpt._heap_round, lpt_capped._heap_run

    def counted_round(loads, costs, items, assignment):
        steps.append(costs.size)
        heap_round(loads, costs, items, assignment)

    def counted_run(state, position, stop):
        steps.append(stop - position)
        return heap_run(state, position, stop)

    monkeypatch.setattr(lpt, "_heap_round", counted_round)
    monkeypatch.setattr(lpt_capped, "_heap_run", counted_run)
    return steps


def spread_then_run(num_ranks: int, count: int, cost: float) -> np.ndarray:
    """Distinct costs spreading the loads over many times `cost`, then `count` items of `cost`: the rounds of the
    run stop after the few ranks within `cost` of the least load."""
    return np.concatenate((100.0 * np.arange(num_ranks, 0, -1) + 0.5, np.full(count, cost)))


@pytest.mark.parametrize("num_ranks, count", [(64, 500), (5000, 4000)])
def test_a_run_over_spread_loads_takes_no_heap_step(monkeypatch, num_ranks, count):
    costs = spread_then_run(num_ranks, count, 3.0)
    steps = heap_steps(monkeypatch)
    assert np.array_equal(lpt.greedy_unpadded(costs, num_ranks), heap_lpt(costs, num_ranks))
    assert steps == []


def test_a_capped_run_takes_no_heap_step(monkeypatch):
    """The uncapped plan overflows (costs fall as lengths rise), so the capped greedy places the rest; its runs of
    one length and cost go at once, each rank at most its room's worth."""
    lengths = np.repeat([1, 2, 4, 8, 16, 32, 64], 300)
    costs = 1000.0 / lengths
    steps = heap_steps(monkeypatch)
    cap = int(lengths.sum() // 64 * 1.1)
    got = lpt.solve(balancing_problem(lengths, costs, 64, cap)).assignment
    assert np.array_equal(got, capped_lpt(costs, lengths, 64, cap))
    assert steps == []


def heap_run(loads: np.ndarray, ranks: np.ndarray, cost: float, count: int, limits: np.ndarray | None):
    """`place_run`'s answer the textbook way: each item to the least (load, rank) with room left."""
    heap = list(zip(loads.tolist(), ranks.tolist(), range(loads.size)))
    heapq.heapify(heap)
    left = None if limits is None else limits.tolist()
    chosen, taken, after = [], np.zeros(loads.size, dtype=np.int64), loads.copy()
    while heap and len(chosen) < count:
        load, rank, k = heapq.heappop(heap)
        chosen.append(rank)
        taken[k] += 1
        after[k] = load = load + cost
        if left is None or taken[k] < left[k]:
            heapq.heappush(heap, (load, rank, k))
    return np.array(chosen, dtype=np.int64), taken, after


@settings(max_examples=100, deadline=None)
@given(data=st.data(), size=st.integers(1, 40), count=st.integers(1, 120), capped=st.booleans(),
       cost=st.sampled_from([1.0, 0.5, 3.0, 0.1, 1e-17, 7.25]))
def test_place_run_is_the_heap_loop(data, size, count, capped, cost):
    """Loads on a coarse grid (ties, loads apart by whole costs), ranks in any numbering, limits of 1-4 items; where
    a level is found (always but for costs lost in the loads' rounding), the loop's ranks, counts and loads."""
    loads = np.sort(np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 4.5, 1e3]), min_size=size,
                                                max_size=size))))
    numbering = np.array(data.draw(st.permutations(range(size))), dtype=np.int64)
    ranks = np.empty(size, dtype=np.int64)
    order = np.lexsort((numbering, loads))
    loads, ranks = loads[order], numbering[order]
    limits = np.array(data.draw(st.lists(st.integers(1, 4), min_size=size, max_size=size))) if capped else None
    got = lpt_runs.place_run(loads, ranks, cost, count, limits)
    if got is None:
        assert cost == 1e-17
        return
    expected = heap_run(loads, ranks, cost, count, limits)
    for ours, theirs in zip(got, expected):
        assert np.array_equal(ours, theirs)


@settings(max_examples=60, deadline=None)
@given(num_ranks=st.integers(32, 72), share=st.sampled_from([1, 8, 10**6]), data=st.data())
def test_runs_of_equal_costs_give_the_heap_loop(num_ranks, share, data):
    """Few distinct costs (long runs, ties everywhere), zeros and a cost lost in the loads' rounding included, under
    any run share: the heap loop's plan."""
    values = st.sampled_from([0.0, 1e-17, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0])
    costs = np.array(data.draw(st.lists(values, min_size=1, max_size=6 * num_ranks)), dtype=np.float64)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lpt_runs, "RUN_SHARE", share)
        assert np.array_equal(lpt.greedy_unpadded(costs, num_ranks), heap_lpt(costs, num_ranks))


@settings(max_examples=60, deadline=None)
@given(num_ranks=st.integers(32, 48), share=st.sampled_from([1, 8]), slack=st.floats(0.9, 1.3),
       falling=st.booleans(), data=st.data())
def test_capped_runs_give_the_capped_loop(num_ranks, share, slack, falling, data):
    """Power-of-two lengths and 0, costs rising or falling with them (the uncapped plan then overflows), caps from
    infeasible to loose: the capped loop's plan, or no room where it finds none."""
    lengths = np.array(data.draw(st.lists(st.sampled_from([0, 1, 2, 4, 8, 16]), min_size=1,
                                          max_size=8 * num_ranks)), dtype=np.int64)
    costs = (64.0 / (lengths + 1)) if falling else lengths + 0.25 * lengths**2 + 0.5
    cap = max(int(lengths.sum() / num_ranks * slack), int(lengths.max()))
    expected = capped_lpt(costs, lengths, num_ranks, cap)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lpt_runs, "RUN_SHARE", share)
        try:
            got = lpt.solve(balancing_problem(lengths, costs, num_ranks, cap)).assignment
        except InfeasibleError:
            got = None
    assert (got is None) == (expected is None)
    assert got is None or np.array_equal(got, expected)


def test_regression_costs_from_1e_minus_300_to_1e300_under_a_cap_leaked_an_overflow_warning():
    """Cause (probe57 L1): a run's slots below the water level divided by a cost of 1e-300 overflowed to inf (then
    capped at the run's count, so the plan was right), and numpy warned: under warnings-as-errors `balance` failed
    with "algorithm 'lpt' raised RuntimeWarning"."""
    import warnings

    from orchmllm import balance

    rng = np.random.default_rng(31)
    num_ranks = int(rng.choice([1, 2, 3, 7, 64, 257, 4096, 4097, 5000, 8192]))  # probe57's draw: 257 ranks
    costs = rng.choice([1e300, 1e299, 1.5e300, 1e-300], int(rng.integers(1, 3 * num_ranks + 2)))
    rng.shuffle(costs)
    lengths = rng.integers(1, 5, costs.size)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = balance(lengths, num_ranks, costs=costs, algorithm="lpt", max_tokens_per_rank=8)
    assert np.array_equal(plan.assignment, capped_lpt(costs, lengths, num_ranks, 8))

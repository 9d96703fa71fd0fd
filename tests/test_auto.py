"""`auto` and its local search: bounded work and memory on large inputs (issue 11)."""

import tracemalloc

import numpy as np
import pytest

from orchmllm.balancers import make_problem
from orchmllm.balancers import auto, local_search, lpt
from orchmllm.balancers.problem import rank_loads, rank_tokens


def makespan(problem, assignment):
    return float(rank_loads(problem, assignment).max())


def test_exchange_pairs_of_a_rank_with_many_items_are_windowed_not_all_built():
    # The cause of the 10^6-item OOM: every pair of a rank's 15 625 items (122 million) was built.
    many = np.arange(2000)
    _, first, second = local_search._subsets_upto_two(
        many, np.zeros(many.size, dtype=np.int64), None, local_search._pair_offsets(many.size))
    pairs = int(np.count_nonzero(second >= 0))
    assert many.size - 1 <= pairs <= local_search.MAX_PAIRS_PER_RANK + many.size
    assert np.all(first[second >= 0] < second[second >= 0])


def test_exchange_pairs_of_a_rank_with_few_items_are_all_built():
    few = np.arange(128)
    _, _, second = local_search._subsets_upto_two(
        few, np.zeros(few.size, dtype=np.int64), None, local_search._pair_offsets(few.size))
    assert int(np.count_nonzero(second >= 0)) == 128 * 127 // 2


def test_local_search_on_thousands_of_items_per_rank_stays_linear_in_memory():
    # 40 000 items on 4 ranks: all pairs would be 4 x 50 million candidates (gigabytes).
    lengths = np.random.default_rng(11).integers(1, 5000, 40_000)
    problem = make_problem(lengths, 4)
    start = lpt.solve(problem).assignment
    tracemalloc.start()
    try:
        improved = local_search.improve(problem, start)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20
    assert makespan(problem, improved) <= makespan(problem, start)


def test_work_budget_grows_with_n_and_is_a_count_not_a_clock():
    assert local_search.default_work(10**6) > local_search.default_work(10**5) >= local_search.DEFAULT_WORK
    lengths = np.random.default_rng(5).integers(1, 1000, 60_000)
    problem = make_problem(lengths, 16)
    first, second = auto.solve(problem).assignment, auto.solve(make_problem(lengths.copy(), 16)).assignment
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("seed", range(6))
def test_windowed_pairs_never_worsen_a_start_and_keep_the_cap(monkeypatch, seed):
    # A tiny pair budget puts small instances on the windowed path that large ones take.
    monkeypatch.setattr(local_search, "MAX_PAIRS_PER_RANK", 4)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 200, 90)
    start = rng.integers(0, 5, lengths.size)
    cap = int(rank_tokens(make_problem(lengths, 5), start).max()) + int(rng.integers(0, 50))
    problem = make_problem(lengths, 5, max_tokens_per_rank=cap)
    improved = local_search.improve(problem, start)
    assert makespan(problem, improved) <= makespan(problem, start)
    assert rank_tokens(problem, improved).max() <= cap
    np.testing.assert_array_equal(improved, local_search.improve(problem, start.copy()))

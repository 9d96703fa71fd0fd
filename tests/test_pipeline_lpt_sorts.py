"""The shaped LPT's key sorts (`kernels.lpt`): a start's keys by introsort where they hold many runs
(`_START_SORT`), a round that reads a quarter of the keys or fewer sorting those alone (`_front_sorted`); the same
choices and sums as LPT's heap loop from the start loads."""

import heapq

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.kernels import lpt


def _heap_from(sorted_costs, start):
    """LPT from `start`: each cost (largest first) to the least (load, rank); the rank of each and the sums added."""
    heap = [(float(load), rank) for rank, load in enumerate(start)]
    heapq.heapify(heap)
    ranks = []
    for cost in sorted_costs.tolist():
        load, rank = heapq.heappop(heap)
        ranks.append(rank)
        heapq.heappush(heap, (load + cost, rank))
    sums = np.zeros(start.size)
    np.add.at(sums, ranks, sorted_costs)
    return np.array(ranks), sums


@settings(max_examples=60, deadline=None)
@given(st.integers(32, 160), st.floats(1.0, 1.3), st.integers(0, 2**32 - 1), st.sampled_from([1, 7, 1024]))
def test_greedy_from_a_raised_start_is_the_heap_loop(ranks, items_per_rank, seed, spread):
    """Few items a rank (the last round reads few keys: a partition first) from random integer start loads (keys of
    many runs: introsort): the choices and sums of the heap loop."""
    rng = np.random.default_rng(seed)
    count = int(ranks * items_per_rank)
    sorted_costs = np.sort(rng.integers(1, 50 * spread, count).astype(float))[::-1].copy()
    start = rng.integers(0, 20 * spread, ranks).astype(float)
    found = lpt.greedy_from(sorted_costs, ranks, np.arange(count), start, np.ones(count, dtype=np.int64))
    assert found is not None
    ranks_of, sums = _heap_from(sorted_costs, start)
    np.testing.assert_array_equal(found[0], ranks_of)
    np.testing.assert_array_equal(found[1], sums)


def test_front_sorted_sorts_the_keys_read_and_keeps_the_rest():
    """A quarter or fewer read: those sorted first (a partition), the rest the other keys; more: all sorted."""
    keys = np.random.default_rng(3).permutation(1000).astype(np.int64) * 7 + 1
    front = lpt._front_sorted(keys.copy(), 250)
    np.testing.assert_array_equal(front[:250], np.sort(keys)[:250])
    np.testing.assert_array_equal(np.sort(front), np.sort(keys))
    np.testing.assert_array_equal(lpt._front_sorted(keys.copy(), 251), np.sort(keys))

"""The zigzag layout of split items: every token on exactly one group rank, counts, balanced causal work."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmllm.balancers.context_parallel.layout import chunk_sizes, shard, shard_positions, shard_tokens, unshard

lengths_st = st.integers(min_value=0, max_value=2000)
degrees_st = st.integers(min_value=1, max_value=16)


def causal_work(length, degree):
    """Attention work of each group rank under a causal mask: a token at position p attends p + 1 keys."""
    return [int((shard_positions(length, degree, rank) + 1).sum()) for rank in range(degree)]


@given(lengths_st, degrees_st)
def test_every_token_on_exactly_one_group_rank(length, degree):
    positions = np.concatenate([shard_positions(length, degree, rank) for rank in range(degree)])
    assert np.array_equal(np.sort(positions), np.arange(length))


@given(st.lists(lengths_st, max_size=6), degrees_st)
def test_counts_sum_to_the_length_and_differ_by_at_most_one(lengths, degree):
    counts = shard_tokens(lengths, degree)
    assert counts.shape == (len(lengths), degree) and counts.dtype == np.int64
    assert counts.sum(axis=1).tolist() == lengths
    for length, row in zip(lengths, counts):
        assert row.max() - row.min() <= 1 and row.max() == -(-length // degree)
        assert row.tolist() == [len(shard_positions(length, degree, rank)) for rank in range(degree)]


@given(lengths_st, degrees_st)
def test_group_rank_k_holds_chunks_k_and_its_mirror(length, degree):
    sizes = chunk_sizes([length], degree)[0]
    assert sizes.max() - sizes.min() <= 1 and np.all(np.diff(sizes) <= 0)  # earlier chunks larger
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    for rank in range(degree):
        mirror = 2 * degree - 1 - rank
        expected = list(range(offsets[rank], offsets[rank + 1])) + list(range(offsets[mirror], offsets[mirror + 1]))
        assert shard_positions(length, degree, rank).tolist() == expected


@given(st.integers(min_value=0, max_value=200), degrees_st)
def test_causal_work_equal_when_2c_divides_the_length(quotient, degree):
    work = causal_work(quotient * 2 * degree, degree)
    assert max(work) == min(work)


@given(lengths_st, degrees_st)
def test_causal_work_differs_by_less_than_twice_the_length(length, degree):
    work = causal_work(length, degree)
    assert max(work) - min(work) < max(2 * length, 1)


@given(lengths_st, degrees_st, st.integers(min_value=1, max_value=3))
def test_unshard_inverts_shard(length, degree, width):
    item = np.arange(length * width, dtype=np.float64).reshape(length, width)
    parts = shard(item, degree)
    assert [len(part) for part in parts] == shard_tokens([length], degree)[0].tolist()
    assert np.array_equal(unshard(parts), item)


def test_degree_one_is_the_whole_item():
    assert shard_positions(5, 1, 0).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("call, error, match", [
    (lambda: shard_tokens([4], 0), ValueError, r"`degree` must be >= 1; got 0"),
    (lambda: shard_tokens([4, -1], 2), ValueError, r"`lengths` must be non-negative integers; got -1 at index 1"),
    (lambda: shard_tokens([4], 2.5), TypeError, r"`degree` must be an int"),
    (lambda: shard_positions(4, 2, 2), ValueError, r"`group_rank` must be in \[0, degree=2\); got 2"),
    (lambda: shard_positions(-4, 2, 0), ValueError, r"`length` must be >= 0; got -4"),
    (lambda: shard(3.0, 2), ValueError, r"`array` must have a token axis"),
    (lambda: unshard([]), ValueError, r"`shards` must be a non-empty sequence"),
    (lambda: unshard([[0], [1, 2, 3]]), ValueError, r"must hold \[2, 2\] tokens; got \[1, 3\]"),
])
def test_bad_input_is_a_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()

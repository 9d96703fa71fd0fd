"""The most and the fewest tokens of an item's shards from its length alone (`TimeTable.most_fewest`): ⌈l / c⌉ and
⌊l / c⌋ are the row maximum and minimum of `layout.shard_tokens` (its counts sum to l and differ by at most one),
which the layout's needs and the two tiers' deal read without reducing the shards."""

import numpy as np
import pytest

from orchmllm.balancers.context_parallel.layout import shard_tokens
from orchmllm.balancers.context_parallel.timetable import TimeTable
from orchmllm.tests.test_cp_layout_structures import GPUS, layout_inputs


@pytest.mark.parametrize("degree", [1, 2, 3, 4, 8, 16])
def test_most_and_fewest_tokens_of_a_shard_from_the_lengths(degree):
    rng = np.random.default_rng(degree)
    lengths = np.concatenate(([0, 1, degree - 1, degree, 2 * degree - 1, 2 * degree + 1], rng.integers(0, 10**6, 500)))
    problem, spec, _, _, _, _ = layout_inputs(lengths, 64, None, 0)
    table = TimeTable(problem, spec, GPUS, np.arange(lengths.size))
    rows = rng.permutation(lengths.size)
    most, fewest = table.most_fewest(rows, degree)
    shards = shard_tokens(lengths[rows], degree)
    np.testing.assert_array_equal(most, shards.max(axis=1))
    np.testing.assert_array_equal(fewest, shards.min(axis=1))


def test_needs_are_the_shards_with_their_most_and_fewest():
    lengths = np.random.default_rng(3).integers(0, 200_000, 300)
    problem, spec, _, _, _, _ = layout_inputs(lengths, 64, None, 0)
    table = TimeTable(problem, spec, GPUS, np.arange(0, lengths.size, 2))
    items = np.arange(0, lengths.size, 2)[::-1]
    for degree in spec.degrees:
        assert table.shards_of(items, degree) == [(row, max(row), min(row))
                                                  for row in shard_tokens(lengths[items], degree).tolist()]

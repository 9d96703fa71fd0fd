"""The split planner's `TimeTable` makes only its times for every item at once; the rows as lists, the item -> row
map and each degree's shard table are made where first asked (zeros_giants, D = 512 x 16, seed 11: a layout reads
2.8k of its tables' 111k rows one at a time).  What it answers is the eager table's, bit for bit."""

from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel.layout import shard_tokens
from orchmllm.balancers.context_parallel.timetable import TimeTable
from orchmllm.balancers.problem import make_problem
from orchmllm.tests.test_cp_layout_structures import COST, GPUS


def _table() -> tuple[TimeTable, np.ndarray, np.ndarray]:
    lengths = np.random.default_rng(3).integers(0, 70_000, 300)
    problem = replace(make_problem(lengths, 64, cost=COST), max_tokens_per_rank=32_768)
    items = np.flatnonzero(lengths > 20_000)[::-1]  # not ascending: rows are the order given
    return TimeTable(problem, ContextParallel(gpus_per_node=GPUS), GPUS, items), lengths, items


def test_lazy_parts_answer_as_the_eager_table():
    times, lengths, items = _table()
    for row, item in enumerate(items.tolist()):
        assert times.rows[item] == row and times.listed[row] == times.table[row].tolist()
        for k, c in enumerate(ContextParallel().degrees):
            assert times.time(item, c) == times.table[row, k]
            shards = shard_tokens(lengths[item: item + 1], c)[0].tolist()
            assert times.shard(item, c) == (shards, max(shards), min(shards))
    for c in ContextParallel().degrees:
        assert np.array_equal(times.shards[c], shard_tokens(lengths[items], c))
        assert times.shards_of(items[:5], c) == [times.shard(item, c) for item in items[:5].tolist()]


def test_a_table_makes_only_what_is_asked():
    """One item's time at degree 4 lists its row only and makes no shard table (the eager table listed every row
    and made every degree's shards)."""
    times, _, items = _table()
    times.time(int(items[7]), 4)
    assert list(times.listed) == [7] and not dict(times.shards)
    times.shard(int(items[7]), 8)
    assert list(dict(times.shards)) == [8]


def test_regression_an_item_outside_the_table_read_the_last_row():
    """a05d67e's item -> row map held -1 for an item outside the table, so `time`/`shard` of it answered the last
    row's (another item's) times and shards; the dict before it raised KeyError (rev51 F3), as now."""
    times, lengths, items = _table()
    outside = int(np.flatnonzero(lengths <= 20_000)[0])
    for ask in (times.time, times.shard):
        with pytest.raises(KeyError):
            ask(outside, 4)

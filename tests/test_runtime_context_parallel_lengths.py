"""probe55 N4 (fix56): a split item of 2**40 tokens raised MemoryError: the layout made its shards' positions (8 TiB
of int64) before anything said the length was absurd.  A split item's length and an unsplit sequence's are refused
above 2**32 tokens, naming the argument and the limit, before any allocation."""

import pytest

from orchmllm.runtime.context_parallel import ContextParallelLayout, SplitItem

LIMIT = r"must be at most 2\*\*32 tokens \(its positions are made whole, 8 bytes a token"


def test_regression_a_split_item_of_2_to_the_40_tokens_raised_memory_error():
    with pytest.raises(ValueError, match=r"`length of split item 7` " + LIMIT + r".*got 1099511627776"):
        SplitItem(item=7, length=2**40, group=(0, 1))


def test_regression_an_unsplit_sequence_of_2_to_the_40_tokens_raised_memory_error():
    with pytest.raises(ValueError, match=r"`sequences entry` " + LIMIT):
        ContextParallelLayout.planned(0, 2, [2**40], []).positions()


def test_the_limit_itself_is_a_length():
    split = SplitItem(item=0, length=2**32, group=(0, 1))  # the limit (a literal: the control runs on the parent)
    assert split.length == 2**32
    layout = ContextParallelLayout.planned(0, 1, [3], [])
    assert layout.positions().tolist() == [0, 1, 2]

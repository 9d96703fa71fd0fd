"""probe55: BalancedDistributedSampler(None, ...) raised AttributeError "'NoneType' object has no attribute 'flags'"
(the check of whether `lengths` had been checked read None's flags); it names `lengths` now, as for every other
value that is no sequence of lengths."""

import pytest

from orchmllm.runtime.sampler import BalancedDistributedSampler


def test_regression_lengths_none_raised_an_attribute_error():
    with pytest.raises(TypeError, match="`lengths` must be a 1-D sequence of integers; got NoneType"):
        BalancedDistributedSampler(None, num_replicas=2, rank=0, global_batch_size=2)


def test_lengths_set_to_none_after_use_is_named_too():
    sampler = BalancedDistributedSampler([3, 4, 5, 6], num_replicas=2, rank=0, global_batch_size=2)
    assert len(list(sampler)) == 2
    sampler.lengths = None
    with pytest.raises(TypeError, match="`lengths` must be a 1-D sequence of integers; got NoneType"):
        list(sampler)

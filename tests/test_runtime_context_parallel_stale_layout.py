"""probe55 N1 (fix56): a rank that attends with an earlier micro-batch's layout while its peers built new ones.

The header of a row schema was swapped once per layout: the stale layout's exchange had swapped it, so that rank sent
its payload where its peers sent their header.  With a layout of other split items the stale rank attended to the
peer's header row as keys, with no error, and its peer blamed "keys and values of another dtype or shape"; with rows
of other sizes gloo could abort.  Now every `ContextParallelLayout.build` (a collective, counted alike on every rank)
makes an earlier layout's exchange swap its header again at its next call, and the header carries a digest of the
layout's split items: every rank of the pair raises ContextParallelError naming the stale layout.  A layout used
again on every rank (activation checkpointing's recompute after the next micro-batch's build) still attends exactly."""

import torch
import torch.nn.functional as F

from orchmllm.runtime.context_parallel import (ContextParallelError, ContextParallelLayout, SplitItem,
                                               context_parallel_attention)
from orchmllm.runtime.launch import run_processes


def _build(length):
    split = SplitItem(item=0, length=length, group=(0, 1))
    return ContextParallelLayout.build([split], [split])


def _error(layout, seed):
    """The largest difference of this rank's attention on `layout` from SDPA over the whole item."""
    whole = [torch.randn(layout.splits[0].length, 1, 2, dtype=torch.float64,
                         generator=torch.Generator().manual_seed(seed + part)) for part in range(3)]
    positions = layout.positions()
    out = context_parallel_attention(*(t[positions] for t in whole), layout)
    expected = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in whole), is_causal=True)
    return float((out - expected.transpose(0, 1)[positions]).abs().max())


def _stale(rank, size):
    first = _build(8)
    _error(first, 0)
    second = _build(12)  # every rank builds the next micro-batch's layout; rank 0 attends with the first
    try:
        return _error(first if rank == 0 else second, 1)
    except ContextParallelError as error:
        return str(error)


def _used_again(rank, size):
    first = _build(8)
    errors = [_error(first, 0)]
    second = _build(8)  # the same split items
    errors += [_error(second, 1), _error(first, 2), _error(first, 3), _error(second, 4)]  # recompute: every rank
    third = _build(8)
    errors.append(_error(first if rank == 0 else third, 5))  # a stale layout of the same split items: the same
    return errors


def test_regression_a_stale_layout_of_other_split_items_was_read_silently():
    outcomes = run_processes(_stale, 2, timeout_s=60, collective_timeout_s=15)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert isinstance(o.value, str), (o.rank, o.value)  # rank 0 attended to its peer's header row before
        assert (f"context-parallel attention on rank {o.rank}: group peers rank {1 - o.rank} (split item 0 on group "
                f"(0, 1)) attend with a layout of other split items than this rank's; a layout kept from an earlier "
                f"micro-batch on some rank?") in o.value, o.value


def test_layouts_used_again_on_every_rank_attend_exactly():
    outcomes = run_processes(_used_again, 2, timeout_s=60, collective_timeout_s=15)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert max(error for o in outcomes for error in o.value) < 1e-12, [o.value for o in outcomes]

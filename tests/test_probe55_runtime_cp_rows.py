"""probe55: ranks of a context-parallel group whose keys and values differ in dtype or shape.

The K/V exchange sends rows of the keys and values flattened: rows of another size (float64 beside float32,
other kv heads) made gloo abort one process (SIGABRT, "Received data size doesn't match expected size") while
its peer reported a dead peer; rows of the same size (bfloat16 beside float16: "called it with causal=False";
2 heads of 4 beside 4 heads of 2: nothing) were misread.  Each pair now swaps a header row first and both raise
ContextParallelError naming the other's dtype and shapes.  Ranks that change their shapes together (layers of
other kv heads) still attend exactly."""

import pytest
import torch
import torch.nn.functional as F

from orchmllm.runtime.context_parallel import (ContextParallelError, ContextParallelLayout, SplitItem,
                                               context_parallel_attention)
from orchmllm.runtime.launch import run_processes

LENGTH = 8
ODD = {  # case -> per rank (dtype, kv heads, dim)
    "float64 beside float32": ((torch.float64, 1, 2), (torch.float32, 1, 2)),
    "bfloat16 beside float16": ((torch.bfloat16, 1, 2), (torch.float16, 1, 2)),
    "2 heads of 4 beside 4 of 2": ((torch.float32, 2, 4), (torch.float32, 4, 2)),
    "1 head beside 2": ((torch.float32, 1, 2), (torch.float32, 2, 2)),
}


def _qkv(rank, dtype, heads, dim, seed, layout=None):
    """This rank's shard of one item's q, k, v (the whole item drawn alike on every rank), and the whole item's; on
    `layout`, or a new one."""
    whole = [torch.randn(LENGTH, heads, dim, generator=torch.Generator().manual_seed(seed + part), dtype=torch.float64)
             for part in range(3)]
    split = SplitItem(item=0, length=LENGTH, group=(0, 1))
    layout = layout or ContextParallelLayout.build([split], [split])
    positions = layout.positions()
    return [t[positions].to(dtype) for t in whole], whole, layout, positions


def _job(rank, size):
    outcomes = {}
    for case, schemas in ODD.items():
        dtype, heads, dim = schemas[rank]
        (q, k, v), _, layout, _ = _qkv(rank, dtype, heads, dim, 0)
        try:
            context_parallel_attention(q, k, v, layout)
            outcomes[case] = "attended"
        except ContextParallelError as error:
            outcomes[case] = str(error)
    return outcomes


def _heads_job(rank, size):
    """Every rank changes its heads at the second call (a model whose layers differ): on new layouts, and on one
    layout whose exchange then agrees a second row schema (rev55 N2: `_Exchange.schemas` never held two)."""
    errors, shared = [], None
    for fresh in (True, False):
        for heads in (1, 3):
            (q, k, v), whole, layout, positions = _qkv(rank, torch.float64, heads, 2, heads, None if fresh else shared)
            shared = shared or layout
            out = context_parallel_attention(q, k, v, layout)
            expected = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in whole), is_causal=True)
            errors.append(float((out - expected.transpose(0, 1)[positions]).abs().max()))
    return errors, getattr(shared.exchange(True), "schemas", None)  # None on a497ade's parent: no header round


@pytest.fixture(scope="module")
def outcomes():
    return run_processes(_job, 2, timeout_s=60, collective_timeout_s=20)


@pytest.mark.parametrize("case", sorted(ODD))
def test_regression_group_peers_with_other_rows_aborted_or_misread_them(outcomes, case):
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]  # no rank aborted
    for o in outcomes:
        message = o.value[case]
        assert "group peers pass keys and values of another dtype or shape" in message, message
        dtype, heads, dim = ODD[case][1 - o.rank]
        assert f"rank {1 - o.rank} (split item 0 on group (0, 1)): {str(dtype)[6:]} keys ({heads}, {dim})" in message


@pytest.fixture(scope="module")
def heads_outcomes():
    """A job of its own: the odd cases' abort on a497ade's parent no longer fails these too (rev55 N2: a497ade's
    "6 of 6 fail on the parent" were 5; the heads case failed only through the shared job)."""
    return run_processes(_heads_job, 2, timeout_s=60, collective_timeout_s=20)


def test_ranks_changing_their_heads_together_attend_exactly(heads_outcomes):
    """Not a regression test: it passes on a497ade's parent, which had no header round."""
    assert all(o.ok for o in heads_outcomes), [o.error for o in heads_outcomes]
    assert max(error for o in heads_outcomes for error in o.value[0]) < 1e-12


def test_one_layout_agrees_a_second_row_schema(heads_outcomes):
    assert all(o.ok and len(o.value[1]) == 2 for o in heads_outcomes), [o.value for o in heads_outcomes]


def test_query_key_and_value_of_other_dtypes_are_named_before_any_exchange():
    split = SplitItem(item=0, length=4, group=(0,))
    layout = ContextParallelLayout.build([2, split], [split])
    q = k = torch.ones(6, 1, 2)
    with pytest.raises(ValueError, match="`query`, `key` and `value` must share one dtype and device; got "
                                         "torch.float32 on cpu, torch.float32 on cpu, torch.float64 on cpu"):
        context_parallel_attention(q, k, k.double(), layout)


def test_the_header_rows_ride_on_the_payloads_device():
    """rev55 F1: the header was a CPU tensor whatever the K/V rows' device, and NCCL moves no CPU tensor: every
    context-parallel call with peers failed on GPUs (blamed on a dead peer).  It is built on the given device."""
    from orchmllm.runtime.cp_rows import agree_rows

    class Exchange:
        send_rows, peer_items = {1: None, 3: None}, {1: "item 0", 3: "item 0"}

    seen = []

    def p2p(sends, recvs, exchange, group, phase):
        seen.append({t.device.type for t in [*sends.values(), *recvs.values()]})
        raise LookupError("stop before the host read: meta tensors hold no data")

    with pytest.raises(LookupError):
        agree_rows((1, 1, 2, 1, 2), Exchange, None, p2p, torch.device("meta"), 0, 0)
    assert seen == [{"meta"}]

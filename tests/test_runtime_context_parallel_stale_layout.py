"""probe55 N1 (fix56): a rank that attends with an earlier micro-batch's layout while its peers use new ones.

The header of a row schema was swapped once per layout: the stale layout's exchange had swapped it, so that rank sent
its payload where its peers sent their header.  The stale rank attended to the peer's header row as keys, with no
error, and its peer blamed "keys and values of another dtype or shape"; with rows of other sizes gloo aborted.  Now
every layout epoch of the group (a `ContextParallelLayout.build`, a dispatcher's exchange: collectives, counted alike
on every rank) makes an earlier layout's exchange swap its header again at its next call, and the header carries a
digest of the layout's epoch and split items: every rank of the pair raises ContextParallelError naming the stale
layout.  A layout used again on every rank (activation checkpointing's recompute after the next micro-batch's build)
still attends exactly."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from orchmllm.balancers import CostModel
from orchmllm.balancers.context_parallel import ContextParallel
from orchmllm.orchestrator.samples import Sample
from orchmllm.orchestrator.stages import Stage
from orchmllm.runtime import MultiStageRuntime, PostBalancingDispatcher
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


STALE = ("attend with a layout of another micro-batch ({}); a layout kept from an earlier micro-batch on some rank? "
         "every rank must attend with this micro-batch's layout")
OTHER_EPOCH = r"this rank's was made in layout epoch \d+: a `build` or an input exchange came between"
SAME_EPOCH = re.escape("other split items, made in the same layout epoch")


def _stale(rank, size, length):
    first = _build(8)
    _error(first, 0)
    second = _build(length)  # every rank builds the next micro-batch's layout; rank 0 attends with the first
    try:
        return _error(first if rank == 0 else second, 1)
    except ContextParallelError as error:
        return str(error)


def _used_again(rank, size):
    first = _build(8)
    errors = [_error(first, 0)]
    second = _build(8)  # the same split items
    errors += [_error(second, 1), _error(first, 2), _error(first, 3), _error(second, 4)]  # recompute: every rank
    return errors


SPEC = ContextParallel(degrees=(1, 2), gpus_per_node=2, half_efficiency_tokens=1, latency_s=0, kv_bytes_per_token=0,
                       seconds_per_cost=1.0)


def _dispatched(rank, size):
    """Two dispatched steps splitting item 0 over both ranks; rank 0 attends with the first step's layout again."""
    dispatcher = PostBalancingDispatcher(context_parallel=SPEC)
    micros = []
    for step in range(2):
        lengths = [(40, 3), (2, 5)][rank]
        x = torch.randn(sum(lengths), 1, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
        plan = dispatcher.plan(lengths)
        [micro] = dispatcher.microbatches(plan, dispatcher.dispatch({"x": x}, plan))
        micros.append(micro)
    use = micros[0] if rank == 0 else micros[1]
    q = use.data["x"]
    try:
        context_parallel_attention(q, q, q, use.layout)
    except ContextParallelError as error:
        return str(error)
    return "attended"


def _within_step(rank, size, stale):
    """One dispatched step of two micro-batches, each splitting an item over both ranks.  `stale`: rank 0 attends
    in micro-batch 1 with micro-batch 0's layout (fix58; before, it attended to its peer's header row as keys and
    gloo aborted its peer).  Else every rank attends with each micro-batch's layout, and in micro-batch 1 again
    with micro-batch 0's (activation checkpointing's recompute): what each call returned."""
    spec = ContextParallel(degrees=(1, 2), gpus_per_node=2, half_efficiency_tokens=1, latency_s=0,
                           kv_bytes_per_token=0, seconds_per_cost=1.0)
    dispatcher = PostBalancingDispatcher(context_parallel=spec, max_tokens_per_microbatch=24)
    x = torch.randn(40, 1, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    plan = dispatcher.plan([40])
    seen, outputs = [], []
    for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": x}, plan)):
        seen.append(micro)
        use = seen[0] if stale and rank == 0 else micro
        try:
            outputs.append(context_parallel_attention(*[use.data["x"]] * 3, use.layout))
        except ContextParallelError as error:
            return str(error)
        if micro.index == 1 and not stale:
            outputs.append(context_parallel_attention(*[seen[0].data["x"]] * 3, seen[0].layout))
    assert [len(micro.layout.splits) for micro in seen] == [1, 1] and seen[0].layout.splits != seen[1].layout.splits
    return "attended" if stale else torch.equal(outputs[0], outputs[2])


def _named(said: str, rank: int, items: str, when: str) -> bool:
    """Whether `said` is rank `rank`'s refusal of its peer's layout: the peer's split items (`items`), the epoch its
    layout was made in, and `when` (a pattern: OTHER_EPOCH or SAME_EPOCH)."""
    peer = re.escape(f"context-parallel attention on rank {rank}: group peers rank {1 - rank} ({items}; layout epoch ")
    return re.fullmatch(peer + r"\d+\) " + re.escape(STALE).replace(re.escape("{}"), when), said) is not None


def _named_stale(outcomes, items=(0, 0), when=OTHER_EPOCH):
    """Each rank names its peer, with the split item of the peer's exchange it attends with (`items`, by rank)."""
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert isinstance(o.value, str), (o.rank, o.value)  # rank 0 attended to its peer's header row before
        assert _named(o.value, o.rank, f"split item {items[o.rank]} on group (0, 1)", when), o.value


@pytest.mark.parametrize("length", [12, 8], ids=["other split items", "the same split items"])
def test_regression_a_stale_built_layout_was_read_silently_or_aborted(length):
    _named_stale(run_processes(_stale, 2, args=(length,), timeout_s=60, collective_timeout_s=15))


def test_regression_a_dispatched_steps_layout_kept_for_the_next_step_was_read_silently():
    _named_stale(run_processes(_dispatched, 2, timeout_s=60, collective_timeout_s=15))


def test_layouts_used_again_on_every_rank_attend_exactly():
    outcomes = run_processes(_used_again, 2, timeout_s=60, collective_timeout_s=15)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert max(error for o in outcomes for error in o.value) < 1e-12, [o.value for o in outcomes]


def test_regression_another_micro_batchs_layout_of_the_same_step_was_read_silently():
    """fix58: micro-batches of one dispatched step shared a layout epoch, so a rank attending with another
    micro-batch's layout swapped no header where its peer did (rank 0 attended, rank 1 aborted: SIGABRT).  Each
    micro-batch the loop reaches begins an epoch on every rank alike."""
    _named_stale(run_processes(_within_step, 2, args=(True,), timeout_s=60, collective_timeout_s=15), items=(0, 1),
                 when=SAME_EPOCH)


def test_a_dispatched_micro_batchs_layout_recomputed_in_the_next_attends_the_same():
    outcomes = run_processes(_within_step, 2, args=(False,), timeout_s=60, collective_timeout_s=15)
    assert [(o.ok, o.value) for o in outcomes] == [(True, True)] * 2, [o.error for o in outcomes]


def _listed(rank, size):
    """Two dispatched steps splitting item 0 over both ranks; in the first, rank 0 alone lists the micro-batches
    (for logging) before its loop: what each attention call did."""
    dispatcher, said = PostBalancingDispatcher(context_parallel=SPEC), []
    for step in range(2):
        x = torch.randn(43 if rank == 0 else 7, 1, 4, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(rank))
        plan = dispatcher.plan([(40, 3), (2, 5)][rank])
        moved = dispatcher.dispatch({"x": x}, plan)
        if rank == 0 and step == 0:
            list(dispatcher.microbatches(plan, moved))
        for micro in dispatcher.microbatches(plan, moved):
            try:
                said.append(context_parallel_attention(*[micro.data["x"]] * 3, micro.layout).shape[0])
            except ContextParallelError as error:
                said.append(str(error))
    return said


def test_regression_a_rank_that_listed_its_micro_batches_alone_attends_at_the_next_step():
    """fix60: every micro-batch a loop reached counted in the epoch a layout carries, so the next step's layouts of
    a rank that had listed a step's micro-batches alone carried another epoch than its peers': a correct program
    was refused as a stale layout on both ranks.  Only collectives count there now (the micro-batches reached still
    make an earlier layout swap its header again)."""
    outcomes = run_processes(_listed, 2, timeout_s=60, collective_timeout_s=15)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert [all(isinstance(said, int) for said in o.value) for o in outcomes] == [True, True], outcomes


def _multistage(rank, size, stale):
    """Two steps of a multi-stage runtime (text only) splitting both ranks' samples over both ranks.  `stale`: rank 0
    attends in the second step with the first step's pass layout; else rank 0 lists the first step's micro-batches
    before its loop (their layouts are made again there)."""
    runtime = MultiStageRuntime((Stage("llm", "llm", CostModel(linear=1)),), context_parallel=SPEC)
    embed, kept, said = nn.Embedding(16, 4).double(), [], []
    for step in range(2):
        length = 40 if rank == 0 else 3
        routes = runtime.plan([Sample(text=length, segments=(), source=rank, id=rank)])
        ids = torch.randint(0, 16, (length,), generator=torch.Generator().manual_seed(rank + step))
        moved = runtime.dispatch(routes, text={"input_ids": ids})
        if rank == 0 and step == 0 and not stale:
            list(runtime.microbatches(routes, moved))
        for micro in runtime.microbatches(routes, moved):
            x = runtime.forward(micro.routes, micro.data, encoders={}, text_embedding=embed).embeddings[:, None, :]
            kept.append(micro)
            layout = kept[0].layout if stale and rank == 0 else micro.layout
            try:
                said.append(context_parallel_attention(x, x, x, layout).shape[0])
            except ContextParallelError as error:
                said.append(str(error))
    return said


@pytest.mark.filterwarnings("ignore:`context_parallel` sets latency_s")
def test_regression_a_multistage_pass_layout_kept_for_the_next_step_is_named():
    """fix60: the multi-stage runtime began no layout epoch, so a rank that kept the first step's pass layout sent its
    payload where its peer sent a header: rank 0 attended to the header row as keys (no error), rank 1 aborted
    (SIGABRT).  Its input exchange and every pass its loop reaches now begin one, as the dispatcher's do."""
    outcomes = run_processes(_multistage, 2, args=(True,), timeout_s=60, collective_timeout_s=15)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert isinstance(o.value[0], int) and len(o.value) == 2, o.value
        assert _named(o.value[1], o.rank, "split item 0 on group (0, 1), split item 1 on group (0, 1)",
                      OTHER_EPOCH), o.value
    outcomes = run_processes(_multistage, 2, args=(False,), timeout_s=60, collective_timeout_s=15)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert [all(isinstance(said, int) for said in o.value) for o in outcomes] == [True, True], outcomes

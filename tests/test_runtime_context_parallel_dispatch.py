"""Split items through the dispatcher on real gloo groups: `balance(..., context_parallel=)` plans
move a giant's tokens as zigzag chunks in the one fused all-to-all, the micro-batch's layout feeds
`context_parallel_attention`, and the float64 loss and every gradient equal the unsplit
single-process reference within 1e-12 inside DDP and FSDP2; random plans (mixed degrees, groups,
micro-batch counts, empty ranks) lose and duplicate no token, every rank runs the same collectives,
and the exchange moves exactly the bytes the plan's shards need."""

import contextlib
import math
import re

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from orchmllm.balancers import CostModel
from orchmllm.balancers.context_parallel import ContextParallel
from orchmllm.balancers.context_parallel.layout import shard_tokens
from orchmllm.runtime import (ContextParallelError, DispatchPlan, GatheredMetadata, PlanMismatchError,
                              PostBalancingDispatcher, accumulate, context_parallel_attention, normalize_loss)
from orchmllm.runtime import dispatcher as dispatcher_module
from orchmllm.runtime.agreement import plan_word
from orchmllm.runtime.context_parallel import ContextParallelLayout, SplitItem
from orchmllm.runtime.counting import CollectiveCounter as Counter
from orchmllm.runtime.launch import spawn
from orchmllm.runtime.sharding import StepSharding

HIDDEN, HEADS, KV_HEADS, DIM = 4, 2, 1, 3
# a split costs its shard's share and nothing else, so tiny items split where that pays
SPEC = ContextParallel(degrees=(1, 2, 4), gpus_per_node=4, half_efficiency_tokens=1, latency_s=0,
                       kv_bytes_per_token=0, seconds_per_cost=1.0)
COST = CostModel(linear=1.0, quadratic=0.05)
# lengths each rank samples; the plans split item 0 over 4 ranks, and items 1, 2, 3 over 2 ranks; micro-batched
# (at most 24 tokens a rank and micro-batch) the third mixes degrees 2 and 4 over 2 micro-batches
STEPS = {4: ((40, 3, 2), (2, 1), (6, 3), (5,)), 2: ((31,), (12, 29), (36, 18), (22,)),
         "micro-batched": ((31, 12), (29,), (36, 18), (22, 5, 7))}
BUDGETS = {4: None, 2: None, "micro-batched": 24}


def step_data(homes, seed):
    """Per item (rank by rank): inputs, targets, padding mask, loss mask; the same on every rank."""
    rng = np.random.default_rng(seed)
    return [(torch.from_numpy(rng.standard_normal((length, HIDDEN))),
             torch.from_numpy(rng.standard_normal((length, HIDDEN))),
             torch.from_numpy(rng.random(length) < 0.2),
             torch.from_numpy(rng.random(length) < 0.7))
            for lengths in homes for length in lengths]


class PositionalAttention(nn.Module):
    """Sinusoidal positions (a learned frequency, so its gradient sees every position), then one
    grouped-query attention layer."""

    def __init__(self):
        super().__init__()
        self.frequency = nn.Parameter(torch.linspace(0.1, 0.7, HIDDEN))
        self.qkv = nn.Linear(HIDDEN, (HEADS + 2 * KV_HEADS) * DIM)
        self.out = nn.Linear(HEADS * DIM, HIDDEN)

    def forward(self, x, positions, attend):
        x = x + torch.sin(positions[:, None].to(x.dtype) * self.frequency)
        q, k, v = self.qkv(x).split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], dim=1)
        attended = attend(q.reshape(len(x), HEADS, DIM), k.reshape(len(x), KV_HEADS, DIM),
                          v.reshape(len(x), KV_HEADS, DIM))
        return self.out(attended.reshape(len(x), HEADS * DIM))


def naive_attention(q, k, v, padding):
    """Causal attention of one whole item written out; a query with no key left gets zeros."""
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(q.shape[2])
    allowed = ~padding[None, :].expand(len(q), -1) & torch.ones(len(q), len(q), dtype=torch.bool).tril()
    peak = scores.masked_fill(~allowed, -torch.inf).amax(-1, keepdim=True)
    weights = torch.exp(scores.masked_fill(~allowed, 0.0) - torch.where(torch.isfinite(peak), peak, 0.0)) * allowed
    return torch.einsum("hqk,khd->qhd", weights / weights.sum(-1, keepdim=True).clamp_min(1e-300), v)


def reference(homes, seed):
    """Unsplit, unbalanced, one process: every item's output, and the gradients of the global mean loss."""
    torch.manual_seed(0)
    model = PositionalAttention().double()
    data = step_data(homes, seed)
    outputs = [model(x, torch.arange(len(x)), lambda q, k, v, p=padding: naive_attention(q, k, v, p))
               for x, _, padding, _ in data]
    loss_tokens = sum(int(mask.sum()) for *_, mask in data)
    loss = sum(((out * target).sum(-1) * mask).sum() for out, (_, target, _, mask) in zip(outputs, data))
    (loss / loss_tokens).backward()
    return [out.detach() for out in outputs], [p.grad for p in model.parameters()]


def dispatch_job(rank, size, homes, seed, wrapper, budget):
    torch.manual_seed(0)
    model = PositionalAttention().double()
    if wrapper == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard
        wrapped = fully_shard(model)
    data = step_data(homes, seed)
    first = sum(len(lengths) for lengths in homes[:rank])
    mine = data[first:first + len(homes[rank])]
    batch = {key: torch.cat([item[part] for item in mine]) for part, key in enumerate(("x", "target", "pad", "loss"))}
    batch["sample"] = torch.arange(first, first + len(mine))
    dispatcher = PostBalancingDispatcher(cost=COST, context_parallel=SPEC, per_item_keys={"sample"},
                                         max_tokens_per_microbatch=budget)
    lengths = list(homes[rank])
    plan = dispatcher.plan(lengths, loss_tokens=[int(item[3].sum()) for item in mine])
    moved = dispatcher.dispatch(batch, plan, lengths=lengths)
    outputs, loss_tokens = {}, 0
    for micro in dispatcher.microbatches(plan, moved):
        with accumulate(wrapped, micro):
            d = micro.data
            attend = lambda q, k, v: context_parallel_attention(q, k, v, micro.layout,  # noqa: E731
                                                                key_padding_mask=d["pad"])
            out = wrapped(d["x"], micro.layout.positions(), attend)
            normalize_loss(((out * d["target"]).sum(-1) * d["loss"]).sum(), micro).backward()
            outputs.update(zip(micro.items.tolist(), out.detach().split(micro.lengths.tolist())))
            loss_tokens += int(d["loss"].sum())
    out = torch.cat([outputs[item] for item in plan.local_items.tolist()] + [torch.zeros(0, HIDDEN).double()])
    home = dispatcher.combine({"out": out, "sample": moved["sample"]}, plan, split_reduce="first", order="local_items",
                              differentiable=False)
    grads = [p.grad.full_tensor() if wrapper == "fsdp2" else p.grad for p in model.parameters()]
    return grads, home, loss_tokens, plan.num_loss_tokens, plan.balance.degree.tolist(), plan.num_microbatches


def relative_error(got, expected):
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    difference = float((got - expected).abs().max()) if expected.numel() else 0.0
    return difference / scale if scale else difference


@pytest.mark.background
@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
@pytest.mark.parametrize("step", [2, 4, "micro-batched"])
def test_split_items_through_the_dispatcher_train_as_the_unsplit_reference(step, wrapper):
    homes, seed = STEPS[step], len(str(step))
    results = spawn(dispatch_job, 4, args=(homes, seed, wrapper, BUDGETS[step]), timeout_s=120)
    outputs, expected = reference(homes, seed)
    assert set(results[0][4]) == ({1, step} if step != "micro-batched" else {2, 4})  # the plan split giants
    assert results[0][5] == (1 if BUDGETS[step] is None else 2)
    assert sum(result[2] for result in results) == results[0][3]  # every loss token counted once
    first = 0
    for rank, (grads, home, *_) in enumerate(results):
        assert max(relative_error(g, r) for g, r in zip(grads, expected)) <= 1e-12
        count = len(homes[rank])
        assert home["sample"].tolist() == list(range(first, first + count))  # per-item rows: group rank 0's
        assert relative_error(home["out"], torch.cat(outputs[first:first + count])) <= 1e-12  # reassembled
        first += count


def random_step(rng, size):
    """Lengths per home rank (some ranks none), and per item a micro-batch and a group (degree 1, 2, 3,
    4 or 8 up to the world; distinct ranks in any order)."""
    counts = rng.integers(0, 4, size=size)
    lengths = rng.integers(0, 13, size=int(counts.sum()))
    degree = rng.choice([d for d in (1, 2, 3, 4, 8) if d <= size], size=lengths.size)
    groups = np.concatenate([rng.permutation(size)[:d] for d in degree]) if lengths.size else np.zeros(0, np.int64)
    count = int(rng.integers(1, 4))
    return counts, lengths, degree, groups, rng.integers(0, count, size=lengths.size), count


def needed_bytes(counts, lengths, degree, groups, rank, row_bytes, item_bytes):
    """Bytes rank `rank` must send for its items' tokens (and per-item rows) to reach their groups."""
    first = int(counts[:rank].sum())
    starts = np.cumsum(degree) - degree
    total = 0
    for item in range(first, first + int(counts[rank])):
        group = groups[starts[item]:starts[item] + degree[item]].tolist()
        shares = shard_tokens([lengths[item]], degree[item])[0] if degree[item] > 1 else [lengths[item]]
        total += sum(int(tokens) * row_bytes + item_bytes for tokens, peer in zip(shares, group) if peer != rank)
    return total


def check_microbatch(micro):
    """What is wrong with a dispatched micro-batch of (item, position) token rows, or None."""
    layout, tokens = micro.layout, micro.data["token"]
    if not torch.equal(micro.data["item"], torch.from_numpy(micro.items)):
        return "per-item rows differ from the micro-batch's items"
    if list(layout.lengths) != micro.lengths.tolist() or sum(layout.lengths) != len(tokens):
        return "the layout's sequences differ from the micro-batch's rows"
    for item, entry, part in zip(micro.items.tolist(), layout.sequences, torch.split(tokens, list(layout.lengths))):
        if not (part[:, 0] == item).all() or getattr(entry, "item", item) != item:
            return f"sequence of item {item} holds rows of other items"
    if not torch.equal(tokens[:, 1], layout.positions()):
        return "positions differ from the tokens' unsplit positions"
    return None


def random_plans_job(rank, size, seed, count):
    counter = Counter()
    dispatcher = PostBalancingDispatcher(context_parallel=ContextParallel(degrees=(1, 2, 4, 8)),
                                         per_item_keys={"item"})
    rng = np.random.default_rng(seed)
    problems, per_plan, held, expected = [], [], [], []
    for number in range(count):
        counts, lengths, degree, groups, microbatch, num_microbatches = random_step(rng, size)
        mine = np.arange(int(counts[:rank].sum()), int(counts[:rank + 1].sum()))
        metadata = GatheredMetadata(np.stack([lengths, lengths], axis=1), counts)  # what the all-gather gives
        words = (dispatcher.config_fingerprint, metadata.counts, metadata.values)
        sharding = StepSharding.from_groups(lengths, counts, degree, groups, microbatch, rank,
                                            lambda digest: plan_word(*words, digest))
        plan = DispatchPlan(metadata, None, sharding.route, 0.0, microbatch, num_microbatches, sharding,
                            dispatcher.config_fingerprint, dispatcher.config_options)
        token_ids = torch.cat([torch.zeros(0, 2, dtype=torch.int64)] + [
            torch.stack([torch.full((int(lengths[i]),), i), torch.arange(int(lengths[i]))], 1) for i in mine])
        before, sent = dict(counter.calls), counter.sent
        moved = dispatcher.dispatch({"token": token_ids, "item": torch.from_numpy(mine)}, plan)
        sent = counter.sent - sent
        micros = list(dispatcher.microbatches(plan, moved))
        problems += [(number, problem) for problem in map(check_microbatch, micros) if problem]
        if len(micros) != num_microbatches:
            problems.append((number, f"{len(micros)} micro-batches of {num_microbatches}"))
        home = dispatcher.combine(moved, plan, split_reduce="first", order="local_items", differentiable=False)
        if not (torch.equal(home["token"], token_ids) and torch.equal(home["item"], torch.from_numpy(mine))):
            problems.append((number, "combine did not reassemble the home rows"))
        needed = needed_bytes(counts, lengths, degree, groups, rank, 16, 8)
        if sent != needed:
            problems.append((number, f"dispatch sent {sent} bytes, the plan's shards need {needed}"))
        per_plan.append(tuple(counter.calls[kind] - before[kind] for kind in Counter.KINDS))
        held.append(torch.zeros(lengths.size, 13, dtype=torch.int64))  # copies of each (item, position) here
        held[-1].index_put_((moved["token"][:, 0], moved["token"][:, 1]), torch.ones(len(moved["token"]),
                            dtype=torch.int64), accumulate=True)
        expected.append((torch.arange(13)[None, :] < torch.from_numpy(lengths)[:, None]).long())
    everywhere = torch.cat(held)  # every plan's copies summed over the ranks in one all-reduce, after the last plan
    dist.all_reduce(everywhere)
    for number, (copies, wanted) in enumerate(zip(torch.split(everywhere, [len(h) for h in held]), expected)):
        if not torch.equal(copies, wanted):
            problems.append((number, "tokens lost or duplicated across the ranks"))
    return problems, per_plan


@pytest.mark.background
@pytest.mark.parametrize("size, count", [(2, 400), (3, 300), (5, 200), (8, 100)])  # 1000 plans (issue 27)
def test_random_plans_lose_no_token_and_run_the_same_collectives(size, count):
    results = spawn(random_plans_job, size, args=(size, count), timeout_s=300)
    assert [problem for problems, _ in results for problem in problems] == []
    per_plan = [calls for _, calls in results]
    assert all(calls == per_plan[0] for calls in per_plan)  # every rank, every plan: the same collectives
    # dispatch: a guard all-reduce and an all-to-all (a plan built by hand is never the one every rank expects);
    # combine: its all-to-all, whose header rides in it from the second plan on (issue 24); split items or not
    # (all_gather, all_gather_object, all_reduce, all_to_all_single, batch_isend_irecv, broadcast); the token
    # check's all-reduce comes after the last plan
    assert per_plan[0][0] == (0, 0, 2, 2, 0, 0) and set(per_plan[0][1:]) == {(0, 0, 1, 2, 0, 0)}


def unsplit_groups(plan, num_items):
    """A planner that, on one rank, left every item whole (a time-limited search stopping elsewhere)."""
    return np.asarray(plan.assignment, dtype=np.int64), np.ones(num_items, dtype=np.int64)


def other_split_job(rank, size, homes):
    if rank == 1:
        dispatcher_module.item_groups = unsplit_groups
    dispatcher = PostBalancingDispatcher(cost=COST, context_parallel=SPEC)
    lengths = list(homes[rank])
    plan = dispatcher.plan(lengths)
    try:
        dispatcher.dispatch({"x": torch.zeros(sum(lengths), 2)}, plan)
    except PlanMismatchError as error:
        return str(error)
    return None


def test_ranks_whose_plans_split_differently_stop_at_the_exchange_naming_them():
    """The groups, degrees and chunk layout ride in the plan word the exchange checks: with the same
    assignment but no split on rank 1, rank 1's rows would be cut by other chunk sizes."""
    errors = spawn(other_split_job, 4, args=(STEPS[4],), timeout_s=60)
    assert all(error is not None and "ranks [1] disagree" in error for error in errors), errors


SCORE_HOMES = ((40, 3), (2, 5))  # item 0 split over both ranks (2 × 2 zigzag chunks), the rest whole


def per_item_score_job(rank, size, split_reduce):
    """Each rank scores every item it holds by the sum of its rows' positions (a sequence log-prob computed
    shard by shard) and sends the scores home with `combine`; the home gets, per item, the positions' sum.
    `split_reduce` "mixed": rank 0 passes "sum", rank 1 "first"."""
    if split_reduce == "mixed":
        split_reduce = "first" if rank else "sum"
    spec = ContextParallel(degrees=(1, 2), gpus_per_node=2, half_efficiency_tokens=1, latency_s=0,
                           kv_bytes_per_token=0, seconds_per_cost=1.0)
    dispatcher = PostBalancingDispatcher(cost=COST, context_parallel=spec, per_item_keys={"sid"})
    lengths = list(SCORE_HOMES[rank])
    first = len(SCORE_HOMES[0]) if rank else 0
    positions = torch.cat([torch.arange(length, dtype=torch.float64) for length in lengths]).requires_grad_()
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch({"pos": positions, "sid": 10 + torch.arange(first, first + len(lengths))}, plan,
                                differentiable=True)
    outputs = [{"sid": micro.data["sid"],
                "score": torch.stack([rows.sum() for rows in micro.data["pos"].split(micro.lengths.tolist())])}
               for micro in dispatcher.microbatches(plan, moved)]
    try:
        home = dispatcher.combine(outputs, plan, per_item_keys=("sid", "score"), split_reduce=split_reduce)
    except ValueError as error:
        return plan.balance.degree.tolist(), str(error)
    home["score"].sum().backward()
    return plan.balance.degree.tolist(), home["score"].tolist(), home["sid"].tolist(), positions.grad.tolist()


@pytest.mark.parametrize("split_reduce", ["sum", {"score": "sum", "sid": "first"}], ids=["sum", "per key"])
def test_regression_a_per_item_output_of_a_split_item_came_home_as_group_rank_0s_partial_row(split_reduce):
    """`combine` kept group rank 0's row of a per-item output: a score summed shard by shard came home as
    390 of 780 (zigzag shards hold equal position sums).  `split_reduce="sum"` adds the group's rows (and
    their gradients flow back to every shard); "first" keeps group rank 0's (an id every rank holds)."""
    results = spawn(per_item_score_job, 2, args=(split_reduce,), timeout_s=60)
    for rank, (degree, scores, sids, grads) in enumerate(results):
        assert degree[0] == 2
        assert scores == [float(sum(range(length))) for length in SCORE_HOMES[rank]]
        ids = [10 + item for item in range(2 * rank, 2 * rank + 2)]
        assert sids == (ids if split_reduce != "sum" or rank else [20, 11])  # "sum" adds the ids too
        assert grads == [1.0] * sum(SCORE_HOMES[rank])


def test_a_per_item_output_of_a_split_item_without_split_reduce_is_refused_on_every_rank():
    results = spawn(per_item_score_job, 2, args=(None,), timeout_s=60)
    for degree, error in results:
        assert re.search(r"combine: item 0 is split over ranks \[0, 1\] and its per-item outputs \['score', 'sid'\] "
                         r"have a row on each: pass split_reduce='sum' .* or 'first'", error), error


def test_regression_a_split_items_per_item_key_was_labelled_per_token_in_a_schema_mismatch():
    """Cause (probe7 P7-04): the schema of a piece whose rows per item are an array read "(per token)", and a
    split plan's per-item keys have an array (a row per rank of a split item's group)."""
    for degree, error in spawn(per_item_score_job, 2, args=("mixed",), timeout_s=60):
        assert "the schema of the pieces differs across ranks" in error, error
        assert "score (split_reduce='sum'): float64[] (per item)" in error and "score: float64[] (per item)" in error
        assert "sid: int64[] (per item)" in error and "(per token)" not in error, error


@contextlib.contextmanager
def monkeypatched_host_reads():
    """Every way a tensor's value reaches the host (`tolist`, `item`, `bool`) raises inside the body."""
    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read on the host")
    saved = {name: getattr(torch.Tensor, name) for name in ("tolist", "item", "__bool__")}
    for name in saved:
        setattr(torch.Tensor, name, refuse)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def attention_slip_job(rank, size, slip):
    """Item 0 (40 tokens) split over both ranks; rank 0's shard has 3 padded rows.  "mask where padded": each
    rank passes its mask only where it has padding (`mask if mask.any() else None`), returned against both
    ranks passing theirs; "causal differs": rank 1 attends without the causal mask; "causal differs later": so
    does it at the third call, after both ranks called with either flag; "padding added later": rank 0's shard
    has its padding at the second call only (its peer, which found none at the first, attends unmasked); "host
    reads": every rank passes its mask, and the calls after the first may read no tensor on the host."""
    spec = ContextParallel(degrees=(1, 2), gpus_per_node=2, half_efficiency_tokens=1, latency_s=0,
                           kv_bytes_per_token=0, seconds_per_cost=1.0)
    dispatcher = PostBalancingDispatcher(cost=COST, context_parallel=spec)
    lengths = list(SCORE_HOMES[rank])
    x = torch.randn(sum(lengths), 1, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    plan = dispatcher.plan(lengths)
    [micro] = dispatcher.microbatches(plan, dispatcher.dispatch({"x": x}, plan))
    q = micro.data["x"]
    padding = torch.zeros(len(q), dtype=torch.bool)
    padding[:3] = rank == 0
    calls = {"causal differs": [{"causal": rank == 0}],
             "causal differs later": [{"causal": True}, {"causal": False}, {"causal": rank == 0}],
             "padding added later": [{}, {"key_padding_mask": padding}, {}]}.get(slip)
    if calls is not None:
        try:
            for arguments in calls:
                context_parallel_attention(q, q, q, micro.layout, **arguments)
        except ContextParallelError as error:
            return str(error)
        return None
    if slip == "host reads":
        first = context_parallel_attention(q, q, q, micro.layout, key_padding_mask=padding)
        with monkeypatched_host_reads():
            later = context_parallel_attention(q, q, q, micro.layout, key_padding_mask=padding)
        return float((later - first).abs().max())
    mixed = context_parallel_attention(q, q, q, micro.layout, key_padding_mask=padding if padding.any() else None)
    both = context_parallel_attention(q, q, q, micro.layout, key_padding_mask=padding)
    return float((mixed - both).abs().max())


def test_regression_a_rank_passing_no_padding_mask_attended_to_its_peers_padded_keys():
    """The padding column went out, but a rank that passed no mask ignored its peers': rank 1 attended to
    rank 0's 3 padded keys of their split item (off by 0.578), no error."""
    assert spawn(attention_slip_job, 2, args=("mask where padded",), timeout_s=60) == [0.0, 0.0]


def test_regression_a_group_calling_attention_with_other_causal_flags_was_silent():
    errors = spawn(attention_slip_job, 2, args=("causal differs",), timeout_s=60)
    for rank, error in enumerate(errors):
        assert error is not None and f"attention on rank {rank} with causal={rank == 0}: a peer of its split items' " \
            f"groups (rank {1 - rank}: split item 0 on group (0, 1)) called it with causal={rank != 0}" in error, error


def test_a_group_whose_flags_or_padding_change_at_a_later_call_raises_on_every_rank():
    """Later calls of a layout read no flag on the host, but a rank that has called it with either `causal`
    reads every call's, and a new mask is compared with the first call's: a peer that found no padding there
    attends unmasked.  The rank that pads more raises; its peer stops at its next call."""
    for rank, error in enumerate(spawn(attention_slip_job, 2, args=("causal differs later",), timeout_s=60)):
        assert error is not None and f"attention on rank {rank} with causal={rank == 0}: a peer" in error, error
    first, peer = spawn(attention_slip_job, 2, args=("padding added later",), timeout_s=60, collective_timeout_s=20)
    assert first is not None and "attention on rank 0: `key_padding_mask` pads tokens that it did not pad at the " \
        "first call with this layout (causal=True)" in first, first
    assert peer is not None and "the K/V exchange (forward) with its group peers failed (rank 0: split item 0" in peer


def test_regression_every_split_attention_call_read_its_flags_on_the_host():
    """P4-18's check read two flags on the host at every call with split items (a GPU sync per layer): later
    calls of a layout now read nothing: in a gloo group with every host read refused, and on meta tensors (no
    data); the first call checks."""
    assert spawn(attention_slip_job, 2, args=("host reads",), timeout_s=60) == [0.0, 0.0]
    split = SplitItem(item=0, length=8, group=(0,))
    q = torch.randn(8, 2, 4, dtype=torch.float64)
    for mask in (None, torch.arange(8) < 2):
        layout = ContextParallelLayout.build([split], [split])
        context_parallel_attention(q, q, q, layout, causal=mask is None, key_padding_mask=mask)
        meta = q.to("meta")
        assert context_parallel_attention(meta, meta, meta, layout, causal=mask is None,
                                          key_padding_mask=mask).shape == (8, 2, 4)

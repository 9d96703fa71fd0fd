"""Gradient accumulation over post-balanced micro-batches, in real gloo groups: DDP, FSDP2 and the
multi-stage runtime give the gradients of one pass over the global batch."""

import contextlib
import re
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from orchmllm.balancers import CostModel
from orchmllm.orchestrator.samples import Sample
from orchmllm.runtime import MultiStageRuntime, PostBalancingDispatcher, all_reduce_gradients, normalize_loss
from orchmllm.runtime.demo.data import IGNORE, SyntheticMultimodal
from orchmllm.runtime.demo import compare_gradients, demo_stages
from orchmllm.runtime.launch import spawn
from orchmllm.runtime.microbatch import ModelContractError, accumulate
from orchmllm.runtime.pairing import split_rows
from orchmllm.runtime.demo.model import ModelConfig, TinyMultimodalModel

LENGTHS = {0: [9, 1, 7, 12, 3, 5], 1: [2, 2], 2: [], 3: [15, 4, 4, 11]}  # rank 2 samples nothing
BUDGET = 16  # tokens per rank and micro-batch: 73 tokens on 4 ranks need at least 2 micro-batches


class TokenModel(nn.Module):
    """Per-token model whose every parameter takes part even in an empty micro-batch."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.hidden = nn.Linear(8, 8)
        self.head = nn.Linear(8, 50)

    def forward(self, tokens):
        return self.head(torch.tanh(self.hidden(self.embed(tokens))))


def rank_batch(rank, per_rank=LENGTHS):
    lengths = per_rank[rank]
    generator = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, 50, (sum(lengths),), generator=generator)
    labels = torch.randint(-1, 50, (sum(lengths),), generator=generator)  # -1: no loss on this token
    return lengths, tokens, labels


def loss_tokens(lengths, labels):
    return [int(part.ge(0).sum()) for part in labels.split(lengths)] if lengths else []


def reference_gradients():
    """One pass over the global batch in one process: sum of token losses / global loss tokens."""
    torch.manual_seed(0)
    model = TokenModel().double()
    tokens = torch.cat([rank_batch(r)[1] for r in LENGTHS])
    labels = torch.cat([rank_batch(r)[2] for r in LENGTHS])
    loss = nn.functional.cross_entropy(model(tokens), labels, ignore_index=-1, reduction="sum")
    (loss / labels.ge(0).sum()).backward()
    return [p.grad.numpy().copy() for p in model.parameters()]


def accumulated(model, wrapped, rank, num_microbatches):
    """A micro-batched step through the dispatcher; returns (micro-batch count, my items per micro)."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET, num_microbatches=num_microbatches)
    lengths, tokens, labels = rank_batch(rank)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    moved = dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)
    sizes = []
    for micro in dispatcher.microbatches(plan, moved):
        with accumulate(wrapped, micro):
            logits = wrapped(micro.data["tokens"])
            loss_sum = nn.functional.cross_entropy(logits, micro.data["labels"], ignore_index=-1, reduction="sum")
            normalize_loss(loss_sum, micro).backward()
        sizes.append(int(micro.items.size))
        assert int(plan.lengths[micro.items].sum()) <= BUDGET
        # packed attention's per-sample lengths (there were none): the micro-batch's tokens, item by item
        assert micro.lengths.tolist() == plan.lengths[micro.items].tolist()
        assert micro.lengths.dtype == torch.int64 and int(micro.lengths.sum()) == micro.data["tokens"].shape[0]
    return plan.num_microbatches, sizes


def ddp_job(rank, size, num_microbatches):
    torch.manual_seed(0)
    model = TokenModel().double()
    ddp = nn.parallel.DistributedDataParallel(model)
    count, sizes = accumulated(model, ddp, rank, num_microbatches)
    return count, sizes, [p.grad.numpy().copy() for p in model.parameters()]


def fsdp_job(rank, size, num_microbatches):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TokenModel().double()
    fully_shard(model)
    count, sizes = accumulated(model, model, rank, num_microbatches)
    return count, sizes, [p.grad.full_tensor().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("num_microbatches", [None, 6], ids=["smallest_m", "m6_with_empty_cells"])
@pytest.mark.parametrize("job", [ddp_job, fsdp_job], ids=["ddp", "fsdp2"])
def test_accumulated_micro_batches_give_the_global_gradient(job, num_microbatches):
    results = spawn(job, len(LENGTHS), args=(num_microbatches,), timeout_s=120)
    counts = {count for count, _, _ in results}
    assert len(counts) == 1 and counts.pop() >= (num_microbatches or 2)  # every rank ran the same M >= 2
    sizes = [size for _, per_micro, _ in results for size in per_micro]
    assert sum(sizes) == sum(len(v) for v in LENGTHS.values())  # every sample once
    if num_microbatches == 6:  # 14 items in 24 cells: empty micro-batches ran every collective too
        assert 0 in sizes
    reference = reference_gradients()
    for _, _, grads in results:
        worst = max(float(np.abs(g - r).max() / np.abs(r).max()) for g, r in zip(grads, reference))
        assert worst <= 1e-12


class EarlyReturnModel(TokenModel):
    """Returns logits through the embedding alone on an empty micro-batch (a natural guard), leaving `hidden` and
    `head` out of that rank's graph."""

    def forward(self, tokens):
        if tokens.numel() == 0:
            return self.embed(tokens) @ torch.zeros(8, 50, dtype=self.embed.weight.dtype)
        return super().forward(tokens)


def early_return_job(rank, size, wrap):
    """A step of 6 micro-batches (14 items in 24 cells: ranks with an empty last micro-batch) through a DDP or
    FSDP2 model that returns early on empty input; what each rank raised, and its gradients' sum."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = EarlyReturnModel().double()
    wrapped = nn.parallel.DistributedDataParallel(model) if wrap == "ddp" else fully_shard(model)
    try:
        accumulated(model, wrapped, rank, 6)
    except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
        return type(error).__name__, str(error)
    return "no error", ""


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_regression_a_model_returning_early_on_an_empty_micro_batch_trained_on_unreduced_gradients(wrap):
    """Cause (probe8 P8-01): the runtime hands every rank every micro-batch, an empty one included, and a model that
    returns early there leaves parameters out of the backward that reduces gradients: DDP left their gradients
    unreduced without an error (off by a relative 0.24), or the ranks' reductions paired up different buckets.
    Now the first `normalize_loss(loss, micro)` of that micro-batch checks the loss's graph on every rank (the
    runtime's first step, and any step where a rank's last micro-batch is empty) and every rank raises."""
    outcomes = spawn(early_return_job, len(LENGTHS), args=(wrap,), timeout_s=120)
    assert {kind for kind, _ in outcomes} == {"ModelContractError"}, outcomes
    named = [message for _, message in outcomes if "does not depend on parameters" in message]
    assert named and all(message.endswith("every rank where unused parameters are harmless") for _, message in outcomes)
    prefix = "module." if wrap == "ddp" else ""
    for message in named:
        assert f"does not depend on parameters {prefix}head.bias, {prefix}head.weight, {prefix}hidden.bias, " \
               f"{prefix}hidden.weight of the model" in message, message
        assert ("the loss given to `normalize_loss` in micro-batch 5 of 6 (whose backward reduces gradients; 0 "
                "items on rank") in message
    others = [message for _, message in outcomes if message not in named]
    assert all("this rank stops with them" in message for message in others), others


class TwoHeadModel(TokenModel):
    """Logits and a value per token: every parameter takes part, the loss is normalised in two parts."""

    def __init__(self):
        super().__init__()
        self.value = nn.Linear(8, 1)

    def forward(self, tokens):
        hidden = torch.tanh(self.hidden(self.embed(tokens)))
        return self.head(hidden), self.value(hidden).squeeze(-1)


def two_part_loss_job(rank, size, wrap):
    """A step of 6 micro-batches (ranks with an empty last one) whose loss is two parts normalised apart, or one
    part normalised and another added after: what each rank raised, and its gradients."""
    torch.manual_seed(0)
    model = TwoHeadModel().double()
    wrapped = nn.parallel.DistributedDataParallel(model)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET, num_microbatches=6)
    lengths, tokens, labels = rank_batch(rank)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    moved = dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)
    try:
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(wrapped, micro):
                logits, values = wrapped(micro.data["tokens"])
                policy = nn.functional.cross_entropy(logits, micro.data["labels"], ignore_index=-1, reduction="sum")
                value = values.square().sum()
                if wrap == "two parts":
                    (normalize_loss(policy, micro) + normalize_loss(value, micro)).backward()
                else:
                    (normalize_loss(policy, micro) + 1e-3 * value).backward()
    except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
        return type(error).__name__, str(error)
    return "no error", [p.grad.abs().sum().item() for p in model.parameters()]


def test_regression_a_loss_normalised_in_two_parts_was_refused_as_leaving_out_parameters():
    """Cause (probe8 P8-10): the check of P8-01 walked the graph of the first `normalize_loss` argument of the
    micro-batch, so a policy + value loss normalised in two parts was refused on every rank for the value head,
    which the backward reaches.  The check runs as the backward starts, over every part normalised."""
    for kind, grads in spawn(two_part_loss_job, len(LENGTHS), args=("two parts",), timeout_s=120):
        assert kind == "no error" and all(grad > 0 for grad in grads), (kind, grads)


def test_a_term_added_outside_normalize_loss_is_not_seen_and_the_check_says_so():
    """An auxiliary term added to the normalised loss is invisible to the check (it sees the parts given to
    `normalize_loss`): a value head reached only through it is named on every rank, with the way out."""
    for kind, message in spawn(two_part_loss_job, len(LENGTHS), args=("aux added after",), timeout_s=120):
        assert kind == "ModelContractError", (kind, message)
        assert "module.value.bias, module.value.weight of the model" in message or "on ranks [" in message, message
        assert "normalise every part of it with `normalize_loss`" in message, message


ONE_EMPTY = {0: [26, 36, 20, 24], 1: [29, 25, 22, 22], 2: [11, 32, 27, 1]}  # T 40: M 4, the last holds 1, 1, 0 items


def constant_loss_job(rank, size, check, per_rank, budget, num_microbatches):
    """The model returns logits through every parameter, and the loss of an empty micro-batch is a constant (a
    natural guard where there are no labels): what each rank raised.  LENGTHS at T = 64, M = 4: every item
    fits micro-batch 0, so the last micro-batch, whose backward reduces gradients, is empty on every rank;
    ONE_EMPTY at T = 40: on rank 2 only."""
    torch.manual_seed(0)
    model = TokenModel().double()
    wrapped = nn.parallel.DistributedDataParallel(model)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=budget, num_microbatches=num_microbatches)
    lengths, tokens, labels = rank_batch(rank, per_rank)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    moved = dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)
    try:
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(wrapped, micro, check=check):
                logits = wrapped(micro.data["tokens"])
                if micro.items.size:
                    loss_sum = nn.functional.cross_entropy(logits, micro.data["labels"], ignore_index=-1,
                                                           reduction="sum")
                else:
                    loss_sum = logits.new_zeros((), requires_grad=True)
                normalize_loss(loss_sum, micro).backward()
    except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
        return type(error).__name__, str(error)
    return "no error", ""


def test_regression_a_constant_loss_on_an_empty_micro_batch_left_every_gradient_unreduced():
    """Cause (probe8 P8-12): the model check walked the model's outputs (P8-10), which reach every parameter
    whatever the loss does with them: a loss that is a constant on an empty last micro-batch gave DDP no gradient
    to reduce, and the step trained on each rank's own gradients (off by 0.1), silently.  The check walks the
    loss's parts now, as the backward starts."""
    for rank, (kind, message) in enumerate(spawn(constant_loss_job, len(LENGTHS), args=(True, LENGTHS, 64, 4),
                                                 timeout_s=120)):
        assert kind == "ModelContractError", (kind, message)
        assert message.startswith(f"rank {rank}: the loss given to `normalize_loss` in micro-batch 3 of 4 (whose "
                                  f"backward reduces gradients; 0 items on rank {rank}) does not depend on parameters "
                                  f"module.embed.weight, module.head.bias"), message
    unchecked = spawn(constant_loss_job, len(LENGTHS), args=(False, LENGTHS, 64, 4), timeout_s=120)
    assert {kind for kind, _ in unchecked} == {"no error"}


def test_regression_a_constant_loss_on_some_ranks_empty_micro_batch_stopped_them_after_their_peers_backward():
    """Cause (probe8 P8-14): P8-12's first fix checked after the backward, which under DDP had already posted the
    other ranks' bucket reductions: the rank with the constant loss raised, its peers died inside DDP's backward
    on gloo's "Connection closed by peer" (a hang under NCCL).  The check runs before the backward, on every
    rank."""
    outcomes = spawn(constant_loss_job, len(ONE_EMPTY), args=(True, ONE_EMPTY, 40, None), timeout_s=120)
    assert [kind for kind, _ in outcomes] == ["ModelContractError"] * 3, outcomes
    assert outcomes[2][1].startswith("rank 2: the loss given to `normalize_loss` in micro-batch 3 of 4 (whose "
                                     "backward reduces gradients; 0 items on rank 2) does not depend on parameters"), \
        outcomes[2]
    for rank in (0, 1):
        assert outcomes[rank][1].startswith(f"rank {rank}: on ranks [2] the loss of micro-batch 3 leaves out "
                                            f"parameters"), outcomes[rank]


def misuse_job(rank, size):
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET)
    lengths, tokens, labels = rank_batch(rank)
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)
    messages = []
    for micro in dispatcher.microbatches(plan, moved):
        try:
            normalize_loss(torch.zeros((), dtype=torch.float64), micro.data["labels"].ge(0).sum())
        except ValueError as error:
            messages.append(str(error))
    return messages, plan.num_microbatches


def test_per_micro_batch_loss_normalisation_raises_on_every_rank():
    for messages, count in spawn(misuse_job, len(LENGTHS), timeout_s=60):
        assert count >= 2 and len(messages) == count
        assert all("normalize_loss(loss_sum, micro)" in message for message in messages)


CONFIG = ModelConfig(vocab=32, llm_hidden=8, encoder_hidden=8, heads=2, patch_dim=6, frame_dim=5, pool=2, stride=2)
STAGES = demo_stages({m: CostModel() for m in ("image", "audio", "llm")}, CONFIG)


def multistage_gradients(model, runtime, samples, local, *, microbatched):
    loss_counts = [int(part.ne(IGNORE).sum()) for part in local.text["labels"].split([s.text for s in samples])]
    routes = runtime.plan(samples, loss_tokens=loss_counts)
    moved = runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs)
    count = 0
    for micro in runtime.microbatches(routes, moved):
        packed = runtime.forward(micro.routes, micro.data, encoders=model.encoders(), text_embedding=model.llm.embed)
        # the LLM lengths packed attention needs, known before the forward
        assert torch.equal(micro.lengths, packed.sample_lengths)
        labels = packed.scatter_text(micro.data.text["labels"], IGNORE)
        loss_sum = model.loss_sum(model.llm(packed.embeddings, packed.sample_lengths), labels)
        denominator = micro if microbatched else (labels != IGNORE).sum()  # a plain step may divide by a count
        normalize_loss(loss_sum, denominator, gradient_reduction="sum").backward()
        count += 1
    all_reduce_gradients(model.parameters(), op="sum")
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads, count


def multistage_job(rank, size, fused):
    torch.manual_seed(0)
    model = TinyMultimodalModel(CONFIG).double()
    data = SyntheticMultimodal(CONFIG, samples_per_rank=5, seed=0)
    samples = data.samples(0, rank)
    local = data.tensors(samples, torch.float64)
    reference, _ = multistage_gradients(model, MultiStageRuntime(STAGES, balance_llm=False, balance_encoders=False),
                                        samples, local, microbatched=False)
    budget = int(max(s.llm_length for r in range(size) for s in data.samples(0, r)))
    runtime = MultiStageRuntime(STAGES, max_tokens_per_microbatch=budget, fused_input_exchange=fused)
    grads, count = multistage_gradients(model, runtime, samples, local, microbatched=True)
    return count, compare_gradients(reference, grads)["grad_max_rel_diff"]


@pytest.mark.parametrize("fused", [True, False], ids=["fused_input_exchange", "per_micro_batch_exchange"])
def test_multi_stage_micro_batches_give_the_unbalanced_gradient(fused):
    results = spawn(multistage_job, 3, args=(fused,), timeout_s=120)
    counts = {count for count, _ in results}
    assert len(counts) == 1 and counts.pop() >= 2
    assert max(diff for _, diff in results) <= 1e-12


def test_split_rows_keeps_item_order_within_each_micro_batch():
    tensor = torch.arange(10)
    parts = split_rows(tensor, np.array([3, 0, 2, 5]), np.array([1, 0, 1, 0]), 3)
    assert [p.tolist() for p in parts] == [[5, 6, 7, 8, 9], [0, 1, 2, 3, 4], []]
    with pytest.raises(ValueError, match="tensor has 10 rows but its 2 items own 4"):
        split_rows(tensor, np.array([1, 3]), np.array([0, 0]), 1)


def test_micro_batch_options_are_validated():
    with pytest.raises(ValueError, match="`num_microbatches` needs `max_tokens_per_microbatch`"):
        PostBalancingDispatcher(num_microbatches=2)
    with pytest.raises(ValueError, match="exclude each other"):
        PostBalancingDispatcher(max_tokens_per_rank=10, max_tokens_per_microbatch=10)


@pytest.mark.parametrize("options, error, message", [
    (dict(max_tokens_per_microbatch=0), ValueError, "`max_tokens_per_microbatch` must be >= 1; got 0"),
    (dict(max_tokens_per_microbatch="x"), TypeError, "`max_tokens_per_microbatch` must be an int"),
    (dict(max_tokens_per_microbatch=2**64), ValueError, r"`max_tokens_per_microbatch` must be at most 2\*\*63 - 1"),
    (dict(max_tokens_per_microbatch=16, num_microbatches=0), ValueError, "`num_microbatches` must be >= 1; got 0"),
    (dict(max_tokens_per_microbatch=16, microbatch_overhead=-1.0), ValueError, "`microbatch_overhead` must be finite"),
    (dict(max_tokens_per_microbatch=16, microbatch_algorithm="zzz"), ValueError,
     "unknown `microbatch_algorithm` 'zzz'"),
])
def test_the_dispatcher_checks_its_micro_batch_options_when_built(options, error, message):
    """They were checked only by `plan()`, and not at all on a step with no items anywhere."""
    with pytest.raises(error, match=message):
        PostBalancingDispatcher(**options)


@pytest.mark.parametrize("algorithm", ["lpt", "ilp", "greedy"])
def test_regression_the_dispatchers_algorithm_was_ignored_with_a_micro_batch_budget(algorithm):
    """Cause (probe10 P10-13): with `max_tokens_per_microbatch` the step is planned by `microbatch_algorithm`,
    and `algorithm='ilp'` (wanting proven plans) or 'lpt' was validated, fingerprinted and never used."""
    with pytest.raises(ValueError, match=f"^`algorithm` '{algorithm}' plans a step of one pass per rank, which "
                                         f"`max_tokens_per_microbatch` replaces: its cells come from the micro-batch "
                                         f"planner .*; leave `algorithm` at 'auto'$"):
        PostBalancingDispatcher(algorithm=algorithm, max_tokens_per_microbatch=16)


def test_an_empty_step_runs_the_fixed_micro_batch_count():
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=16, num_microbatches=4)
    plan = dispatcher.plan([])
    parts = list(dispatcher.microbatches(plan, dispatcher.dispatch({"x": torch.zeros(0)}, plan)))
    assert plan.num_microbatches == len(parts) == 4 and all(m.items.size == 0 for m in parts)


def test_loss_tokens_beyond_an_items_tokens_are_refused():
    """A loss token is one of the item's tokens: more would inflate the step's loss denominator."""
    with pytest.raises(ValueError, match="`loss_tokens` must be at most each item's length: item 1 has 9 loss tokens "
                                         "of 5"):
        PostBalancingDispatcher(max_tokens_per_microbatch=16).plan([3, 5], loss_tokens=[3, 9])
    samples = SyntheticMultimodal(CONFIG, samples_per_rank=2, seed=0).samples(0, 0)
    too_many = [samples[0].llm_length + 1, 0]
    with pytest.raises(ValueError, match="`loss_tokens` must be at most each sample's LLM tokens: sample 0 has"):
        MultiStageRuntime(STAGES, max_tokens_per_microbatch=10**6).plan(samples, loss_tokens=too_many)


def items_job(rank, size):
    data = SyntheticMultimodal(CONFIG, samples_per_rank=4, seed=0)
    samples = data.samples(0, rank)
    runtime = MultiStageRuntime(STAGES, max_tokens_per_microbatch=int(max(s.llm_length for r in range(size)
                                                                              for s in data.samples(0, r))))
    routes = runtime.plan(samples)
    local = data.tensors(samples, torch.float64)
    moved = runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs)
    return [(micro.items.tolist(), routes.step.cells.rank[micro.items].tolist()) for micro in
            runtime.microbatches(routes, moved)]


def test_a_multi_stage_micro_batch_lists_this_ranks_samples_only():
    """`micro.items` listed every rank's samples of the micro-batch (summing over ranks counted each D times)."""
    results = spawn(items_job, 2, timeout_s=120)
    for rank, micros in enumerate(results):
        assert all(set(ranks) <= {rank} for _, ranks in micros)
    for index in range(len(results[0])):
        union = sorted(item for micros in results for item in micros[index][0])
        assert len(union) == len(set(union))
    assert sorted(item for micros in results for items, _ in micros for item in items) == list(range(8))


def test_one_process_micro_batches_cover_the_batch():
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=10)
    lengths = [4, 6, 3, 7, 2]
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch({"x": torch.arange(sum(lengths))}, plan)
    parts = list(dispatcher.microbatches(plan, moved))
    assert len(parts) == plan.num_microbatches >= 3 and parts[-1].is_last and not parts[0].is_last
    assert sorted(np.concatenate([m.items for m in parts]).tolist()) == list(range(5))
    assert sorted(torch.cat([m.data["x"] for m in parts]).tolist()) == list(range(sum(lengths)))
    assert all(int(np.asarray(lengths)[m.items].sum()) <= 10 for m in parts)
    assert dist.is_initialized() is False


@pytest.mark.parametrize("pairs, error, message", [
    (lambda parts: [(parts[0], {"x": parts[0].data["x"]})] * len(parts), ValueError, r"pairs micro-batch 0 twice"),
    (lambda parts: [(part, {"x": part.data["x"]}) for part in parts[1:]], ValueError, r"lacks micro-batches \[0\]"),
    (lambda parts: [[part, {"x": part.data["x"]}] for part in parts], TypeError, r"a list of one `\(micro, mapping\)`"),
], ids=["twice", "missing", "not a pair"])
def test_combine_refuses_pairs_that_do_not_cover_the_micro_batches_once(pairs, error, message):
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=10)
    lengths = [4, 6, 3, 7, 2]
    plan = dispatcher.plan(lengths)
    parts = list(dispatcher.microbatches(plan, dispatcher.dispatch({"x": torch.arange(sum(lengths))}, plan)))
    home = dispatcher.combine([(part, {"x": part.data["x"]}) for part in parts[::-1]], plan, differentiable=False)
    assert home["x"].tolist() == list(range(sum(lengths)))
    with pytest.raises(error, match=message):
        dispatcher.combine(pairs(parts), plan)


@pytest.mark.parametrize("num_microbatches", [None, 2])
def test_a_multi_stage_step_with_no_sample_anywhere_runs_its_micro_batches(num_microbatches):
    """It raised "`lengths` must not be empty", an argument the caller never passed."""
    local = SyntheticMultimodal(CONFIG, samples_per_rank=2, seed=0).tensors([], torch.float64)
    model = TinyMultimodalModel(CONFIG).double()
    runtime = MultiStageRuntime(STAGES, max_tokens_per_microbatch=64, num_microbatches=num_microbatches)
    routes = runtime.plan(())
    moved = runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs)
    shapes = [runtime.forward(micro.routes, micro.data, encoders=model.encoders(),
                              text_embedding=model.llm.embed).embeddings.shape[0]
              for micro in runtime.microbatches(routes, moved)]
    assert shapes == [0] * (num_microbatches or 1) and routes.step.step_cost == routes.step.lower_bound == 0


def _two_microbatch_step(rank):
    """Rank 1's second micro-batch holds its lower items: (dispatcher, plan, sid, tok, moved) of that step."""
    lengths = [[6, 1, 5, 2], [3, 4, 6, 1]][rank]
    dispatcher = PostBalancingDispatcher(per_item_keys=("sid",), max_tokens_per_microbatch=8)
    plan = dispatcher.plan(lengths)
    sid = torch.tensor([100 * rank + i for i in range(len(lengths))])
    tok = torch.cat([torch.full((length,), 100 * rank + i) for i, length in enumerate(lengths)])
    moved = dispatcher.dispatch({"sid": sid, "tok": tok}, plan)
    return dispatcher, plan, sid, tok, moved


def combine_microbatch_outputs_job(rank, size):
    """Rank 1's second micro-batch holds its lower items: its outputs concatenated over the loop are in
    another order than `plan.local_items`."""
    dispatcher, plan, sid, tok, moved = _two_microbatch_step(rank)
    outputs, order = [], []
    for micro in dispatcher.microbatches(plan, moved):
        outputs.append((micro, {"sid": micro.data["sid"] * 10, "tok": micro.data["tok"] * 10}))
        order += micro.items.tolist()
    home = dispatcher.combine(outputs, plan, differentiable=False)
    (last, part), = outputs[1:]
    try:
        dispatcher.combine(outputs[:1] + [(last, {"sid": part["sid"][:1], "tok": part["tok"]})], plan)
    except ValueError as error:
        refused = str(error)
    return (order != sorted(order), torch.equal(home["sid"], sid * 10), torch.equal(home["tok"], tok * 10),
            plan.num_microbatches, refused)


def test_regression_combine_after_a_micro_batch_loop_returned_outputs_to_the_wrong_items():
    """Cause: `combine` took rows in `plan.local_items` order, while the outputs a micro-batch loop collects
    come micro-batch after micro-batch (rank 1: items [2, 3] then [0, 1]): per-item and per-token outputs
    went home to the wrong items, no error.  `combine` takes the per-micro-batch outputs, paired with their
    micro-batches."""
    outcomes = spawn(combine_microbatch_outputs_job, 2, timeout_s=60)
    assert any(reordered for reordered, *_ in outcomes)  # the case that went wrong is present
    for _, item_ok, token_ok, count, refused in outcomes:
        assert item_ok and token_ok and count == 2
        assert "`outputs[m]['sid']` of micro-batch 1 must be a tensor of 2 rows" in refused, refused


def combine_one_mapping_job(rank, size, order):
    """The same loop, its outputs concatenated into one mapping, combined with `order`."""
    dispatcher, plan, sid, tok, moved = _two_microbatch_step(rank)
    micros = list(dispatcher.microbatches(plan, moved))
    concatenated = {key: torch.cat([micro.data[key] * 10 for micro in micros]) for key in ("sid", "tok")}
    try:
        home = dispatcher.combine(concatenated, plan, order=order, differentiable=False)
    except ValueError as error:
        return str(error)
    return torch.equal(home["sid"], sid * 10) and torch.equal(home["tok"], tok * 10)


def test_regression_one_mapping_of_concatenated_micro_batch_outputs_went_home_to_the_wrong_items():
    """README warned that outputs concatenated micro-batch after micro-batch would come home to the wrong
    items, but `combine` took them silently (rank 1: per-item [1020, 1030, 1000, 1010] for [1000, ...])."""
    refused = spawn(combine_one_mapping_job, 2, args=(None,), timeout_s=60)  # the rank named is the plan's
    assert all(isinstance(message, str) and re.search(r"`outputs` is one mapping, but rank \d's items come in another "
               r"order micro-batch by micro-batch", message) for message in refused), refused
    assert spawn(combine_one_mapping_job, 2, args=("microbatches",), timeout_s=60) == [True, True]


def _equal_microbatches_step(rank):
    """4 items of 4 tokens per rank, 8 tokens per micro-batch: 2 micro-batches of equal row counts on every rank."""
    dispatcher = PostBalancingDispatcher(cost=CostModel(linear=1.0), per_item_keys=("sid",),
                                         max_tokens_per_microbatch=8)
    sid = torch.arange(4 * rank, 4 * rank + 4)
    tok = sid.repeat_interleave(4)
    plan = dispatcher.plan([4, 4, 4, 4])
    moved = dispatcher.dispatch({"sid": sid, "tok": tok}, plan)
    return dispatcher, plan, sid, tok, moved


def combine_out_of_order_job(rank, size, form):
    """The micro-batch outputs collected in reverse order (as a pipeline schedule may finish them), combined."""
    dispatcher, plan, sid, tok, moved = _equal_microbatches_step(rank)
    micros = list(dispatcher.microbatches(plan, moved))[::-1]
    outputs = [{"sid": micro.data["sid"] * 10, "tok": micro.data["tok"] * 10} for micro in micros]
    if form == "pairs":
        outputs = list(zip(micros, outputs))
    elif form == "pairs of another step":  # micro-batches of a step whose items sit in other micro-batches
        other = PostBalancingDispatcher(per_item_keys=("sid",), max_tokens_per_microbatch=8)
        step = other.plan([6, 2, 6, 2])
        others = list(other.microbatches(step, other.dispatch({"sid": sid, "tok": sid.repeat_interleave(4)}, step)))
        outputs = list(zip(others, outputs))
    try:
        home = dispatcher.combine(outputs, plan, differentiable=False)
    except ValueError as error:
        return plan.num_microbatches, str(error)
    return plan.num_microbatches, torch.equal(home["sid"], sid * 10) and torch.equal(home["tok"], tok * 10)


def test_regression_a_list_of_micro_batch_outputs_in_another_order_went_home_to_the_wrong_items():
    """Cause (probe5 P5-06): `combine` took a bare list of per-micro-batch outputs as in micro-batch order and
    checked only each entry's row count, so micro-batches of equal row counts collected in another order came home
    to each other's items (rank 0 got items 4..7's outputs), no error.  With several micro-batches `combine` now
    takes `(micro, outputs)` pairs, in any order, and refuses a bare list on every rank, naming the pairs."""
    for count, message in spawn(combine_out_of_order_job, 2, args=("list",), timeout_s=60):
        assert count == 2
        assert isinstance(message, str) and "its order cannot be checked" in message and \
            "outputs.append((micro, {...}))" in message, message
    assert spawn(combine_out_of_order_job, 2, args=("pairs",), timeout_s=60) == [(2, True), (2, True)]
    for _, message in spawn(combine_out_of_order_job, 2, args=("pairs of another step",), timeout_s=60):
        assert isinstance(message, str) and "is not a micro-batch of `plan`" in message, message



def kept_micro_batches_job(rank, size):
    """Step k's micro-batches kept (in reverse, as a pipeline may finish them) and paired with the outputs of
    step k+1, whose plan is the same (same lengths); then one of them given to `normalize_loss`."""
    dispatcher, plan, sid, tok, moved = _equal_microbatches_step(rank)
    kept = list(dispatcher.microbatches(plan, moved))[::-1]
    plan = dispatcher.plan([4, 4, 4, 4], loss_tokens=[1, 1, 1, 1])
    moved = dispatcher.dispatch({"sid": sid + 100, "tok": tok + 100}, plan)
    outputs = [{"sid": micro.data["sid"], "tok": micro.data["tok"]} for micro in dispatcher.microbatches(plan, moved)]
    results = []
    for call in (lambda: dispatcher.combine(list(zip(kept, outputs)), plan, differentiable=False)["sid"].tolist(),
                 lambda: normalize_loss(torch.ones(()), kept[0]).item()):
        try:
            results.append(call())
        except ValueError as error:
            results.append(str(error))
    return results


def test_regression_micro_batches_kept_from_the_previous_step_took_this_steps_outputs_home_to_the_wrong_items():
    """Cause (probe6 P6-19): `combine` matched the pairs' micro-batches by index and items only, so step k's
    micro-batches, kept in a loop variable, paired with step k+1's outputs of the same plan sent rank 0's outputs
    to rank 1's items, no error; and `normalize_loss(loss, kept_micro)` divided by step k's loss tokens."""
    for combined, normalized in spawn(kept_micro_batches_job, 2, timeout_s=60):
        assert isinstance(combined, str) and "pairs micro-batch 1 of another step than the latest dispatch's" in \
            combined, combined
        assert isinstance(normalized, str) and normalized.startswith(
            "normalize_loss with micro-batch 1 of an earlier step (its runtime has run another since): it would "
            "divide by that step's 32 loss tokens"), normalized


class IdEmbedding(nn.Module):
    """Embeds a token id as itself (one float64 column), its parameter in the graph."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Linear(1, 1)

    def forward(self, ids, lengths=None):
        column = (ids[:, :1] if ids.dim() > 1 else ids[:, None]).double()
        return column + 0 * self.weight(column)


def scatter_labels_job(rank, size, form):
    """Text-only samples in 2 micro-batches of 8 tokens; each micro-batch's labels (ids + 1000) scattered by `form`:
    the key, or the tensor of the next micro-batch (a slip of the same row count)."""
    runtime = MultiStageRuntime((STAGES[0], STAGES[-1]), max_tokens_per_microbatch=8)
    text = [[4, 4, 2, 6], [4, 4, 6, 2]][rank]
    samples = [Sample(text=t, segments=(), source=rank, id=10 * rank + k) for k, t in enumerate(text)]
    ids = torch.cat([torch.full((t,), 10 * rank + k) for k, t in enumerate(text)])
    routes = runtime.plan(samples)
    moved = runtime.dispatch(routes, text={"input_ids": ids, "labels": ids + 1000},
                             inputs={"image": torch.zeros(0, CONFIG.patch_dim)}, samples=samples)
    micros = list(runtime.microbatches(routes, moved))
    embedding, encoders, matched = IdEmbedding().double(), {"image": IdEmbedding().double()}, []
    for index, micro in enumerate(micros):
        packed = runtime.forward(micro.routes, micro.data, encoders=encoders, text_embedding=embedding)
        values = "labels" if form == "key" else micros[(index + 1) % len(micros)].data.text["labels"]
        try:
            labels = packed.scatter_text(values, -100)
        except ValueError as error:
            return len(micros), str(error)
        matched.append(torch.equal(labels, packed.embeddings[:, 0].long() + 1000))
    return len(micros), matched


def test_regression_scatter_text_of_another_micro_batchs_labels_paired_them_with_this_ones_embeddings():
    """Cause (probe5 P5-04): `Assembled.scatter_text(values)` checked only the row count, so the labels of another
    micro-batch of as many text tokens were placed against this one's embeddings, no error.  `scatter_text` takes
    the key of the micro-batch's own `micro.data.text` (the README's pattern), and a tensor of another micro-batch
    the step yielded is refused, naming the key form."""
    assert spawn(scatter_labels_job, 2, args=("key",), timeout_s=60) == [(2, [True, True])] * 2
    for count, message in spawn(scatter_labels_job, 2, args=("tensor",), timeout_s=60):
        assert count == 2 and isinstance(message, str), message
        assert "`values` is micro-batch 1's `micro.data.text['labels']`, not this micro-batch's" in message, message
        assert "packed.scatter_text('labels', fill)" in message, message


class CheckpointedTwoHeadModel(TwoHeadModel):
    """TwoHeadModel whose trunk, a method of the model, runs under a reentrant checkpoint (its recomputation is not
    in the graph the check walks)."""

    def trunk(self, embedded):
        return torch.tanh(self.hidden(embedded))

    def forward(self, tokens):
        from torch.utils.checkpoint import checkpoint

        hidden = checkpoint(self.trunk, self.embed(tokens), use_reentrant=True)
        return self.head(hidden), self.value(hidden).squeeze(-1)


class CheckpointedWithATargetModel(CheckpointedTwoHeadModel):
    """CheckpointedTwoHeadModel whose forward also computes a target without grad (old logits), every module."""

    def forward(self, tokens):
        outputs = super().forward(tokens)
        with torch.no_grad():
            self.head(self.trunk(self.embed(tokens)))
        return outputs


def empty_rank_shapes_job(rank, size, shape, num_microbatches=None):
    """ONE_EMPTY at T = 40 (rank 2's last micro-batch empty; with `num_microbatches` 6 every rank's) through DDP:
    what each rank raised where an empty micro-batch takes `shape`."""
    torch.manual_seed(0)
    model = (CheckpointedWithATargetModel() if shape.endswith("a no-grad block in forward") else
             CheckpointedTwoHeadModel() if shape.startswith("reentrant") else TwoHeadModel()).double()
    wrapped = nn.parallel.DistributedDataParallel(model)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=40, num_microbatches=num_microbatches)
    lengths, tokens, labels = rank_batch(rank, ONE_EMPTY)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    moved = dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)
    try:
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(wrapped, micro):
                if micro.items.size == 0 and shape == "no backward":
                    continue
                if micro.items.size == 0 and shape == "model not called":
                    loss_sum = torch.zeros((), dtype=torch.float64, requires_grad=True)
                else:
                    if shape.endswith("a no-grad pass first"):  # old log-probs, a reference pass
                        with torch.no_grad():
                            wrapped(micro.data["tokens"])
                    logits, values = wrapped(micro.data["tokens"])
                    loss_sum = (nn.functional.cross_entropy(logits, micro.data["labels"], ignore_index=-1,
                                                            reduction="sum") + values.square().sum()
                                if micro.items.size else values.sum() * 0 if shape.startswith("reentrant, one output")
                                else logits.sum() * 0 + values.sum() * 0)
                loss = normalize_loss(loss_sum, micro)
                if micro.items.size or shape != "backward skipped":
                    loss.backward()
    except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
        return type(error).__name__, str(error)
    return "no error", ""


@pytest.mark.parametrize("shape", ["reentrant, one output", "model not called", "no backward"])
def test_regression_empty_micro_batch_shapes_the_check_let_through_or_hung_on(shape):
    """Causes (probe9 P9-01..03): a reentrant checkpoint anywhere switched the check off (a loss using one output
    of two trained on gradients 0.04 off); a rank that did not call the model was not checked (silent, or its
    peers hung); a rank that ran no backward left its peers in the check's all-reduce to the group's timeout.
    Now the parameters of modules run inside a reentrant checkpoint count as reached, every other one must be,
    and a rank whose body normalised no loss joins the check at the body's end: every rank raises."""
    outcomes = spawn(empty_rank_shapes_job, len(ONE_EMPTY), args=(shape,), timeout_s=120)
    assert [kind for kind, _ in outcomes] == ["ModelContractError"] * 3, outcomes
    assert outcomes[0][1].startswith("rank 0: on ranks [2] the loss of micro-batch 3 leaves out"), outcomes[0]
    expected = "no loss passed through" if shape == "no backward" else "the loss given to `normalize_loss`"
    assert outcomes[2][1].startswith(f"rank 2: {expected}"), outcomes[2]


@pytest.mark.parametrize("num_microbatches", [None, 6], ids=["rank 2 empty", "every rank empty"])
def test_regression_a_normalised_loss_whose_backward_was_skipped_on_an_empty_micro_batch_went_unchecked(
        num_microbatches):
    """Cause (probe10 P10-04): `accumulate`'s exit joined the check only where the body normalised no loss, so a body
    that normalised its loss but skipped the backward on an empty micro-batch (`if tokens: loss.backward()`) was
    never checked: with every rank empty, DDP reduced nothing (gradients 0.04-0.06 off, silently); with rank 2
    empty, its peers waited in the check.  Now a due check that no backward ran joins at the exit: every rank
    raises, naming the skipped backward."""
    outcomes = spawn(empty_rank_shapes_job, len(ONE_EMPTY), args=("backward skipped", num_microbatches),
                     timeout_s=120)
    assert [kind for kind, _ in outcomes] == ["ModelContractError"] * 3, outcomes
    last = 3 if num_microbatches is None else 5
    empty = [2] if num_microbatches is None else [0, 1, 2]
    for rank, (_, message) in enumerate(outcomes):
        if rank in empty:
            assert message.startswith(f"rank {rank}: the loss given to `normalize_loss` in micro-batch {last} of "), \
                message
            assert "had no backward inside the `with accumulate` block" in message, message
        else:
            assert message.startswith(f"rank {rank}: on ranks {empty} the loss of micro-batch {last} leaves out"), \
                message


@pytest.mark.parametrize("shape", ["reentrant, one output, a no-grad pass first", "reentrant, every output, a no-grad "
                                   "pass first", "reentrant, one output, a no-grad block in forward",
                                   "reentrant, every output, a no-grad block in forward"])
def test_regression_a_no_grad_pass_beside_a_reentrant_checkpoint_hid_every_parameter_from_the_check(shape):
    """Cause (probe10 P10-09): the parameters of every module run without grad in the body counted as reached at
    a reentrant checkpoint, so a `torch.no_grad()` pass of the model there (PPO's old log-probs) hid the whole
    model, and a loss using one output of two on an empty micro-batch trained silently wrong (0.04-0.06); so did
    a no-grad block inside the model's forward (P10-15).  Now only the modules each reentrant checkpoint's forward
    ran count, at its node."""
    outcomes = spawn(empty_rank_shapes_job, len(ONE_EMPTY), args=(shape,), timeout_s=120)
    if "every output" in shape:
        assert [kind for kind, _ in outcomes] == ["no error"] * 3, outcomes
        return
    assert [kind for kind, _ in outcomes] == ["ModelContractError"] * 3, outcomes
    assert outcomes[2][1].startswith("rank 2: the loss given to `normalize_loss` in micro-batch 3 of 4 (whose "
                                     "backward reduces gradients; 0 items on rank 2) does not depend on parameters "
                                     "module.head.bias, module.head.weight of the model"), outcomes[2]


def test_regression_nested_accumulate_named_parameters_without_saying_which_model():
    """Cause (probe10 P10-14): with nested `accumulate` blocks for two models of one class, the refusal named the
    parameters "of the model given to `accumulate`", which both models' names fit; it names the block now."""
    for _, message in spawn(nested_models_job, len(LENGTHS), args=(True,), timeout_s=120):
        assert "module.hidden.weight of the model given to `accumulate` (DistributedDataParallel of TokenModel, " \
               "block 1 of 2 nested `accumulate` blocks, outermost first)" in message, message


def test_regression_the_nested_block_was_named_from_the_thread_running_the_check():
    """Cause (review7 R7-12): the refusal found a check's place among nested `accumulate` blocks in the thread's
    own record, but the check runs in the backward, which on GPUs runs on autograd's device thread: there the
    block went unnamed.  The checks of one nest keep it themselves."""
    import threading

    from orchmllm.runtime.microbatch import _Contract
    from orchmllm.runtime.model_check import named as _named

    outer = _Contract(None, nn.Linear(2, 2))
    inner = _Contract(None, nn.Linear(2, 2), (outer,))
    named = []
    thread = threading.Thread(target=lambda: named.append(_named(inner)))
    thread.start()
    thread.join()
    assert named == ["Linear, block 2 of 2 nested `accumulate` blocks, outermost first"]


def test_a_reentrant_checkpoint_with_a_loss_through_every_output_passes_the_check():
    """The correct program beside P9-01: the checkpointed trunk's parameters count as reached."""
    assert [kind for kind, _ in spawn(empty_rank_shapes_job, len(ONE_EMPTY), args=("reentrant, every output",),
                                      timeout_s=120)] == ["no error"] * 3


def nested_models_job(rank, size, bad):
    """Policy (outer `accumulate`) and critic (inner), each under DDP, one loop; on the empty last micro-batch the
    policy's part is a constant where `bad`, else `logits.sum() * 0`: what each rank raised."""
    torch.manual_seed(0)
    policy, critic = (nn.parallel.DistributedDataParallel(TokenModel().double()) for _ in range(2))
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=64, num_microbatches=4)
    lengths, tokens, labels = rank_batch(rank)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    moved = dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)
    try:
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(policy, micro), accumulate(critic, micro):
                logits, values = policy(micro.data["tokens"]), critic(micro.data["tokens"])
                policy_sum = (nn.functional.cross_entropy(logits, micro.data["labels"], ignore_index=-1,
                                                          reduction="sum") if micro.items.size
                              else logits.new_zeros((), requires_grad=True) if bad else logits.sum() * 0)
                (normalize_loss(policy_sum, micro) + normalize_loss(values.sum() * 0, micro)).backward()
    except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
        return type(error).__name__, str(error)
    return "no error", ""


@pytest.mark.parametrize("bad", [True, False], ids=["policy part constant", "both parts through the outputs"])
def test_regression_nested_accumulate_checked_only_the_inner_model(bad):
    """Cause (probe9 P9-06): `accumulate` kept one model check per thread, so nested bodies for two models
    (policy and critic in one loop) checked the inner one only; the outer one's parameters left out on an empty
    micro-batch trained silently wrong (0.04-0.06).  Each nested model is checked against the parts."""
    outcomes = spawn(nested_models_job, len(LENGTHS), args=(bad,), timeout_s=120)
    if not bad:
        assert [kind for kind, _ in outcomes] == ["no error"] * len(LENGTHS), outcomes
        return
    assert [kind for kind, _ in outcomes] == ["ModelContractError"] * len(LENGTHS), outcomes
    for rank, (_, message) in enumerate(outcomes):
        assert message.startswith(f"rank {rank}: the loss given to `normalize_loss` in micro-batch 3 of 4 (whose "
                                  f"backward reduces gradients; 0 items on rank {rank}) does not depend on parameters "
                                  f"module.embed.weight"), message


def fsdp2_skipped_forward_job(rank, size, shape):
    """ONE_EMPTY at T = 40 through FSDP2: on its empty last micro-batch rank 2 normalises a zero leaf without
    calling the model, or leaves the body at once (`continue`); the other ranks run the model."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = fully_shard(TwoHeadModel().double())
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=40)
    lengths, tokens, labels = rank_batch(rank, ONE_EMPTY)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    moved = dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)
    for micro in dispatcher.microbatches(plan, moved):
        with accumulate(model, micro):
            if micro.items.size == 0 and shape == "no backward":
                continue
            if micro.items.size == 0:
                loss_sum = torch.zeros((), dtype=torch.float64, requires_grad=True)
            else:
                logits, values = model(micro.data["tokens"])
                loss_sum = nn.functional.cross_entropy(logits, micro.data["labels"], ignore_index=-1,
                                                       reduction="sum") + values.square().sum()
            normalize_loss(loss_sum, micro).backward()


@pytest.mark.parametrize("shape", ["model not called", "no backward"])
def test_regression_under_fsdp2_a_rank_skipping_the_forward_blamed_its_peers_at_the_timeout(shape):
    """Cause (probe10 P10-01): under FSDP2 the forward all-gathers the parameters, so where rank 2 did not call the
    model on its empty micro-batch its peers waited in that all-gather and rank 2 in the model check's all-reduce,
    until the group's timeout, where rank 2, the one at fault, blamed a dead peer.  Now rank 2 knows it ran no
    forward of the model and stops at once, saying so; its peers fail as it leaves, not at the timeout."""
    from orchmllm.runtime.launch import run_processes

    outcomes = run_processes(fsdp2_skipped_forward_job, len(ONE_EMPTY), args=(shape,), timeout_s=240,
                             collective_timeout_s=120)
    assert not any(outcome.ok for outcome in outcomes), outcomes
    assert "ModelContractError: rank 2: no forward of the model ran inside `with accumulate(model, micro):` in " \
           "micro-batch 3 of 4 (whose backward reduces gradients; 0 items on this rank): the model's forward must " \
           "run inside the block" in outcomes[2].error, outcomes[2]
    assert all(outcome.seconds is not None and outcome.seconds < 60 for outcome in outcomes), outcomes  # not 120


def summed_loss(logits, micro):
    """The micro-batch's token loss summed; on an empty one a zero that still depends on every logit."""
    if micro.items.size:
        return nn.functional.cross_entropy(logits, micro.data["labels"], ignore_index=-1, reduction="sum")
    return logits.sum() * 0


def fsdp2_forward_before_the_block_job(rank, size):
    """ONE_EMPTY at T = 40 through FSDP2, each micro-batch's forward run just before `with accumulate(model,
    micro):`, normalize_loss and the backward inside it: what each rank raised."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = fully_shard(TokenModel().double())
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=40)
    lengths, tokens, labels = rank_batch(rank, ONE_EMPTY)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)):
            logits = model(micro.data["tokens"])
            with accumulate(model, micro):
                normalize_loss(summed_loss(logits, micro), micro).backward()
    except ModelContractError as error:
        return str(error)
    return "no error"


def test_regression_under_fsdp2_a_forward_before_the_block_was_refused_as_a_skipped_forward():
    """Cause (probe11 P11-07): under FSDP2 a loop running the forward just before `with accumulate(model, micro):`
    was refused on every rank with "the body of `accumulate` ran no forward ... call the model on every
    micro-batch", which every rank did; the message now states the rule it breaks: the forward runs inside."""
    for rank, message in enumerate(spawn(fsdp2_forward_before_the_block_job, len(ONE_EMPTY), timeout_s=90)):
        assert message.startswith(f"rank {rank}: no forward of the model ran inside `with accumulate(model, "
                                  f"micro):` in micro-batch 3 of 4"), message
        assert "the model's forward must run inside the block" in message, message
        assert "a forward run before the block is not seen" in message, message


class SkipOnEmptyModel(TokenModel):
    """TokenModel that skips `hidden` on an empty micro-batch: under DDP that rank's `hidden` gets no gradient."""

    def forward(self, tokens):
        embedded = self.embed(tokens)
        return self.head(torch.tanh(self.hidden(embedded)) if tokens.numel() else embedded)


def bare_loop_job(rank, size, budget, listed=False, no_sync=False, num_microbatches=None):
    """A DDP step of SkipOnEmptyModel whose micro-batch loop has no `accumulate` (ONE_EMPTY: with the budget rank 2's
    last micro-batch is empty; without it, the runtime's first step of one micro-batch, 2 items for 3 ranks), over
    the generator or a list of the micro-batches (`listed`), with `no_sync()` but on the last or without: what each
    rank raised at which micro-batch, and the micro-batches whose body ran to its end."""
    torch.manual_seed(0)
    wrapped = nn.parallel.DistributedDataParallel(SkipOnEmptyModel().double())
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=budget, num_microbatches=num_microbatches)
    lengths, tokens, labels = rank_batch(rank, ONE_EMPTY if budget else {0: [5, 3], 1: [], 2: []})
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    moved = dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)
    micros = dispatcher.microbatches(plan, moved)
    done = []
    try:
        for micro in list(micros) if listed else micros:
            with wrapped.no_sync() if no_sync and not micro.is_last else contextlib.nullcontext():
                loss_sum = nn.functional.cross_entropy(wrapped(micro.data["tokens"]), micro.data["labels"],
                                                       ignore_index=-1, reduction="sum")
                normalize_loss(loss_sum, micro).backward()
            done.append(micro.index)
    except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
        return type(error).__name__, str(error), done
    return "no error", "", done


def no_grad_reference_job(rank, size):
    """A plain model's micro-batch loop without `accumulate` (its gradients reduced by hand) that runs a DDP
    reference model under `torch.no_grad()` in each body: the micro-batches whose body ran to its end."""
    torch.manual_seed(0)
    reference, model = nn.parallel.DistributedDataParallel(SkipOnEmptyModel().double()), SkipOnEmptyModel().double()
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=40)
    lengths, tokens, labels = rank_batch(rank, ONE_EMPTY)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    done = []
    for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)):
        with torch.no_grad():
            reference(micro.data["tokens"])
        loss_sum = nn.functional.cross_entropy(model(micro.data["tokens"]), micro.data["labels"], ignore_index=-1,
                                               reduction="sum")
        normalize_loss(loss_sum, micro).backward()
        done.append(micro.index)
    return done


def test_regression_a_ddp_reference_model_under_no_grad_made_a_plain_loop_refused():
    """Cause (review7 R7-21): the bare-loop refusal noted any forward of a DDP module in a due body, so a plain
    model's loop (gradients reduced by hand) that ran a DDP reference model under `torch.no_grad()` was refused;
    only a forward with grad, whose backward DDP reduces, is noted now."""
    assert spawn(no_grad_reference_job, len(ONE_EMPTY), timeout_s=60) == [[0, 1, 2, 3]] * 3


def bare_loop_refused(outcomes, count):
    """Whether every rank refused the bare loop at the step's first micro-batch, before any backward."""
    assert [(kind, done) for kind, _, done in outcomes] == [("ModelContractError", [])] * 3, outcomes
    for _, message, _ in outcomes:
        assert message.startswith(f"normalize_loss(loss, micro) outside `with accumulate(model, micro):` on "
                                  f"micro-batch 0 of {count}, in a step due the model check"), message
        assert "(DistributedDataParallel of SkipOnEmptyModel)" in message, message
        assert "`accumulate(model, micro, check=False)` on every rank skips the check" in message, message
    return True


@pytest.mark.parametrize("budget", [40, None], ids=["budget, last micro-batch empty", "first step, one micro-batch"])
def test_regression_a_bare_micro_batch_loop_under_ddp_got_no_model_check(budget):
    """Cause (probe10 P10-21, P10-11's first-step repro): the model check ran only inside `accumulate`, so a loop
    normalising with `normalize_loss(loss, micro)` but without `accumulate` (README's multi-stage block) let a model
    skipping a layer on an empty micro-batch train silently wrong under DDP (0.02-0.12 off), its peers dying in
    DDP's backward.  Now normalize_loss in a step due the check outside `accumulate(model, micro)` raises, on every
    rank at the step's first micro-batch (which steps are due is decided from the plan every rank holds)."""
    outcomes = spawn(bare_loop_job, len(ONE_EMPTY), args=(budget,), timeout_s=60)
    assert bare_loop_refused(outcomes, 4 if budget else 1)


def test_regression_a_bare_loop_over_a_list_of_the_micro_batches_escaped_the_refusal():
    """Cause (probe11 P11-03): the forward of a DDP module was noted by a hook that lived only while the
    generator of micro-batches was suspended at its `yield`, so a bare loop over `list(microbatches(...))` (the
    generator ended before any body ran) noted nothing: a layer skipped on an empty micro-batch trained silently
    wrong on rank 2 (0.0376 off) while its peers died in gloo.  The note now lives while the step is held."""
    outcomes = spawn(bare_loop_job, len(ONE_EMPTY), args=(40, True, True), timeout_s=60)
    assert bare_loop_refused(outcomes, 4)


def test_regression_a_bare_loop_without_no_sync_died_in_ddp_before_the_due_micro_batch():
    """Cause (probe11 P11-08): without `no_sync` every micro-batch's backward reduces, and the forward was noted
    only in the body of the step's last micro-batch, so with 6 micro-batches (ranks' tails empty from micro-batch
    3 or 4) rank 2's empty micro-batch 3 reduced with a layer missing and the ranks died in raw DDP and gloo errors
    before the refusal was reached.  A due step is now watched from its first micro-batch."""
    outcomes = spawn(bare_loop_job, len(ONE_EMPTY), args=(40, False, False, 6), timeout_s=60)
    assert bare_loop_refused(outcomes, 6)


def wrapped_module_job(rank, size, call="module", block="model"):
    """A DDP step whose `accumulate` body calls the wrapped module (`model.module(...)`, `call` "module") instead of
    the DDP module, or DDP's own `model.forward(...)` ("forward"), or the DDP module ("model"), the block given the
    DDP module (`block` "model") or the module it wraps ("inner"): what each rank raised, or the gradients."""
    torch.manual_seed(0)
    wrapped = nn.parallel.DistributedDataParallel(TokenModel().double())
    forward = {"module": wrapped.module, "forward": wrapped.forward, "model": wrapped}[call]
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=40)
    lengths, tokens, labels = rank_batch(rank, ONE_EMPTY)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)):
            with accumulate(wrapped if block == "model" else wrapped.module, micro):
                normalize_loss(summed_loss(forward(micro.data["tokens"]), micro), micro).backward()
    except ModelContractError as error:
        return str(error)
    return [parameter.grad.numpy().copy() for parameter in wrapped.parameters()]


def test_regression_a_body_calling_the_module_inside_ddp_kept_each_rank_s_own_gradients():
    """Cause (probe12 P12-10): `accumulate(ddp_model, micro)` whose body called `ddp_model.module(x)` passed the
    model check (the loss reached every parameter) but DDP's own forward, which readies its reduction, never ran:
    every rank kept its own gradients, no error.  Every rank now raises on the micro-batch that reduces."""
    for rank, message in enumerate(spawn(wrapped_module_job, len(ONE_EMPTY), timeout_s=60)):
        assert message.startswith(f"rank {rank}: the body of `accumulate` in micro-batch 3 of 4"), message
        assert "called modules inside the DDP module (DistributedDataParallel of TokenModel; `model.module(...)` " \
               "or a method of it) but not the DDP module itself" in message, message


def test_regression_a_block_given_the_module_inside_ddp_checked_nothing_and_held_no_sync():
    """Cause (probe15 P15-13): `accumulate(ddp.module, micro)` whose body called `ddp(x)` (a common unwrap) held no
    sync and ran no check (a plain module), so a model skipping layers on an empty micro-batch left the ranks'
    reductions waiting on each other until the process group's timeout.  On a step due the check, the block of the
    module a DDP forward in its body wraps is refused on every rank, before the backward."""
    for rank, message in enumerate(spawn(wrapped_module_job, len(ONE_EMPTY), args=("model", "inner"), timeout_s=60)):
        assert message.startswith(f"rank {rank}: the body of `accumulate` in micro-batch 0 of 4 ran the forward of "
                                  f"DistributedDataParallel of TokenModel, whose gradients DDP or FSDP2 reduce, "
                                  f"wrapping the module the block was given, its `.module`: pass the DDP module "
                                  f"itself, `accumulate(ddp, micro)`"), message


def test_regression_a_body_calling_ddp_s_own_forward_was_refused_as_calling_the_module_inside():
    """Cause (probe13 P13-02): the check took DDP's own forward to have run only where the DDP module's forward hook
    fired, which `model.forward(...)` (DDP's forward, readying its reduction, called without `__call__`) skips: the
    correct loop was refused on every rank as calling `model.module(...)`.  The gradients are now those of
    `model(...)`."""
    by_forward, by_call = (spawn(wrapped_module_job, len(ONE_EMPTY), args=(call,), timeout_s=60)
                           for call in ("forward", "model"))
    for forward_gradients, call_gradients in zip(by_forward, by_call):
        assert not isinstance(forward_gradients, str), forward_gradients
        for got, want in zip(forward_gradients, call_gradients):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


class PlainRoot(nn.Module):
    """A plain module around a DDP-wrapped model that skips a layer on an empty micro-batch."""

    def __init__(self):
        super().__init__()
        self.body = nn.parallel.DistributedDataParallel(SkipOnEmptyModel().double())

    def forward(self, tokens):
        return self.body(tokens)


def plain_root_job(rank, size, check):
    """ONE_EMPTY at T = 40 (rank 2's last micro-batch empty) with `accumulate(root, micro, check=check)`, `root` a
    plain module holding a DDP module: what each rank raised."""
    torch.manual_seed(0)
    root = PlainRoot()
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=40)
    lengths, tokens, labels = rank_batch(rank, ONE_EMPTY)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)):
            with accumulate(root, micro, check=check):
                normalize_loss(summed_loss(root(micro.data["tokens"]), micro), micro).backward()
    except ValueError as error:
        return f"micro-batch {micro.index}: {error}"
    return "no error"


@pytest.mark.parametrize("check", [True, False])
def test_regression_accumulate_given_a_plain_module_around_a_ddp_one_held_no_sync_and_checked_nothing(check):
    """Cause (probe13 P13-04): `accumulate` looked at the module it was given only: a plain root holding a DDP module
    was taken for a plain model with a hand-made all-reduce, so the sync was held for no micro-batch and no check
    ran: the rank whose empty micro-batch skipped a layer trained wrong, its peers died in DDP's all-reduce.  Every
    rank now refuses it at the first block, naming the DDP module to pass instead."""
    for message in spawn(plain_root_job, len(ONE_EMPTY), args=(check,), timeout_s=60):
        assert message.startswith("micro-batch 0: `model` (PlainRoot) holds modules whose gradients DDP or FSDP2 "
                                  "reduce: body (DistributedDataParallel of SkipOnEmptyModel)"), message


def early_exit_job(rank, size, check):
    """Two DDP steps whose micro-batch loop (in `accumulate`) is left by `break` after micro-batch 1 of 4: what the
    second step raised on each rank."""
    torch.manual_seed(0)
    wrapped = nn.parallel.DistributedDataParallel(TokenModel().double())
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=40)
    lengths, tokens, labels = rank_batch(rank, ONE_EMPTY)
    try:
        for _ in range(2):
            plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
            moved = dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)
            for micro in dispatcher.microbatches(plan, moved):
                with accumulate(wrapped, micro, check=check):
                    logits = wrapped(micro.data["tokens"])
                    normalize_loss(nn.functional.cross_entropy(logits, micro.data["labels"], ignore_index=-1,
                                                               reduction="sum"), micro).backward()
                if micro.index == 1:
                    break
    except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
        return f"{type(error).__name__}: {error}"
    return "no error"


def test_regression_a_micro_batch_loop_left_early_never_synchronised_the_step_s_gradients():
    """Cause (probe12 P12-09): a loop left by `break` before the step's last micro-batch never ran the block that
    synchronises DDP's gradients, and the next step planned as if the step had ended: every rank kept its own
    gradients, no error.  The next dispatch (since probe13 P13-10; the next `plan()` before) now raises on every
    rank (through its exchange header); `check=False` leaves the rest knowingly."""
    outcomes = spawn(early_exit_job, len(ONE_EMPTY), args=(True,), timeout_s=60)
    assert sum(outcome.startswith("ValueError: the micro-batch loop of the previous step on this thread ended "
                                  "after micro-batch 1 of 4") for outcome in outcomes) >= 1, outcomes
    assert all(outcome.startswith(("ValueError: the micro-batch loop", "PeerInputError")) for outcome in outcomes), \
        outcomes
    assert spawn(early_exit_job, len(ONE_EMPTY), args=(False,), timeout_s=60) == ["no error"] * 3


OVERLAP_STEPS = ({0: [5, 3, 4, 2], 1: [6, 1, 1, 2]}, {0: [2, 6, 3], 1: [4, 4, 1, 1]}, {0: [1, 5, 5], 1: [6, 2, 3]})


def overlap_features(step, rank):
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(sum(OVERLAP_STEPS[step][rank]), 3, generator=generator, dtype=torch.float64)


def overlap_reference(steps):
    """The gradient of each of `steps` of OVERLAP_STEPS as one pass over its global batch in one process."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    expected = []
    for step in steps:
        features = torch.cat([overlap_features(step, rank) for rank in OVERLAP_STEPS[step]])
        (net(features).sum() / features.shape[0]).backward()
        expected.append(torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy().copy())
        net.zero_grad()
    return expected


def overlapped_steps_job(rank, size, leave=False):
    """Two dispatchers alternate by step (the README's way to overlap two steps' data movement): step k + 1's `plan`
    and `dispatch` run inside step k's DDP loop, after micro-batch 0's `accumulate` block.  Each step's micro-batch
    count and gradients; with `leave`, step 0's loop is left there (`break`, its gradients kept): what the next loop
    raised."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net)
    dispatchers = [PostBalancingDispatcher(max_tokens_per_microbatch=6) for _ in range(2)]

    def prepare(step):
        dispatcher, lengths = dispatchers[step % 2], OVERLAP_STEPS[step][rank]
        plan = dispatcher.plan(lengths)
        return dispatcher, plan, dispatcher.dispatch({"x": overlap_features(step, rank)}, plan, lengths=lengths)

    counts, gradients, upcoming = [], [], prepare(0)
    for step in range(len(OVERLAP_STEPS)):
        dispatcher, plan, moved = upcoming
        try:
            micros = dispatcher.microbatches(plan, moved)
        except ValueError as error:
            return str(error)
        for micro in micros:
            with accumulate(model, micro):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
            if micro.index == 0 and step + 1 < len(OVERLAP_STEPS):
                upcoming = prepare(step + 1)
                if leave:
                    break
        if leave:  # its gradients kept, unsynchronised
            continue
        counts.append(plan.num_microbatches)
        gradients.append(torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy().copy())
        net.zero_grad()
    return counts, gradients


def test_regression_the_next_step_planned_inside_a_loop_by_a_second_dispatcher_was_taken_for_a_loop_left_early():
    """Cause (probe13 P13-01): every `plan()` on the thread took the gradient sync that the running loop's
    `accumulate` held (micro-batch 0 of 2) for a loop left early, so two dispatchers alternating by step, the next
    step planned and dispatched inside the current loop, were refused on every rank.  A `plan()` now leaves alone
    the loop of another dispatcher's step that has not ended: the steps' gradients are one pass's."""
    expected = overlap_reference(range(len(OVERLAP_STEPS)))
    for counts, gradients in spawn(overlapped_steps_job, 2, timeout_s=60):
        assert min(counts) >= 2, counts  # micro-batch 0 holds the sync: the next step is planned inside the loop
        for got, want in zip(gradients, expected):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    for message in spawn(overlapped_steps_job, 2, args=(True,), timeout_s=60):  # a loop left there is still refused
        assert message.startswith("a micro-batch loop with grad began (`microbatches()`) while this thread's "
                                  "micro-batch loop of a step that has not ended is open after its micro-batch 0 of 2"
                                  ), message
        assert "if that loop was left early (`break`, an exception, its generator kept)" in message, message


def planned_inside_job(rank, size):
    """One DDP dispatcher: step k + 1's `plan` runs inside step k's loop, after micro-batch 0's `accumulate` block,
    its `dispatch` after the loop.  Each step's gradients."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6)
    gradients, upcoming = [], dispatcher.plan(OVERLAP_STEPS[0][rank])
    for step, per_rank in enumerate(OVERLAP_STEPS):
        plan = upcoming
        moved = dispatcher.dispatch({"x": overlap_features(step, rank)}, plan, lengths=per_rank[rank])
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(model, micro):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
            if micro.index == 0 and step + 1 < len(OVERLAP_STEPS):
                upcoming = dispatcher.plan(OVERLAP_STEPS[step + 1][rank])
        gradients.append(torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy().copy())
        net.zero_grad()
    return gradients


def test_regression_the_next_step_planned_inside_the_loop_by_its_own_dispatcher_was_taken_for_a_loop_left_early():
    """Cause (probe13 P13-10): `plan()` decided whether the step's loop had been left early, so one dispatcher
    planning the next step inside the loop (dispatching it after) was refused on every rank.  A step ends at its
    dispatcher's next dispatch (of another plan), which now decides, its refusal in the exchange header."""
    expected = overlap_reference(range(len(OVERLAP_STEPS)))
    for gradients in spawn(planned_inside_job, 2, timeout_s=60):
        for got, want in zip(gradients, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def dropped_step_job(rank, size, clear):
    """OVERLAP_STEPS on one DDP dispatcher; every rank drops step 1 after micro-batch 0's block (`break`, a loss spike
    seen), its gradients cleared first where `clear` ("none": set to None, "zero": zeroed) : what step 2's `plan`
    raised, or steps 0 and 2's gradients."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6)
    gradients = []
    try:
        for step, per_rank in enumerate(OVERLAP_STEPS):
            plan = dispatcher.plan(per_rank[rank])
            moved = dispatcher.dispatch({"x": overlap_features(step, rank)}, plan, lengths=per_rank[rank])
            for micro in dispatcher.microbatches(plan, moved):
                if step == 1 and micro.index == 1:
                    if clear == "stepped":  # the loop's usual optimizer step, after a bug's `break`
                        torch.optim.SGD(net.parameters(), lr=0.5).step()
                    if clear:
                        net.zero_grad(set_to_none=clear == "none")
                    break
                with accumulate(model, micro):
                    normalize_loss(model(micro.data["x"]).sum(), micro).backward()
            else:
                gradients.append(torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy().copy())
                net.zero_grad()
    except ValueError as error:
        return str(error)
    return gradients


def test_regression_a_step_dropped_on_purpose_with_its_gradients_cleared_was_refused_as_a_loop_left_early():
    """Cause (probe13 P13-05): a DDP step left after micro-batch 0 on every rank, its gradients cleared (the usual
    way to drop a step after a loss spike), was refused by the next `plan()` as a loop whose gradients were never
    synchronised, and `check=False`, its only way out, had to be passed before the decision.  Nothing is left to
    synchronise there: every gradient None or zero is now accepted; a step left with its gradients is refused."""
    expected = overlap_reference((0, 2))
    for clear in ("none", "zero"):
        for gradients in spawn(dropped_step_job, 2, args=(clear,), timeout_s=60):
            assert not isinstance(gradients, str), gradients
            for got, want in zip(gradients, expected, strict=True):
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    for message in spawn(dropped_step_job, 2, args=(None,), timeout_s=60):
        assert message.startswith("the micro-batch loop of the previous step on this thread ended after micro-batch 0 "
                                  "of 2"), message
        assert "to drop a step on purpose, clear its gradients first" in message, message


def test_regression_a_loop_left_by_a_bug_then_stepped_and_cleared_was_taken_for_a_dropped_step():
    """Cause (probe13 P13-19, a regression of P12-09 by 5cff787): a loop left after micro-batch 0 on every rank,
    then the loop's usual `optimizer.step(); optimizer.zero_grad()`, had every gradient zero at the next `plan()`,
    so it was accepted as a step dropped on purpose: each replica had stepped on its own unsynchronised gradients
    and they trained on apart, no error.  A held step counts as dropped only where the model's parameters are those
    of its held block too: every rank refuses it."""
    for message in spawn(dropped_step_job, 2, args=("stepped",), timeout_s=60):
        assert isinstance(message, str) and message.startswith(
            "the micro-batch loop of the previous step on this thread ended after micro-batch 0 of 2"), message
        assert "clear its gradients first, with no optimizer step" in message, message


def ordered_steps_job(rank, size, order):
    """Step 0 of OVERLAP_STEPS (M = 2) on DDP, its micro-batches run in `accumulate` "reversed", "twice" in index
    order (two passes over the step's micro-batches), or with the last run again ("last twice"): what each rank
    raised at which micro-batch, or the gradient."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6)
    lengths = OVERLAP_STEPS[0][rank]
    plan = dispatcher.plan(lengths)
    micros = list(dispatcher.microbatches(plan, dispatcher.dispatch({"x": overlap_features(0, rank)}, plan)))
    assert len(micros) == 2
    try:
        for micro in micros[::-1] if order == "reversed" else micros * 2 if order == "twice" else micros + micros[-1:]:
            with accumulate(model, micro):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
    except ValueError as error:
        return f"micro-batch {micro.index}: {error}"
    return torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy().copy()


def test_regression_micro_batches_run_out_of_order_synchronised_on_the_first_block_and_not_after():
    """Cause (probe13 P13-07): under DDP the block of the step's last micro-batch synchronises the gradients, so run
    first (`reversed(list(...))`) it reduced one micro-batch's and the others stayed each rank's own, no error until
    the next `plan()` called the loop left early.  The last micro-batch's block now refuses, before its forward,
    to run before the step's others; passes in index order, one after the other, are fine."""
    for message in spawn(ordered_steps_job, 2, args=("reversed",), timeout_s=60):
        assert message.startswith("micro-batch 1: micro-batch 1 of 2, the step's last, runs in `accumulate` before "
                                  "micro-batches [0] of its step"), message
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    features = torch.cat([overlap_features(0, rank) for rank in OVERLAP_STEPS[0]])
    (2 * net(features).sum() / features.shape[0]).backward()
    for gradient in spawn(ordered_steps_job, 2, args=("twice",), timeout_s=60):
        assert not isinstance(gradient, str), gradient
        np.testing.assert_allclose(gradient, torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy(), rtol=0,
                                   atol=1e-12)


def test_regression_the_last_micro_batch_run_again_was_refused_as_run_before_the_others():
    """Cause (probe17 P17-12): the step's last micro-batch run a second time (a retry: `micros + micros[-1:]`) was
    refused, rightly, but "before micro-batches [0] of its step", which had run first.  It now says it runs again."""
    for message in spawn(ordered_steps_job, 2, args=("last twice",), timeout_s=60):
        assert message.startswith("micro-batch 1: micro-batch 1 of 2, the step's last, runs in `accumulate` again, "
                                  "after its block synchronised the step's gradients"), message


def own_count_job(rank, size):
    """ONE_EMPTY at T = 40 through DDP of SkipOnEmptyModel (rank 2's last micro-batch empty), a bare loop (no
    `accumulate`; `no_sync()` but on the last micro-batch) dividing each micro-batch's loss by its own loss tokens:
    the bodies that ran, and what each rank raised."""
    torch.manual_seed(0)
    wrapped = nn.parallel.DistributedDataParallel(SkipOnEmptyModel().double())
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=40)
    lengths, tokens, labels = rank_batch(rank, ONE_EMPTY)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    ran = []
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)):
            with contextlib.nullcontext() if micro.is_last else wrapped.no_sync():
                loss_sum = summed_loss(wrapped(micro.data["tokens"]), micro)
                (loss_sum / max(int(micro.data["labels"].ge(0).sum()), 1)).backward()
            ran.append(micro.index)
    except ModelContractError as error:
        return ran, str(error)
    return ran, "no error"


def test_regression_a_bare_loop_dividing_by_its_own_count_was_not_checked():
    """Cause (issue 24, the bare-loop rule): a loop without `accumulate` whose loss never went through
    `normalize_loss(loss, micro)` (divided by each micro-batch's own count: tokens weighted by the micro-batch they
    sit in) ran no model check, and the layer rank 2 skipped on its empty last micro-batch trained wrong or paired
    DDP's reductions wrongly.  In a step due the check, a body that ran a DDP forward with grad and no `accumulate`
    block is refused on every rank after it (its backward has run: no collective waits)."""
    for ran, message in spawn(own_count_job, len(ONE_EMPTY), timeout_s=60):
        assert ran == [0], (ran, message)
        assert message.startswith("a micro-batch loop body without `with accumulate(model, micro):`, its loss "
                                  "normalised otherwise than by `normalize_loss(loss, micro)` (by a count of its own, "
                                  "or by hand), on micro-batch 0 of 4, in a step due the model check"), message


SKIPPED_EMPTY = {0: [6, 6], 1: [1]}  # three micro-batches: one rank's non-last ones hold nothing


def skipping_empty_job(rank, size):
    """SKIPPED_EMPTY on DDP, a loop that skips its rank's empty micro-batches but the last (they add nothing): the
    rows of each micro-batch and the gradient, or what was raised."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6, num_microbatches=3)
    lengths = SKIPPED_EMPTY[rank]
    features = torch.randn(sum(lengths), 3, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    plan = dispatcher.plan(lengths)
    sizes = []
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": features}, plan, lengths=lengths)):
            sizes.append(int(micro.data["x"].shape[0]))
            if not sizes[-1] and not micro.is_last:
                continue
            with accumulate(model, micro):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
    except ValueError as error:
        return sizes, str(error)
    return sizes, torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy().copy()


def test_regression_the_order_check_took_a_skipped_empty_micro_batch_for_one_run_out_of_order():
    """Cause (review9 R9-02, after 67cbb2d): the order check counted a micro-batch as run only where its block ran,
    so a loop skipping its rank's empty micro-batches (nothing to synchronise) was refused on that rank alone, its
    peers dying in DDP's all-reduce.  A micro-batch with no rows on the rank counts as run."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    features = torch.cat([torch.randn(sum(SKIPPED_EMPTY[rank]), 3, generator=torch.Generator().manual_seed(rank),
                                      dtype=torch.float64) for rank in SKIPPED_EMPTY])
    (net(features).sum() / features.shape[0]).backward()
    expected = torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy()
    outcomes = spawn(skipping_empty_job, 2, timeout_s=60)
    assert any(0 in sizes[:-1] for sizes, _ in outcomes), outcomes  # a non-last micro-batch skipped somewhere
    for sizes, gradient in outcomes:
        assert not isinstance(gradient, str), (sizes, gradient)
        np.testing.assert_allclose(gradient, expected, rtol=0, atol=1e-12)


SMALL = ModelConfig(vocab=32, llm_hidden=8, encoder_hidden=8, heads=2, patch_dim=6, frame_dim=5, pool=2, stride=2)


class MultiStageWhole(nn.Module):
    """The demo model whose forward runs the multi-stage runtime on a micro-batch, for DDP to wrap."""

    def __init__(self):
        super().__init__()
        self.model = TinyMultimodalModel(SMALL).double()

    def forward(self, runtime, micro):
        model = self.model
        packed = runtime.forward(micro.routes, micro.data, encoders=model.encoders(), text_embedding=model.llm.embed)
        labels = packed.scatter_text(micro.data.text["labels"], IGNORE)
        return model.loss_sum(model.llm(packed.embeddings, packed.sample_lengths), labels)


def second_dispatch_job(rank, size, second, listed=False):
    """Two DDP steps of the multi-stage runtime; with `second`, the step's routes dispatch a second batch dict inside
    its loop, after micro-batch 0's block; with `listed`, rank 0 alone lists the step's micro-batches before the loop
    (logging): each step's micro-batch count and summed absolute gradient."""
    torch.manual_seed(0)
    whole = MultiStageWhole()
    ddp = nn.parallel.DistributedDataParallel(whole)
    data = SyntheticMultimodal(SMALL, samples_per_rank=5, seed=0)
    budget = int(max(s.llm_length for step in (0, 1) for r in range(size) for s in data.samples(step, r)))
    runtime = MultiStageRuntime(demo_stages({m: CostModel() for m in ("image", "audio", "llm")}, SMALL),
                                max_tokens_per_microbatch=budget)
    out = []
    for step in range(2):
        samples = data.samples(step, rank)
        local = data.tensors(samples, torch.float64)
        counts = [int(part.ne(IGNORE).sum()) for part in local.text["labels"].split([s.text for s in samples])]
        routes = runtime.plan(samples, loss_tokens=counts)
        moved = runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs)
        ran = 0
        if listed and rank == 0:
            len(list(runtime.microbatches(routes, moved)))
        for micro in runtime.microbatches(routes, moved):
            with accumulate(ddp, micro):
                normalize_loss(ddp(runtime, micro), micro).backward()
            if second and micro.index == 0:
                runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs)
            ran += 1
        out.append((ran, float(sum(p.grad.abs().sum() for p in whole.parameters() if p.grad is not None))))
        ddp.zero_grad()
    return out


def test_regression_a_second_batch_dict_of_a_multi_stage_step_was_taken_for_a_loop_left_early():
    """Cause (review9 R9-03, after 2758396): every `MultiStageRuntime.dispatch` decided whether the loop of the step
    had been left early, so a second batch dict dispatched along the step's routes inside its loop was refused on
    every rank.  As the dispatcher, only routes other than the loop's end it."""
    plain, second = (spawn(second_dispatch_job, 2, args=(flag,), timeout_s=120) for flag in (False, True))
    assert all(ran > 1 for out in plain for ran, _ in out), plain  # micro-batch 0 holds the sync
    for with_second, without in zip(second, plain):
        assert [ran for ran, _ in with_second] == [ran for ran, _ in without]
        np.testing.assert_allclose([total for _, total in with_second], [total for _, total in without], rtol=1e-12)


def test_regression_a_multi_stage_step_ended_by_how_often_one_rank_listed_its_micro_batches():
    """Cause (review9 R9-07, multi-stage): every `MultiStageRuntime.microbatches` call began a step, so rank 0, which
    listed the micro-batches for logging, ran its loop in step 2 (not due the model check) while rank 1 ran it in
    step 1 (due): the check's collective met rank 0's gradient all-reduce, and gloo failed on both ranks.  A step now
    begins at a dispatch's first `microbatches`, as decided alike on every rank."""
    plain, listed = (spawn(second_dispatch_job, 2, args=(False, flag), timeout_s=120) for flag in (False, True))
    for with_listing, without in zip(listed, plain):
        assert [ran for ran, _ in with_listing] == [ran for ran, _ in without]
        np.testing.assert_allclose([total for _, total in with_listing], [total for _, total in without], rtol=1e-12)


def stepped_inside_job(rank, size, inside=0, fused=False):
    """Steps 0 to `inside` of OVERLAP_STEPS (M = 2) on DDP with SGD (or a fused Adam), the optimizer stepped after
    each step's last micro-batch, and in step `inside` after micro-batch 0's block too (mini-batches inside the
    step): what each rank raised, or whether its parameters are those of rank 0."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1, fused=True) if fused else \
        torch.optim.SGD(net.parameters(), lr=0.1)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6)
    try:
        for step in range(inside + 1):
            plan = dispatcher.plan(OVERLAP_STEPS[step][rank])
            for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": overlap_features(step, rank)}, plan)):
                with accumulate(model, micro):
                    normalize_loss(model(micro.data["x"]).pow(2).sum(), micro).backward()
                if step == inside or micro.is_last:
                    optimizer.step()
                    optimizer.zero_grad()
    except ValueError as error:
        return f"step {step + 1} ({'due' if micro.contract else 'not due'}) micro-batch {micro.index}: {error}"
    weights = torch.cat([net.weight.flatten(), net.bias]).detach()
    first = weights.clone()
    torch.distributed.broadcast(first, 0)
    return bool(torch.equal(weights, first))


def test_regression_an_optimizer_step_inside_a_dispatched_step_updated_each_replica_on_its_own_gradients():
    """Cause (probe13 P13-16): an optimizer step between micro-batches of a step (PPO-style mini-batches) ran on the
    gradients `accumulate` kept unsynchronised: the replicas drifted apart, no error.  On a step due the check, the
    next block of the step refuses parameters that changed since the step's first held block (every rank)."""
    for message in spawn(stepped_inside_job, 2, timeout_s=60):
        assert isinstance(message, str) and message.startswith(
            "step 1 (due) micro-batch 1: the parameters of DistributedDataParallel of Linear changed between "
            "micro-batches 0 and 1 of a step"), message


def test_regression_an_optimizer_step_inside_a_step_not_due_the_check_updated_each_replica_on_its_own_gradients():
    """Cause (probe13 P13-16 residual): the refusal above ran on steps due the model check only, so mini-batches
    inside a later step (with a token budget M varies, and a trainer stepping every K micro-batches splits only the
    steps of M > K) let the replicas drift apart, no error.  The parameter versions are checked on every step."""
    for message in spawn(stepped_inside_job, 2, args=(2,), timeout_s=60):
        assert isinstance(message, str) and message.startswith(
            "step 3 (not due) micro-batch 1: the parameters of DistributedDataParallel of Linear changed between "
            "micro-batches 0 and 1 of a step"), message


def test_regression_a_fused_optimizer_stepped_inside_a_step_unseen_by_the_version_counters():
    """Cause (probe14 P14-01): fused optimizers (`Adam(fused=True)`, the usual choice on GPUs) write the parameters
    without bumping their version counters, so an optimizer step between micro-batches went unseen and the replicas
    drifted apart, no error.  Every optimizer step is counted by a global step hook too."""
    for message in spawn(stepped_inside_job, 2, args=(2, True), timeout_s=60):
        assert isinstance(message, str) and message.startswith(
            "step 3 (not due) micro-batch 1: the parameters of DistributedDataParallel of Linear changed between "
            "micro-batches 0 and 1 of a step"), message


class MomentumPair(nn.Module):
    """A query layer trained and a frozen key layer moved towards it in every forward (MoCo / BYOL style)."""

    def __init__(self):
        super().__init__()
        self.query, self.key = nn.Linear(3, 1).double(), nn.Linear(3, 1).double()
        self.key.requires_grad_(False)

    def forward(self, x):
        with torch.no_grad():
            for key, query in zip(self.key.parameters(), self.query.parameters()):
                key.mul_(0.9).add_(query, alpha=0.1)
        return self.query(x) + self.key(x)


def momentum_job(rank, size):
    """Three steps of a DDP MomentumPair, the optimizer stepped after each step's last micro-batch: whether every
    parameter equals rank 0's (what each rank raised, else)."""
    torch.manual_seed(0)
    net = MomentumPair()
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.query.parameters(), lr=0.1)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6)
    try:
        for step in range(3):
            plan = dispatcher.plan(OVERLAP_STEPS[step][rank])
            for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": overlap_features(step, rank)}, plan)):
                with accumulate(model, micro):
                    normalize_loss(model(micro.data["x"]).pow(2).sum(), micro).backward()
            optimizer.step()
            optimizer.zero_grad()
    except ValueError as error:
        return str(error)
    weights = torch.cat([parameter.detach().flatten() for parameter in net.parameters()])
    first = weights.clone()
    torch.distributed.broadcast(first, 0)
    return bool(torch.equal(weights, first))


def test_regression_a_frozen_parameter_written_by_the_forward_was_taken_for_an_optimizer_step():
    """Cause (probe14 P14-04): the version check read every parameter, so a frozen one a forward writes in place (a
    momentum encoder, an embedding's max_norm) was refused as an optimizer step inside the step.  Only trainable
    parameters are read; the replicas stay equal."""
    assert spawn(momentum_job, 2, timeout_s=60) == [True, True]


def test_regression_the_forward_noting_hook_outlived_its_step():
    """Cause (probe12 P12-L3 = review8 R8-15): the global forward pre-hook that notes a due step's forwards stayed
    installed after the step's loop until the next plan(), so after the last training step every module call in
    the process ran through it.  The step's last `accumulate` block removes it (one process, a first step)."""
    model, dispatcher = TokenModel().double(), PostBalancingDispatcher(max_tokens_per_microbatch=40)
    lengths, tokens, labels = rank_batch(0, ONE_EMPTY)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))  # an earlier test's hook gone
    hooks = torch.nn.modules.module._global_forward_pre_hooks
    before = len(hooks)
    micros = list(dispatcher.microbatches(plan, dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)))
    assert micros[-1].contract is not None and len(hooks) == before + 1  # due: watched from the first
    for micro in micros:
        with accumulate(model, micro):
            normalize_loss(model(micro.data["tokens"]).sum(), micro).backward()
    assert len(hooks) == before


def reference_with_grad_job(rank, size):
    """A plain model's bare loop (gradients reduced by hand) that runs a DDP reference model with grad in each
    body and detaches its output: what each rank raised."""
    torch.manual_seed(0)
    reference, model = nn.parallel.DistributedDataParallel(SkipOnEmptyModel().double()), SkipOnEmptyModel().double()
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=40)
    lengths, tokens, labels = rank_batch(rank, ONE_EMPTY)
    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens(lengths, labels))
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)):
            reference(micro.data["tokens"]).detach()
            loss_sum = nn.functional.cross_entropy(model(micro.data["tokens"]), micro.data["labels"],
                                                   ignore_index=-1, reduction="sum")
            normalize_loss(loss_sum, micro).backward()
    except ModelContractError as error:
        return str(error)
    return "no error"


def test_regression_the_bare_loop_refusal_did_not_say_a_ddp_reference_model_had_set_it_off():
    """Cause (probe11 P11-04): a plain model's loop that ran a DDP reference model with grad (its output detached)
    was refused with advice about the trained model only; the message now names the DDP module's class and says a
    reference model's forward belongs under torch.no_grad()."""
    for message in spawn(reference_with_grad_job, len(ONE_EMPTY), timeout_s=60):
        assert "after a forward with grad of a DDP or FSDP2 module (DistributedDataParallel of SkipOnEmptyModel)" \
            in message, message
        assert "if that DistributedDataParallel of SkipOnEmptyModel is a reference model whose output the loss does " \
            "not depend on, run it under torch.no_grad()" in message, message


def static_graph_job(rank, size, teacher=False):
    """The steps of OVERLAP_STEPS (M >= 2) on a DDP built with static_graph=True; with `teacher`, a frozen teacher's
    no-grad pass over another batch, through a second dispatcher, inside each step's loop after micro-batch 0's
    block: each step's gradients."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net, static_graph=not teacher)
    dispatcher, other = PostBalancingDispatcher(max_tokens_per_microbatch=6), PostBalancingDispatcher()
    gradients = []
    for step, per_rank in enumerate(OVERLAP_STEPS):
        plan = dispatcher.plan(per_rank[rank])
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": overlap_features(step, rank)}, plan)):
            with accumulate(model, micro):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
            if teacher and micro.index == 0:
                with torch.no_grad():
                    lengths = OVERLAP_STEPS[-1 - step][rank]
                    taught = other.plan(lengths)
                    moved = other.dispatch({"x": overlap_features(2 - step, rank)}, taught)
                    for part in other.microbatches(taught, moved):
                        net(part.data["x"]).sum()
        gradients.append(torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy().copy())
        net.zero_grad()
    return gradients


@pytest.mark.parametrize("teacher", [False, True], ids=["static_graph", "teacher_no_grad_pass_inside"])
def test_regression_static_graph_ddp_and_a_no_grad_pass_inside_the_loop_could_not_train(teacher):
    """Causes (probe15 P15-01, P15-02): a DDP built with static_graph=True must run its first backward synchronised
    (it records the graph), and `accumulate` held the sync of every micro-batch but the last: torch's internal
    assert on every rank, a first step of M > 1 could not train.  Now that backward synchronises (the last one's
    all-reduce averages its mean again: the same gradient).  A frozen teacher's no-grad pass through a second
    dispatcher inside the loop was refused as a loop left early (its `microbatches()` took the held sync for an
    abandoned one); a no-grad `microbatches()` keeps it, as `plan()` does.  Gradients as one float64 pass."""
    expected = overlap_reference(range(len(OVERLAP_STEPS)))
    for gradients in spawn(static_graph_job, 2, args=(teacher,), timeout_s=60):
        for got, want in zip(gradients, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def inside_with_grad_job(rank, size, what):
    """Step 0 of OVERLAP_STEPS (M = 2) on DDP; after micro-batch 0's block, inside the loop: a frozen teacher's
    micro-batch loop through a second dispatcher with grad on ("teacher"), or the next step dispatched through the
    loop's own dispatcher ("dispatch"): what each rank raised."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(3, 1).double())
    teacher = nn.Linear(3, 1).double().requires_grad_(False)
    dispatcher, other = PostBalancingDispatcher(max_tokens_per_microbatch=6), PostBalancingDispatcher()
    plan = dispatcher.plan(OVERLAP_STEPS[0][rank])
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": overlap_features(0, rank)}, plan)):
            with accumulate(model, micro):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
            if micro.index == 0:
                runs = other if what == "teacher" else dispatcher
                taught = runs.plan(OVERLAP_STEPS[1][rank])
                moved = runs.dispatch({"x": overlap_features(1, rank)}, taught)
                for part in other.microbatches(taught, moved):
                    teacher(part.data["x"]).sum()
    except ValueError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("what", ["teacher", "dispatch"])
def test_regression_a_loop_with_grad_or_a_dispatch_inside_a_loop_was_refused_as_a_loop_left_early(what):
    """Cause (probe15 P15-02 residue): a frozen teacher's micro-batch loop run with grad inside the student's loop
    (through a second dispatcher), and the next step dispatched inside the loop, are refused, as they must be (the
    student's held gradient sync would be lost), but the message opened with "the micro-batch loop of the previous
    step on this thread ended after micro-batch 0" before naming either case.  Where the held loop's generator is
    still open the message now leads with what began inside it, and its fix."""
    began = {"teacher": "a micro-batch loop with grad began (`microbatches()`)",
             "dispatch": "the next step was dispatched"}[what]
    fix = {"teacher": "run a frozen model's micro-batch loop there (a teacher's, an evaluation's) under "
                      "`torch.no_grad()`",
           "dispatch": "dispatch it after the loop's last micro-batch"}[what]
    for message in spawn(inside_with_grad_job, 2, args=(what,), timeout_s=60):
        assert message.startswith(f"{began} while this thread's micro-batch loop of a step that has not ended is open "
                                  f"after its micro-batch 0 of 2, where `accumulate` holds DistributedDataParallel of "
                                  f"Linear's gradient sync"), message
        assert fix in message, message


def skipped_failure_job(rank, size):
    """Step 0 of OVERLAP_STEPS (M = 2, due the model check) on DDP; rank 1's body raises inside `accumulate` on the
    last micro-batch, before its backward, and the loop catches it outside the block and goes on (the habit of
    skipping an out-of-memory batch): what each rank raised, and how long it took."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(3, 1).double())
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6)
    plan = dispatcher.plan(OVERLAP_STEPS[0][rank])
    start = time.monotonic()
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": overlap_features(0, rank)}, plan)):
            try:
                with accumulate(model, micro):
                    loss = model(micro.data["x"]).sum()
                    if rank == 1 and micro.is_last:
                        raise RuntimeError("out of memory (simulated)")
                    normalize_loss(loss, micro).backward()
            except RuntimeError:
                continue
        dispatcher.plan(OVERLAP_STEPS[1][rank])
    except ValueError as error:
        return str(error), time.monotonic() - start
    return "no error", time.monotonic() - start


def test_regression_a_body_that_raised_on_the_checked_micro_batch_left_its_peers_in_the_check_until_the_timeout():
    """Cause (probe16 P16-14, HG): a block leaving by an exception skipped the model check it owed (it joins the
    check only where its body ends without a backward), so where a rank's body raised on the last micro-batch of a
    step due the check and the loop caught it outside the block, its peers waited in the check's all-reduce and it
    in the next step's metadata all-gather, until the group's timeout, both blaming a dead peer.  The block now joins
    the check as a rank whose body raised: every rank raises at once, naming it."""
    for rank, (message, seconds) in enumerate(spawn(skipped_failure_job, 2, timeout_s=60, collective_timeout_s=30)):
        assert message.startswith(f"rank {rank}: ranks [1] raised inside the body of `accumulate` in micro-batch 1 of "
                                  f"2, before its backward"), message
        assert seconds < 20, seconds


def unfused_due_job(rank, size):
    """Three DDP loops of the multi-stage runtime without the fused input exchange, routes made once and dispatched
    before each loop: whether each loop's micro-batches were due the model check, and whether some rank's last
    micro-batch was empty (due whatever ran before)."""
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(MultiStageWhole())
    data = SyntheticMultimodal(SMALL, samples_per_rank=5, seed=0)
    budget = int(max(s.llm_length for r in range(size) for s in data.samples(0, r)))
    runtime = MultiStageRuntime(demo_stages({m: CostModel() for m in ("image", "audio", "llm")}, SMALL),
                                max_tokens_per_microbatch=budget, fused_input_exchange=False)
    samples = data.samples(0, rank)
    local = data.tensors(samples, torch.float64)
    routes = runtime.plan(samples)
    due = []
    for _ in range(3):
        moved = runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs)
        for micro in runtime.microbatches(routes, moved):
            with accumulate(ddp, micro):
                normalize_loss(ddp(runtime, micro), micro).backward()
        due.append(micro.contract is not None)
        ddp.zero_grad()
    empty = not np.all(np.diff(routes.microbatches[-1].plan.shards.rank_offsets))
    return due, empty


def test_regression_without_the_fused_input_exchange_every_step_was_due_the_model_check():
    """Cause (issue 24 runtime item 6): without the fused input exchange `dispatch` runs no header, so routes made
    once keep one step, and only a runtime's first step was due the check: every loop was, a model-check walk and
    all-reduce each step (cost only).  Steps are due until a training loop ran (or a rank's last micro-batch is
    empty)."""
    for due, empty in spawn(unfused_due_job, 2, timeout_s=120):
        assert due == [True, empty, empty], (due, empty)


def zipped_loops_job(rank, size):
    """Two DDP models, each with its own dispatcher, their loops of step 0 of OVERLAP_STEPS interleaved with `zip`
    (multi-task, policy and value), each body in its own `accumulate`: each model's gradients."""
    models, dispatchers, loops = [], [], []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(nn.parallel.DistributedDataParallel(nn.Linear(3, 1).double()))
        dispatchers.append(PostBalancingDispatcher(max_tokens_per_microbatch=6))
        plan = dispatchers[-1].plan(OVERLAP_STEPS[0][rank])
        loops.append(dispatchers[-1].microbatches(plan, dispatchers[-1].dispatch({"x": overlap_features(0, rank)},
                                                                                 plan)))
    for pair in zip(*loops):
        for model, micro in zip(models, pair):
            with accumulate(model, micro):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
    return [torch.cat([model.module.weight.grad.flatten(), model.module.bias.grad]).numpy() for model in models]


def test_regression_two_models_loops_interleaved_with_zip_were_refused_as_bare_loops():
    """Cause (probe15 P15-15): the bare-loop check compared a micro-batch with the latest `accumulate` block on the
    thread, so two models' loops interleaved with `zip`, each body in its own block, were refused on every rank as
    'a micro-batch loop body without `with accumulate(model, micro):`'.  Each micro-batch's blocks are its own now;
    both models' gradients are one float64 pass's."""
    (expected,) = overlap_reference([0])
    for gradients in spawn(zipped_loops_job, 2, timeout_s=60):
        for got in gradients:
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def forgotten_block_job(rank, size, nested, frozen=()):
    """Two FSDP2 modules (an encoder and a head, no sharded root) trained on OVERLAP_STEPS' step 0 (M >= 2, due the
    check), the body in a block for the head only, or (`nested`) in one block per module; the encoder's parameters
    named in `frozen` frozen: the trainable parameters' gradients, or what each rank raised."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    encoder, head = nn.Linear(3, 3).double(), nn.Linear(3, 1).double()
    for name in frozen:
        getattr(encoder, name).requires_grad_(False)
    fully_shard(encoder)
    fully_shard(head)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6)
    plan = dispatcher.plan(OVERLAP_STEPS[0][rank])
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": overlap_features(0, rank)}, plan)):
            with accumulate(head, micro), (accumulate(encoder, micro) if nested else contextlib.nullcontext()):
                normalize_loss(head(torch.tanh(encoder(micro.data["x"]))).sum(), micro).backward()
    except ModelContractError as error:
        return str(error)
    return [parameter.grad.full_tensor().numpy() for parameter in (*encoder.parameters(), *head.parameters())
            if parameter.requires_grad]


def test_regression_a_forgotten_block_of_one_of_two_fsdp2_modules_checked_nothing_and_held_no_sync():
    """Cause (probe15 P15-13 addendum): with two FSDP2 modules and a block for the head only, the encoder's forward
    ran inside a block of another model: its sync was not held and nothing checked it, so an encoder skipping layers
    on an empty micro-batch left the ranks waiting until the group's timeout.  On a step due the check, a DDP or
    FSDP2 forward in a body that none of its blocks' models is or holds is refused on every rank; one block per
    module trains to one float64 pass's gradients."""
    for rank, message in enumerate(spawn(forgotten_block_job, 2, args=(False,), timeout_s=60)):
        assert isinstance(message, str) and message.startswith(
            f"rank {rank}: the body of `accumulate` in micro-batch 0 of 2 ran the forward of FSDPLinear, whose "
            f"gradients DDP or FSDP2 reduce, given no block of its own (the blocks here are given FSDPLinear): nest "
            f"one `accumulate` block per DDP or FSDP2 module"), message
    torch.manual_seed(0)
    encoder, head = nn.Linear(3, 3).double(), nn.Linear(3, 1).double()
    features = torch.cat([overlap_features(0, rank) for rank in OVERLAP_STEPS[0]])
    (head(torch.tanh(encoder(features))).sum() / features.shape[0]).backward()
    for gradients in spawn(forgotten_block_job, 2, args=(True,), timeout_s=60):
        assert not isinstance(gradients, str), gradients
        for got, parameter in zip(gradients, (*encoder.parameters(), *head.parameters()), strict=True):
            np.testing.assert_allclose(got, parameter.grad.numpy(), rtol=0, atol=1e-12)


def test_regression_a_frozen_fsdp2_reference_model_run_with_grad_in_the_policys_block_was_refused():
    """Cause (review10 R10-07): a DDP or FSDP2 forward in a body that none of its blocks' models is or holds was
    refused without asking whether it had a trainable parameter, so a frozen reference model sharded with
    `fully_shard` (a KL baseline run without torch.no_grad()) in the policy's block was refused, though it has no
    gradient to reduce.  A module with no trainable parameter is not refused, and the head trains to one float64
    pass's gradients; one trainable parameter left (the encoder's bias) is still refused."""
    torch.manual_seed(0)
    encoder, head = nn.Linear(3, 3).double().requires_grad_(False), nn.Linear(3, 1).double()
    features = torch.cat([overlap_features(0, rank) for rank in OVERLAP_STEPS[0]])
    (head(torch.tanh(encoder(features))).sum() / features.shape[0]).backward()
    for gradients in spawn(forgotten_block_job, 2, args=(False, ("weight", "bias")), timeout_s=60):
        assert not isinstance(gradients, str), gradients
        for got, parameter in zip(gradients, head.parameters(), strict=True):
            np.testing.assert_allclose(got, parameter.grad.numpy(), rtol=0, atol=1e-12)
    for rank, message in enumerate(spawn(forgotten_block_job, 2, args=(False, ("weight",)), timeout_s=60)):
        assert isinstance(message, str) and message.startswith(
            f"rank {rank}: the body of `accumulate` in micro-batch 0 of 2 ran the forward of FSDPLinear, whose "
            f"gradients DDP or FSDP2 reduce, given no block of its own"), message

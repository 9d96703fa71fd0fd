"""Runtime tier 3: the dispatcher, the multi-stage runtime and prefetch in real gloo groups."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from orchmllm.balancers import CostModel
from orchmllm.runtime import (HierarchicalAllToAll, MultiStageRuntime, PostBalancingDispatcher, Prefetcher,
                              all_reduce_gradients, normalize_loss)
from orchmllm.runtime.demo.data import IGNORE, SyntheticMultimodal
from orchmllm.runtime.microbatch import accumulate
from orchmllm.runtime.demo import demo_stages
from orchmllm.runtime.launch import spawn
from orchmllm.runtime.demo.model import ModelConfig, TinyMultimodalModel

LENGTHS = {0: [9, 1, 7, 12, 3], 1: [2, 2], 2: [], 3: [15, 4, 4]}  # rank 2 samples nothing


class UserModel(nn.Module):
    """A model the runtime knows nothing about: a GRU over each sequence, a per-token head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.head = nn.Linear(8, 50)

    def forward(self, tokens, lengths):
        outputs = [self.gru(self.embed(chunk)[None])[0][0] for chunk in tokens.split(lengths) if chunk.numel()]
        hidden = torch.cat(outputs) if outputs else self.embed(tokens)
        return self.head(hidden)


def user_batch(rank):
    lengths = LENGTHS[rank]
    generator = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, 50, (sum(lengths),), generator=generator)
    labels = torch.randint(-1, 50, (sum(lengths),), generator=generator)  # -1: no loss on this token
    return lengths, {"tokens": tokens, "labels": labels, "sample_id": torch.arange(len(lengths)) + 100 * rank}


def user_loss_step(model, batch, lengths):
    logits = model(batch["tokens"], [int(l) for l in lengths])
    labels = batch["labels"]
    loss_sum = nn.functional.cross_entropy(logits, labels, ignore_index=-1, reduction="sum")
    normalize_loss(loss_sum, (labels >= 0).sum(), gradient_reduction="mean").backward()
    all_reduce_gradients(model.parameters(), op="mean")
    return [p.grad.clone() for p in model.parameters()]


def dispatcher_job(rank, size):
    torch.manual_seed(0)
    model = UserModel().double()
    lengths, batch = user_batch(rank)
    reference = user_loss_step(model, batch, lengths)
    model.zero_grad(set_to_none=True)
    results = {}
    for name, transport in (("flat", None), ("hierarchical", HierarchicalAllToAll(2))):
        dispatcher = PostBalancingDispatcher(algorithm="lpt", cost=CostModel(per_item=2, linear=1),
                                             per_item_keys={"sample_id"}, check_plan=True, transport=transport)
        plan = dispatcher.plan(lengths)
        balanced = dispatcher.dispatch(batch, plan)
        np.testing.assert_array_equal(plan.local_items, plan.balance.items_of(rank))
        assert balanced["sample_id"].tolist() == [100 * int(plan.metadata.source_ranks[i]) +
                                                  int(i - plan.metadata.counts[:plan.metadata.source_ranks[i]].sum())
                                                  for i in plan.local_items]
        grads = user_loss_step(model, balanced, plan.local_lengths)
        model.zero_grad(set_to_none=True)
        worst = max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, reference))
        assert worst <= 1e-12, (name, worst)
        results[name] = (plan.balance.makespan, float(plan.lengths.sum()))

        # A per-item output computed on the balanced rank goes home through `combine`, and
        # its gradient flows back to the balanced rank.
        scores = model.head.weight.sum() * torch.arange(len(plan.local_items), dtype=torch.float64)
        home = dispatcher.combine({"score": scores.reshape(-1, 1)}, plan, per_item_keys={"score"})["score"]
        assert home.shape == (len(lengths), 1)
        home.sum().backward()
        assert model.head.weight.grad is not None
        model.zero_grad(set_to_none=True)
        results[name + "-home"] = (home.detach().reshape(-1) / model.head.weight.sum()).round().tolist()
        results[name + "-sent"] = (plan.local_items.tolist(), plan.balance.assignment.tolist())
    return results


def test_dispatcher_wraps_a_foreign_training_loop_without_changing_gradients():
    results = spawn(dispatcher_job, 4, timeout_s=120)
    makespan = results[0]["flat"][0]
    assert all(r["flat"][0] == makespan == r["hierarchical"][0] for r in results)
    # 59 tokens + 2 per item over 4 ranks: mean load 19.75; LPT reaches 21.
    assert makespan <= 21
    for name in ("flat", "hierarchical"):
        local_items, assignment = results[0][name + "-sent"]
        # Item i's score is its position on its balanced rank; it must come home in order.
        positions = {}
        for rank in range(4):
            for position, item in enumerate(np.flatnonzero(np.asarray(assignment) == rank)):
                positions[int(item)] = position
        counts = [len(LENGTHS[r]) for r in range(4)]
        homes = [positions[i] for i in range(sum(counts))]
        assert sum((r[name + "-home"] for r in results), []) == homes


def prefetch_job(rank, size):
    stages = demo_stages({m: CostModel(per_item=1, linear=1) for m in ("image", "audio", "llm")}, ModelConfig())
    runtime = MultiStageRuntime(stages, check_plan=True)
    data = SyntheticMultimodal(ModelConfig(), samples_per_rank=5, seed=1)
    prefetcher = Prefetcher(lambda samples, group: runtime.plan(samples, metadata_group=group))
    digests = []
    for step in range(3):
        prefetcher.submit(data.samples(step, rank))
        # The training thread keeps issuing its own collectives meanwhile.
        for _ in range(20):
            value = torch.ones(1)
            dist.all_reduce(value)
            assert value.item() == size
        prefetched = prefetcher.result(timeout=30)
        synchronous = runtime.plan(data.samples(step, rank))
        assert prefetched.step.digest() == synchronous.step.digest()
        digests.append(prefetched.step.digest())
    prefetcher.close()
    return digests, prefetcher.hidden_fraction


def test_prefetched_plans_equal_synchronous_plans_while_training_collectives_run():
    results = spawn(prefetch_job, 3, timeout_s=120)
    assert all(r[0] == results[0][0] for r in results)
    assert all(0.0 <= r[1] <= 1.0 for r in results)


def reference_sequence(model, sample, text_ids, patches, frames):
    """The sample's LLM input built alone, on one process, from its raw tensors."""
    text_embedded = model.llm.embed(text_ids)
    pieces, covered = {}, np.zeros(sample.llm_length, dtype=bool)
    image_at = audio_at = 0
    for segment in sample.segments:
        if segment.modality == "image":
            encoded = model.vision(patches[image_at: image_at + segment.length], [segment.length])
            image_at += segment.length
        else:
            encoded = model.audio(frames[audio_at: audio_at + segment.length], [segment.length])
            audio_at += segment.length
        position = segment.position
        pieces[position] = encoded
        covered[position: position + segment.tokens] = True
    sequence = torch.zeros(sample.llm_length, text_embedded.shape[1], dtype=text_embedded.dtype)
    sequence[torch.from_numpy(np.flatnonzero(~covered))] = text_embedded
    for position, encoded in pieces.items():
        sequence[position: position + encoded.shape[0]] = encoded
    return sequence


def split_local(batch):
    """Per-sample tensors of a LocalBatch, in sample order."""
    text_at = image_at = audio_at = 0
    out = []
    for sample in batch.samples:
        images = sum(g.length for g in sample.segments if g.modality == "image")
        audio = sum(g.length for g in sample.segments if g.modality == "audio")
        out.append((batch.text["input_ids"][text_at: text_at + sample.text],
                    batch.inputs["image"][image_at: image_at + images],
                    batch.inputs["audio"][audio_at: audio_at + audio]))
        text_at, image_at, audio_at = text_at + sample.text, image_at + images, audio_at + audio
    return out


def multistage_job(rank, size):
    config = ModelConfig(llm_hidden=16, encoder_hidden=16, vocab=64)
    torch.manual_seed(0)
    model = TinyMultimodalModel(config).double()
    datasets = [SyntheticMultimodal(config, samples_per_rank=count, seed=5) for count in (3, 0, 4, 2)]
    stages = demo_stages({m: CostModel(per_item=4, linear=1) for m in ("image", "audio", "llm")}, config)
    batch = datasets[rank].local_batch(0, rank, torch.float64)
    packed_by_transport = []
    for transport in (None, HierarchicalAllToAll(2)):
        runtime = MultiStageRuntime(stages, transport=transport, check_plan=True)
        routes = runtime.plan(batch.samples)
        moved = runtime.dispatch(routes, text=batch.text, per_sample=batch.per_sample, inputs=batch.inputs)
        [micro] = runtime.microbatches(routes, moved)
        step, moved = micro.routes.plan, micro.data
        assert moved.per_sample["sample_id"].tolist() == step.batch.sample_id[step.llm.items_on(rank)].tolist()
        packed = runtime.forward(micro.routes, moved, encoders=model.encoders(), text_embedding=model.llm.embed)
        labels = packed.scatter_text(moved.text["labels"], IGNORE)
        assert (labels != IGNORE).sum() == (moved.text["labels"] != IGNORE).sum()
        logits = model.llm(packed.embeddings, packed.sample_lengths)
        normalize_loss(model.loss_sum(logits, labels), (labels != IGNORE).sum()).backward()
        assert all(p.grad is not None for p in model.vision.parameters())
        model.zero_grad(set_to_none=True)
        packed_by_transport.append(packed)
    flat, hierarchical = packed_by_transport
    assert torch.equal(flat.embeddings, hierarchical.embeddings)

    starts = np.concatenate(([0], np.cumsum(flat.sample_lengths.numpy())))
    per_rank = {r: split_local(datasets[r].local_batch(0, r, torch.float64)) for r in range(size)}
    sources = step.batch.sample_source
    with torch.no_grad():
        for k, sample_index in enumerate(flat.samples):
            source = int(sources[sample_index])
            local_index = int(sample_index - np.flatnonzero(sources == source)[0])
            sample = datasets[source].samples(0, source)[local_index]
            expected = reference_sequence(model, sample, *per_rank[source][local_index])
            # (torch.testing would import sympy in every child: seconds of startup)
            assert (flat.embeddings[starts[k]: starts[k + 1]] - expected).abs().max() <= 1e-12 * expected.abs().max()
    return len(flat.samples)


def test_multistage_assembly_equals_each_sample_built_alone():
    checked = spawn(multistage_job, 4, timeout_s=120)
    assert sum(checked) == 9  # every sample exactly once


def detached_job(rank, size, which):
    """Rank `which` (or every rank, None) dispatches embeddings made by an encoder that requires grad, with
    `differentiable` left False; returns what each rank raised."""
    torch.manual_seed(rank)
    encoder = nn.Linear(2, 3)
    lengths = [2, 3]
    made = encoder(torch.randn(5, 2))
    embeddings = made if which is None or rank == which else made.detach()
    dispatcher = PostBalancingDispatcher()
    try:
        dispatcher.dispatch({"e": embeddings, "t": torch.arange(5)}, dispatcher.plan(lengths))
    except RuntimeError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("which", [None, 1], ids=["every-rank", "rank-1"])
def test_regression_dispatch_detached_a_tensor_that_requires_grad_and_its_encoder_never_learned(which):
    """Cause (probe8 P8-03): `dispatch` (`differentiable=False` by default) moved a tensor that requires grad
    without its graph: the encoder that made it got no gradient, and no error said so.  Every rank now raises,
    naming the rank and the key."""
    for rank, message in enumerate(spawn(detached_job, 2, args=(which,), timeout_s=60)):
        named = rank if which is None else which  # where every rank has a reason, each raises its own
        assert f"rank {named}'s `batch['e']` requires grad but `differentiable` is False" in message, message
        assert "pass differentiable=True to let its gradient flow back" in message, message


def test_dispatch_under_no_grad_or_with_differentiable_takes_a_tensor_that_requires_grad():
    encoder = nn.Linear(2, 3)
    dispatcher = PostBalancingDispatcher()
    with torch.no_grad():
        moved = dispatcher.dispatch({"e": encoder(torch.randn(5, 2))}, dispatcher.plan([2, 3]))
    assert not moved["e"].requires_grad
    moved = dispatcher.dispatch({"e": encoder(torch.randn(5, 2))}, dispatcher.plan([2, 3]), differentiable=True)
    moved["e"].sum().backward()
    assert encoder.weight.grad is not None


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "per-micro-batch"])
def test_regression_multistage_dispatch_detached_inputs_that_require_grad(fused):
    """Cause (probe8 P8-03's sibling): `MultiStageRuntime.dispatch(inputs={"image": proj(x)})` moved image features
    made with grad without their graph: `proj` never got a gradient, and no error said so."""
    from orchmllm.orchestrator import Sample, Segment, Stage

    stages = (Stage("i", "image", CostModel()), Stage("llm", "llm", CostModel()))
    runtime = MultiStageRuntime(stages, check_encoders=False, max_tokens_per_microbatch=8,
                                fused_input_exchange=fused)
    samples = [Sample(3, (Segment("image", 2, 2),), id=0), Sample(2, (), id=1)]
    projection = nn.Linear(4, 4)
    routes = runtime.plan(samples)
    with pytest.raises(RuntimeError, match=r"rank 0's `inputs\['image'\]` requires grad but the runtime moves raw "
                                           r"inputs, text and per-sample tensors without their graph, .* compute it "
                                           r"inside an encoder"):
        moved = runtime.dispatch(routes, text={"input_ids": torch.arange(5)},
                                 inputs={"image": projection(torch.randn(2, 4))}, samples=samples)
        list(runtime.microbatches(routes, moved))


def test_regression_a_second_batch_dict_dispatched_along_the_step_s_plan_ended_the_step():
    """Cause (probe13 P13-06): every `dispatch` ended the step its micro-batches carry, so a second batch dict
    dispatched along the same plan (inside the loop, or after it for rewards computed from the outputs) made the
    step's own micro-batches "of an earlier step" to `normalize_loss` and `combine`.  A step now ends where a plan
    other than the latest dispatch's is dispatched (the next `plan()`'s, equal or not)."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6, per_item_keys=("sid",))
    lengths = [5, 3, 4, 2]
    features = torch.arange(14, dtype=torch.float64)
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch({"x": features, "sid": torch.arange(4)}, plan, lengths=lengths)
    pairs = []
    for micro in dispatcher.microbatches(plan, moved):
        if micro.index == 0:
            dispatcher.dispatch({"y": features * 2}, plan, lengths=lengths)
        weight = torch.ones((), dtype=torch.float64, requires_grad=True)
        normalize_loss((micro.data["x"] * weight).sum(), micro).backward()
        pairs.append((micro, {"out": micro.data["x"] * 3, "sid": micro.data["sid"]}))
    assert len(pairs) >= 3
    dispatcher.dispatch({"y": features * 2}, plan, lengths=lengths)
    home = dispatcher.combine(pairs, plan)
    assert torch.equal(home["out"], features * 3) and home["sid"].tolist() == [0, 1, 2, 3]
    dispatcher.dispatch({"x": features, "sid": torch.arange(4)}, dispatcher.plan(lengths))  # the next step
    with pytest.raises(ValueError, match=r"normalize_loss with micro-batch 0 of an earlier step \(its runtime has run "
                                         r"another since\)"):
        normalize_loss(torch.ones((), requires_grad=True), pairs[0][0])


def test_regression_a_plan_dispatched_every_step_never_ended_its_step():
    """Cause (review9 R9-01, after 7e05741): a step ended only where another plan object was dispatched, so one plan
    made once and dispatched every step (the same lengths each step) never ended its first: step 0's micro-batches
    normalised and combined in step 2, and every step was due the model check.  A step also ends where
    `microbatches` follows a dispatch that came after the step's loop (the next step's loop); loops with no
    dispatch between them are one step's passes (review9 R9-05)."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6, per_item_keys=("sid",))
    lengths = [5, 3, 4, 2]
    plan = dispatcher.plan(lengths)
    steps = []
    for step in range(3):
        moved = dispatcher.dispatch({"x": torch.arange(14, dtype=torch.float64) + 100 * step, "sid": torch.arange(4)},
                                    plan, lengths=lengths)
        steps.append(list(dispatcher.microbatches(plan, moved)))
        for micro in steps[-1]:  # a training loop: later steps are due only where a rank's last micro-batch is empty
            with accumulate(nn.Linear(1, 1), micro):
                pass
    tokens = [micros[0].step for micros in steps]  # three steps: each a token of its own, the earlier two ended
    assert tokens[0] is not tokens[1] and tokens[1] is not tokens[2] and [token.ended for token in tokens] == [
        True, True, False]
    assert [micros[-1].contract is not None for micros in steps] == [True, False, False]
    with pytest.raises(ValueError, match=r"normalize_loss with micro-batch 0 of an earlier step"):
        normalize_loss(torch.ones((), requires_grad=True), steps[0][0])
    with pytest.raises(ValueError, match=r"`outputs` pairs micro-batch 0 of another step than the latest dispatch's"):
        dispatcher.combine([(micro, {"out": micro.data["x"] * 3, "sid": micro.data["sid"]}) for micro in steps[0]],
                           plan)
    home = dispatcher.combine([(micro, {"out": micro.data["x"] * 3}) for micro in steps[2]], plan)
    assert torch.equal(home["out"], (torch.arange(14, dtype=torch.float64) + 200) * 3)
    # (review9 R9-05) loops without a dispatch between them are passes of one step: a no-grad pass, then training
    moved = dispatcher.dispatch({"x": torch.arange(14, dtype=torch.float64), "sid": torch.arange(4)}, plan)
    with torch.no_grad():
        first = list(dispatcher.microbatches(plan, moved))
    second = list(dispatcher.microbatches(plan, moved))
    assert first[0].step is second[0].step and first[0].step is not tokens[2] and tokens[2].ended  # a fourth step
    normalize_loss(torch.ones((), requires_grad=True), first[0])
    dispatcher.combine([(micro, {"out": micro.data["x"]}) for micro in first], plan)


def empty_interleaved_job(rank, size):
    """A step with items ([2], [3]), then one with none anywhere, on a dispatcher planning for an interleaved
    pipeline of P = 2: each step's micro-batches on this rank."""
    from orchmllm.balancers import Pipeline
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=8,
                                         pipeline=Pipeline(stages=2, schedule="interleaved", virtual_stages=2))
    counts = []
    for lengths in ([[2], [3]][rank], []):
        plan = dispatcher.plan(lengths)
        moved = dispatcher.dispatch({"t": torch.zeros(sum(lengths), dtype=torch.int64)}, plan, lengths=lengths)
        counts.append((plan.num_microbatches, len(list(dispatcher.microbatches(plan, moved)))))
    return counts


def test_regression_an_empty_step_under_an_interleaved_pipeline_ran_one_micro_batch():
    """Cause (probe16 P16-04): the dispatcher gave a step with no item on any rank M = 1 micro-batch (a fixed M, or
    1), which the interleaved schedule cannot run (it runs whole groups of P); the orchestrator's path already ran P
    (d964689).  Now the dispatcher's empty step runs `pipeline.runnable(M)` too."""
    for counts in spawn(empty_interleaved_job, 2, timeout_s=60):
        assert counts == [(2, 2), (2, 2)], counts


SAME_LENGTHS = {0: [5, 3, 4, 2], 1: [6, 1, 1, 2]}  # every step's: each step's plan has the same identity


def same_lengths_features(step, rank):
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(sum(SAME_LENGTHS[rank]), 3, generator=generator, dtype=torch.float64)


def kept_plan_job(rank, size):
    """Three DDP steps of the same lengths (M = 2), each planned afresh, but rank 1 dispatches the plan object of
    its previous step (kept by mistake) from step 1 on: each step's gradients, and on rank 1 whether each loop's
    micro-batches carried a step of their own (the previous one ended)."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6)
    gradients, tokens, kept = [], [], None
    for step in range(3):
        plan = dispatcher.plan(SAME_LENGTHS[rank])
        used = kept if rank == 1 and kept is not None else plan
        moved = dispatcher.dispatch({"x": same_lengths_features(step, rank)}, used, lengths=SAME_LENGTHS[rank])
        for micro in dispatcher.microbatches(used, moved):
            with accumulate(model, micro):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
        tokens.append(micro.step)
        gradients.append(torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy().copy())
        net.zero_grad()
        kept = kept or plan
    return gradients, [token.ended for token in tokens], len({id(token) for token in tokens})


def test_a_plan_object_kept_by_one_rank_of_the_same_identity_as_its_peers_fresh_one_does_no_harm():
    """A rank dispatching an earlier plan object while its peers dispatch a fresh one of the same identity (the
    configuration and gathered metadata, which the plan is a function of) moves the same rows to the same ranks;
    it only ends its step at its next `microbatches` instead of at the dispatch (as with a plan made once): every
    step's gradients are one float64 pass's, and each loop is a step of its own on every rank."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    expected = []
    for step in range(3):
        features = torch.cat([same_lengths_features(step, rank) for rank in SAME_LENGTHS])
        (net(features).sum() / features.shape[0]).backward()
        expected.append(torch.cat([net.weight.grad.flatten(), net.bias.grad]).numpy().copy())
        net.zero_grad()
    for gradients, ended, distinct in spawn(kept_plan_job, 2, timeout_s=60):
        assert ended == [True, True, False] and distinct == 3, (ended, distinct)
        for got, want in zip(gradients, expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


LOCAL_HOMES = ([6, 1, 1], [2, 3, 3])  # 8 tokens on each rank before and after the plan moves items


def local_batch_job(rank, size, budget):
    """`microbatches` given the dict this rank passed to `dispatch` (its local batch) instead of what `dispatch`
    returned, whose row total is the plan's: what each rank raised."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=budget)
    lengths = LOCAL_HOMES[rank]
    batch = {"x": torch.cat([torch.full((length,), float(10 * rank + item)) for item, length in enumerate(lengths)])}
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch(batch, plan, lengths=lengths)
    assert moved["x"].shape == batch["x"].shape
    try:
        list(dispatcher.microbatches(plan, batch))
    except ValueError as error:
        return str(error)
    return "accepted"


@pytest.mark.parametrize("budget", [None, 8], ids=["one batch", "micro-batches"])
def test_regression_the_local_batch_passed_as_moved_paired_other_items_rows_with_the_plans_lengths(budget):
    """Cause (probe16 P16-11, SW): `microbatches(plan, batch)` with the dict given to `dispatch` (a typo for
    `moved`) was accepted where the rank's row totals matched the plan's: each micro-batch held this rank's own
    rows under the lengths of the items the plan gave it (inputs, labels and positions of other samples).  A tensor
    given to the latest plan's dispatch, not one it returned, is now refused naming the key."""
    for message in spawn(local_batch_job, 2, args=(budget,), timeout_s=60):
        assert message.startswith("`moved['x']` is a tensor this rank gave `dispatch` (its local batch), not one "
                                  "`dispatch` returned"), message


def test_regression_moved_of_another_kind_and_an_unknown_order_got_no_clear_error():
    """Cause (probe16 P16-10): `microbatches(plan, [moved])` died in Python's "unhashable type: 'dict'", a
    per-item tensor of another row count in "tensor has 3 rows but its 2 items own 2" (naming no key), and
    `combine(pairs, plan, order=...)` checked `order` only for one mapping of outputs, so a typo there passed
    silently.  World size 1: the same path, no communication."""
    dispatcher = PostBalancingDispatcher(per_item_keys=("sid",), max_tokens_per_microbatch=6)
    plan = dispatcher.plan([5, 3, 4])
    moved = dispatcher.dispatch({"x": torch.arange(12.0), "sid": torch.arange(3)}, plan)
    with pytest.raises(TypeError, match=r"^`moved` must be the mapping of tensors that `dispatch` returned; got list"):
        dispatcher.microbatches(plan, [moved])
    with pytest.raises(TypeError, match=r"`moved\['sid'\]` is a list"):
        dispatcher.microbatches(plan, {**moved, "sid": [0, 1, 2]})
    with pytest.raises(ValueError, match=r"^`moved\['sid'\]` \(what `dispatch` returned\) has 4 rows but its 3 items "
                                         r"own 3"):
        dispatcher.microbatches(plan, {**moved, "sid": torch.arange(4)})
    pairs = [(micro, {"out": micro.data["x"] * 2}) for micro in dispatcher.microbatches(plan, moved)]
    assert len(pairs) == plan.num_microbatches > 1
    with pytest.raises(ValueError, match=r"`order` must be None or one of \('local_items', 'microbatches'\); got "
                                         r"'sideways'"):
        dispatcher.combine(pairs, plan, order="sideways")
    assert torch.equal(dispatcher.combine(pairs, plan)["out"], torch.arange(12.0) * 2)

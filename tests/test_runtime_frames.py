"""Videos split between frames through the multi-stage runtime on real gloo ranks.

A video of F frames (`Segment(frames=F)`) rides in the runtime's metadata all-gather; where the planner
runs it as parts of whole frames on several encoder ranks, each rank's frame-wise encoder gets only its
parts' rows and every part's embeddings reach the LLM rank(s) holding their positions (zigzag shards of
a context-parallel split of the same sample too) in the runtime's usual exchanges.  The float64 loss
and every gradient (encoder, text embedding, LLM) equal one unsplit pass over the global batch in one
process within 1e-12, plain and micro-batched, with and without context parallelism, under no wrapper
(hand all-reduce), DDP and FSDP2; a step that splits frames makes the same collectives as the same step
without frames, and its all-to-alls send exactly the bytes the plan counts."""

import functools

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from orchmllm.balancers import CostModel
from orchmllm.balancers.context_parallel import ContextParallel
from orchmllm.orchestrator import frames as planner_frames
from orchmllm.orchestrator.samples import Sample, Segment
from orchmllm.orchestrator.stages import Stage
from orchmllm.runtime import (ContextParallelLayout, MultiStageRuntime, PlanMismatchError, all_reduce_gradients,
                              normalize_loss)
from orchmllm.runtime.demo.giants import CausalBlock
from orchmllm.runtime.counting import CollectiveCounter as Counter
from orchmllm.runtime.launch import spawn
from orchmllm.runtime.microbatch import accumulate

UNITS, TOKENS, PATCH, HIDDEN, HEADS, VOCAB = 4, 2, 6, 8, 2, 32  # per frame: 4 patches in, 2 embeddings out
STAGES = (Stage("vision", "video", CostModel(), input_bytes_per_unit=PATCH * 8, output_bytes_per_token=HIDDEN * 8),
          Stage("llm", "llm", CostModel(linear=1.0, quadratic=0.05), input_bytes_per_unit=16))  # ids + labels
SPEC = ContextParallel(degrees=(1, 2, 4), gpus_per_node=4, half_efficiency_tokens=1, latency_s=0,
                       kv_bytes_per_token=0, seconds_per_cost=1.0)
SCENARIOS = {"plain": {}, "micro-batched": {"max_tokens_per_microbatch": 60},
             "micro-batched, exchanged per micro-batch": {"max_tokens_per_microbatch": 60,
                                                          "fused_input_exchange": False},
             "context-parallel": {"context_parallel": SPEC},
             "context-parallel, micro-batched": {"context_parallel": SPEC, "max_tokens_per_microbatch": 60}}
IGNORE = -100


def rank_samples(rank, frames=True):
    """Short samples (some with a video of one or two frames) and, on rank 2, a giant: 40 text tokens and
    a video of 8 frames at position 10, which costs the vision stage more than a rank's share.
    `frames=False`: the same lengths, every video one frame (nothing to split)."""
    samples = []
    for k in range(3):
        count = 1 + (rank + k) % 2
        video = Segment("video", UNITS * count, TOKENS * count, 1, frames=count if frames else 1)
        samples.append(Sample(10 + 3 * ((rank + k) % 4), (video,) if k % 2 == 0 else (), rank, 100 * rank + k))
    if rank == 2:
        samples.append(Sample(40, (Segment("video", 8 * UNITS, 8 * TOKENS, 10, frames=8 if frames else 1),), 2, 99))
    return samples


def sample_tensors(sample):
    """(input ids, labels, each segment's patches) of a sample, drawn from its id."""
    rng = np.random.default_rng(sample.id)
    ids, labels = (torch.from_numpy(rng.integers(0, VOCAB, sample.text)) for _ in range(2))
    return ids, labels, [torch.from_numpy(rng.standard_normal((s.length, PATCH))) for s in sample.segments]


def local_tensors(samples):
    """This rank's packed text (input ids, labels) and video patches."""
    drawn = [sample_tensors(sample) for sample in samples]
    text = {key: torch.cat([d[part] for d in drawn] + [torch.zeros(0, dtype=torch.int64)])
            for part, key in enumerate(("input_ids", "labels"))}
    patches = torch.cat([p for d in drawn for p in d[2]] + [torch.zeros(0, PATCH, dtype=torch.float64)])
    return text, {"video": patches}


class FrameEncoder(nn.Module):
    """Frame by frame: patches projected, then each of a frame's output tokens a softmax-weighted mix of
    that frame's patches (attention within the frame only), projected again."""

    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Linear(PATCH, HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.score = nn.Linear(HIDDEN, TOKENS, bias=False)  # a bias shifts every patch's score alike: no gradient

    def forward(self, patches, lengths):
        x = torch.tanh(self.embed(patches.reshape(-1, UNITS, PATCH)))  # (frames, patches, hidden)
        pooled = torch.einsum("fpt,fph->fth", torch.softmax(self.score(x), dim=1), x)
        return self.out(pooled).reshape(-1, HIDDEN)


class LM(nn.Module):
    """Unsplit positions (a learned frequency), one causal block through the layout, a token head."""

    def __init__(self):
        super().__init__()
        self.frequency = nn.Parameter(torch.linspace(0.05, 0.9, HIDDEN))
        self.block, self.head = CausalBlock(HIDDEN, HEADS), nn.Linear(HIDDEN, VOCAB)

    def forward(self, embeddings, layout):
        x = embeddings + torch.sin(layout.positions()[:, None].to(embeddings.dtype) * self.frequency)
        return self.head(self.block(x, layout))


class FramesModel(nn.Module):
    """The root module: the runtime's encoders and assembly, the LLM and the summed token loss."""

    def __init__(self):
        super().__init__()
        self.video, self.embed, self.llm = FrameEncoder(), nn.Embedding(VOCAB, HIDDEN), LM()

    def forward(self, runtime, micro):
        packed = runtime.forward(micro.routes, micro.data, encoders={"video": self.video}, text_embedding=self.embed)
        layout = micro.layout or ContextParallelLayout.planned(dist.get_rank(), dist.get_world_size(),
                                                               micro.lengths.tolist(), ())
        labels = packed.scatter_text(micro.data.text["labels"], IGNORE)
        return F.cross_entropy(self.llm(packed.embeddings, layout), labels, ignore_index=IGNORE, reduction="sum")


def reference(samples):
    """The global batch of `samples` unsplit, unbalanced, in this process: each video encoded whole and spliced
    into its sample's text; (the loss over the step's loss tokens, every parameter's gradient)."""
    torch.manual_seed(0)
    model = FramesModel().double()
    loss = 0.0
    for sample in samples:
        ids, labels, patches = sample_tensors(sample)
        pieces, text_at, position = [], 0, 0
        for segment, rows in zip(sample.segments, patches):
            pieces += [model.embed(ids[text_at:text_at + segment.position - position]),
                       model.video(rows, torch.tensor([segment.length]))]
            text_at += segment.position - position
            position = segment.position + segment.tokens
        sequence = torch.cat(pieces + [model.embed(ids[text_at:])])
        is_text = torch.ones(len(sequence), dtype=torch.bool)
        for segment in sample.segments:
            is_text[segment.position:segment.position + segment.tokens] = False
        targets = torch.full((len(sequence),), IGNORE, dtype=torch.int64).masked_scatter(is_text, labels)
        logits = model.llm(sequence, ContextParallelLayout.planned(0, 1, [len(sequence)], ()))
        loss = loss + F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
    loss = loss / sum(sample.text for sample in samples)
    loss.backward()
    return float(loss.detach()), [p.grad for p in model.parameters()]


def planned_bytes(step):
    """Bytes the step's plan moves between ranks: its inputs, and its embeddings forward and back."""
    return step.input_exchange().bytes_moved + 2 * sum(e.bytes_moved for e in step.embedding_exchanges())


def train_step(samples, wrapper, options, counter=None):
    """One step of `options` on this rank's `samples` from the same parameters: (loss share, gradients, whether
    a video ran in frame parts, a part's embeddings were cut between zigzag chunks, two parts of a video ran
    on one rank; collectives by kind and bytes sent before the gradient reduction, the plan's bytes)."""
    torch.manual_seed(0)
    model = FramesModel().double()
    wrapped = model
    if wrapper == "ddp":
        wrapped = nn.parallel.DistributedDataParallel(model)
    elif wrapper == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for module in (model.video, model.embed, model.llm):
            fully_shard(module)
        wrapped = fully_shard(model)
    runtime = MultiStageRuntime(STAGES, **options)
    before, sent = (dict(counter.calls), counter.sent) if counter else ({}, 0)
    text, inputs = local_tensors(samples)
    routes = runtime.plan(samples)
    moved = runtime.dispatch(routes, text=text, inputs=inputs, samples=samples)
    reduction = "mean" if wrapper else "sum"
    loss = 0.0
    for micro in runtime.microbatches(routes, moved):
        with accumulate(wrapped, micro):
            loss_sum = wrapped(runtime, micro)
            normalize_loss(loss_sum, micro, gradient_reduction=reduction).backward()
            loss += float(loss_sum.detach()) / routes.num_loss_tokens
    calls = {kind: counter.calls[kind] - before[kind] for kind in Counter.KINDS} if counter else {}
    sent = counter.sent - sent if counter else 0
    if not wrapper:
        all_reduce_gradients(list(model.parameters()), op="sum")
    grads = [p.grad.full_tensor() if wrapper == "fsdp2" else p.grad for p in model.parameters()]
    passes = routes.step.microbatches
    videos = [plan.stage_plans[0] for plan in passes]
    split = (any(np.any(video.item_first_unit) for video in videos),  # a video in frame parts
             any(plan.route_segment.size > video.num_items for plan, video in zip(passes, videos)),  # cut by chunks
             any(np.unique(np.stack([video.item_segment, video.destination]), axis=1).shape[1] < video.num_items
                 for video in videos))  # two parts of a video on one encoder rank
    return loss, grads, split, calls, sent, planned_bytes(routes.step)


def scenarios_job(rank, size, wrapper):
    counter = Counter() if not wrapper else None
    results = {name: train_step(rank_samples(rank), wrapper, options, counter) for name, options in SCENARIOS.items()}
    if counter:  # the same steps with every video one frame: nothing split between frames
        results.update({f"{name}, one frame": train_step(rank_samples(rank, False), wrapper, options, counter)
                        for name, options in SCENARIOS.items()})
    return results


def relative_error(got, expected):
    return float((got - expected).abs().max()) / max(float(expected.abs().max()), 1e-300)


@functools.cache
def scenarios_reference():
    """`reference` of the scenarios' global batch, computed once for the three wrappers."""
    return reference([sample for rank in range(4) for sample in rank_samples(rank)])


@pytest.mark.background
@pytest.mark.parametrize("wrapper", [None, "ddp", "fsdp2"], ids=["hand all-reduce", "ddp", "fsdp2"])
def test_videos_split_between_frames_train_as_the_unsplit_single_process_step(wrapper):
    results = spawn(scenarios_job, 4, args=(wrapper,), timeout_s=300)
    expected_loss, expected = scenarios_reference()
    for name in SCENARIOS:
        frames_split, parts_cut, _ = results[0][name][2]
        assert frames_split and parts_cut == ("context-parallel" in name), name  # the plan split what it should
        assert abs(sum(r[name][0] for r in results) - expected_loss) <= 1e-12 * expected_loss, name
        for result in results:
            assert max(relative_error(g, e) for g, e in zip(result[name][1], expected)) <= 1e-12, name
    if wrapper is None:
        for name in SCENARIOS:
            unsplit = f"{name}, one frame"
            assert not results[0][unsplit][2][0]
            assert [r[name][3] for r in results] == [r[unsplit][3] for r in results], name  # no extra collective
            for key in (name, unsplit):  # the all-to-alls send what the plan moves, no byte more
                assert sum(r[key][4] for r in results) == results[0][key][5], key


SPEC3 = ContextParallel(degrees=(1, 2), gpus_per_node=3, half_efficiency_tokens=1, latency_s=0, kv_bytes_per_token=0,
                        seconds_per_cost=1.0)
RANDOM_OPTIONS = ({}, {"context_parallel": SPEC3, "max_tokens_per_microbatch": 60})


def random_samples(seed, size):
    """Every rank's samples of a random step: 0-3 samples a rank, each 1-11 text tokens and 0-2 videos of
    1-9 frames at random positions."""
    rng, homes = np.random.default_rng(seed), []
    for rank in range(size):
        samples = []
        for k in range(int(rng.integers(0, 4))):
            text = int(rng.integers(1, 12))
            videos, position, left = [], 0, text
            for _ in range(int(rng.integers(0, 3))):
                count, gap = int(rng.choice([1, 1, 2, 3, 6, 9])), int(rng.integers(0, left + 1))
                position, left = position + gap, left - gap
                videos.append(Segment("video", UNITS * count, TOKENS * count, position, frames=count))
                position += TOKENS * count
            samples.append(Sample(text, tuple(videos), rank, 1000 * rank + k))
        homes.append(samples)
    return homes


def random_job(rank, size, seeds):
    return [train_step(random_samples(seed, size)[rank], None, options)[:3] for seed in seeds
            for options in RANDOM_OPTIONS]


@pytest.mark.background
def test_random_steps_with_videos_split_between_frames_train_as_the_unsplit_step():
    """3 ranks, random videos (empty ranks, several videos a sample, two parts of one video on one rank),
    plain and context-parallel micro-batched."""
    seeds = range(12)
    results = spawn(random_job, 3, args=(seeds,), timeout_s=300)
    references = {seed: reference([sample for home in random_samples(seed, 3) for sample in home]) for seed in seeds}
    for index, seed in enumerate(np.repeat(seeds, len(RANDOM_OPTIONS))):  # each seed's step under both options
        expected_loss, expected = references[seed]
        assert abs(sum(r[index][0] for r in results) - expected_loss) <= 1e-12 * expected_loss, seed
        for result in results:
            assert max(relative_error(g, e) for g, e in zip(result[index][1], expected)) <= 1e-12
    assert np.all(np.any([split for split in (r[2] for r in results[0])], axis=0))  # every kind of split ran


def mismatch_job(rank, size):
    """Rank 1 plans without frame splits (a planner that stopped elsewhere): every rank stops at the
    exchange.  Then rank 2 dispatches its samples with every video one frame, not as it planned them."""
    samples = rank_samples(rank)
    text, inputs = local_tensors(samples)
    runtime, errors, gain = MultiStageRuntime(STAGES), [], planner_frames.MIN_GAIN
    if rank == 1:
        planner_frames.MIN_GAIN = float("inf")
    routes = runtime.plan(samples)
    planner_frames.MIN_GAIN = gain
    for routes, given in ((routes, samples), (runtime.plan(samples), rank_samples(rank, frames=rank != 2))):
        try:
            runtime.dispatch(routes, text=text, inputs=inputs, samples=given)
            errors.append(None)
        except PlanMismatchError as error:
            errors.append(str(error))
    return errors


def test_ranks_whose_plans_split_frames_differently_or_kept_other_frames_stop_naming_the_rank():
    results = spawn(mismatch_job, 4, timeout_s=120)
    assert all(errors[0] is not None and "ranks [1] disagree" in errors[0] for errors in results), results
    assert all(errors[1] is not None and "rank 2" in errors[1] for errors in results), results
    assert "(modality, length, tokens, position, frames)" in results[2][1]

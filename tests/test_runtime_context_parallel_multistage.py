"""Split samples through the multi-stage runtime on real gloo ranks: `Orchestrator(context_parallel=)` splits
a giant image+text sample over a group; its text chunks, per-sample rows and image embeddings (cut
where a chunk starts inside the image) reach the group in the runtime's exchanges, each micro-batch's
layout feeds `context_parallel_attention`, and the float64 gradients of every parameter (encoders
included) equal the same step run unsplit, within 1e-12, plain and micro-batched, fused or not."""

import pytest
import torch
from torch import nn

from orchmllm.balancers import CostModel
from orchmllm.balancers.context_parallel import ContextParallel
from orchmllm.orchestrator.samples import Sample, Segment
from orchmllm.runtime import (ContextParallelLayout, EncoderContractError, MultiStageRuntime, PlanMismatchError,
                              all_reduce_gradients, normalize_loss)
from orchmllm.runtime.demo import demo_stages
from orchmllm.runtime.demo.data import IGNORE, SyntheticMultimodal
from orchmllm.runtime.demo.giants import CausalBlock
from orchmllm.runtime.demo.model import ModelConfig, TinyMultimodalModel
from orchmllm.runtime.launch import spawn

CONFIG = ModelConfig(vocab=32, llm_hidden=8, encoder_hidden=8, heads=2, patch_dim=6, frame_dim=5, pool=2, stride=2)
STAGES = demo_stages({"image": CostModel(), "audio": CostModel(), "llm": CostModel(linear=1.0, quadratic=0.05)},
                     CONFIG)
SPEC = ContextParallel(degrees=(1, 2, 4), gpus_per_node=4, half_efficiency_tokens=1, kv_bytes_per_token=0,
                       seconds_per_cost=1.0)  # the latency: the topology's


def rank_samples(rank):
    """Rank 3 samples a giant last (so its shards follow other samples on their ranks): 60 text tokens
    around an image of 12 tokens at position 20 and audio at 50."""
    small = [Sample(3 + (rank + k) % 4, (Segment("image", 2 * CONFIG.pool, 2, 1),) if k % 2 else (), rank,
                    100 * rank + k) for k in range(3)]
    if rank < 3:
        return small
    giant = Sample(60, (Segment("image", 12 * CONFIG.pool, 12, 20), Segment("audio", 4 * CONFIG.stride, 4, 50)),
                   3, 99)
    return small + [giant]


class SplitLM(nn.Module):
    """Unsplit positions (a learned frequency), one causal block through the layout, a token head."""

    def __init__(self):
        super().__init__()
        self.frequency = nn.Parameter(torch.linspace(0.05, 0.9, CONFIG.llm_hidden))
        self.block = CausalBlock(CONFIG.llm_hidden, CONFIG.heads)
        self.head = nn.Linear(CONFIG.llm_hidden, CONFIG.vocab)

    def forward(self, embeddings, layout):
        x = embeddings + torch.sin(layout.positions()[:, None].to(embeddings.dtype) * self.frequency)
        return self.head(self.block(x, layout))


def step_gradients(rank, size, runtime, models, local, layout_of):
    routes = runtime.plan(local.samples)
    moved = runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs)
    encoders, lm = models
    split, ids = 0, []
    for micro in runtime.microbatches(routes, moved):
        packed = runtime.forward(micro.routes, micro.data, encoders=encoders.encoders(),
                                 text_embedding=encoders.llm.embed)
        layout = layout_of(micro)
        split += len(layout.splits)
        ids += micro.data.per_sample["sample_id"].tolist()
        assert micro.data.per_sample["sample_id"].tolist() == routes.batch.sample_id[micro.items].tolist()
        labels = packed.scatter_text(micro.data.text["labels"], IGNORE)
        loss = nn.functional.cross_entropy(lm(packed.embeddings, layout), labels, ignore_index=IGNORE, reduction="sum")
        normalize_loss(loss, micro, gradient_reduction="sum").backward()
    parameters = [*encoders.vision.parameters(), *encoders.audio.parameters(), encoders.llm.embed.weight,
                  *lm.parameters()]
    all_reduce_gradients(parameters, op="sum")
    grads = [p.grad.clone() for p in parameters]
    for p in parameters:
        p.grad = None
    return grads, split, ids


def multistage_job(rank, size, options):
    torch.manual_seed(0)
    models = (TinyMultimodalModel(CONFIG).double(), SplitLM().double())
    local = SyntheticMultimodal(CONFIG, seed=0).tensors(rank_samples(rank), torch.float64)
    whole = MultiStageRuntime(STAGES)  # one pass, unsplit: the step's gradient whatever the micro-batches
    split = MultiStageRuntime(STAGES, context_parallel=SPEC, **options)
    unsplit = lambda micro: ContextParallelLayout.planned(rank, size, micro.lengths.tolist(), ())  # noqa: E731
    reference, _, _ = step_gradients(rank, size, whole, models, local, unsplit)
    grads, splits, ids = step_gradients(rank, size, split, models, local, lambda micro: micro.layout)
    error = max(float((g - r).abs().max()) / max(float(r.abs().max()), 1e-300) for g, r in zip(grads, reference)
                if r.abs().max() > 0)
    return error, splits, ids


@pytest.mark.parametrize("options", [{}, {"max_tokens_per_microbatch": 48},
                                     {"max_tokens_per_microbatch": 48, "fused_input_exchange": False}],
                         ids=["plain", "micro-batched", "micro-batched, exchanged per micro-batch"])
def test_a_split_sample_through_the_multistage_runtime_trains_as_the_unsplit_step(options):
    results = spawn(multistage_job, 4, args=(options,), timeout_s=180)
    assert sum(splits for _, splits, _ in results) >= 2  # the giant ran split, on every rank of its group
    assert max(error for error, _, _ in results) <= 1e-12
    ids = sorted(i for _, _, held in results for i in held)
    every = sorted(sample.id for rank in range(4) for sample in rank_samples(rank))
    assert sorted(set(ids)) == every and len(ids) > len(every)  # per-sample rows: a copy per group rank


def other_split_job(rank, size):
    local = SyntheticMultimodal(CONFIG, seed=0).tensors(rank_samples(rank), torch.float64)
    runtime = MultiStageRuntime(STAGES, context_parallel=SPEC)
    if rank == 1:  # a planner that stopped elsewhere on this rank: the same samples' plan, unsplit
        runtime.orchestrator = MultiStageRuntime(STAGES).orchestrator
    routes = runtime.plan(local.samples)
    try:
        runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs)
    except PlanMismatchError as error:
        return str(error)
    return None


def test_ranks_whose_step_plans_split_differently_stop_at_the_exchange_naming_them():
    errors = spawn(other_split_job, 4, timeout_s=60)
    assert all(error is not None and "ranks [1] disagree" in error for error in errors), errors


class EarlyEmbedding(nn.Embedding):
    """A text embedding that returns early on empty input (leaving its weight out of the graph there)."""

    def forward(self, ids):
        return self.weight.new_zeros(0, self.embedding_dim) if ids.numel() == 0 else super().forward(ids)


def textless_chunks_job(rank, size):
    """Step 1: text on every rank (the embedding's first call is checked and passes). Step 2: one sample
    whose middle is all image, split at c = 4: ranks 1-3 hold only chunks without text."""
    torch.manual_seed(0)
    model, embedding = TinyMultimodalModel(CONFIG).double(), EarlyEmbedding(CONFIG.vocab, CONFIG.llm_hidden).double()
    runtime = MultiStageRuntime(STAGES, context_parallel=SPEC)
    image = Sample(8, (Segment("image", 56 * CONFIG.pool, 56, 4),), 0, 7)
    for samples in (rank_samples(rank), [image] if rank == 0 else []):
        local = SyntheticMultimodal(CONFIG, seed=0).tensors(samples, torch.float64)
        routes = runtime.plan(local.samples)
        moved = runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs)
        for micro in runtime.microbatches(routes, moved):
            try:
                runtime.forward(micro.routes, micro.data, encoders=model.encoders(), text_embedding=embedding)
            except EncoderContractError as error:
                return int(micro.routes.plan.llm.degree.max()), str(error)
    return None


def test_an_embedding_returning_early_on_a_rank_of_textless_chunks_is_named_on_every_rank():
    """A rank holding only chunks without text calls the text embedding on empty input: the contract is
    checked there (the rank's text pieces were counted as items, so an early return went unchecked)."""
    results = spawn(textless_chunks_job, 4, timeout_s=120)
    assert all(result is not None and result[0] == 4 for result in results), results
    assert all("`text_embedding` on rank" in message for _, message in results)

"""Gradient equivalence: rearranging samples between ranks leaves the all-reduced gradient
unchanged, as a Hypothesis property over random batches and random plans of every stage.
The property runs *inside* every process of one spawned gloo group: each rank executes
the same derandomised examples in the same order (no shrinking, so no rank-dependent
replays), taking its own part of each global batch; the collectives line up.
"""

import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from orchmllm.balancers import CostModel
from orchmllm.orchestrator.plan import compose
from orchmllm.orchestrator.planner import stage_plan
from orchmllm.orchestrator.samples import Batch, Sample, Segment
from orchmllm.orchestrator.step import StepPlan
from orchmllm.runtime import MultiStageRuntime, all_reduce_gradients, normalize_loss
from orchmllm.runtime.demo.data import IGNORE, SyntheticMultimodal
from orchmllm.runtime.demo import compare_gradients, demo_stages, run_demo
from orchmllm.runtime.launch import spawn
from orchmllm.runtime.demo.model import ModelConfig, TinyMultimodalModel

RANKS = 3
CONFIG = ModelConfig(vocab=32, llm_hidden=8, encoder_hidden=8, heads=2, patch_dim=6, frame_dim=5, pool=2, stride=2)
STAGES = demo_stages({m: CostModel() for m in ("image", "audio", "llm")}, CONFIG)


@st.composite
def samples(draw, rank, index):
    text = draw(st.integers(1, 10))
    kinds = draw(st.lists(st.sampled_from(["image", "audio"]), max_size=2))
    tokens = [draw(st.integers(1, 3)) for _ in kinds]
    inserts = sorted(draw(st.lists(st.integers(0, text), min_size=len(kinds), max_size=len(kinds))))
    segments, before = [], 0
    for kind, count, insert in zip(kinds, tokens, inserts):
        units = count * (CONFIG.pool if kind == "image" else CONFIG.stride)
        segments.append(Segment(kind, units, count, insert + before))
        before += count
    return Sample(text, tuple(segments), rank, 1000 * rank + index)


@st.composite
def global_batches(draw):
    """Per rank 0-3 samples (some ranks empty), and a random destination per item per stage."""
    per_rank = [[draw(samples(rank, i)) for i in range(draw(st.integers(0, 3)))] for rank in range(RANKS)]
    if not any(per_rank):
        per_rank[0].append(draw(samples(0, 0)))
    batch = Batch.from_samples([s for rank in per_rank for s in rank], RANKS)
    destinations = []
    for stage in STAGES:
        count = batch.num_samples if stage.is_llm else batch.segments_of(stage.modality).size
        destinations.append(draw(st.lists(st.integers(0, RANKS - 1), min_size=count, max_size=count)))
    return per_rank, batch, destinations


def step_plan(batch, destinations):
    plans = tuple(stage_plan(batch, stage, np.asarray(dest, dtype=np.int64), "random")
                  for stage, dest in zip(STAGES, destinations))
    return StepPlan(batch, tuple(STAGES), (compose(batch, STAGES, plans),), (np.arange(batch.num_samples),))


def gradients(model, runtime, routes, local):
    moved = runtime.dispatch(routes, text=local.text, per_sample=local.per_sample, inputs=local.inputs)
    [micro] = runtime.microbatches(routes, moved)
    packed = runtime.forward(micro.routes, micro.data, encoders=model.encoders(), text_embedding=model.llm.embed)
    labels = packed.scatter_text(micro.data.text["labels"], IGNORE)
    logits = model.llm(packed.embeddings, packed.sample_lengths)
    normalize_loss(model.loss_sum(logits, labels), (labels != IGNORE).sum(), gradient_reduction="sum").backward()
    all_reduce_gradients(model.parameters(), op="sum")
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def equivalence_job(rank, size):
    torch.manual_seed(0)
    model = TinyMultimodalModel(CONFIG).double()
    runtime = MultiStageRuntime(STAGES)
    data = SyntheticMultimodal(CONFIG, seed=0)
    worst = []

    @settings(max_examples=10, derandomize=True, database=None, deadline=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(global_batches())
    def property_(case):
        per_rank, batch, destinations = case
        local = data.tensors(per_rank[rank], torch.float64)
        home = step_plan(batch, [(batch.sample_source if stage.is_llm else
                                  batch.sample_source[batch.segment_sample[batch.segments_of(stage.modality)]])
                                 for stage in STAGES])
        moved = step_plan(batch, destinations)
        reference = gradients(model, runtime, runtime.routes(home), local)
        rearranged = gradients(model, runtime, runtime.routes(moved), local)
        difference = compare_gradients(reference, rearranged)
        assert difference["grad_max_rel_diff"] <= 1e-12, difference
        worst.append(difference["grad_max_rel_diff"])

    property_()
    return len(worst), max(worst)


def test_gradients_do_not_depend_on_where_samples_run():
    results = spawn(equivalence_job, RANKS, timeout_s=120)
    assert all(count == 10 for count, _ in results)
    assert max(worst for _, worst in results) <= 1e-12


def test_demo_float64_is_exact_and_loses_no_sample():
    report = run_demo(ranks=2, steps=2, seed=1, dtype="float64", samples_per_rank=3, costs="flops", repeats=1,
                      replay_repeats=2, timeout_s=120)
    assert report.grad_max_rel_diff <= 1e-12
    assert report.samples_lost == 0 and report.samples_duplicated == 0
    assert report.steps == 2 and report.ranks == 2
    assert 0.0 <= report.planning_hidden_fraction <= 1.0
    assert report.busy_max_over_mean_balanced >= 1.0 and report.busy_max_over_mean_unbalanced >= 1.0
    for kind in ("balanced", "unbalanced", "identical_work"):
        per_step = getattr(report, f"busy_max_over_mean_{kind}_isolated_per_step")
        assert len(per_step) == 2 and all(ratio >= 1.0 for ratio in per_step)
        assert getattr(report, f"busy_max_over_mean_{kind}_isolated") == pytest.approx(np.mean(per_step))
    assert all(seconds > 0 for seconds in report.busy_seconds_per_rank_balanced_isolated)
    assert report.busy_max_over_mean_balanced_planned <= report.busy_max_over_mean_unbalanced_planned
    assert 0 < report.replay_seconds < report.wall_seconds and 0 < report.concurrent_seconds < report.wall_seconds
    assert json.loads(json.dumps(report.to_json())) == report.to_json()

"""Passes whose segments are all of one modality (a micro-batch of videos' frames): the stage's items are the
batch's own columns and the routes the stage plan's, read without gathers or scatters; plans as before."""

import dataclasses

import numpy as np
import pytest

from orchmllm import ContextParallel, Orchestrator, Topology
from orchmllm.orchestrator import plan as plan_module
from orchmllm.orchestrator.plan import compose, offsets_within_rank
from orchmllm.orchestrator.planner import item_tokens, stage_items
from orchmllm.orchestrator.samples import Batch, Sample, Segment, group_order, is_counting
from orchmllm.study.models import MODELS

STAGES = MODELS["84b"].stages()  # image (unpadded), audio (padded), llm


def frames_batch(num_ranks: int, seed: int, audio: bool = False) -> Batch:
    """Samples of text and 576-unit image frames (144 embeddings each), a few with an audio clip where `audio`."""
    rng = np.random.default_rng(seed)
    samples = []
    for index in range(num_ranks * 4):
        count = 200 if index % 16 == 0 else int(rng.integers(0, 40))  # a long video: split at 16k tokens a cell
        frames = [Segment("image", 576, 144) for _ in range(count)]
        if audio and index % 7 == 0:
            frames.append(Segment("audio", 300, 75))
        samples.append(Sample(int(rng.integers(16, 2000)), tuple(frames), source=index % num_ranks, id=index))
    return Batch.from_samples(samples, num_ranks)


def generic(pass_plan):
    """The pass composed again from copies of its stage plans' segments (not `counting`'s): the general path."""
    plans = tuple(dataclasses.replace(plan, item_segment=np.array(plan.item_segment)) for plan in pass_plan.stage_plans)
    return compose(pass_plan.batch, pass_plan.stages, plans)


ROUTES = ("route_stage", "route_encoder_rank", "route_encoder_offset", "route_llm_rank", "route_llm_offset",
          "route_tokens", "route_rank_offsets", "route_rank_order", "route_segment", "route_row")


def test_stage_items_of_one_modality_are_the_batch_columns():
    batch = frames_batch(16, 0)
    image, audio = STAGES[0], STAGES[1]
    segments = batch.segments_of("image")
    assert is_counting(segments) and segments.size == batch.num_segments
    assert batch.segments_of("audio").size == 0
    items = stage_items(batch, image)
    assert items.sample is batch.segment_sample and items.length is batch.segment_length
    assert item_tokens(batch, image, items) is batch.segment_tokens
    assert stage_items(batch, audio).sample.size == 0
    mixed = frames_batch(16, 0, audio=True)  # two modalities: gathered, as before
    items = stage_items(mixed, image)
    assert not is_counting(items.segment) and not np.shares_memory(items.sample, mixed.segment_sample)
    assert np.array_equal(items.segment, np.flatnonzero(mixed.segment_modality == mixed.modalities.index("image")))
    assert not is_counting(np.arange(5)) and not is_counting(segments[1:])


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("split", [False, True])
def test_one_modality_routes_are_the_stage_plans(seed, split):
    batch = frames_batch(64, seed)
    options = dict(context_parallel=ContextParallel(), max_tokens_per_microbatch=16384) if split else {}
    step = Orchestrator(STAGES, Topology.for_world_size(64), **options).plan(batch)
    assert any(pass_plan.splits for pass_plan in step.microbatches) == split
    for pass_plan in step.microbatches:
        image = pass_plan.stage_plans[0]
        if not pass_plan.splits:  # whole segments: the image plan's own columns, no scatter
            assert pass_plan.route_encoder_rank is image.destination
            assert pass_plan.route_encoder_offset is image.item_offset
        assert pass_plan.route_stage.strides == (0,) and not pass_plan.route_stage.flags.writeable
        again = generic(pass_plan)
        assert again.route_stage.strides != (0,)
        for name in ROUTES:
            assert np.array_equal(getattr(pass_plan, name), getattr(again, name)), name
        assert pass_plan.digest() == again.digest()


def test_mixed_passes_compose_as_before():
    batch = frames_batch(64, 3, audio=True)
    pass_plan = Orchestrator(STAGES, Topology.for_world_size(64)).plan(batch).microbatches[0]
    assert pass_plan.route_stage.strides == (8,)
    assert np.array_equal(pass_plan.route_stage, (batch.segment_modality == batch.modalities.index("audio")) * 1)


def brute_offsets(ranks, sizes, num_ranks):
    offsets, used = np.zeros(ranks.size, dtype=np.int64), np.zeros(num_ranks, dtype=np.int64)
    for item, rank in enumerate(ranks):
        offsets[item], used[rank] = used[rank], used[rank] + sizes[item]
    return offsets


@pytest.mark.parametrize("seed", range(4))
def test_offsets_of_equal_sizes_take_no_running_sum(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    num_ranks = int(rng.integers(1, 9))
    ranks = rng.integers(0, num_ranks, int(rng.integers(1, 300)))
    rank_offsets, order = group_order(ranks, num_ranks)
    equal, other = np.full(ranks.size, 576), rng.integers(0, 50, ranks.size)
    calls = []
    cumsum = np.cumsum
    monkeypatch.setattr(plan_module.np, "cumsum", lambda *a, **k: calls.append(1) or cumsum(*a, **k))
    inputs, outputs = offsets_within_rank(rank_offsets, order, equal, equal // 4)
    assert not calls  # the places on each rank, times the size
    assert np.array_equal(inputs, brute_offsets(ranks, equal, num_ranks))
    assert np.array_equal(outputs, brute_offsets(ranks, equal // 4, num_ranks))
    assert not inputs.flags.writeable and inputs.dtype == np.int64
    mixed, same = offsets_within_rank(rank_offsets, order, other, equal)
    assert len(calls) == 1 - (other.min() == other.max())  # sizes that differ: one running sum
    assert np.array_equal(mixed, brute_offsets(ranks, other, num_ranks))
    assert np.array_equal(same, brute_offsets(ranks, equal, num_ranks))

"""Videos priced as their encoder works, frame by frame: a video of F frames costs F · f(l / F) and a part
of k of its frames k · f(l / F), in every plan, load, bound and step, and in the simulators' model FLOPs
(probe6 P6-21; `orchestrator.frames.frame_costs`)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import CostModel, InfeasibleError, Orchestrator, Topology
from orchmllm.orchestrator.frames import frame_costs
from orchmllm.orchestrator.samples import Batch, Sample, Segment
from orchmllm.orchestrator.stages import Stage
from orchmllm.study.microbatch_sim import simulate_microbatched_step
from orchmllm.study.models import GPUS, MODELS
from orchmllm.study.pipeline_sim import encoder_flops
from orchmllm.study.simulator import cluster, simulate_step
from orchmllm.study.strategies import get_strategy

VISION = CostModel(linear=1.0, quadratic=0.05)  # attention: a frame of 8 units costs 11.2, a video of 64 units 268.8
STAGES = (Stage("vision", "video", VISION, input_bytes_per_unit=4.0, output_bytes_per_token=8.0),
          Stage("llm", "llm", CostModel(linear=1.0, quadratic=0.01), input_bytes_per_unit=2.0))


def f(length):
    return float(VISION.item_costs(np.array([length]))[0])


def item_frames(batch, plan):
    """The frames each item of an encoder stage plan holds: a whole segment's, or its part's."""
    frames = np.ones(batch.num_segments, dtype=np.int64) if batch.segment_frames is None else batch.segment_frames
    return plan.item_length // (batch.segment_length[plan.item_segment] // frames[plan.item_segment])


def test_regression_a_video_of_frames_was_priced_at_its_whole_length_not_frame_by_frame():
    """P6-21: a video of 64 units in 8 frames, split 32 + 32 over 2 ranks beside two clips of 8, was planned at
    f(64) / 2 + f(8) = 145.6 a rank (the whole length's cost shared by frames); its frame-local encoder does
    4 · f(8) + f(8) = 56 a rank, which is also the bound: the plan is optimal."""
    batch = Batch.from_samples([Sample(40, (Segment("video", 64, 16, 10, frames=8),), 0, 1),
                                Sample(5, (Segment("video", 8, 2, 0),), 1, 2),
                                Sample(5, (Segment("video", 8, 2, 0),), 1, 3)], num_ranks=2)
    vision = Orchestrator(STAGES, 2).plan(batch).microbatches[0].stage_plans[0]
    assert vision.item_length.tolist() == [32, 32, 8, 8] and sorted(vision.destination.tolist()) == [0, 0, 1, 1]
    assert vision.item_time.tolist() == [4 * f(8), 4 * f(8), f(8), f(8)]
    assert vision.loads.tolist() == pytest.approx([5 * f(8)] * 2, rel=1e-12)
    assert vision.lower_bound == pytest.approx(5 * f(8), rel=1e-12) and vision.gap < 1e-12


def test_a_video_its_frames_make_cheap_stays_whole():
    """A video of 8 frames of 8 units costs 8 · f(8) = 89.6, not f(64) = 268.8: beside 24 clips of one frame
    on 4 ranks (a share of 89.6) it needs no split, where pricing it at f(64) split it."""
    samples = [Sample(40, (Segment("video", 64, 16, 10, frames=8),), 0, 0)]
    samples += [Sample(5, (Segment("video", 8, 2, 0),), 1 + k % 3, 1 + k) for k in range(24)]
    vision = Orchestrator(STAGES, 4).plan(Batch.from_samples(samples, 4)).microbatches[0].stage_plans[0]
    assert vision.num_items == 25 and vision.item_time[0] == 8 * f(8)
    assert vision.makespan == pytest.approx(8 * f(8), rel=1e-12) and vision.gap < 1e-12


@st.composite
def video_steps(draw):
    """(batch, topology, options): 1-6 samples on 1-4 ranks, each with 0-2 videos of 1-6 frames of 1-9 units,
    a plain or a micro-batched step, encoders balanced or kept home, locality paid by seconds or not."""
    num_ranks = draw(st.integers(1, 4))
    samples = []
    for index in range(draw(st.integers(1, 6))):
        videos, position = [], 0
        for _ in range(draw(st.integers(0, 2))):
            frames, units = draw(st.integers(1, 6)), draw(st.integers(1, 9))
            videos.append(Segment("video", frames * units, frames * draw(st.integers(0, 2)), position, frames=frames))
            position += videos[-1].tokens
        samples.append(Sample(draw(st.integers(1, 30)), tuple(videos), draw(st.integers(0, num_ranks - 1)), index))
    batch = Batch.from_samples(samples, num_ranks)
    options = draw(st.sampled_from([{}, {"balance_encoders": False}, {"seconds_per_cost": 1e-9}]))
    if draw(st.booleans()):
        options["max_tokens_per_microbatch"] = draw(st.integers(int(batch.sample_llm_length.max()),
                                                                2 * int(batch.sample_llm_length.max())))
    return batch, Topology(1, num_ranks), options


@settings(max_examples=40, deadline=None)
@given(case=video_steps())
def test_every_plan_prices_a_part_of_k_frames_at_k_frames_cost(case):
    """In every micro-batch's encoder plan (balanced, kept home, split or not) each item costs k · f(l / k) for
    its k frames, the loads sum the item costs, a segment's parts sum to F · f(l / F), and the bounds hold."""
    batch, topology, options = case
    try:
        step = Orchestrator(STAGES, topology, **options).plan(batch)
    except InfeasibleError:
        return
    for plan in step.microbatches:
        vision = plan.stage_plans[0]
        if not vision.num_items:
            continue
        frames = item_frames(plan.batch, vision)
        assert np.array_equal(vision.item_time, frames * VISION.item_costs(vision.item_length // frames))
        assert vision.loads == pytest.approx(np.bincount(vision.destination, vision.item_time, topology.world_size),
                                             rel=1e-12)
        whole = frame_costs(VISION, plan.batch.segment_length, plan.batch.segment_frames)
        assert np.bincount(vision.item_segment, vision.item_time) == pytest.approx(whole, rel=1e-12)
        assert vision.lower_bound <= vision.makespan * (1 + 1e-12)
    assert step.lower_bound <= step.step_cost * (1 + 1e-12)


@settings(max_examples=25, deadline=None)
@given(frames=st.integers(2, 4), units=st.integers(1, 12), clips=st.lists(st.integers(1, 40), max_size=2))
def test_the_bound_is_below_every_split_and_assignment_of_the_frames(frames, units, clips):
    """Brute force on 2 ranks: every multiset of parts of the video's frames, every assignment of the parts and
    the clips; the best makespan is at least the plan's bound (plain and micro-batched), and the plan reaches it
    within the stage's gap."""
    samples = [Sample(10, (Segment("video", frames * units, frames, 0, frames=frames),), 0, 0)]
    samples += [Sample(5, (Segment("video", length, 1, 0),), 1, 1 + k) for k, length in enumerate(clips)]
    batch = Batch.from_samples(samples, 2)
    best = np.inf
    for size in range(1, frames + 1):
        for parts in itertools.combinations_with_replacement(range(1, frames + 1), size):
            if sum(parts) != frames:
                continue
            costs = [k * f(units) for k in parts] + [f(length) for length in clips]
            for ranks in itertools.product((0, 1), repeat=len(costs)):
                best = min(best, max(np.bincount(ranks, costs, 2)))
    plain = Orchestrator(STAGES, 2).plan(batch)
    micro = Orchestrator(STAGES, 2, max_tokens_per_microbatch=int(batch.sample_llm_length.max())).plan(batch)
    assert plain.stage_lower_bounds["vision"] <= best * (1 + 1e-12)
    assert micro.stage_lower_bounds["vision"] <= best * (1 + 1e-12)
    assert plain.microbatches[0].stage_plans[0].makespan >= best * (1 - 1e-12)


def video_batch(num_ranks):
    """Images of 8 frames (a video of the model's image encoder) and single images, on `num_ranks` ranks."""
    samples = [Sample(300, (Segment("image", 8 * 576, 8 * 64, 0, frames=8 if k % 2 else 1),), k % num_ranks, k)
               for k in range(2 * num_ranks)]
    return Batch.from_samples(samples, num_ranks)


def test_the_simulators_count_a_videos_flops_frame_by_frame():
    """Model FLOPs (MFU) and the pipeline's encoder FLOPs: a video of F frames is F · f(l / F) of its encoder."""
    model, gpu, topology = MODELS["10b"], GPUS["h100"], cluster(8)
    stages, batch = model.stages(), video_batch(8)
    image, llm = stages[0].cost, stages[-1].cost
    frames = batch.segment_frames
    expected = frame_costs(image, batch.segment_length, frames)
    assert np.array_equal(frames, [1, 8] * 8) and expected[1] < image.item_costs(batch.segment_length)[1]
    assert encoder_flops(batch, stages) == pytest.approx(expected, rel=1e-12)
    flops = float(expected.sum() + llm.item_costs(batch.sample_llm_length).sum())
    plain = Orchestrator(stages, topology).plan(batch)
    figures = simulate_step(plain, get_strategy("ours"), model, gpu, topology)
    assert figures.mfu * figures.step_seconds * 8 * gpu.peak_flops == pytest.approx(flops, rel=1e-9)
    budget = int(batch.sample_llm_length.max())
    micro = Orchestrator(stages, topology, max_tokens_per_microbatch=budget).plan(batch)
    result = simulate_microbatched_step(micro, "ours", model, gpu, topology)
    assert result.mfu * result.step_seconds * 8 * gpu.peak_flops == pytest.approx(flops, rel=1e-9)


def test_regression_a_cap_below_a_video_of_frames_says_the_video_must_fit_whole():
    """Cause: a cap below a video that its frames could divide under it gave only "a cap of at least 32",
    which reads as wrong where frames split videos (probe6 P6-18): frames split a video to balance
    cost, each plan starting from the video whole, so the minimum is right and now says why."""
    stages = (Stage("vision", "video", CostModel(), max_tokens_per_rank=16), Stage("llm", "llm", CostModel()))
    batch = Batch.from_samples([Sample(40, (Segment("video", 32, 16, 10, frames=4),), 0, 1), Sample(5, (), 1, 2)],
                               num_ranks=2)
    with pytest.raises(InfeasibleError, match=r"a cap of at least 32 is needed \(its 4 frames may run on several "
                                              r"ranks to balance cost, but each plan starts from the video whole"):
        Orchestrator(stages, 2).plan(batch)

"""Split items in the orchestrator's step and in `balance_microbatches`: every row of every pass lands
exactly once on its group (`check_split_pass`), micro-batch plans against brute force over
assignments × degrees × micro-batches, today's plans kept where nothing pays, videos split between
frames, and the errors of the new entry points."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import ContextParallel, CostModel, InfeasibleError, Orchestrator, balance_microbatches
from orchmllm.orchestrator import Batch, Sample, Segment, Stage, shards
from orchmllm.testing.context_parallel import brute_force_split_microbatches, check_split_pass
from orchmllm.topology import Topology

CHEAP = dict(seconds_per_cost=1.0, kv_bytes_per_token=0.0, half_efficiency_tokens=0.0)  # latency: the Topology's
STAGES = (Stage("vision", "image", CostModel(linear=1.0), input_bytes_per_unit=3.0, output_bytes_per_token=2.0),
          Stage("llm", "llm", CostModel(linear=1.0, quadratic=0.01), input_bytes_per_unit=1.0))


@st.composite
def split_steps(draw):
    """(batch, topology, spec, options): up to 6 samples of text and images (videos of several frames
    among them) on 1-8 ranks, nodes of 2 or 4 gpus, a spec from free to dear splitting, a plain or a
    micro-batched step."""
    nodes, gpus = draw(st.sampled_from([(1, 1), (1, 2), (1, 4), (2, 2), (2, 4)]))
    num_ranks = nodes * gpus
    samples = []
    for _ in range(draw(st.integers(1, 6))):
        segments = []
        for _ in range(draw(st.integers(0, 2))):
            frames = draw(st.sampled_from([1, 1, 2, 3, 8]))
            segments.append(Segment("image", 4 * frames, frames * draw(st.integers(0, 6)), frames=frames))
        text = draw(st.one_of(st.integers(0, 20), st.integers(60, 400)))
        samples.append(Sample(text, tuple(segments), source=draw(st.integers(0, num_ranks - 1))))
    batch = Batch.from_samples(samples, num_ranks)
    degrees = [1] + [c for c in (2, 4) if c <= gpus and draw(st.booleans())]
    spec = ContextParallel(degrees=degrees, seconds_per_cost=1.0, kv_bytes_per_token=draw(st.sampled_from([0.0, 1e-6])),
                           half_efficiency_tokens=draw(st.sampled_from([0.0, 8.0])))
    options = {}
    if draw(st.booleans()):
        longest = int(batch.sample_llm_length.max())
        options["max_tokens_per_microbatch"] = draw(st.integers(max(1, -(-longest // degrees[-1])), 2 * longest + 1))
    return batch, Topology(nodes, gpus, latency_s=draw(st.sampled_from([0.0, 1e-3]))), spec, options  # the spec's
    # latency would be the topology's (a latency set on both is warned about)


@settings(max_examples=60, deadline=None)
@given(case=split_steps())
def test_every_row_lands_once_on_its_group(case):
    batch, topology, spec, options = case
    try:
        step = Orchestrator(STAGES, topology, context_parallel=spec, **options).plan(batch)
    except InfeasibleError:
        return
    for plan in step.microbatches:
        check_split_pass(plan)
    assert step.lower_bound <= step.step_cost * (1 + 1e-12)
    again = Orchestrator(STAGES, topology, context_parallel=spec, **options).plan(batch)
    assert again.digest() == step.digest()


@given(split_steps(), st.data())
@settings(max_examples=60, deadline=None)
def test_embedded_rows_of_a_chunk_are_its_segments_overlap(case, data):
    """`shards._embedded` (one binary search per chunk end over all samples' segments) against
    `text_before` (each position against every segment of its sample)."""
    batch = case[0]
    sample = np.array(data.draw(st.lists(st.integers(0, batch.num_samples - 1), min_size=1, max_size=8)))
    ends = np.array([sorted(data.draw(st.lists(st.integers(0, int(batch.sample_llm_length[s])), min_size=2,
                                               max_size=2))) for s in sample])
    split = np.array(data.draw(st.lists(st.booleans(), min_size=sample.size, max_size=sample.size)))
    embedded = shards._embedded(batch, sample, ends[:, 0], ends[:, 1] - ends[:, 0], split)
    inside = [int(np.diff(ends[k] - shards.text_before(batch, int(s), ends[k]))[0]) if split[k] else 0
              for k, s in enumerate(sample)]
    assert embedded.tolist() == inside


@settings(max_examples=40, deadline=None)
@given(case=split_steps())
def test_without_splitting_the_step_is_todays(case):
    batch, topology, _, options = case
    try:
        today = Orchestrator(STAGES, topology, **options).plan(batch)
    except InfeasibleError:
        return
    unsplit = Orchestrator(STAGES, topology, context_parallel=ContextParallel(degrees=(1,)), **options).plan(batch)
    assert unsplit.digest() == today.digest()
    assert (unsplit.step_cost, unsplit.lower_bound) == (today.step_cost, today.lower_bound)


@st.composite
def tiny_microbatches(draw):
    """(lengths, D, spec, budget, overhead): up to 3 items on 1, 2 or 4 ranks (nodes of 2 or 4), a
    budget from the longest shard up, splitting from free to dear."""
    num_ranks = draw(st.sampled_from([1, 2, 4]))
    degrees = [1] + [c for c in (2, 4) if c <= num_ranks and draw(st.booleans())]
    spec = ContextParallel(degrees=degrees, gpus_per_node=4, seconds_per_cost=1.0,
                           latency_s=draw(st.sampled_from([0.0, 1e-3])),
                           half_efficiency_tokens=draw(st.sampled_from([0.0, 4.0])), kv_bytes_per_token=0.0)
    lengths = draw(st.lists(st.one_of(st.integers(1, 12), st.integers(20, 90)), min_size=1,
                            max_size=3 if num_ranks < 4 else 2))
    budget = draw(st.integers(-(-max(lengths) // degrees[-1]), max(1, sum(lengths))))
    return lengths, num_ranks, spec, budget, draw(st.sampled_from([0.0, 5.0]))


@settings(max_examples=60, deadline=None)
@given(case=tiny_microbatches())
def test_microbatch_plans_against_brute_force(case):
    lengths, num_ranks, spec, budget, overhead = case
    cost = CostModel(linear=1.0, quadratic=0.05)
    try:
        plan = balance_microbatches(lengths, num_ranks, cost=cost, max_tokens_per_microbatch=budget,
                                    microbatch_overhead=overhead, context_parallel=spec)
    except InfeasibleError:
        optimum = brute_force_split_microbatches(lengths, num_ranks, spec, max_tokens_per_microbatch=budget,
                                                 num_microbatches=range(1, len(lengths) + 1), cost=cost,
                                                 microbatch_overhead=overhead)
        assert optimum.makespan is None, f"refused a budget the plan {optimum} meets"
        return
    optimum = brute_force_split_microbatches(lengths, num_ranks, spec, max_tokens_per_microbatch=budget,
                                             num_microbatches=range(1, max(len(lengths), plan.num_microbatches) + 1),
                                             cost=cost, microbatch_overhead=overhead)
    check_microbatch_plan(plan, lengths, num_ranks, spec, cost, budget, overhead)
    assert plan.lower_bound <= optimum.makespan * (1 + 1e-12) and optimum.makespan <= plan.step_cost * (1 + 1e-12)
    if str(plan.status) == "optimal":
        assert math.isclose(plan.step_cost, optimum.makespan, rel_tol=1e-12)


def check_microbatch_plan(plan, lengths, num_ranks, spec, cost, budget, overhead):
    """Groups aligned and inside a node, one group per rank and micro-batch, cells recomputed, budget held."""
    from orchmllm.balancers.context_parallel.layout import shard_tokens
    loads = np.zeros((plan.num_microbatches, num_ranks))
    tokens = np.zeros((plan.num_microbatches, num_ranks), dtype=np.int64)
    owner = {}
    for item, length in enumerate(lengths):
        m, s, c = int(plan.microbatch[item]), int(plan.rank[item]), int(plan.degree[item])
        assert c in spec.degrees and s % c == 0 and s + c <= num_ranks
        assert plan.item_ranks(item).tolist() == list(range(s, s + c))
        if c > 1:
            assert s // spec.gpus_per_node == (s + c - 1) // spec.gpus_per_node
            for r in range(s, s + c):
                assert owner.setdefault((m, r), (s, c)) == (s, c), "two groups on one rank in one micro-batch"
        loads[m, s:s + c] += spec.time(cost, [length], c)[0]
        tokens[m, s:s + c] += shard_tokens([length], c)[0]
    assert np.array_equal(loads, plan.cell_loads) and np.array_equal(tokens, plan.cell_tokens)
    assert tokens.max() <= budget
    assert math.isclose(plan.step_cost, math.fsum(loads.max(axis=1)) + plan.num_microbatches * overhead,
                        rel_tol=1e-12)


def test_a_giant_splits_and_the_step_beats_todays():
    """Seven short samples and a giant on 8 ranks: the giant runs on a group of 4, every row lands on its
    group, and the step is about a quarter of today's (whose bound was the giant alone)."""
    samples = [Sample(100 + 10 * k, (Segment("image", 16, 4),), source=k) for k in range(7)]
    samples.append(Sample(4000, (Segment("image", 512, 128, position=900), Segment("image", 64, 16)), source=7))
    batch = Batch.from_samples(samples, 8)
    spec = ContextParallel(degrees=(1, 2, 4), **CHEAP)
    today = Orchestrator(STAGES, Topology(2, 4)).plan(batch)
    step = Orchestrator(STAGES, Topology(2, 4), context_parallel=spec).plan(batch)
    plan = step.microbatches[0]
    assert plan.llm.degree.tolist() == [1] * 7 + [4] and plan.llm.item_ranks(7).tolist() == [0, 1, 2, 3]
    check_split_pass(plan)
    assert step.step_cost < 0.3 * today.step_cost and step.gap < 0.01
    assert step.digest() != today.digest()


def test_a_video_splits_between_frames_and_reaches_its_shards():
    """A video of 40 frames costs 40× an image: its frames run on several ranks (no group), and every
    part's embeddings reach the ranks holding their positions of its split sample."""
    samples = [Sample(50, (Segment("image", 8, 2),), source=k) for k in range(7)]
    samples.append(Sample(3000, (Segment("image", 8 * 40, 2 * 40, position=500, frames=40),), source=3))
    batch = Batch.from_samples(samples, 8)
    step = Orchestrator(STAGES, Topology(2, 4),
                        context_parallel=ContextParallel(degrees=(1, 2, 4), **CHEAP)).plan(batch)
    plan = step.microbatches[0]
    vision = plan.stage_plans[0]
    parts = vision.item_segment == 7
    assert parts.sum() > 1 and np.unique(vision.destination[parts]).size > 1
    assert vision.makespan < 40 * 8 / 2  # the video alone on one rank, halved at least
    assert plan.llm.degree[7] > 1
    check_split_pass(plan)


def test_without_videos_in_parts_the_encoder_plan_is_todays():
    samples = [Sample(50, (Segment("image", 8 * 4, 2 * 4, frames=4),), source=k % 4) for k in range(8)]
    batch = Batch.from_samples(samples, 4)
    plan = Orchestrator(STAGES, Topology(1, 4)).plan(batch).microbatches[0]
    assert plan.stage_plans[0].num_items == 8 and not plan.splits


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(degrees=(1, 3)), ValueError, "powers of two"),
    (dict(latency_s=-1.0), ValueError, "`latency_s` must be finite and >= 0"),
    (dict(overlap=float("nan")), ValueError, "`overlap` must be finite"),
    (dict(inter_node_bw_bytes_per_s=float("inf")), ValueError, "`inter_node_bw_bytes_per_s` must be finite"),
    (dict(seconds_per_cost=0.0), ValueError, "`seconds_per_cost` must be finite and > 0"),
])
def test_bad_split_cost_parameters_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        ContextParallel(**kwargs)


def test_bad_orchestrator_options_are_refused():
    batch_ranks = Topology(1, 4)
    with pytest.raises(ValueError, match=r"holds 8 > num_ranks 4"):
        Orchestrator(STAGES, batch_ranks, context_parallel=ContextParallel())
    with pytest.raises(TypeError, match="`context_parallel` must be a ContextParallel"):
        Orchestrator(STAGES, batch_ranks, context_parallel=(1, 2))
    with pytest.raises(ValueError, match="needs `balance_llm=True`"):
        Orchestrator(STAGES, batch_ranks, context_parallel=ContextParallel(degrees=(1, 2)), balance_llm=False)
    padded = (STAGES[0], Stage("llm", "llm", CostModel(), padded=True, algorithm="padded"))
    with pytest.raises(ValueError, match="the LLM stage 'llm' is padded"):
        Orchestrator(padded, batch_ranks, context_parallel=ContextParallel(degrees=(1, 2)))


def test_a_budget_no_degree_meets_names_the_item_and_what_works():
    spec = ContextParallel(degrees=(1, 2, 4), **CHEAP)
    with pytest.raises(InfeasibleError, match=r"item 3 \(5000 tokens\) fits max_tokens_per_microbatch=1000 at no "
                                              r"allowed degree \(1, 2, 4\).*degree 8 would span more than the 4 ranks "
                                              r"a group may: it needs a budget of at least 1250"):
        balance_microbatches([100, 200, 300, 5000], 4, max_tokens_per_microbatch=1000, context_parallel=spec)
    batch = Batch.from_samples([Sample(100), Sample(5000, source=1)], 4)
    with pytest.raises(InfeasibleError, match=r"item 1 \(5000 tokens\).*degree 8 would span more than the 4 ranks "
                                              r"a group may: it needs a budget of at least 1250"):
        Orchestrator(STAGES, Topology(1, 4), context_parallel=spec, max_tokens_per_microbatch=1000).plan(batch)


def test_bad_microbatch_options_are_refused():
    spec = ContextParallel(degrees=(1, 2), **CHEAP)
    with pytest.raises(ValueError, match="cannot be combined with `costs`, `padded` or `pipeline`"):
        balance_microbatches([4, 5], 2, max_tokens_per_microbatch=8, costs=[1.0, 2.0], context_parallel=spec)
    with pytest.raises(ValueError, match="cannot be combined with `costs`, `padded` or `pipeline`"):
        balance_microbatches([4, 5], 2, max_tokens_per_microbatch=8, padded=True, context_parallel=spec)
    with pytest.raises(TypeError, match="`context_parallel` must be a ContextParallel"):
        balance_microbatches([4, 5], 2, max_tokens_per_microbatch=8, context_parallel="2")
    with pytest.raises(ValueError, match=r"holds 4 > num_ranks 2"):
        balance_microbatches([4, 5], 2, max_tokens_per_microbatch=8, context_parallel=ContextParallel(degrees=(1, 4)))
    with pytest.raises(ValueError, match="`microbatch_overhead` must be finite and >= 0"):
        balance_microbatches([4, 5], 2, max_tokens_per_microbatch=8, microbatch_overhead=-1.0, context_parallel=spec)


def test_bad_frames_are_refused():
    with pytest.raises(ValueError, match="length and tokens divisible by its frames"):
        Segment("image", 10, 4, frames=4)
    with pytest.raises(ValueError, match=r"`segment_frames` must be positive and divide .* segment 0 has 3 frames"):
        Batch.from_arrays(num_ranks=2, modalities=("image",), sample_text=[5], sample_source=[0], segment_sample=[0],
                          segment_modality=[0], segment_length=[8], segment_tokens=[4], segment_frames=[3])


def test_the_pass_check_fails_on_a_misplaced_row():
    """`check_split_pass` is not vacuous: a piece written one row off, or a shard on the wrong rank, fails it."""
    import dataclasses
    samples = [Sample(100, source=k) for k in range(3)] + [Sample(3000, (Segment("image", 64, 16, position=5),))]
    step = Orchestrator(STAGES, Topology(1, 4), context_parallel=ContextParallel(degrees=(1, 2, 4), **CHEAP)).plan(
        Batch.from_samples(samples, 4))
    plan = step.microbatches[0]
    assert plan.llm.degree[3] > 1
    check_split_pass(plan)
    moved = plan.route_llm_offset.copy()
    moved[-1] += 1
    with pytest.raises(AssertionError, match="lands off its position"):
        check_split_pass(dataclasses.replace(plan, route_llm_offset=moved))
    shards = plan.shards
    rank = shards.rank.copy()
    rank[np.flatnonzero(shards.degree > 1)[0]] += 1
    wrong = dataclasses.replace(plan)
    wrong.__dict__["shards"] = dataclasses.replace(shards, rank=rank)
    with pytest.raises(AssertionError, match="misplaced"):
        check_split_pass(wrong)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=12), st.lists(st.integers(0, 30), max_size=40), st.booleans(),
       st.sampled_from(["left", "right"]))
def test_the_count_of_starts_is_the_binary_search_of_every_key(starts, keys, ascending, side):
    """`shards._searched` (one search per start and a running count where the keys ascend) is
    `np.searchsorted` of every key, ties and keys out of order included."""
    starts = np.sort(np.array(starts, dtype=np.int64))
    keys = np.array(sorted(keys) if ascending else keys, dtype=np.int64)
    assert shards._searched(starts, keys, side).tolist() == np.searchsorted(starts, keys, side=side).tolist()

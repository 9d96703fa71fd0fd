"""Multi-stage planning: composition simulated item by item, per-stage invariants, bad input."""

import collections
import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmllm.balancers import CostModel, InfeasibleError
from orchmllm.orchestrator.plan import offsets_within_rank
from orchmllm.orchestrator.samples import group_order
from orchmllm.orchestrator.planner import Orchestrator, input_bytes, stage_items
from orchmllm.orchestrator.samples import Batch, Sample, Segment
from orchmllm.orchestrator.stages import Stage
from orchmllm.topology import Topology

STAGES = (
    Stage("vision", "image", CostModel(linear=1.0, quadratic=0.01), algorithm="lpt",
          input_bytes_per_unit=1176, output_bytes_per_token=8192),
    Stage("audio", "audio", CostModel(linear=1.0), padded=True, algorithm="padded",
          input_bytes_per_unit=512, output_bytes_per_token=8192),
    Stage("llm", "llm", CostModel(linear=1.0, quadratic=0.001), algorithm="lpt", input_bytes_per_unit=4),
)


def random_batch(seed: int, num_ranks: int, per_rank: int, modalities=("image", "audio")) -> Batch:
    rng = np.random.default_rng(seed)
    samples = []
    for index in range(num_ranks * per_rank):
        segments, end = [], 0
        for _ in range(int(rng.integers(0, 4))):
            modality = modalities[int(rng.integers(len(modalities)))]
            tokens = int(rng.integers(0, 30))
            position = end + int(rng.integers(0, 5))
            segments.append(Segment(modality, int(rng.integers(1, 200)), tokens, position))
            end = position + tokens
        text = max(end - sum(s.tokens for s in segments), 0) + int(rng.integers(0, 40))
        samples.append(Sample(text, tuple(segments), source=index // per_rank, id=1000 + index))
    return Batch.from_samples(samples, num_ranks)


def reference_sequence(batch: Batch, sample: int) -> np.ndarray:
    """Labels of the sample's LLM sequence: segment s token t -> (s+1)·10⁴+t, text token j -> -(j+1)."""
    length = int(batch.sample_llm_length[sample])
    labels = np.zeros(length, dtype=np.int64)
    is_text = np.ones(length, dtype=bool)
    for s in np.flatnonzero(batch.segment_sample == sample):
        start, tokens = int(batch.segment_position[s]), int(batch.segment_tokens[s])
        labels[start:start + tokens] = (s + 1) * 10_000 + np.arange(tokens)
        is_text[start:start + tokens] = False
    labels[is_text] = -(np.arange(int(is_text.sum())) + 1)
    return labels


def encoder_outputs(plan) -> dict:
    """Every encoder rank's output buffer, built item by item in the rank's processing order."""
    buffers = {}
    for index, stage_plan in enumerate(plan.stage_plans[:-1]):
        for rank in range(plan.num_ranks):
            rows = []
            for item in stage_plan.items_on(rank):
                segment = int(stage_plan.item_segment[item])
                assert int(stage_plan.item_offset[item]) == sum(len(r) for r in rows)
                rows.append((segment + 1) * 10_000 + np.arange(int(plan.batch.segment_tokens[segment])))
            buffers[index, rank] = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    return buffers


def assemble(plan, rank: int, fetch) -> np.ndarray:
    """Rank's packed LLM sequence from its recipe; `fetch(entry)` returns one embedding's rows."""
    recipe = plan.assembly(rank)
    packed = np.full(recipe.num_tokens, np.iinfo(np.int64).min, dtype=np.int64)
    written = np.zeros(recipe.num_tokens, dtype=np.int64)
    for e in range(recipe.embedding_segment.size):
        start, tokens = int(recipe.embedding_llm_offset[e]), int(recipe.embedding_tokens[e])
        packed[start:start + tokens] = fetch(recipe, e)
        written[start:start + tokens] += 1
    for t in range(recipe.text_sample.size):
        start, length = int(recipe.text_llm_offset[t]), int(recipe.text_length[t])
        packed[start:start + length] = -(int(recipe.text_offset[t]) + np.arange(length) + 1)
        written[start:start + length] += 1
    assert np.all(written == 1), "embeddings and text spans must tile the packed sequence exactly once"
    return packed


def check_composition(plan) -> None:
    """Every embedding arrives once, at the recipe's offset, and every sample's sequence is exact."""
    batch = plan.batch
    buffers = encoder_outputs(plan)

    def direct(recipe, e):
        stage, encoder_rank = int(recipe.embedding_stage[e]), int(recipe.embedding_encoder_rank[e])
        start = int(recipe.embedding_encoder_offset[e])
        return buffers[stage, encoder_rank][start:start + int(recipe.embedding_tokens[e])]

    arrived = []
    for rank in range(plan.num_ranks):
        packed = assemble(plan, rank, direct)
        recipe = plan.assembly(rank)
        arrived.extend(recipe.embedding_segment.tolist())
        for sample, offset, length in zip(recipe.samples, recipe.sample_offsets, recipe.sample_lengths):
            assert plan.llm.destination[sample] == rank
            np.testing.assert_array_equal(packed[offset:offset + length], reference_sequence(batch, sample))
    assert sorted(arrived) == list(range(batch.num_segments))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("num_ranks,per_rank", [(1, 5), (4, 3), (8, 2)])
def test_every_embedding_arrives_once_at_the_recipe_offset(seed, num_ranks, per_rank):
    check_composition(Orchestrator(STAGES, num_ranks).plan(random_batch(seed, num_ranks, per_rank)).microbatches[0])


@pytest.mark.parametrize("placement", ["identity", "lap", "lap_node"])
def test_placement_only_relabels_groups_and_keeps_the_composition(placement):
    batch = random_batch(4, 16, 3)
    topology = Topology(2, 8)
    plain = Orchestrator(STAGES, topology, placement=None).plan(batch).microbatches[0]
    placed = Orchestrator(STAGES, topology, placement=placement, padded_placement=placement).plan(batch).microbatches[0]
    for before, after in zip(plain.stage_plans, placed.stage_plans):
        np.testing.assert_array_equal(np.sort(before.loads), np.sort(after.loads))
        assert after.makespan == before.makespan
    check_composition(placed)
    if placement == "lap":  # exact: no relabelling keeps more embedding bytes on the LLM rank
        assert placed.embedding_exchange().bytes_moved <= plain.embedding_exchange().bytes_moved


@pytest.mark.parametrize("seed", range(4))
def test_one_exchange_and_two_exchanges_place_every_embedding_identically(seed):
    batch = random_batch(seed, 4, 4)
    plan = Orchestrator(STAGES, 4).plan(batch).microbatches[0]
    buffers = encoder_outputs(plan)
    home_exchange, onward_exchange = plan.two_exchange_scheme()
    # Exchange 1: each embedding back to the rank that sampled it, keyed by segment.
    at_home = {}
    for segment in range(batch.num_segments):
        stage, rank = int(plan.route_stage[segment]), int(home_exchange.source[segment])
        start = int(plan.route_encoder_offset[segment])
        at_home[int(home_exchange.destination[segment]), segment] = \
            buffers[stage, rank][start:start + int(plan.route_tokens[segment])]
    assert len(at_home) == batch.num_segments
    # Exchange 2: from home to the LLM rank of the sample.
    at_llm = {(int(onward_exchange.destination[s]), s): at_home[int(onward_exchange.source[s]), s]
              for s in range(batch.num_segments)}

    def direct(recipe, e):
        stage, encoder_rank = int(recipe.embedding_stage[e]), int(recipe.embedding_encoder_rank[e])
        start = int(recipe.embedding_encoder_offset[e])
        return buffers[stage, encoder_rank][start:start + int(recipe.embedding_tokens[e])]

    for rank in range(4):
        two = assemble(plan, rank, lambda recipe, e: at_llm[rank, int(recipe.embedding_segment[e])])
        np.testing.assert_array_equal(assemble(plan, rank, direct), two)
    moved_twice = sum(e.bytes_moved for e in plan.two_exchange_scheme())
    assert plan.embedding_exchange().bytes_moved <= moved_twice


@pytest.mark.parametrize("seed", range(3))
def test_locality_stays_within_the_slack_and_keeps_the_composition(seed):
    batch = random_batch(seed, 16, 3)
    topology = Topology(2, 8)
    plain = Orchestrator(STAGES, topology, placement=None).plan(batch).microbatches[0]
    local = Orchestrator(STAGES, topology, placement="locality", padded_placement="locality",
                         makespan_slack=0.01).plan(batch).microbatches[0]
    for before, after in zip(plain.stage_plans, local.stage_plans):
        assert after.makespan <= before.makespan * 1.01 + 1e-9
    check_composition(local)


def test_locality_moves_nothing_when_every_rank_already_holds_the_same_work():
    one_rank = [Sample(40, (Segment("image", 64, 16), Segment("audio", 30, 8))), Sample(7, (Segment("image", 9, 3),)),
                Sample(120)]
    samples = [Sample(s.text, s.segments, source=rank) for rank in range(8) for s in one_rank]
    plan = Orchestrator(STAGES, Topology(2, 4), padded_placement="locality").plan(
        Batch.from_samples(samples, 8)).microbatches[0]
    assert plan.input_exchange().bytes_moved == 0 and plan.embedding_exchange().bytes_moved == 0


@pytest.mark.parametrize("seed", range(3))
def test_input_exchange_carries_every_input_once(seed):
    batch = random_batch(seed, 4, 3)
    plan = Orchestrator(STAGES, 4).plan(batch).microbatches[0]
    exchange = plan.input_exchange()
    items = sum(p.num_items for p in plan.stage_plans)
    assert exchange.source.size == items
    expected = sum(float((p.item_length * p.stage.input_bytes_per_unit).sum()) for p in plan.stage_plans[:-1])
    expected += float(batch.sample_text.sum()) * STAGES[-1].input_bytes_per_unit
    assert exchange.item_bytes.sum() == pytest.approx(expected)
    for stage_plan in plan.stage_plans[:-1]:
        for rank in range(4):
            items_here = stage_plan.items_on(rank)
            lengths = stage_plan.item_length[items_here]
            np.testing.assert_array_equal(stage_plan.item_input_offset[items_here], np.cumsum(lengths) - lengths)


@given(seed=st.integers(0, 2**16), num_ranks=st.sampled_from([1, 2, 3, 8]),
       per_rank=st.integers(1, 6))
def test_stage_plans_keep_the_balancer_invariants(seed, num_ranks, per_rank):
    batch = random_batch(seed, num_ranks, per_rank)
    plan = Orchestrator(STAGES, num_ranks).plan(batch).microbatches[0]
    for stage_plan in plan.stage_plans:
        k = stage_plan.num_items
        assert np.all((stage_plan.destination >= 0) & (stage_plan.destination < num_ranks))
        assert sorted(stage_plan.rank_items.tolist()) == list(range(k))
        assert stage_plan.rank_offsets[-1] == k
        assert stage_plan.makespan >= stage_plan.lower_bound - 1e-9
        assert stage_plan.makespan == pytest.approx(float(stage_plan.loads.max()) if k else 0.0)
        if not stage_plan.stage.padded and k:
            costs = stage_plan.stage.cost.item_costs(stage_plan.item_length)
            assert float(stage_plan.loads.sum()) == pytest.approx(float(costs.sum()))
    assert plan.llm.num_items == batch.num_samples


@given(num_ranks=st.integers(1, 9), ranks_and_sizes=st.lists(
    st.tuples(st.integers(0, 8), st.integers(0, 5), st.integers(0, 3)), max_size=40))
def test_rank_order_and_offsets_match_an_item_by_item_walk(num_ranks, ranks_and_sizes):
    ranks = np.array([r % num_ranks for r, _, _ in ranks_and_sizes], dtype=np.int64)
    first = np.array([a for _, a, _ in ranks_and_sizes], dtype=np.int64)
    second = np.array([b for _, _, b in ranks_and_sizes], dtype=np.int64)
    rank_offsets, order = group_order(ranks, num_ranks)
    first_offsets, second_offsets = offsets_within_rank(rank_offsets, order, first, second)
    filled = np.zeros((num_ranks, 2), dtype=np.int64)
    expected_order = []
    for rank in range(num_ranks):
        assert rank_offsets[rank] == len(expected_order)
        for item in np.flatnonzero(ranks == rank):
            expected_order.append(item)
            assert (first_offsets[item], second_offsets[item]) == tuple(filled[rank])
            filled[rank] += first[item], second[item]
    assert order.tolist() == expected_order and rank_offsets[-1] == ranks.size


@pytest.mark.parametrize("num_items, num_groups", [(360_000, 2560), (2**21, 3000), (1000, 2**16 + 5),
                                                    (70_000, 2**16 + 5)],
                         ids=["radix_16_bit_groups", "radix_many_items", "packed_32_bit_keys", "many_groups"])
def test_group_order_is_the_stable_sort_by_group_on_every_path(num_items, num_groups):
    groups = np.random.default_rng(num_items).integers(0, num_groups, num_items)
    offsets, order = group_order(groups, num_groups)
    assert np.array_equal(order, np.argsort(groups, kind="stable"))
    assert np.array_equal(offsets, np.concatenate(([0], np.cumsum(np.bincount(groups, minlength=num_groups)))))


@pytest.mark.parametrize("audio_bytes_per_token", [8192, 1000], ids=["same_bytes", "mixed_bytes"])
def test_llm_anchor_bytes_are_each_samples_text_and_embedding_bytes(audio_bytes_per_token):
    stages = (STAGES[0], Stage("audio", "audio", CostModel(linear=1.0), output_bytes_per_token=audio_bytes_per_token),
              STAGES[2])
    batch = random_batch(3, 4, 5)
    orchestrator = Orchestrator(stages, 4)
    llm_stage = stages[-1]
    anchors, anchor_bytes = orchestrator._anchors(batch, llm_stage, stage_items(batch, llm_stage), None, None)
    per_token = {stage.modality: stage.output_bytes_per_token for stage in stages}
    expected = [batch.sample_text[i] * llm_stage.input_bytes_per_unit
                + sum(batch.segment_tokens[s] * per_token[batch.modalities[batch.segment_modality[s]]]
                      for s in np.flatnonzero(batch.segment_sample == i)) for i in range(batch.num_samples)]
    np.testing.assert_array_equal(anchors, batch.sample_source)
    np.testing.assert_array_equal(anchor_bytes, expected)


def test_same_metadata_gives_a_bit_identical_plan():
    batch = random_batch(7, 8, 4)
    first = Orchestrator(STAGES, 8).plan(batch).microbatches[0]
    again = Orchestrator(STAGES, 8).plan(random_batch(7, 8, 4)).microbatches[0]
    assert first.digest() == again.digest()


def test_memory_cap_is_respected_and_infeasible_cap_is_an_error():
    batch = random_batch(3, 4, 4)
    llm = STAGES[-1]
    total = int(batch.sample_llm_length.sum())
    cap = max(int(batch.sample_llm_length.max()), -(-total // 4)) + int(batch.sample_llm_length.max())
    capped = (*STAGES[:-1], Stage("llm", "llm", llm.cost, algorithm="lpt", max_tokens_per_rank=cap))
    plan = Orchestrator(capped, 4).plan(batch).microbatches[0]
    assert plan.llm.tokens.max() <= cap
    tiny = (*STAGES[:-1], Stage("llm", "llm", llm.cost, algorithm="lpt", max_tokens_per_rank=1))
    with pytest.raises(ValueError, match="max_tokens_per_rank"):
        Orchestrator(tiny, 4).plan(batch).microbatches[0]


def test_rank_without_text_or_samples_assembles_regression_empty_text_spans():
    samples = [Sample(0, (Segment("image", 8, 3),), source=0), Sample(0, (Segment("audio", 5, 2),), source=0)]
    plan = Orchestrator(STAGES, 3, balance_llm=False).plan(Batch.from_samples(samples, 3)).microbatches[0]
    check_composition(plan)
    recipe = plan.assembly(0)
    assert recipe.text_sample.size == 0 and recipe.num_tokens == 5
    assert plan.assembly(2).num_tokens == 0


def test_stages_with_no_items_on_any_rank_work():
    batch = random_batch(1, 4, 3, modalities=("image",))
    plan = Orchestrator(STAGES, 4).plan(batch).microbatches[0]
    audio = plan.stage_plan("audio")
    assert audio.num_items == 0 and audio.makespan == 0 and audio.gap == 0
    text_only = Batch.from_samples([Sample(5, source=r) for r in range(4)], 4)
    plan = Orchestrator(STAGES, 4).plan(text_only).microbatches[0]
    assert plan.embedding_exchange().item_bytes.size == 0
    assert [plan.assembly(r).num_tokens for r in range(4)] == [5, 5, 5, 5]


def test_ablation_switches_keep_items_home():
    batch = random_batch(2, 4, 4)
    plan = Orchestrator(STAGES, 4, balance_encoders=False).plan(batch).microbatches[0]
    for stage_plan in plan.stage_plans[:-1]:
        np.testing.assert_array_equal(stage_plan.destination, stage_plan.source)
    plan = Orchestrator(STAGES, 4, balance_encoders=False, balance_llm=False).plan(batch).microbatches[0]
    assert plan.embedding_exchange().bytes_moved == 0 and plan.input_exchange().bytes_moved == 0


def test_segment_past_its_sequence_is_rejected():
    with pytest.raises(ValueError, match="past the sample's LLM sequence"):
        Sample(10, (Segment("image", 100, 20, position=15),))
    with pytest.raises(ValueError, match="past the sample's LLM sequence"):
        Batch.from_arrays(num_ranks=1, modalities=("image",), sample_text=[3], sample_source=[0],
                          segment_sample=[0], segment_modality=[0], segment_length=[4], segment_tokens=[2],
                          segment_position=[4])


def test_overlapping_segments_are_rejected():
    with pytest.raises(ValueError, match="inside the previous segment"):
        Sample(10, (Segment("image", 8, 4, position=0), Segment("audio", 8, 4, position=2)))


@pytest.mark.parametrize("options, error, match", [
    ({"makespan_slack": -0.5}, ValueError, "`makespan_slack` must be"),
    ({"makespan_slack": float("nan")}, ValueError, "`makespan_slack` must be"),
    ({"balance_encoders": "no"}, TypeError, "`balance_encoders` must be a bool"),
    ({"balance_llm": 0}, TypeError, "`balance_llm` must be a bool"),
    # a misspelt option was "PlanOptions.__init__() got an unexpected keyword argument", a class the user never named
    ({"placemnt": "lap"}, TypeError, r"Orchestrator got an unknown option 'placemnt'; the options are \[.*'placement'"),
])
def test_regression_orchestrator_options_are_checked_when_built(options, error, match):
    """`makespan_slack` was stored unchecked (a negative slack only failed inside a step's
    locality search, a NaN never), and `bool()` read the string "no" as True."""
    with pytest.raises(error, match=match):
        Orchestrator(STAGES, 4, **options)


@pytest.mark.parametrize("options, error, match", [
    ({"microbatching": None}, TypeError, r"Orchestrator got an unknown option 'microbatching'; the options are "
                                         r"\['max_tokens_per_microbatch', 'num_microbatches', 'microbatch_overhead', "
                                         r"'microbatch_algorithm', 'context_parallel', 'pipeline', 'placement'"),
    ({"pipeline": "1f1b"}, TypeError, r"`pipeline` must be a Pipeline\(stages=..., schedule=...\) or None; got str"),
], ids=["a derived field", "a pipeline of the wrong type"])
def test_regression_a_derived_field_was_offered_as_an_option_and_a_mistyped_pipeline_blamed_on_the_budget(
        options, error, match):
    """Cause (fix24d F24-06): the unknown-option check listed every field of PlanOptions, `microbatching` (derived,
    not an argument) too, which then failed as "PlanOptions.__init__() got an unexpected keyword argument"; and
    `pipeline="1f1b"` without a token budget was told it "needs `max_tokens_per_microbatch`", not that it is no
    Pipeline."""
    with pytest.raises(error, match=match):
        Orchestrator(STAGES, 4, **options)


@pytest.mark.parametrize("ranks", [0, -3])
def test_regression_a_number_of_ranks_below_one_was_blamed_on_gpus_per_node(ranks):
    """Cause: an int `topology` became Topology(1, ranks), whose check named `gpus_per_node`, not given."""
    with pytest.raises(ValueError, match=rf"`topology` as a number of ranks must be >= 1; got {ranks}"):
        Orchestrator(STAGES, ranks)


def test_orchestrator_options_are_frozen_and_canonical():
    options = Orchestrator(STAGES, 4, max_tokens_per_microbatch=np.int64(64), microbatch_overhead=1).options
    assert type(options.max_tokens_per_microbatch) is int and options.microbatch_overhead == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.placement = None


def test_a_plain_step_is_a_step_of_one_pass():
    """Without a token budget the StepPlan holds one PassPlan of the whole batch, and its step-level
    figures are those of that pass (one shape for every step: the runtime never branches on it)."""
    batch = random_batch(3, 4, 3)
    step = Orchestrator(STAGES, 4).plan(batch)
    (one,) = step.microbatches
    assert step.cells is None and step.num_microbatches == 1 and one.batch is batch
    assert [samples.tolist() for samples in step.microbatch_samples] == [list(range(batch.num_samples))]
    assert step.microbatch_of_samples.tolist() == [0] * batch.num_samples
    assert step.step_cost == sum(plan.makespan for plan in one.stage_plans)
    assert step.lower_bound == sum(plan.lower_bound for plan in one.stage_plans) and step.gap >= 0
    for index, plan in enumerate(one.stage_plans):
        assert np.array_equal(step.stage_destinations(index), plan.destination)
    assert step.digest() == one.digest()
    assert np.array_equal(step.input_exchange().destination, one.input_exchange().destination)
    assert [e.bytes_moved for e in step.embedding_exchanges()] == [one.embedding_exchange().bytes_moved]


def test_regression_a_step_that_splits_nothing_built_its_constant_columns_slowly_and_scanned_them(monkeypatch):
    """Cause of a planning-time regression (issue 25, T 8k micro-batched step at 2560 x 32): the constant
    columns of a step that splits nothing (degree 1, first unit and row 0, segment -1) came from
    np.broadcast_to (~15 us each, 41 per step), and whether a pass holds segments in parts was np.any over
    every zero of such a column (~45 us at 30k items, twice per pass).  Now `plan.constant` and
    `plan.any_nonzero`, which reads a stride-0 column once."""
    orchestrator, batch = Orchestrator(STAGES, 4), random_batch(1, 4, 6)
    scanned, any_of = [], np.any
    monkeypatch.setattr(np, "broadcast_to", lambda *args, **kwargs: pytest.fail("np.broadcast_to in a step"))
    monkeypatch.setattr(np, "any", lambda array, *args, **kwargs: (scanned.append(np.size(array)),
                                                                   any_of(array, *args, **kwargs))[1])
    (one,) = orchestrator.plan(batch).microbatches
    assert not one.splits
    encoders = sum(plan.num_items for plan in one.stage_plans[:-1])
    assert encoders > 8 and max(scanned) < encoders // 2, scanned


def test_a_step_computes_each_stages_item_costs_once_and_keeps_no_memory_for_constant_columns(monkeypatch):
    """Cause of a planning-time regression (issue 25, 2c40c04): `stage_plan` computed every stage's item
    costs again for `StagePlan.item_time` (the balancer's own: `BalancePlan.item_costs`), and filled
    per-item arrays of ones and zeros for the degrees, parts and route rows of a step that splits nothing, and
    new counts 0..n-1 per pass (page faults of the memory a plan keeps: 1.04-1.15x the planning time)."""
    counts, item_costs = collections.Counter(), CostModel.item_costs

    def counted(cost, lengths):
        counts[id(cost), np.size(lengths)] += 1
        return item_costs(cost, lengths)

    monkeypatch.setattr(CostModel, "item_costs", counted)
    orchestrator, batch = Orchestrator(STAGES, 4), random_batch(0, 4, 6)
    orchestrator.plan(batch)
    counts.clear()
    (one,) = orchestrator.plan(batch).microbatches
    for plan in one.stage_plans:
        # once in each plan of the step: "locality", "lap" and no placement (`step.least_moving`, 4 ranks)
        assert plan.num_items > 4 and counts[id(plan.stage.cost), plan.num_items] == 3, plan.stage.name
        assert np.array_equal(plan.item_time, item_costs(plan.stage.cost, plan.item_length))
        assert plan.degree.tolist() == [1] * plan.num_items and plan.item_first_unit.tolist() == [0] * plan.num_items
        assert plan.degree.strides == plan.item_first_unit.strides == plan.item_first_row.strides == (0,)
    assert one.route_row.tolist() == [0] * one.route_row.size and one.route_row.strides == (0,)
    llm = one.llm  # its items' samples and the routes' segments: 0, 1, ... in one array the process keeps
    assert llm.item_segment.tolist() == [-1] * llm.num_items and llm.item_segment.strides == (0,)
    assert llm.item_sample.tolist() == list(range(llm.num_items))
    assert one.route_segment.tolist() == list(range(batch.num_segments))
    assert np.shares_memory(llm.item_sample, one.route_segment)


def test_unknown_modality_is_rejected():
    batch = Batch.from_samples([Sample(3, (Segment("video", 10, 2),), source=0)], 1)
    with pytest.raises(ValueError, match="unknown modality 'video'"):
        Orchestrator(STAGES, 1).plan(batch).microbatches[0]


def test_composing_stage_plans_that_leave_out_a_segment_is_an_error():
    """Regression: compose filled the routes of a segment no stage plan held with stale memory."""
    from orchmllm.orchestrator.plan import compose
    from orchmllm.orchestrator.planner import StageItems, stage_plan

    batch = random_batch(1, 4, 4)
    plans = []
    for stage in STAGES:
        items = stage_items(batch, stage)
        if stage.modality == "image":
            items = StageItems(*(array[1:] for array in items))
        plans.append(stage_plan(batch, stage, batch.sample_source[items.sample], "none", items=items))
    left_out = int(stage_items(batch, STAGES[0]).segment[0])
    with pytest.raises(ValueError, match=f"segment {left_out} \\('image'\\) is in no stage plan"):
        compose(batch, STAGES, tuple(plans))


@pytest.mark.parametrize("field", ["text", "length", "tokens", "position"])
def test_negative_sizes_are_rejected(field):
    kwargs = {"text": 5, "length": 4, "tokens": 2, "position": 0}
    kwargs[field] = -1
    with pytest.raises(ValueError, match=f"`{field}` must be >= 0"):
        Sample(kwargs["text"], (Segment("image", kwargs["length"], kwargs["tokens"], kwargs["position"]),))


def test_default_positions_pack_segments_before_the_text_in_both_constructors():
    samples = [Sample(5, (Segment("image", 8, 3), Segment("audio", 4, 2)), source=0),
               Sample(2, (Segment("audio", 6, 4),), source=1), Sample(9, source=1)]
    from_samples = Batch.from_samples(samples, 2)
    from_arrays = Batch.from_arrays(num_ranks=2, modalities=("image", "audio"), sample_text=[5, 2, 9],
                                    sample_source=[0, 1, 1], segment_sample=[0, 0, 1], segment_modality=[0, 1, 1],
                                    segment_length=[8, 4, 6], segment_tokens=[3, 2, 4])
    np.testing.assert_array_equal(from_samples.segment_position, [0, 3, 0])
    np.testing.assert_array_equal(from_arrays.segment_position, [0, 3, 0])
    assert from_arrays.sample(0) == Sample(5, (Segment("image", 8, 3, 0), Segment("audio", 4, 2, 3)), source=0, id=0)
    assert from_arrays.sample(2) == Sample(9, source=1, id=2)


@pytest.mark.parametrize("build", ["from_arrays", "constructor"])
def test_per_sample_segment_offsets_and_llm_lengths_match_each_sample(build):
    batch = random_batch(5, 3, 4)
    if build == "constructor":  # no values left behind by validation: computed on first use
        batch = dataclasses.replace(batch)
    for index in range(batch.num_samples):
        sample = batch.sample(index)
        start, end = batch.sample_segment_offsets[index:index + 2]
        np.testing.assert_array_equal(np.arange(start, end), np.flatnonzero(batch.segment_sample == index))
        assert batch.sample_llm_length[index] == sample.llm_length
    assert batch.sample_segment_offsets[-1] == batch.num_segments
    assert not batch.sample_segment_offsets.flags.writeable and not batch.sample_llm_length.flags.writeable


def test_batch_arrays_are_validated():
    with pytest.raises(ValueError, match="`sample_source` must be ranks in \\[0, 2\\)"):
        Batch.from_arrays(num_ranks=2, modalities=(), sample_text=[1, 2], sample_source=[0, 2])
    with pytest.raises(ValueError, match="`segment_sample` must be non-decreasing"):
        Batch.from_arrays(num_ranks=1, modalities=("image",), sample_text=[9, 9], sample_source=[0, 0],
                          segment_sample=[1, 0], segment_modality=[0, 0], segment_length=[1, 1],
                          segment_tokens=[1, 1])
    with pytest.raises(ValueError, match="`segment_length` must be non-negative"):
        Batch.from_arrays(num_ranks=1, modalities=("image",), sample_text=[9], sample_source=[0],
                          segment_sample=[0], segment_modality=[0], segment_length=[-1], segment_tokens=[1])


def test_stage_lists_are_validated():
    with pytest.raises(ValueError, match="exactly one LLM stage"):
        Orchestrator(STAGES[:-1], 2)
    with pytest.raises(ValueError, match="unknown `algorithm`"):
        Stage("vision", "image", CostModel(), algorithm="magic")
    with pytest.raises(ValueError, match="stage 'vision': algorithm 'padded' solves the padded cost"):
        Stage("vision", "image", CostModel(), algorithm="padded")  # a stage unpadded: its plan raised, on every step
    with pytest.raises(ValueError, match="1 nodes × 4 gpus = 4 != batch.num_ranks 2"):
        Orchestrator(STAGES, 4).plan(random_batch(0, 2, 2)).microbatches[0]


@pytest.mark.parametrize("kwargs,message", [
    (dict(input_bytes_per_unit=-1.0), "`input_bytes_per_unit` must be finite and >= 0"),
    (dict(output_bytes_per_token=float("nan")), "`output_bytes_per_token` must be finite and >= 0"),
    (dict(max_tokens_per_rank=0), "`max_tokens_per_rank` must be a positive int or None"),
])
def test_stage_fields_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Stage("vision", "image", CostModel(), **kwargs)
    with pytest.raises(ValueError, match="produces no embeddings"):
        Stage("llm", "llm", CostModel(), output_bytes_per_token=2.0)


def test_orchestrator_options_are_validated():
    with pytest.raises(ValueError, match="unknown `placement` 'nearby'"):
        Orchestrator(STAGES, 2, placement="nearby")
    with pytest.raises(ValueError, match="unknown `uniform_algorithm` 'magic'"):
        Orchestrator(STAGES, 2, uniform_algorithm="magic")
    with pytest.raises(TypeError, match="`topology` must be a Topology or an int"):
        Orchestrator(STAGES, "two")
    with pytest.raises(TypeError, match="`batch` must be a Batch"):
        Orchestrator(STAGES, 2).plan([Sample(3)]).microbatches[0]


def test_assembly_rank_is_validated():
    plan = Orchestrator(STAGES, 2).plan(random_batch(0, 2, 2)).microbatches[0]
    with pytest.raises(ValueError, match="`rank` must be an int in \\[0, 2\\)"):
        plan.assembly(2)


def test_topology_with_several_nodes_plans_like_any_other():
    batch = random_batch(5, 16, 2)
    plan = Orchestrator(STAGES, Topology(2, 8)).plan(batch).microbatches[0]
    assert plan.num_ranks == 16
    assert sorted(np.concatenate([plan.assembly(r).samples for r in range(16)]).tolist()) == list(range(32))


@pytest.mark.parametrize("audio_bytes", [8192, 3000], ids=["equal_per_token", "per_segment"])
def test_input_bytes_are_an_items_input_and_a_samples_text_plus_received_embeddings(audio_bytes):
    stages = (STAGES[0], dataclasses.replace(STAGES[1], output_bytes_per_token=audio_bytes), STAGES[2])
    batch = random_batch(4, 4, 6)
    for stage in stages[:2]:
        np.testing.assert_array_equal(input_bytes(batch, stages, stage),
                                      stage_items(batch, stage).length * float(stage.input_bytes_per_unit))
    per_token = {"image": 8192, "audio": audio_bytes}
    received = np.zeros(batch.num_samples)
    for segment, sample in enumerate(batch.segment_sample.tolist()):
        received[sample] += batch.segment_tokens[segment] * per_token[batch.modalities[batch.segment_modality[segment]]]
    np.testing.assert_array_equal(input_bytes(batch, stages, stages[2]), batch.sample_text * 4 + received)


def test_an_encoder_cap_below_one_segment_names_the_stage_and_the_sample():
    """Cause: the balancer's "`max_tokens_per_rank`=2 is below the largest item (3 tokens at index 0)" named
    neither the stage (one of several encoder caps) nor the sample: "item 0" indexed the stage's segments
    (probe3 UE8)."""
    stages = (Stage("audio", "audio", CostModel(linear=1)),
              Stage("vision", "image", CostModel(per_item=1, linear=1), max_tokens_per_rank=4),
              Stage("llm", "llm", CostModel(linear=1)))
    samples = [Sample(text=4, segments=(Segment("audio", 2, 2), Segment("image", 3 + 2 * (r == 2), 3)), source=r,
                      id=100 + r) for r in range(4)]
    with pytest.raises(InfeasibleError, match=r"stage 'vision' \(image\): max_tokens_per_rank=4 is below segment 1 of "
                                              r"sample id 102 \(5 tokens\); a cap of at least 5 is needed") as error:
        Orchestrator(stages, Topology(num_nodes=1, gpus_per_node=4)).plan(Batch.from_samples(samples, 4))
    assert error.value.min_cap == 5


def one(sample: Sample) -> Batch:
    return Batch.from_samples([sample], 2)


@pytest.mark.parametrize("make, message", [
    (lambda: one(Sample(10**30)),
     r"`text` must be below 2\*\*53 \(token counts stay exact in float64 costs\); got 10{30}"),
    (lambda: one(Sample(5, (Segment("image", 10**30, 2),))), r"`length` must be below 2\*\*53"),
    (lambda: one(Sample(5, (Segment("image", 4, 10**20),))), r"`tokens` must be below 2\*\*53"),
    (lambda: one(Sample(2**52, (Segment("image", 4, 2**52),))), r"the sample's LLM sequence \(text 4503599627370496 "
                                                               r"\+ segment tokens\) holds 9007199254740992 tokens, at "
                                                               r"or beyond 2\*\*53"),
    (lambda: Batch.from_arrays(num_ranks=2, modalities=("image",), sample_text=[2**62], sample_source=[0],
                               segment_sample=[0], segment_modality=[0], segment_length=[4], segment_tokens=[2**62]),
     r"`sample_text` must be below 2\*\*53 \(token counts stay exact in float64 costs\); got 4611686018427387904 at "
     r"index 0"),
    (lambda: Batch.from_arrays(num_ranks=2, modalities=("image",), sample_text=[2**52], sample_source=[0],
                               segment_sample=[0], segment_modality=[0], segment_length=[4], segment_tokens=[2**52]),
     r"sample 0's LLM sequence \(text 4503599627370496 \+ segment tokens\) holds 9007199254740992 tokens, at or "
     r"beyond 2\*\*53"),
], ids=["text", "segment length", "segment tokens", "sample's sequence", "array past int64's half",
        "array sample's sequence"])
def test_regression_token_counts_past_2_53_overflowed_int64_or_read_as_objects(make, message):
    """Cause (fix24d F24-11): a Sample or Segment took any non-negative int: text 10**30 became "`sample_text` must
    hold integers; got dtype object", a segment of length 10**30 or 10**20 tokens numpy's raw OverflowError in
    Batch.from_samples, and text + tokens of 2**62 each wrapped int64 to a sequence of -9223372036854775808 tokens
    in the message; a sequence of 2**53 tokens or more was planned with costs no longer exact.  Counts and each
    sample's LLM sequence stay below 2**53, as the workload file reader requires."""
    with pytest.raises(ValueError, match=message):
        make()

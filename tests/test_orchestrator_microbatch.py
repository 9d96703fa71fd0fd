"""Micro-batched step plans: cells for whole samples, every micro-batch's stages balanced and composed."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dataclasses

from orchmllm import InfeasibleError, Orchestrator, Topology
from orchmllm.balancers import balance_microbatches
from orchmllm.balancers.api import trusted_request
from orchmllm.orchestrator import StepPlan, planner
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload

STAGES = MODELS["10b"].stages()


def plan_of(num_ranks, samples_per_rank, budget, seed=0, **options):
    batch = sample_workload("default", num_ranks, samples_per_rank, seed=seed)
    topology = Topology.for_world_size(num_ranks) if num_ranks >= 8 else Topology(1, num_ranks)
    return batch, Orchestrator(STAGES, topology, max_tokens_per_microbatch=budget, **options).plan(batch)


def check_step(batch, plan: StepPlan, budget: int):
    """Every invariant of a micro-batched step, recomputed from the batch."""
    assert isinstance(plan, StepPlan)
    cells = plan.cells
    assert plan.num_microbatches == cells.num_microbatches == len(plan.microbatch_samples)
    seen = np.concatenate(plan.microbatch_samples)
    assert np.array_equal(np.sort(seen), np.arange(batch.num_samples))  # each sample in exactly one micro-batch
    for index, (members, micro) in enumerate(zip(plan.microbatch_samples, plan.microbatches)):
        assert np.all(np.diff(members) > 0) and np.all(cells.microbatch[members] == index)
        assert micro.batch.num_samples == members.size
        assert np.array_equal(micro.batch.sample_text, batch.sample_text[members])
        assert np.array_equal(micro.batch.sample_source, batch.sample_source[members])
        assert np.array_equal(micro.llm.destination, cells.rank[members])
        tokens = np.bincount(micro.llm.destination, weights=micro.batch.sample_llm_length,
                             minlength=batch.num_ranks)
        assert tokens.max() <= budget
        for stage_plan in micro.stage_plans[:-1]:  # every segment of the micro-batch's samples, once
            segments = micro.batch.segments_of(stage_plan.stage.modality)
            assert np.array_equal(stage_plan.item_segment, segments)
            assert stage_plan.makespan >= stage_plan.lower_bound * (1 - 1e-12)
        # encoder outputs go straight to the LLM rank of their sample in this micro-batch
        assert np.array_equal(micro.route_llm_rank, micro.llm.destination[micro.batch.segment_sample])
    assert sum(micro.batch.num_segments for micro in plan.microbatches) == batch.num_segments
    assert plan.step_cost >= plan.lower_bound * (1 - 1e-12)
    assert plan.step_cost == pytest.approx(sum(plan.stage_step_costs.values()))  # no overhead by default
    assert plan.lower_bound == sum(plan.stage_lower_bounds.values())  # properties, as step_cost (were methods)
    assert np.array_equal(plan.microbatch_of_samples, cells.microbatch)
    exchange = plan.input_exchange()
    assert exchange.source.size == batch.num_samples + batch.num_segments
    assert len(plan.embedding_exchanges()) == plan.num_microbatches


@pytest.mark.parametrize("num_ranks, samples_per_rank, budget", [(4, 8, 8192), (8, 16, 16384), (16, 12, 4096 * 3)])
def test_micro_batched_step_keeps_every_invariant(num_ranks, samples_per_rank, budget):
    batch, plan = plan_of(num_ranks, samples_per_rank, budget)
    check_step(batch, plan, budget)
    assert plan.num_microbatches >= 2


@settings(max_examples=15)
@given(seed=st.integers(0, 10**6), num_ranks=st.sampled_from([2, 3, 8]), samples_per_rank=st.integers(1, 10),
       budget=st.sampled_from([8192, 12000, 32768]))
def test_micro_batched_step_invariants_hold_on_random_batches(seed, num_ranks, samples_per_rank, budget):
    batch = sample_workload("default", num_ranks, samples_per_rank, seed=seed)
    budget = max(budget, int(batch.sample_llm_length.max()))
    topology = Topology.for_world_size(num_ranks) if num_ranks >= 8 else Topology(1, num_ranks)
    plan = Orchestrator(STAGES, topology, max_tokens_per_microbatch=budget).plan(batch)
    check_step(batch, plan, budget)


def test_same_batch_gives_a_bit_identical_micro_batched_plan():
    _, first = plan_of(8, 16, 16384, seed=3)
    _, second = plan_of(8, 16, 16384, seed=3)
    assert first.digest() == second.digest()
    _, other = plan_of(8, 16, 16384, seed=4)
    assert other.digest() != first.digest()


def test_a_forced_micro_batch_count_is_honoured_on_every_rank():
    batch, plan = plan_of(4, 8, 65536, num_microbatches=3)
    assert plan.num_microbatches == 3
    check_step(batch, plan, 65536)


def test_unbalanced_encoders_run_where_their_sample_runs():
    batch, plan = plan_of(8, 8, 16384, balance_encoders=False)
    for micro in plan.microbatches:
        for stage_plan in micro.stage_plans[:-1]:
            assert np.array_equal(stage_plan.destination, micro.llm.destination[stage_plan.item_sample])
        assert micro.embedding_exchange().bytes_moved == 0


def test_micro_batch_stages_deal_with_the_filler_on_a_miss(monkeypatch):
    """A micro-batch's unpadded encoder stage deals with fill="on_miss" (its small problems would
    pay more for the repair than for the deal); padded stages and plain steps with fill=None."""
    fills = []

    def recorded(*args, **kwargs):
        fills.append((kwargs["padded"], kwargs.get("fill")))
        return trusted_request(*args, **kwargs)

    monkeypatch.setattr(planner, "trusted_request", recorded)
    monkeypatch.setattr(planner, "WHOLE_STEP_RANKS", 0)  # the "locality" step's own calls, not the plans of others
    batch, plan = plan_of(64, 16, 16384, seed=2)
    assert plan.num_microbatches >= 2
    assert sorted(set(fills)) == [(False, "on_miss"), (True, None)]
    assert fills.count((False, "on_miss")) == plan.num_microbatches  # the vision stage of every micro-batch
    fills.clear()
    Orchestrator(STAGES, Topology.for_world_size(64)).plan(batch)
    assert fills and all(fill is None for _, fill in fills)


def test_num_microbatches_without_a_budget_is_rejected():
    with pytest.raises(ValueError, match="`num_microbatches` needs `max_tokens_per_microbatch`"):
        Orchestrator(STAGES, 4, num_microbatches=2)


@pytest.mark.parametrize("options, error, message", [
    (dict(max_tokens_per_microbatch=0), ValueError, "`max_tokens_per_microbatch` must be >= 1; got 0"),
    (dict(max_tokens_per_microbatch=8192.0), TypeError, "`max_tokens_per_microbatch` must be an int"),
    (dict(max_tokens_per_microbatch=8192, num_microbatches=2.0), TypeError,
     "`num_microbatches` must be an int or None"),
    (dict(max_tokens_per_microbatch=8192, microbatch_overhead=float("nan")), ValueError,
     "`microbatch_overhead` must be finite and >= 0; got nan"),
    (dict(max_tokens_per_microbatch=8192, microbatch_algorithm="zzz"), ValueError,
     "unknown `microbatch_algorithm` 'zzz'; choose one of"),
    (dict(max_tokens_per_microbatch=8192, balance_llm=False), ValueError,
     r"`balance_llm=False` cannot plan micro-batches .* pass cells that do to `plan_cells`"),
])
def test_micro_batch_options_are_checked_when_the_orchestrator_is_built(options, error, message):
    """Bad micro-batch options fail at construction, as `placement` does, not at the first plan; and
    balance_llm=False, which the cells would silently ignore, is refused."""
    with pytest.raises(error, match=message):
        Orchestrator(STAGES, 4, **options)


def test_plan_cells_refuses_cells_that_are_not_of_this_batch():
    """Cells of other samples, ranks, lengths, costs or a larger budget than the orchestrator's (or
    the LLM stage's cap) are refused with the reason, before any micro-batch is planned."""
    batch = sample_workload("default", 4, 8, seed=1)
    lengths, budget, cost = batch.sample_llm_length, 8100, STAGES[-1].cost  # one micro-batch needs > 8100

    def cells(values=lengths, ranks=4, **options):
        return balance_microbatches(values, ranks, **{"max_tokens_per_microbatch": budget, "cost": cost, **options})

    orchestrator = Orchestrator(STAGES, 4, max_tokens_per_microbatch=budget)
    assert orchestrator.plan_cells(batch, cells())
    whole = cells(max_tokens_per_microbatch=10**6)
    cases = [
        (None, TypeError, "`cells` must be a MicroBatchPlan"),
        (cells(lengths[:-3]), ValueError, "`cells` place 29 items on 4 ranks; the batch has 32 samples on 4 ranks"),
        (cells(ranks=8), ValueError, "`cells` place 32 items on 8 ranks"),
        (cells(np.ones_like(lengths)), ValueError,
         r"`cells` were planned for other lengths: cell \(rank 0, micro-batch 0\) holds \d+ of this batch's LLM"),
        (cells(cost=None), ValueError,
         r"`cells` were planned under another cost: their step cost is [\d.]+, this batch.s under the LLM"),
        (dataclasses.replace(whole, lower_bound=2 * whole.step_cost), ValueError,
         "`cells` claim a lower bound .* above their step cost"),
        (dataclasses.replace(whole, cell_tokens=whole.cell_tokens[:, :2]), ValueError,
         r"`cells.cell_tokens` must be a numpy array of shape \(1, 4\)"),
        (dataclasses.replace(whole, rank=whole.rank.astype(float)), ValueError, "`cells.rank` must be a numpy array"),
        (whole, ValueError, r"`cells` put \d+ LLM tokens in cell \(rank \d, micro-batch 0\), over the budget of 8100"),
    ]
    for given, error, message in cases:
        with pytest.raises(error, match=message):
            orchestrator.plan_cells(batch, given)
    # With no budget of its own the orchestrator holds the cells to theirs (the study's peers) and
    # to the LLM stage's cap.
    assert Orchestrator(STAGES, 4).plan_cells(batch, whole).num_microbatches == 1
    llm_capped = (*STAGES[:-1], dataclasses.replace(STAGES[-1], max_tokens_per_rank=8100))
    with pytest.raises(ValueError, match="over the LLM stage 'llm''s max_tokens_per_rank=8100"):
        Orchestrator(llm_capped, 4).plan_cells(batch, whole)


def test_an_llm_cap_below_the_budget_is_named_in_the_error():
    """The LLM stage's max_tokens_per_rank below max_tokens_per_microbatch bounds every cell; an
    error under it says so instead of quoting a max_tokens_per_microbatch the user never gave."""
    batch = sample_workload("default", 4, 8, seed=1)
    stages = (*STAGES[:-1], dataclasses.replace(STAGES[-1], max_tokens_per_rank=3000))
    with pytest.raises(InfeasibleError, match=r"the LLM stage 'llm' has max_tokens_per_rank=3000, below "
                                              r"max_tokens_per_microbatch=8192: a cell holds at most 3000 tokens"):
        Orchestrator(stages, 4, max_tokens_per_microbatch=8192).plan(batch)


def capped(image=None, audio=None):
    """The 10B stages with per-rank (per micro-batch) token caps on the encoders."""
    image_stage, audio_stage, llm_stage = STAGES
    return (dataclasses.replace(image_stage, max_tokens_per_rank=image),
            dataclasses.replace(audio_stage, max_tokens_per_rank=audio), llm_stage)


@pytest.mark.parametrize("caps, num_microbatches", [(dict(image=6000), None), (dict(image=6000), 4),
                                                    (dict(image=12000, audio=3000), None)])
def test_encoder_budgets_hold_in_every_micro_batch(caps, num_microbatches):
    """An encoder stage's max_tokens_per_rank bounds its tokens on every rank in every micro-batch:
    the cells count each sample's share of the cap (one document holds 11 520 image tokens, more
    than a rank's 6 000: its tiles spread over ranks), so every micro-batch's stage fits."""
    batch = sample_workload("default", 4, 8, seed=1)
    budget = 8192
    orchestrator = Orchestrator(capped(**caps), 4, max_tokens_per_microbatch=budget, num_microbatches=num_microbatches)
    plan = orchestrator.plan(batch)
    check_step(batch, plan, budget)
    image = batch.segment_length[batch.segments_of("image")]
    assert plan.num_microbatches >= -(-int(image.sum()) // (4 * caps["image"]))
    for micro in plan.microbatches:
        for stage_plan in micro.stage_plans[:-1]:
            cap = stage_plan.stage.max_tokens_per_rank
            assert cap is None or stage_plan.tokens.max() <= cap


def test_encoder_budgets_that_never_bind_leave_the_plan_bit_identical():
    batch = sample_workload("default", 8, 16, seed=3)
    plain = Orchestrator(STAGES, 8, max_tokens_per_microbatch=16384).plan(batch)
    loose = Orchestrator(capped(image=10**9, audio=10**9), 8, max_tokens_per_microbatch=16384).plan(batch)
    assert loose.digest() == plain.digest() and loose.cells.digest() == plain.cells.digest()


def test_an_encoder_budget_no_micro_batch_meets_names_the_micro_batch_and_stage():
    """Cells not planned for an encoder cap (here one micro-batch of every sample, through
    `plan_cells`), or a cap below the longest image, fail naming the micro-batch and the stage."""
    batch = sample_workload("default", 4, 8, seed=1)
    whole = balance_microbatches(batch.sample_llm_length, 4, max_tokens_per_microbatch=10**6, cost=STAGES[-1].cost)
    with pytest.raises(InfeasibleError, match=r"micro-batch 0, stage 'image encoder': balancing it failed .* its "
                                              r"segments on their samples' ranks put \d+ tokens on rank \d+, over "
                                              r"max_tokens_per_rank=6000 \(cells that are not planned for the cap, "
                                              r"or a sample holding more than it\)"):
        Orchestrator(capped(image=6000), 4).plan_cells(batch, whole)
    with pytest.raises(InfeasibleError, match=r"micro-batch \d+, stage 'image encoder': balancing it failed "
                                              r"\(stage 'image encoder' \(image\): max_tokens_per_rank=5623 is below "
                                              r"segment 0 of sample id 10 \(5624 tokens\)"):
        Orchestrator(capped(image=5623), 4, max_tokens_per_microbatch=8192).plan(batch)


def test_batch_take_keeps_samples_and_their_segments_in_order():
    batch = sample_workload("default", 4, 6, seed=1)
    members = np.array([0, 3, 4, 11, 20])
    sub = batch.take(members)
    for k, index in enumerate(members):
        assert sub.sample(k).segments == batch.sample(int(index)).segments
        assert sub.sample(k).text == batch.sample(int(index)).text
    with pytest.raises(ValueError, match="ascending distinct sample indices"):
        batch.take([3, 1])


BATCH_COLUMNS = ("sample_text", "sample_source", "sample_id", "segment_sample", "segment_modality", "segment_length",
                 "segment_tokens", "segment_position", "sample_segment_offsets", "sample_llm_length")


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), num_groups=st.integers(1, 6), data=st.data())
def test_batch_split_gives_every_group_what_take_gives(seed, num_groups, data):
    batch = sample_workload("default", 4, data.draw(st.integers(1, 8)), seed=seed)
    group = np.array(data.draw(st.lists(st.integers(0, num_groups - 1), min_size=batch.num_samples,
                                        max_size=batch.num_samples)), dtype=np.int64)
    parts = batch.split(group, num_groups)
    assert len(parts) == num_groups
    for index, (members, part) in enumerate(parts):
        assert np.array_equal(members, np.flatnonzero(group == index))
        taken = batch.take(members)
        for name in BATCH_COLUMNS:
            column = getattr(part, name)
            assert column.dtype == np.int64 and not column.flags.writeable
            assert np.array_equal(column, getattr(taken, name)), name


def test_batch_split_rejects_groups_that_are_not_one_per_sample_in_range():
    batch = sample_workload("default", 4, 3, seed=1)
    with pytest.raises(ValueError, match="one int per sample"):
        batch.split(np.zeros(batch.num_samples - 1, dtype=np.int64), 2)
    with pytest.raises(ValueError, match="one int per sample"):
        batch.split(np.zeros(batch.num_samples), 2)
    with pytest.raises(ValueError, match=r"groups in \[0, 2\)"):
        batch.split(np.full(batch.num_samples, 2), 2)


@pytest.mark.parametrize("mix, audio_cap", [("speech", 5000), ("speech", 2**63), ("default", 10**6)])
def test_an_encoder_budget_the_plain_cells_already_meet_keeps_their_plan(mix, audio_cap):
    """The cells are planned on LLM tokens first; only a micro-batch that then finds no plan within
    an encoder's cap makes them count the caps: a cap the plain cells meet (or one no rank could
    ever pass, up to 2**63) leaves the plan bit-identical."""
    batch = sample_workload(mix, 4, 8, seed=8)
    plain = Orchestrator(STAGES, 4, max_tokens_per_microbatch=16384).plan(batch)
    audio = [micro.stage_plans[1].tokens.max(initial=0) for micro in plain.microbatches]
    assert max(audio) <= audio_cap
    plan = Orchestrator(capped(audio=audio_cap), 4, max_tokens_per_microbatch=16384).plan(batch)
    assert plan.digest() == plain.digest()


def test_a_cap_the_plain_cells_miss_is_met_by_cells_that_count_it():
    batch = sample_workload("speech", 4, 8, seed=8)
    plain = Orchestrator(STAGES, 4, max_tokens_per_microbatch=16384).plan(batch)
    assert max(micro.stage_plans[1].tokens.max() for micro in plain.microbatches) > 2000
    plan = Orchestrator(capped(audio=2000), 4, max_tokens_per_microbatch=16384).plan(batch)
    check_step(batch, plan, 16384)
    assert all(micro.stage_plans[1].tokens.max() <= 2000 for micro in plan.microbatches)


def test_a_padded_stage_balanced_unpadded_by_uniform_algorithm_still_holds_its_cap():
    """uniform_algorithm balances the padded audio stage as unpadded; its real tokens (count ·
    longest) are checked against the cap: a plain step refuses clearly, a micro-batch runs the
    segments on their samples' ranks instead (p13 of the probe put 6125 tokens under a 6000 cap)."""
    batch = sample_workload("speech", 4, 16, seed=5)
    stages = capped(audio=6000)
    plan = Orchestrator(stages, 4, max_tokens_per_microbatch=16384, uniform_algorithm="lpt").plan(batch)
    check_step(batch, plan, 16384)
    assert all(micro.stage_plans[1].tokens.max() <= 6000 for micro in plan.microbatches)
    with pytest.raises(InfeasibleError, match=r"stage 'audio encoder': uniform_algorithm 'lpt' balanced it unpadded "
                                              r"and put \d+ tokens \(count · longest\) on rank \d, over its "
                                              r"max_tokens_per_rank=2000"):
        Orchestrator(capped(audio=2000), 4, uniform_algorithm="lpt").plan(sample_workload("speech", 4, 4, seed=5))


@pytest.mark.parametrize("algorithm", ["identity", "karmarkar_karp"])
def test_regression_the_llm_stage_s_algorithm_was_dropped_under_a_micro_batch_budget(algorithm):
    """Cause: with `max_tokens_per_microbatch` the LLM cells come from `microbatch_algorithm`, so the LLM stage's
    `algorithm` ('identity': keep the sampled placement) was validated and never run: one bit-identical plan for
    every choice, no word (probe10 P10-20).  A choice other than a default is refused naming the replacement."""
    stages = (*STAGES[:-1], dataclasses.replace(STAGES[-1], algorithm=algorithm))
    with pytest.raises(ValueError, match=rf"^stage 'llm': `algorithm` '{algorithm}' plans a step of one pass per "
                                         r"rank, which `max_tokens_per_microbatch` replaces: its cells come from the "
                                         r"micro-batch planner \(`microbatch_algorithm` in Python\); leave "
                                         r"`algorithm` at 'lpt' or 'auto'$"):
        Orchestrator(stages, 4, max_tokens_per_microbatch=16384)
    Orchestrator(stages, 4)  # a step of one pass runs it


def test_a_padded_llm_stage_gets_padded_cells():
    """The cells of a padded LLM stage hold count · longest tokens within T (they were planned
    unpadded: 35 576 tokens in one cell of a 16 384 budget)."""
    batch = sample_workload("default", 4, 8, seed=9)
    stages = (*STAGES[:-1], dataclasses.replace(STAGES[-1], padded=True))
    plan = Orchestrator(stages, 4, max_tokens_per_microbatch=16384).plan(batch)
    assert plan.cells.padded and plan.cells.cell_tokens.max() <= 16384
    for micro in plan.microbatches:
        assert micro.llm.tokens.max() <= 16384  # count · longest, as the padded stage holds them
    unpadded = balance_microbatches(batch.sample_llm_length, 4, max_tokens_per_microbatch=16384, cost=STAGES[-1].cost)
    with pytest.raises(ValueError, match="`cells` were planned unpadded; the LLM stage 'llm' is padded"):
        Orchestrator(stages, 4).plan_cells(batch, unpadded)


@pytest.mark.parametrize("options, message", [
    (dict(microbatch_overhead=0.5), "`microbatch_overhead` needs `max_tokens_per_microbatch`"),
    (dict(microbatch_algorithm="greedy"), "`microbatch_algorithm` needs `max_tokens_per_microbatch`"),
    (dict(max_tokens_per_microbatch=2**70), r"`max_tokens_per_microbatch` must be at most 2\*\*63 - 1"),
])
def test_micro_batch_options_without_a_usable_budget_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        Orchestrator(STAGES, 4, **options)


@pytest.mark.parametrize("llm_cap", [None, 6])
def test_regression_a_sample_over_the_microbatch_budget_was_named_by_its_index_among_items(llm_cap):
    """The balancer's "item 0 has 8 tokens > max_tokens_per_microbatch=6" named no sample: the error
    names the sample's id and its LLM tokens, and where the LLM stage's cap lowers the budget, that cap."""
    from orchmllm import CostModel, Sample, Segment, Stage
    from orchmllm.orchestrator import Batch
    stages = (Stage("vision", "image", CostModel(per_item=1, linear=1)),
              Stage("llm", "llm", CostModel(linear=1), max_tokens_per_rank=llm_cap))
    samples = [Sample(text=2, id=40), Sample(text=5, segments=(Segment("image", 3, 3),), id=41)]
    budget = 6 if llm_cap is None else 100
    match = r"sample id 41 has 8 LLM tokens > max_tokens_per_microbatch=6; no micro-batch can hold it"
    with pytest.raises(InfeasibleError, match=match + ("" if llm_cap is None else r".*\(the LLM stage 'llm' has")):
        Orchestrator(stages, 4, max_tokens_per_microbatch=budget).plan(Batch.from_samples(samples, 4))


# Methods of StepPlan that take no argument: each builds an object (built(): the routes) or hashes, what a property
# should not hide.
BUILDING_METHODS = {"digest", "input_exchange", "embedding_exchanges", "built"}


def test_what_a_step_plan_holds_or_costs_is_a_property_not_a_method():
    """Issue 24: MicroBatchStepPlan's stage_step_costs, stage_lower_bounds and microbatch_of_samples were methods
    beside the properties step_cost, lower_bound and gap: one kind now, and a new accessor keeps to it."""
    import inspect

    bare = {name for name, member in vars(StepPlan).items() if not name.startswith("_") and inspect.isfunction(member)
            and len(inspect.signature(member).parameters) == 1}
    assert bare == BUILDING_METHODS

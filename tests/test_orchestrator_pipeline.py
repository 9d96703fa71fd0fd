"""`Orchestrator(..., pipeline=)`: the step it reports runs every micro-batch's encoders on the first stage, as
the event simulation does; without `balance_encoders` its cells are planned seeing them; and
`balance_microbatches(..., first_stage_costs=)` is checked and planned with them."""

import dataclasses

import numpy as np
import pytest

from orchmllm import CostModel, Orchestrator, Topology
from orchmllm.balancers import Pipeline, balance_microbatches
from orchmllm.orchestrator.pipeline import microbatch_order, planned_step
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload
from orchmllm.testing.pipeline import replica_step

BASE = MODELS["10b"].stages()
HEAVY_VISION = (dataclasses.replace(BASE[0], cost=CostModel(linear=40 * BASE[0].cost.linear,
                                                            quadratic=40 * BASE[0].cost.quadratic)), *BASE[1:])
ONE_F_ONE_B = Pipeline(stages=4, schedule="1f1b")


def simulated_step(plan, pipeline):
    """The event simulation of every replica (`testing.pipeline.replica_step`): cell (r, m) costs its LLM load, the
    overhead and the encoder loads the plan gave rank r in micro-batch m, those on the first stage alone."""
    o, times = plan.cells.microbatch_overhead, []
    for r in range(plan.num_ranks):
        encoders = [sum(stage.loads[r] for stage in micro.stage_plans[:-1]) for micro in plan.microbatches]
        costs = [plan.cells.cell_loads[m, r] + o + e for m, e in enumerate(encoders)]
        times.append(replica_step(pipeline, costs, encoders))
    return times


def plan_of(seed=11, pipeline=ONE_F_ONE_B, stages=HEAVY_VISION, workload="vision", **options):
    batch = sample_workload(workload, 8, 48, seed=seed)
    options = dict(max_tokens_per_microbatch=max(16384, int(batch.sample_llm_length.max())), num_microbatches=8,
                   **options)
    return batch, Orchestrator(stages, Topology(1, 8), pipeline=pipeline, **options).plan(batch)


def test_reported_step_is_the_event_simulation_with_the_encoders_on_the_first_stage():
    """Regression: the step reported was the LLM cells' alone (`cells.pipeline`), blind to the heavy vision
    encoder every replica's first stage runs; `StepPlan.pipeline` is the plan as it runs (fails before: no such
    step)."""
    batch, plan = plan_of()
    step, times = plan.pipeline, simulated_step(plan, ONE_F_ONE_B)
    assert step.replica_times.tolist() == times and step.step_time == max(times)
    assert step.step_time > 1.1 * plan.cells.pipeline.step_time  # what the LLM-only view missed
    assert step.lower_bound <= step.step_time and step.gap == pytest.approx(step.step_time / step.lower_bound - 1)
    assert str(step.status) == ("optimal" if step.step_time == step.lower_bound else "feasible")
    # the bound holds for other plans of the batch too: the PP-unaware one, as it runs in its own order
    unaware = Orchestrator(HEAVY_VISION, Topology(1, 8), max_tokens_per_microbatch=plan.cells.max_tokens_per_microbatch,
                           num_microbatches=8).plan(batch)
    assert step.lower_bound <= max(simulated_step(unaware, ONE_F_ONE_B))
    assert planned_step(batch, HEAVY_VISION, unaware.cells, unaware.microbatches, ONE_F_ONE_B,
                        False).step_time == max(simulated_step(unaware, ONE_F_ONE_B))


@pytest.mark.parametrize("pipeline", [ONE_F_ONE_B, Pipeline(stages=4, schedule="gpipe"),
                                      Pipeline(stages=4, schedule="interleaved", virtual_stages=2)],
                         ids=["1f1b", "gpipe", "interleaved"])
def test_cells_see_the_encoders_where_they_run_in_their_samples_cells(pipeline):
    """`balance_encoders=False`: each segment runs on its sample's rank, so the cells planner's step (each
    sample's encoder costs its first-stage part) is the step the plan runs, never above the PP-unaware cells'."""
    _, plan = plan_of(seed=12, pipeline=pipeline, balance_encoders=False)
    step = plan.pipeline
    assert step.step_time == max(simulated_step(plan, pipeline))
    assert plan.cells.pipeline.step_time == pytest.approx(step.step_time, rel=1e-9)  # the same cells' times
    assert step.step_time <= step.unaware_step_time
    assert step.lower_bound <= step.step_time


def test_without_encoder_work_the_step_is_the_cells_own():
    """A batch of text only: the step is the cells planner's, and the cells are those planned without encoders."""
    stages = BASE
    batch, plan = plan_of(stages=stages, workload="default", seed=5)
    text = batch.take(np.flatnonzero(batch.sample_llm_length == batch.sample_text))
    only = Orchestrator(stages, Topology(1, 8), pipeline=ONE_F_ONE_B, max_tokens_per_microbatch=16384,
                        balance_encoders=False).plan(text)
    assert only.pipeline is only.cells.pipeline
    llm_only = Orchestrator(stages[-1:], Topology(1, 8), pipeline=ONE_F_ONE_B, max_tokens_per_microbatch=16384
                            ).plan(text)
    assert llm_only.cells.digest() == only.cells.digest()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(first_stage_costs=[1.0, 1.0, 1.0]), ValueError,
     r"`first_stage_costs` must hold one cost per item, shape \(4,\); got shape \(3,\)"),
    (dict(first_stage_costs=[0.0, -1.0, 0.0, 0.0]), ValueError,
     r"`first_stage_costs` must be finite and non-negative; got -1.0 at index 1"),
    (dict(first_stage_costs=[0.0, 0.0, np.nan, 0.0]), ValueError,
     r"`first_stage_costs` must be finite and non-negative; got nan at index 2"),
    (dict(first_stage_costs=[np.inf, 0.0, 0.0, 0.0]), ValueError,
     r"`first_stage_costs` must be finite and non-negative; got inf at index 0"),
    (dict(first_stage_costs=[1.0, 3.5, 0.0, 0.0]), ValueError,
     r"`first_stage_costs`\[1\]=3.5 is larger than item 1's cost 3.0"),
    (dict(first_stage_costs=["a", "b", "c", "d"]), TypeError, r"`first_stage_costs` must hold real numbers"),
    (dict(first_stage_costs="abcd"), TypeError, r"`first_stage_costs` must be a 1-D sequence"),
    (dict(first_stage_costs=[0.0] * 4, pipeline=None), ValueError, r"`first_stage_costs` needs `pipeline`"),
    (dict(first_stage_costs=[0.0] * 4, padded=True), ValueError, r"`first_stage_costs` need unpadded cells"),
], ids=["length", "negative", "nan", "inf", "above the cost", "strings", "a str", "no pipeline", "padded"])
def test_bad_first_stage_costs_name_the_argument(kwargs, error, match):
    options = {**dict(max_tokens_per_microbatch=8, num_microbatches=2, pipeline=Pipeline(stages=2)), **kwargs}
    with pytest.raises(error, match=match):
        balance_microbatches([4, 3, 2, 1], 2, **options)


def test_first_stage_costs_are_planned_and_reported_as_the_event_simulation_runs_them():
    lengths = sample_workload("vision", 4, 32, seed=21).sample_llm_length
    costs = lengths.astype(float) ** 1.2
    first = np.where(lengths % 2 == 0, 0.6 * costs, 0.0)
    pipeline = Pipeline(stages=4)
    plan = balance_microbatches(lengths, 4, max_tokens_per_microbatch=max(16384, int(lengths.max())), costs=costs,
                                num_microbatches=8, pipeline=pipeline, first_stage_costs=first)
    cell = plan.microbatch * 4 + plan.rank
    rows = [np.bincount(cell, weights=values, minlength=32).reshape(8, 4).T for values in (costs, first)]
    times = [replica_step(pipeline, c, e) for c, e in zip(*rows)]
    assert plan.pipeline.step_time == pytest.approx(max(times), rel=1e-12)
    assert plan.pipeline.lower_bound <= plan.pipeline.step_time <= plan.pipeline.unaware_step_time


def test_peer_cells_are_timed_in_their_own_order_and_an_empty_step_runs_a_whole_group():
    """`plan_cells` with a peer's cells (not planned for the pipeline): the step they run in their own order (their
    own unaware step); cells the interleaved schedule cannot run are refused naming them; a step of no sample runs
    one whole group of P micro-batches (it ran 1, which the interleaved schedule cannot)."""
    batch = sample_workload("vision", 4, 8, seed=1)
    cells = balance_microbatches(batch.sample_llm_length, 4, max_tokens_per_microbatch=16384, cost=BASE[-1].cost,
                                 num_microbatches=3)
    plan = Orchestrator(BASE, Topology(1, 4), max_tokens_per_microbatch=16384, pipeline=ONE_F_ONE_B
                        ).plan_cells(batch, cells)
    assert plan.pipeline.step_time == max(simulated_step(plan, ONE_F_ONE_B)) == plan.pipeline.unaware_step_time
    interleaved = Orchestrator(BASE, Topology(1, 4), max_tokens_per_microbatch=16384,
                               pipeline=Pipeline(stages=2, schedule="interleaved", virtual_stages=2))
    with pytest.raises(ValueError, match=r"`cells.num_microbatches`=3 must be a multiple of the pipeline's `stages`=2"):
        interleaved.plan_cells(batch, cells)
    empty = interleaved.plan(batch.take(np.array([], dtype=np.int64)))
    assert empty.num_microbatches == 2 and empty.pipeline.step_time == 0.0


@pytest.mark.parametrize("seed", range(6))
def test_microbatch_order_is_a_permutation_never_slower_than_the_order_given(seed):
    rng = np.random.default_rng(seed)
    pipeline = [ONE_F_ONE_B, Pipeline(stages=2, schedule="gpipe"),
                Pipeline(stages=2, schedule="interleaved", virtual_stages=2)][seed % 3]
    first = rng.exponential(1.0, (5, 4)) * (rng.random((5, 4)) < 0.4)
    cost = rng.exponential(1.0, (5, 4)) + first
    order, timed = microbatch_order(pipeline, cost, first)
    times = [max(replica_step(pipeline, c, e) for c, e in zip(cost[:, o], first[:, o])) for o in (np.arange(4), order)]
    assert sorted(order.tolist()) == [0, 1, 2, 3] and times[1] <= times[0] and timed.max() == times[1]


def test_regression_an_encoder_heavy_micro_batch_ran_first_and_stalled_the_fill():
    """1F1B: a micro-batch whose encoders load every first stage runs first in the planner's order, so every later
    stage waits for it; the order moves it off the fill (fails before: there was no such order)."""
    first = np.zeros((3, 4))
    first[:, 0] = 3.0
    cost = np.ones((3, 4)) + first
    order = microbatch_order(ONE_F_ONE_B, cost, first)[0]
    steps = [max(replica_step(ONE_F_ONE_B, c, e) for c, e in zip(cost[:, o], first[:, o]))
             for o in (np.arange(4), order)]
    assert order[0] != 0 and steps[1] < steps[0]


def test_reordered_cells_are_the_plans_own():
    """The orchestrator runs its cells in `microbatch_order`: the relabelled cells are valid cells of the batch
    (`plan_cells` takes them and plans the same step), `cells.pipeline` times them in that order (here the 10b
    model's encoders on the default mix: the order moves micro-batches)."""
    batch, plan = plan_of(stages=BASE, workload="default", seed=1)
    again = Orchestrator(BASE, Topology(1, 8), pipeline=ONE_F_ONE_B, num_microbatches=8,
                         max_tokens_per_microbatch=plan.cells.max_tokens_per_microbatch).plan_cells(batch, plan.cells)
    assert again.digest() == plan.digest() and again.pipeline.step_time == plan.pipeline.step_time
    o = plan.cells.microbatch_overhead
    llm_only = max(replica_step(ONE_F_ONE_B, plan.cells.cell_loads[:, r] + o) for r in range(plan.num_ranks))
    assert plan.cells.pipeline.step_time == pytest.approx(llm_only, rel=1e-12)


@pytest.mark.parametrize("pipeline", [Pipeline(stages=2), Pipeline(stages=2, schedule="gpipe"),
                                      Pipeline(stages=2, schedule="interleaved", virtual_stages=2)],
                         ids=["1f1b", "gpipe", "interleaved"])
def test_step_bound_holds_for_every_plan_of_a_tiny_batch_wherever_its_encoders_run(pipeline):
    """Brute force: every sample's cell (rank, micro-batch) within the budget and every image on any rank of its
    sample's micro-batch, each plan timed by the event simulation; the reported bound is at most the best of them,
    which is at most the plan's step."""
    from itertools import product

    from orchmllm import Batch, Stage

    batch = Batch.from_arrays(num_ranks=2, modalities=("image",), sample_text=[30, 5, 20, 10],
                              sample_source=[0, 0, 1, 1], segment_sample=[0, 1, 1, 3], segment_modality=[0, 0, 0, 0],
                              segment_length=[40, 90, 20, 60], segment_tokens=[4, 9, 2, 6])
    stages = (Stage("vision", "image", CostModel(linear=2.0)), Stage("llm", "llm", CostModel()))
    plan = Orchestrator(stages, 2, max_tokens_per_microbatch=40, num_microbatches=2, pipeline=pipeline).plan(batch)
    llm, image = batch.sample_llm_length.astype(float), 2.0 * batch.segment_length
    best = np.inf
    for cells in product(range(4), repeat=4):  # cell = microbatch · 2 + rank
        cells = np.array(cells)
        if np.bincount(cells, weights=batch.sample_llm_length, minlength=4).max() > 40:
            continue
        for ranks in product(range(2), repeat=4):  # each image on a rank of its sample's micro-batch
            where = cells[batch.segment_sample] // 2 * 2 + np.array(ranks)
            first = np.bincount(where, weights=image, minlength=4).reshape(2, 2).T
            cost = np.bincount(cells, weights=llm, minlength=4).reshape(2, 2).T + first
            best = min(best, max(replica_step(pipeline, c, e) for c, e in zip(cost, first)))
    assert plan.pipeline.lower_bound <= best * (1 + 1e-12) and best <= plan.pipeline.step_time * (1 + 1e-12)


def _c90_batch(trial):
    """probe20 c90's batch `trial` (rng 0): D 4-16, P 2-4, images (2·l), padded audio and the LLM (l + 1e-3 l²)."""
    from orchmllm import Batch, Sample, Segment

    rng = np.random.default_rng(0)
    for _ in range(trial + 1):
        num_ranks, stages = int(rng.choice([4, 8, 16])), int(rng.choice([2, 4]))
        samples = [Sample(text=int(rng.integers(1, 1500)), segments=tuple(
            Segment(["image", "audio"][j % 2], int(rng.integers(1, 1200)), int(rng.integers(1, 300)))
            for j in range(int(rng.integers(0, 3)))), source=int(rng.integers(0, num_ranks)), id=i)
            for i in range(num_ranks * int(rng.integers(4, 12)))]
    return Batch.from_samples(samples, num_ranks), Pipeline(stages=stages, schedule=["1f1b", "gpipe"][trial % 2])


def _c90_plan(batch, pipeline, **options):
    from orchmllm import Stage

    quadratic = CostModel(linear=1.0, quadratic=1e-3)
    stages = [Stage("vision", "image", CostModel(linear=2.0)), Stage("audio", "audio", quadratic, padded=True),
              Stage("llm", "llm", quadratic)]
    return Orchestrator(stages, batch.num_ranks, max_tokens_per_microbatch=int(batch.sample_llm_length.max() + 2000),
                        num_microbatches=2 * pipeline.stages, pipeline=pipeline, **options).plan(batch)


def test_regression_balanced_encoders_piled_on_the_same_replicas_of_every_micro_batch():
    """probe20 P20-20 (c90's worst batch, D 8, P 4, 1F1B): each micro-batch's encoder stages are balanced alone, so
    their heaviest groups landed on the same low ranks in every micro-batch and stage, replica 0's first stage
    working ~2.4x the mean: the default (`balance_encoders`) ran 1.81x the step of `balance_encoders=False`.  The
    groups are dealt across the replicas for the step (`spread_encoders`): within a few % (fails before)."""
    batch, pipeline = _c90_batch(10)
    default, home = (_c90_plan(batch, pipeline, balance_encoders=flag) for flag in (True, False))
    assert default.pipeline.step_time <= 1.05 * home.pipeline.step_time
    assert default.pipeline.step_time == max(simulated_step(default, pipeline))
    assert default.pipeline.lower_bound <= default.pipeline.step_time


def test_spread_encoders_only_relabel_each_stages_ranks():
    """The spread step's encoder stage plans are whole plans of their destinations (the layout, offsets, loads and
    tokens `stage_plan` evaluates for them), the step is the event simulation's, and no replica's first stage
    holds far more than the mean (c90's first batch: 2.4x before)."""
    from orchmllm.orchestrator.planner import stage_plan

    batch, pipeline = _c90_batch(0)
    plan = _c90_plan(batch, pipeline)
    for micro in plan.microbatches:
        for stage_plan_ in micro.stage_plans[:-1]:
            fresh = stage_plan(micro.batch, stage_plan_.stage, stage_plan_.destination, stage_plan_.algorithm)
            for name in ("rank_offsets", "rank_items", "item_offset", "item_input_offset", "loads", "tokens"):
                assert np.array_equal(getattr(fresh, name), getattr(stage_plan_, name)), name
    first = np.array([[sum(s.loads[r] for s in micro.stage_plans[:-1]) for micro in plan.microbatches]
                      for r in range(plan.num_ranks)]).sum(axis=1)
    assert first.max() <= 1.5 * first.mean()  # was 2.4x: the heavy groups on the same replicas
    assert plan.pipeline.step_time == max(simulated_step(plan, pipeline))

"""The pipelined step's simulator (`study.pipeline_sim`) and `orchmllm simulate --pipeline-stages`."""

import json

import numpy as np
import pytest

from orchmllm.balancers import Pipeline, balance_microbatches
from orchmllm.cli import main
from orchmllm.study.models import GPUS, MODELS
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.pipeline.planner import plan_for_pipeline
from orchmllm.study.pipeline_sim import STRATEGIES, encoder_flops, run_pipeline_simulation, simulate_pipeline_step
from orchmllm.study.simulator import RECOMPUTE_FACTOR
from orchmllm.study.workloads import sample_workload


def test_text_only_step_is_the_planners_step_in_seconds():
    """No encoders (chat): every stage runs 1/P of a cell, the planner's own model, so the simulated
    step of ours is its plan's step time in seconds, and never slower than the PP-unaware plan."""
    pipeline = Pipeline(stages=4)
    run = run_pipeline_simulation("18b", 32, pipeline=pipeline, workload="chat", samples_per_rank=32, seed=3)
    assert list(run.strategies) == list(STRATEGIES)
    ours = run.strategies["ours"]
    lengths = sample_workload("chat", 8, 32, 3).sample_llm_length
    costs = MODELS["18b"].stages()[-1].cost.item_costs(lengths)
    plan = balance_microbatches(lengths, 8, max_tokens_per_microbatch=16384, costs=costs,
                                num_microbatches=ours.num_microbatches, pipeline=pipeline)
    gpu = GPUS["h100"]
    seconds = plan.pipeline.step_time * RECOMPUTE_FACTOR / (gpu.peak_flops * gpu.kernel_efficiency)
    assert ours.step_seconds == pytest.approx(seconds, rel=1e-9)
    assert ours.speedup_vs_unaware >= 1.0
    for result in run.strategies.values():
        assert 0.0 <= result.bubble_fraction < 1.0


@pytest.mark.parametrize("schedule, virtual, samples, seed", [("1f1b", 1, 16, 0), ("interleaved", 2, 32, 2)])
def test_encoders_on_the_first_stage_never_make_ours_slower_than_unaware(schedule, virtual, samples, seed):
    """Regression: the planner spread a cell's encoder FLOPs over every stage while the simulator runs them
    on the first, so ours ran at 0.956x (1F1B) and 0.978x (interleaved) the PP-unaware plan's speed here;
    the planner now gets them as first-stage parts, its model the simulator's."""
    pipeline = Pipeline(stages=4, schedule=schedule, virtual_stages=virtual)
    run = run_pipeline_simulation("18b", 16, pipeline=pipeline, samples_per_rank=samples, seed=seed,
                                  strategies=("ours", "ours_unaware"))
    assert run.strategies["ours"].speedup_vs_unaware >= 1.0


def test_planner_step_is_the_simulated_step_with_encoders():
    """The default mix has encoder FLOPs: the planner's step of its cells, in seconds, is the simulator's."""
    pipeline, replicas, m = Pipeline(stages=4, schedule="interleaved", virtual_stages=2), 4, 4
    batch, stages = sample_workload("default", replicas, 16, 0), MODELS["18b"].stages()
    llm, encoder = stages[-1].cost.item_costs(batch.sample_llm_length), encoder_flops(batch, stages)
    assert encoder.sum() > 0.1 * llm.sum()
    options = dict(max_tokens_per_microbatch=16384, costs=llm + encoder)
    plain = balance_microbatches(batch.sample_llm_length, replicas, num_microbatches=m, **options)
    problem = make_microbatch_problem(batch.sample_llm_length, replicas, **options)
    replica, slot, step, _ = plan_for_pipeline(problem, plain.rank, plain.microbatch, m, pipeline, first_stage=encoder)
    gpu = GPUS["h100"]
    seconds_per_flop = RECOMPUTE_FACTOR / (gpu.peak_flops * gpu.kernel_efficiency)
    simulated = simulate_pipeline_step("ours", replica, slot, m, llm, encoder, pipeline, replicas, seconds_per_flop)
    assert simulated.step_seconds == pytest.approx(step.step_time * seconds_per_flop, rel=1e-9)
    assert simulated.bubble_fraction == pytest.approx(step.bubble_fraction, rel=1e-9)


def test_interleaved_peers_run_whole_groups():
    run = run_pipeline_simulation("18b", 16, pipeline=Pipeline(stages=4, schedule="interleaved", virtual_stages=2),
                                  samples_per_rank=24, seed=1)
    assert all(np.isfinite(result.step_seconds) for result in run.strategies.values())
    assert run.strategies["ours"].num_microbatches % 4 == 0


def test_cli_reports_step_and_bubble_per_strategy(capsys):
    assert main(["simulate", "--model", "18b", "--gpus", "16", "--pipeline-stages", "4", "--schedule", "1f1b",
                 "--samples-per-rank", "16", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert run["pipeline"]["stages"] == 4 and run["replicas"] == 4
    assert set(run["strategies"]) == set(STRATEGIES)
    assert all({"step_seconds", "bubble_fraction"} <= set(row) for row in run["strategies"].values())


@pytest.mark.parametrize("argv, message", [
    (["--pipeline-stages", "4", "--context-parallel", "1,2"], "--context-parallel is not available with "
                                                             "--pipeline-stages"),
    (["--pipeline-stages", "0"], "--pipeline-stages 0: `stages` must be >= 1"),
    (["--pipeline-stages", "3"], "--gpus 16: `gpus`=16 must be a multiple of the pipeline's stages=3"),
])
def test_cli_pipeline_errors_are_one_line(capsys, argv, message):
    assert main(["simulate", "--gpus", "16", "--samples-per-rank", "8", *argv]) == 2
    assert message in capsys.readouterr().err

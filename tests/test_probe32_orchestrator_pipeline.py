"""probe32's P32-03: `StepPlan.pipeline.unaware_step_time` was the cells planner's LLM-only step while `step_time`
ran the encoders on the first stage, so their ratio read the pipeline-aware plan as 1.5-1.7x slower."""

import pytest

from orchmllm import Orchestrator, Topology
from orchmllm.balancers import Pipeline
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload
from orchmllm.testing.pipeline import replica_step

STAGES = MODELS["10b"].stages()


def simulated_step(plan, pipeline):
    """The event simulation of `plan`: cell (r, m) its LLM load, the overhead and rank r's encoder loads in
    micro-batch m, those on the first stage alone."""
    times = []
    for r in range(plan.num_ranks):
        encoders = [sum(stage.loads[r] for stage in micro.stage_plans[:-1]) for micro in plan.microbatches]
        costs = [plan.cells.cell_loads[m, r] + plan.cells.microbatch_overhead + e for m, e in enumerate(encoders)]
        times.append(replica_step(pipeline, costs, encoders))
    return max(times)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_unaware_step_is_the_plain_plan_run_with_its_encoders_on_the_first_stage(schedule):
    pipeline = Pipeline(stages=2, schedule=schedule)
    batch = sample_workload("vision", 4, 16, seed=23)
    budget = max(16384, int(batch.sample_llm_length.max()))
    plan = Orchestrator(STAGES, Topology(1, 4), max_tokens_per_microbatch=budget, pipeline=pipeline).plan(batch)
    plain = Orchestrator(STAGES, Topology(1, 4), max_tokens_per_microbatch=budget, placement=None,
                         num_microbatches=plan.num_microbatches).plan(batch)
    assert plan.pipeline.step_time == simulated_step(plan, pipeline)
    assert plan.pipeline.unaware_step_time == pytest.approx(simulated_step(plain, pipeline), rel=1e-12)


def test_a_plain_plan_without_cells_within_the_caps_leaves_the_unaware_step_nan(monkeypatch):
    """The reference plan is planned only for `unaware_step_time`: where it finds no plan the pipelined plan stands."""
    import math

    from orchmllm.balancers.problem import InfeasibleError
    from orchmllm.orchestrator import planner

    planned = planner.Orchestrator._plan_microbatches

    def refused_without_pipeline(self, batch, start):
        if self.options.pipeline is None:
            raise InfeasibleError("no plan within the caps", 1)
        return planned(self, batch, start)

    monkeypatch.setattr(planner.Orchestrator, "_plan_microbatches", refused_without_pipeline)
    batch = sample_workload("vision", 4, 8, seed=5)
    budget = max(16384, int(batch.sample_llm_length.max()))
    plan = Orchestrator(STAGES, Topology(1, 4), max_tokens_per_microbatch=budget, pipeline=Pipeline(stages=2)
                        ).plan(batch)
    assert plan.pipeline.step_time > 0 and math.isnan(plan.pipeline.unaware_step_time)

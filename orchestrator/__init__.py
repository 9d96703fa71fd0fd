"""Multi-stage orchestration of multimodal batches (numpy only; never torch).

- `samples`: `Segment`, `Sample`, columnar `Batch` metadata of a step.
- `stages`: `Stage` (a modality encoder or the LLM, with its own cost model, padding,
  algorithm, memory cap and bytes per unit).
- `planner`: `Orchestrator(stages, topology).plan(batch) -> StepPlan`.
- `plan`: `StepPlan`, `StagePlan`, `Exchange`, `AssemblyRecipe` (what the runtime consumes).
- `microbatch`: `MicroBatchStepPlan`, a step as M gradient-accumulation micro-batches.

This is the planning contract the runtime consumes.  Model configs, workloads, strategies
and the simulator are study code: `orchmllm.study`, which imports this package, never the
reverse.
"""

from .microbatch import MicroBatchStepPlan
from .plan import AssemblyRecipe, Exchange, StagePlan, StepPlan
from .planner import Orchestrator
from .samples import Batch, Sample, Segment
from .stages import Stage

__all__ = ["AssemblyRecipe", "Batch", "Exchange", "MicroBatchStepPlan", "Orchestrator", "Sample", "Segment", "Stage",
           "StagePlan", "StepPlan"]

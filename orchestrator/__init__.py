"""Multi-stage orchestration of multimodal batches (numpy only; never torch).

- `samples`: `Segment`, `Sample`, columnar `Batch` metadata of a step.
- `stages`: `Stage` (a modality encoder or the LLM, with its own cost model, padding,
  algorithm, memory cap and bytes per unit).
- `planner`: `Orchestrator(stages, topology).plan(batch) -> StepPlan`.
- `step`: `StepPlan`, a step of M >= 1 passes (gradient-accumulation micro-batches; one
  without a token budget), what the runtime consumes.
- `plan`: `PassPlan` (one pass: its `StagePlan`s and routes), `Exchange`, `AssemblyRecipe`.

This is the planning contract the runtime consumes.  Model configs, workloads, strategies
and the simulator are study code: `orchmllm.study`, which imports this package, never the
reverse.
"""

from .plan import AssemblyRecipe, Exchange, PassPlan, StagePlan
from .planner import Orchestrator
from .samples import Batch, Sample, Segment
from .stages import Stage
from .step import StepPlan

__all__ = ["AssemblyRecipe", "Batch", "Exchange", "Orchestrator", "PassPlan", "Sample", "Segment", "Stage",
           "StagePlan", "StepPlan"]

"""Multi-stage orchestration of multimodal batches (numpy only; never torch).

- `samples`: `Segment`, `Sample`, columnar `Batch` metadata of a step.
- `stages`: `Stage` (a modality encoder or the LLM, with its own cost model, padding,
  algorithm, memory cap and bytes per unit).
- `planner`: `Orchestrator(stages, topology).plan(batch) -> StepPlan`.
- `plan`: `StepPlan`, `StagePlan`, `Exchange`, `AssemblyRecipe` (what the runtime consumes).
- `strategies`: the ablations by name (`STRATEGIES`).
- `workloads`: embedded synthetic multimodal mixes, `load_workload_file`.
- `models`, `simulator`: model configs and the cluster simulator (`run_simulation`).
"""

from .models import MODELS, default_stages
from .plan import AssemblyRecipe, Exchange, StagePlan, StepPlan
from .planner import Orchestrator
from .samples import Batch, Sample, Segment
from .stages import Stage
from .strategies import STRATEGIES, Strategy
from .workloads import list_workloads, load_workload_file, sample_workload

__all__ = ["MODELS", "STRATEGIES", "AssemblyRecipe", "Batch", "Exchange", "Orchestrator", "Sample", "Segment", "Stage",
           "StagePlan", "StepPlan", "Strategy", "default_stages", "list_workloads", "load_workload_file", "sample_workload"]

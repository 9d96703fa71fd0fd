"""Pipeline-parallel steps: the schedules' models, their bounds and the cell planner for them.

`balance_microbatches(..., pipeline=Pipeline(stages=P, schedule="1f1b"))` plans the cells for
the schedule; `replica_times` is the schedule model (`schedules`), `PipelineStep` the certified
step a plan carries.
"""

from .step import PipelineStep
from .schedules import replica_times
from .spec import SCHEDULES, Pipeline

__all__ = ["Pipeline", "PipelineStep", "SCHEDULES", "replica_times"]

"""Pipeline-parallel steps: the schedules' models, their bounds and the cell planner for them."""

from .spec import SCHEDULES, Pipeline
from .schedules import replica_times

__all__ = ["Pipeline", "SCHEDULES", "replica_times"]

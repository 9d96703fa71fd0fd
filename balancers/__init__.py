"""Pure min-max balancers (numpy/scipy/PuLP only; never torch)."""

from .api import balance
from .context_parallel import ContextParallel, ContextParallelPlan
from .cost import CostModel
from .microbatch.api import balance_microbatches
from .microbatch.plan import MicroBatchPlan
from .pipeline import Pipeline, PipelineStep
from .plan import BalancePlan
from .problem import InfeasibleError, KernelResult, Problem, Status, make_problem, require_within_cap
from .registry import (ALGORITHMS, MICROBATCH_ALGORITHMS, Algorithm, Kind, MicroBatchAlgorithm, algorithms,
                       get_algorithm, get_microbatch_algorithm, microbatch_algorithms, register_algorithm,
                       register_microbatch_algorithm)

__all__ = ["ALGORITHMS", "Algorithm", "BalancePlan", "ContextParallel", "ContextParallelPlan", "CostModel",
           "InfeasibleError", "Kind", "KernelResult",
           "MICROBATCH_ALGORITHMS", "MicroBatchAlgorithm", "MicroBatchPlan", "Pipeline", "PipelineStep", "Problem",
           "Status", "algorithms",
           "balance", "balance_microbatches", "get_algorithm", "get_microbatch_algorithm", "make_problem",
           "microbatch_algorithms", "register_algorithm", "register_microbatch_algorithm", "require_within_cap"]

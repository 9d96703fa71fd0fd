"""Pure min-max balancers (numpy/scipy/PuLP only; never torch)."""

from .api import balance
from .cost import CostModel
from .microbatch import MICROBATCH_ALGORITHMS, balance_microbatches
from .microbatch_plan import MicroBatchPlan
from .plan import BalancePlan
from .problem import InfeasibleError, KernelResult, Problem, Status, make_problem, require_within_cap
from .registry import ALGORITHMS, Algorithm, Kind, algorithms, get_algorithm, register_algorithm

__all__ = ["ALGORITHMS", "Algorithm", "BalancePlan", "CostModel", "InfeasibleError", "Kind", "KernelResult",
           "MICROBATCH_ALGORITHMS", "MicroBatchPlan", "Problem", "Status", "algorithms", "balance",
           "balance_microbatches", "get_algorithm", "make_problem", "register_algorithm", "require_within_cap"]

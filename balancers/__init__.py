"""Pure min-max balancers (numpy/scipy/PuLP only; never torch)."""

from .api import balance
from .cost import CostModel
from .plan import BalancePlan
from .problem import InfeasibleError, KernelResult, Problem, Status, make_problem
from .registry import ALGORITHMS

__all__ = ["ALGORITHMS", "BalancePlan", "CostModel", "InfeasibleError", "KernelResult",
           "Problem", "Status", "balance", "make_problem"]

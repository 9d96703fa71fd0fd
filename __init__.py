"""orchmllm: batch post-balancing for multimodal LLM training."""

from .balancers import ALGORITHMS, BalancePlan, CostModel, InfeasibleError, balance

__version__ = "0.1.0"

__all__ = ["ALGORITHMS", "BalancePlan", "CostModel", "InfeasibleError", "__version__", "balance"]

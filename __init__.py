"""orchmllm: batch post-balancing for multimodal LLM training.

The solver layers are importable without torch; `orchmllm.runtime` (torch.distributed)
is imported on its own.
"""

from .balancers import (ALGORITHMS, MICROBATCH_ALGORITHMS, BalancePlan, ContextParallel, CostModel, InfeasibleError,
                        MicroBatchPlan, balance, balance_microbatches, register_algorithm,
                        register_microbatch_algorithm)
from .orchestrator import Batch, Orchestrator, Sample, Segment, Stage, StepPlan
from .topology import Topology, estimate_exchange, place, traffic

__version__ = "0.1.0"

__all__ = ["ALGORITHMS", "MICROBATCH_ALGORITHMS", "BalancePlan", "Batch", "ContextParallel", "CostModel",
           "InfeasibleError", "MicroBatchPlan", "Orchestrator", "Sample", "Segment", "Stage", "StepPlan", "Topology", "__version__", "balance", "balance_microbatches",
           "estimate_exchange", "place", "register_algorithm", "register_microbatch_algorithm", "traffic"]

"""Property-testing toolkit for balancers: strategies, invariant checks, oracles, conformance.

Needs numpy and hypothesis only (never torch).  orchmllm's own tests check its solvers
with exactly these, and the same checks run against any user's kernel (plans that split items
over context-parallel groups: `check_split_plan`, `check_split_microbatch_plan`, `brute_force_split`,
`brute_force_split_microbatches`):

>>> from orchmllm import balance
>>> from orchmllm.testing import brute_force, check_plan
>>> plan = balance([5, 4, 3, 3, 3], 2, algorithm="lpt")
>>> check_plan(plan, [5, 4, 3, 3, 3], 2)           # certified, and not better than the optimum
>>> plan.makespan, brute_force([5, 4, 3, 3, 3], 2).makespan
(10.0, 9.0)
"""

from .checks import check_plan
from .conformance import ConformanceError, ConformanceReport, check_conformance
from .context_parallel import (SPLIT_BRUTE_FORCE_MAX_PLANS, SplitOptimum, brute_force_split,
                               brute_force_split_microbatches, check_split_microbatch_plan, check_split_plan)
from .microbatch import MicroBatchOptimum, brute_force_microbatches, check_microbatch_plan, fewest_microbatches
from .microbatch_conformance import (MicroBatchCase, MicroBatchConformanceReport, check_microbatch_conformance,
                                     microbatch_cases)
from .oracles import (BRUTE_FORCE_MAX_PLANS, Optimum, all_assignments, brute_force, brute_force_of, exact,
                      padded_optimum)
from .pipeline import (BRUTE_FORCE_MAX_PIPELINE_PLANS, PipelineOptimum, PipelineRun, brute_force_pipeline,
                       replica_step, simulate_pipeline)
from .strategies import (COST_MODELS, CONSTRAINTS, BalanceCase, LocatedItems, hard_cases, load_profile, located_items,
                         multimodal_batches, problems, topologies)

__all__ = ["BRUTE_FORCE_MAX_PIPELINE_PLANS", "BRUTE_FORCE_MAX_PLANS", "CONSTRAINTS", "COST_MODELS", "BalanceCase",
           "ConformanceError", "ConformanceReport", "LocatedItems", "MicroBatchCase", "MicroBatchConformanceReport",
           "MicroBatchOptimum", "Optimum", "PipelineOptimum", "PipelineRun", "SPLIT_BRUTE_FORCE_MAX_PLANS",
           "SplitOptimum", "all_assignments", "brute_force", "brute_force_microbatches", "brute_force_of",
           "brute_force_pipeline", "brute_force_split", "brute_force_split_microbatches", "check_conformance",
           "check_microbatch_conformance", "check_microbatch_plan", "check_plan", "check_split_microbatch_plan",
           "check_split_plan", "exact",
           "fewest_microbatches",
           "hard_cases", "load_profile", "located_items", "microbatch_cases", "multimodal_batches", "padded_optimum",
           "problems", "replica_step", "simulate_pipeline", "topologies"]

"""What researchers compare with, on top of the planning core (never imported by it).

- `peers`: peers' balancing heuristics, reimplemented from their public descriptions.
- `models`: model and GPU configurations (`MODELS`, `GPUS`, `default_stages`).
- `workloads`: embedded synthetic multimodal mixes, `load_workload_file`.
- `strategies`: the paper's ablations and peers' systems by name (`STRATEGIES`).
- `simulator`: the cluster simulator of one training step (`run_simulation`).
- `microbatch_peers`, `microbatch_sim`: peers' micro-batching reimplemented, and the simulator
  of a step as M gradient-accumulation micro-batches (`run_microbatch_simulation`).
- `context_parallel_peers`, `context_parallel_sim`, `context_parallel_compare`: peers' ways of
  running giant items (static CP, Megatron's dynamic CP), the simulator of a step whose giant
  LLM items split over context-parallel groups (`run_context_parallel_simulation`), and the
  split rows of `orchmllm compare --context-parallel`.
"""

from .models import GPUS, MODELS, default_stages
from .simulator import run_simulation
from .strategies import STRATEGIES, Strategy
from .workloads import list_workloads, load_workload_file, sample_workload

__all__ = ["GPUS", "MODELS", "STRATEGIES", "Strategy", "default_stages", "list_workloads", "load_workload_file",
           "run_simulation", "sample_workload"]

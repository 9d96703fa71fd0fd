"""orchmllm.runtime: the torch.distributed side of post-balancing (the only layer importing torch).

- `gather_metadata`, `check_agreement`: all-gather per-item lengths (with a configuration
  fingerprint); verify every rank's plan.
- `SchemaGuard`, `ConfigMismatchError`, `PlanMismatchError`, `SchemaMismatchError`: cross-rank
  agreement on configuration, on the plan each exchange follows and on what it moves, checked
  on every rank (`agreement.py`).
- `ExchangeMeta`, `Piece`, `exchange`, `exchange_with_grad`: fused variable-split all-to-all
  of packed tensors along frozen routes, autograd-aware (backward = inverse route).
- `FlatAllToAll`, `HierarchicalAllToAll`: the transports (node-wise: gather within a node,
  one message per node pair, scatter within the node).
- `PostBalancingDispatcher`: single-stage wrapper around a batch dict.
- `ContextParallelLayout`, `SplitItem`, `context_parallel_attention`, `ContextParallelError`: split
  items at run time (`context_parallel.py`): a giant item's zigzag shards on its group attend over
  the whole item, exact gradients; `StepSharding`: their chunks in the one fused exchange
  (`sharding.py`; `PostBalancingDispatcher(context_parallel=...)` uses it, and
  `MultiStageRuntime(stages, context_parallel=...)` its text pieces).
- `MultiStageRuntime`: encoders and LLM balanced from the orchestrator's StepPlan;
  `EncoderContractError`: an encoder whose output leaves out parameters on some rank (`encoders.py`).
- `MicroBatch`, `accumulate`, `gradient_sync`: gradient accumulation over post-balanced
  micro-batches (`dispatcher.microbatches(...)`, `runtime.microbatches(...)`; `microbatch.py`);
  `ModelContractError`: a loss that leaves out parameters of the model on some rank; `ModelCheckWarning`: the
  check cannot tell (a reentrant checkpoint that runs no module; `model_check.py`).
- `Prefetcher`: plan step k+1 in a background thread on its own process group.
- `normalize_loss`, `all_reduce_gradients`: the global reductions that keep gradients exact.
- `demo/`: the multi-process demo in its own room (tiny vision + audio + text model, `demo.run_demo`).

Needs torch: `python3.11 -m pip install 'torch>=2.4,<3'` or your own CUDA build (in the orchmllm
checkout, `python3.11 -m pip install -e '.[runtime]'` installs the same).
"""

try:
    import torch  # noqa: F401  (fail here, with the fix, rather than deep inside a submodule)
except ImportError as error:  # pragma: no cover - exercised by a subprocess test that hides torch
    raise ImportError("orchmllm.runtime needs torch, which is not installed: "
                      "python3.11 -m pip install 'torch>=2.4,<3' (or install your own torch build)") from error

from .agreement import ConfigMismatchError, SchemaGuard, SchemaMismatchError
from .alltoall import FlatAllToAll
from .comm import PeerFailureError, ThreadClashError, take_group
from .context_parallel import ContextParallelError, ContextParallelLayout, SplitItem, context_parallel_attention
from .dispatcher import DispatchPlan, PostBalancingDispatcher
from .encoders import EncoderContractError
from .exchange import ExchangeMeta, Piece, exchange, exchange_with_grad
from .hierarchical import HierarchicalAllToAll, make_transport
from .metadata import (GatheredMetadata, PeerInputError, PlanMismatchError, check_agreement, fingerprint,
                       gather_metadata)
from .microbatch import MicroBatch, ModelContractError, accumulate, gradient_sync
from .model_check import ModelCheckWarning
from .multistage import Assembled, Dispatched, MultiStageRuntime, PassRoutes, StepInputs, StepRoutes
from .prefetch import Prefetcher
from .reduction import all_reduce_gradients, global_count, normalize_loss
from .sharding import StepSharding

__all__ = ["Assembled", "ConfigMismatchError", "ContextParallelError", "ContextParallelLayout", "DispatchPlan",
           "Dispatched", "EncoderContractError", "ExchangeMeta", "FlatAllToAll", "GatheredMetadata",
           "HierarchicalAllToAll", "MicroBatch", "ModelCheckWarning", "ModelContractError", "MultiStageRuntime",
           "PassRoutes", "PeerFailureError", "PeerInputError", "Piece", "PlanMismatchError", "PostBalancingDispatcher",
           "Prefetcher", "SchemaGuard", "SchemaMismatchError", "SplitItem", "StepInputs", "StepRoutes", "StepSharding",
           "ThreadClashError", "accumulate", "all_reduce_gradients", "check_agreement", "context_parallel_attention",
           "exchange", "exchange_with_grad", "fingerprint", "gather_metadata", "global_count", "gradient_sync",
           "make_transport", "normalize_loss", "take_group"]

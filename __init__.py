"""orchmllm: batch post-balancing for multimodal LLM training.

The solver layers are importable without torch; `orchmllm.runtime` (torch.distributed)
is imported on its own.  The names below load on first use (PEP 562), so that
`import orchmllm` is instant and the `orchmllm` command answers Ctrl-C from its start.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "balancers": ["ALGORITHMS", "MICROBATCH_ALGORITHMS", "BalancePlan", "ContextParallel", "CostModel",
                  "InfeasibleError",
                  "MicroBatchPlan", "Pipeline", "balance", "balance_microbatches", "register_algorithm",
                  "register_microbatch_algorithm"],
    "orchestrator": ["Batch", "Orchestrator", "Sample", "Segment", "Stage", "StepPlan"],
    "topology": ["Topology", "estimate_exchange", "place", "traffic"],
}
_HOME = {name: package for package, names in _EXPORTS.items() for name in names}

__all__ = sorted([*_HOME, "__version__"])


def __getattr__(name: str):
    """The public name `name` (or the core subpackage `name`), imported on first use."""
    if name in _HOME:
        value = getattr(import_module(f".{_HOME[name]}", __name__), name)
    elif name in _EXPORTS:
        value = import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

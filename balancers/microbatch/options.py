"""A step's micro-batch options, checked once into a frozen `MicroBatchOptions`.

`balance_microbatches` builds one from its arguments; the orchestrator and the runtime's
dispatcher build one when they are constructed (they hold the options before any lengths) and
hand it to `plan_microbatches`.  So every option is checked at one place (`microbatch_options`),
with one message, and travels under one name from the API to the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..pipeline.spec import Pipeline, as_pipeline
from ..problem import INT64_MAX
from ..registry import get_microbatch_algorithm
from ..validation import as_int, as_real


@dataclass(frozen=True)
class MicroBatchOptions:
    """`balance_microbatches`' micro-batch options, canonical: plain ints and floats, a registered
    micro-batch algorithm's name, a `Pipeline` or None (`microbatch_options` checks them)."""

    max_tokens_per_microbatch: int
    num_microbatches: int | None = None
    microbatch_overhead: float = 0.0
    algorithm: str = "auto"
    pipeline: Pipeline | None = None

    def arguments(self) -> dict:
        """The options as `balance_microbatches`' keyword arguments."""
        return {item.name: getattr(self, item.name) for item in fields(self)}

    def empty_step_microbatches(self) -> int:
        """The micro-batches a step with no item runs: `num_microbatches`, else 1 (interleaved: a whole group)."""
        count = self.num_microbatches or 1
        return count if self.pipeline is None else self.pipeline.runnable(count)

    def with_budget(self, max_tokens_per_microbatch: int) -> MicroBatchOptions:
        """These options with a budget at most theirs (a cell a caller's own cap makes smaller)."""
        if not 1 <= max_tokens_per_microbatch <= self.max_tokens_per_microbatch:
            raise ValueError(f"a cell budget must be in [1, {self.max_tokens_per_microbatch}]; "
                             f"got {max_tokens_per_microbatch}")
        return replace(self, max_tokens_per_microbatch=int(max_tokens_per_microbatch))


def as_budget(value) -> int:
    """`max_tokens_per_microbatch` checked: an int in [1, 2**63 - 1] (token counts are exact int64)."""
    if value is None:
        raise TypeError("`max_tokens_per_microbatch` is required: the token budget T of one micro-batch on one rank")
    budget = as_int(value, "max_tokens_per_microbatch", minimum=1)
    if budget > INT64_MAX:
        raise ValueError(f"`max_tokens_per_microbatch` must be at most 2**63 - 1 (token counts are exact int64); "
                         f"got {budget}")
    return budget


def microbatch_options(max_tokens_per_microbatch, num_microbatches=None, microbatch_overhead=0.0,
                       algorithm="auto", *, algorithm_name: str = "algorithm", pipeline=None) -> MicroBatchOptions:
    """`balance_microbatches`' micro-batch options, checked and canonical; `algorithm_name` is what the
    caller calls its algorithm argument (the orchestrator's `microbatch_algorithm`).

    >>> microbatch_options(16, microbatch_overhead=0)
    MicroBatchOptions(max_tokens_per_microbatch=16, num_microbatches=None, microbatch_overhead=0.0, \
algorithm='auto', pipeline=None)
    """
    get_microbatch_algorithm(algorithm, algorithm_name)
    pipeline = as_pipeline(pipeline)
    count = as_int(num_microbatches, "num_microbatches", minimum=1, optional=True)
    if pipeline is not None and count is None:
        pipeline.check_some_fit()
    return MicroBatchOptions(
        max_tokens_per_microbatch=as_budget(max_tokens_per_microbatch),
        num_microbatches=count if count is None or pipeline is None else pipeline.check_microbatches(count),
        microbatch_overhead=as_real(microbatch_overhead, "microbatch_overhead"), algorithm=str(algorithm),
        pipeline=pipeline)

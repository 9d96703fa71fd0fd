"""The dispatcher's options, frozen and validated once.

`PostBalancingDispatcher(**options)` builds one `DispatchOptions`: every argument is checked
here, with one message naming it (the registry's for algorithm names, `microbatch_options`'
for the micro-batch budget), and every step plans from the canonical values; the ranks
fingerprint the same object (`items()`), so ranks that spell an option differently (a default
passed explicitly, `np.int64(16)` for 16) agree.  The orchestrator's counterpart is
`orchestrator.options.PlanOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..balancers import CostModel, get_algorithm
from ..balancers.problem import as_time_limit
from ..balancers.validation import as_bool, as_int
from ..orchestrator.options import StepOptions
from ..orchestrator.stages import one_pass_replaced


@dataclass(frozen=True)
class DispatchOptions(StepOptions):
    """How the dispatcher plans a step (the arguments of `PostBalancingDispatcher`, which
    documents them); the micro-batch, context-parallel and pipeline options are the
    orchestrator's (`StepOptions`)."""

    algorithm: str = "auto"
    cost: object = None
    padded: bool = False
    max_tokens_per_rank: int | None = None
    time_limit: float | None = None
    per_item_keys: tuple = ()
    check_plan: bool | None = None

    def __post_init__(self) -> None:
        problem = None if self.max_tokens_per_microbatch is None else one_pass_replaced(self.algorithm, ("auto",))
        if problem is not None:
            raise ValueError(problem)
        get_algorithm(self.algorithm, "algorithm")
        canonical = {"padded": as_bool(self.padded, "padded"), "per_item_keys": as_keys(self.per_item_keys),
                     "cost": CostModel() if self.cost is None else self.cost,  # the same model (probe29 P29-05)
                     "max_tokens_per_rank": as_int(self.max_tokens_per_rank, "max_tokens_per_rank", minimum=1,
                                                   optional=True),  # the checks of make_problem
                     "time_limit": as_time_limit(self.time_limit)}
        canonical["check_plan"] = (canonical["time_limit"] is not None if self.check_plan is None
                                   else as_bool(self.check_plan, "check_plan"))
        for name, value in canonical.items():
            object.__setattr__(self, name, value)
        self.check_step()
        if self.padded and self.context_parallel is not None:
            raise ValueError("`padded` cannot be combined with `context_parallel`: split items are costed and laid "
                             "out unpadded (zigzag shards of one packed sequence)")
        if self.microbatching is not None and self.max_tokens_per_rank is not None:
            raise ValueError("`max_tokens_per_rank` and `max_tokens_per_microbatch` exclude each other: with "
                             "micro-batches the per-micro-batch budget bounds what a rank holds")

    def balance_arguments(self) -> dict:
        """The keyword arguments of `balance` for a step of one assignment."""
        splitting = {} if self.context_parallel is None else {"context_parallel": self.context_parallel}
        return dict(algorithm=self.algorithm, cost=self.cost, padded=self.padded,
                    max_tokens_per_rank=self.max_tokens_per_rank, time_limit=self.time_limit, **splitting)

    def microbatch_arguments(self) -> dict:
        """The keyword arguments of `plan_microbatches` beside its `MicroBatchOptions`."""
        splitting = {} if self.context_parallel is None else {"context_parallel": self.context_parallel}
        return dict(cost=self.cost, padded=self.padded, time_limit=self.time_limit, **splitting)


def check_names(keys, requirement: str) -> None:
    """Raise a TypeError ("`{requirement}; got int 1`") unless every key is a str (sorted and named in messages)."""
    odd = next((key for key in keys if not isinstance(key, str)), None)
    if odd is not None:
        raise TypeError(f"`{requirement}; got {type(odd).__name__} {odd!r}")


def as_keys(per_item_keys) -> tuple:
    """`per_item_keys` as a sorted tuple of distinct str names."""
    if isinstance(per_item_keys, str):
        raise TypeError("`per_item_keys` must be a collection of keys, not a str")
    try:
        keys = frozenset(per_item_keys)
    except TypeError:  # probe29: Python's "'NoneType' object is not iterable"
        raise TypeError(f"`per_item_keys` must be a collection of str keys; got {type(per_item_keys).__name__}") \
            from None
    check_names(keys, "per_item_keys` must hold str names")
    return tuple(sorted(keys))

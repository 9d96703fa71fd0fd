"""The dispatcher's options, frozen and validated once.

`PostBalancingDispatcher(**options)` builds one `DispatchOptions`: every argument is checked
here, with one message naming it (the registry's for algorithm names, `microbatch_options`'
for the micro-batch budget), and every step plans from the canonical values; the ranks
fingerprint the same object (`items()`), so ranks that spell an option differently (a default
passed explicitly, `np.int64(16)` for 16) agree.  The orchestrator's counterpart is
`orchestrator.options.PlanOptions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..balancers import get_algorithm
from ..balancers.context_parallel import ContextParallel
from ..balancers.microbatch.options import MicroBatchOptions, microbatch_options
from ..balancers.pipeline import Pipeline
from ..balancers.problem import as_time_limit
from ..balancers.validation import as_bool, as_int


@dataclass(frozen=True)
class DispatchOptions:
    """How the dispatcher plans a step (the arguments of `PostBalancingDispatcher`, which
    documents them).  `microbatching` is the checked `MicroBatchOptions` when
    `max_tokens_per_microbatch` is given (None: one assignment per step)."""

    algorithm: str = "auto"
    cost: object = None
    padded: bool = False
    max_tokens_per_rank: int | None = None
    time_limit: float | None = None
    per_item_keys: frozenset = frozenset()
    check_plan: bool | None = None
    max_tokens_per_microbatch: int | None = None
    num_microbatches: int | None = None
    microbatch_overhead: float = 0.0
    microbatch_algorithm: str = "auto"
    context_parallel: ContextParallel | None = None
    pipeline: Pipeline | None = None
    microbatching: MicroBatchOptions | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.pipeline is not None and (self.context_parallel is not None or self.max_tokens_per_microbatch is None):
            raise ValueError("`pipeline` needs `max_tokens_per_microbatch` and cannot be combined with "
                             "`context_parallel` (split items in a pipeline are not modelled yet)")
        if self.context_parallel is not None and not isinstance(self.context_parallel, ContextParallel):
            raise TypeError(f"`context_parallel` must be a ContextParallel; got {type(self.context_parallel).__name__}")
        get_algorithm(self.algorithm, "algorithm")
        canonical = {"padded": as_bool(self.padded, "padded"), "per_item_keys": _keys(self.per_item_keys)}
        canonical["max_tokens_per_rank"] = as_int(self.max_tokens_per_rank, "max_tokens_per_rank", minimum=1,
                                                  optional=True)  # the checks of make_problem
        canonical["time_limit"] = as_time_limit(self.time_limit)
        canonical["check_plan"] = (self.time_limit is not None if self.check_plan is None
                                   else as_bool(self.check_plan, "check_plan"))
        canonical["microbatching"] = self._microbatching()
        if canonical["microbatching"] is not None:
            checked = canonical["microbatching"]
            canonical.update(max_tokens_per_microbatch=checked.max_tokens_per_microbatch,
                             num_microbatches=checked.num_microbatches,
                             microbatch_overhead=checked.microbatch_overhead)
        for name, value in canonical.items():
            object.__setattr__(self, name, value)

    def _microbatching(self) -> MicroBatchOptions | None:
        if self.max_tokens_per_microbatch is None:
            if self.num_microbatches is not None:
                raise ValueError("`num_microbatches` needs `max_tokens_per_microbatch` (the per-micro-batch token "
                                 "budget)")
            return None
        if self.max_tokens_per_rank is not None:
            raise ValueError("`max_tokens_per_rank` and `max_tokens_per_microbatch` exclude each other: with "
                             "micro-batches the per-micro-batch budget bounds what a rank holds")
        return microbatch_options(self.max_tokens_per_microbatch, self.num_microbatches, self.microbatch_overhead,
                                  self.microbatch_algorithm, algorithm_name="microbatch_algorithm",
                                  pipeline=self.pipeline)

    def balance_arguments(self) -> dict:
        """The keyword arguments of `balance` for a step of one assignment."""
        splitting = {} if self.context_parallel is None else {"context_parallel": self.context_parallel}
        return dict(algorithm=self.algorithm, cost=self.cost, padded=self.padded,
                    max_tokens_per_rank=self.max_tokens_per_rank, time_limit=self.time_limit, **splitting)

    def microbatch_arguments(self) -> dict:
        """The keyword arguments of `plan_microbatches` beside its `MicroBatchOptions`."""
        splitting = {} if self.context_parallel is None else {"context_parallel": self.context_parallel}
        return dict(cost=self.cost, padded=self.padded, time_limit=self.time_limit, **splitting)

    def items(self) -> list[tuple[str, object]]:
        """(argument, canonical value) of every option that shapes the plan, in declaration order
        (what ranks must share; the micro-batch ones only with a budget, as before)."""
        skipped = () if self.microbatching is not None else (
            "max_tokens_per_microbatch", "num_microbatches", "microbatch_overhead", "microbatch_algorithm", "pipeline")
        return [(item.name, sorted(self.per_item_keys, key=repr) if item.name == "per_item_keys"
                 else getattr(self, item.name)) for item in fields(self) if item.init and item.name not in skipped]


def check_names(keys, requirement: str) -> None:
    """Raise a TypeError ("`{requirement}; got int 1`") unless every key is a str (sorted and named in messages)."""
    odd = next((key for key in keys if not isinstance(key, str)), None)
    if odd is not None:
        raise TypeError(f"`{requirement}; got {type(odd).__name__} {odd!r}")


def _keys(per_item_keys) -> frozenset:
    """`per_item_keys` as a frozenset of str names."""
    if isinstance(per_item_keys, str):
        raise TypeError("`per_item_keys` must be a collection of keys, not a str")
    keys = frozenset(per_item_keys)
    check_names(keys, "per_item_keys` must hold str names")
    return keys

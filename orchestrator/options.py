"""The orchestrator's options, frozen and validated once.

`Orchestrator(stages, topology, **options)` builds one `PlanOptions`: every argument is checked
here, with one message naming it, and the planner reads the canonical values (plain bools,
floats and ints) from it; the multi-stage runtime fingerprints the same object, so ranks that
spell an option differently (a default passed explicitly, `np.int64(16)` for 16) agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..balancers import algorithms, get_algorithm
from ..balancers.context_parallel import ContextParallel
from ..balancers.microbatch.options import MicroBatchOptions, microbatch_options
from ..balancers.pipeline import Pipeline
from ..balancers.pipeline.spec import as_pipeline
from ..balancers.validation import as_bool, as_real, is_int
from ..topology import PLACEMENTS, Topology

LOCALITY = "locality"


@dataclass(frozen=True)
class StepOptions:
    """How a step is cut into micro-batches, split over context-parallel groups and run through a
    pipeline: the options the orchestrator's `PlanOptions` and the dispatcher's
    `runtime.options.DispatchOptions` share, checked here once (`check_step`).  `microbatching`
    is the checked `MicroBatchOptions` when `max_tokens_per_microbatch` is given (None: a step of
    one pass)."""

    max_tokens_per_microbatch: int | None = None
    num_microbatches: int | None = None
    microbatch_overhead: float = 0.0
    microbatch_algorithm: str = "auto"
    context_parallel: ContextParallel | None = None
    pipeline: Pipeline | None = None
    microbatching: MicroBatchOptions | None = field(init=False, repr=False, compare=False)

    def check_step(self) -> None:
        """Check the step's options and set their canonical values (the subclasses' `__post_init__`)."""
        if self.context_parallel is not None and not isinstance(self.context_parallel, ContextParallel):
            raise TypeError(f"`context_parallel` must be a ContextParallel or None; got "
                            f"{type(self.context_parallel).__name__}")
        as_pipeline(self.pipeline)
        if self.pipeline is not None and self.context_parallel is not None:
            raise ValueError("`pipeline` and `context_parallel` cannot be combined yet: a split item's group would "
                             "run its micro-batch in lockstep across pipeline replicas, which the pipeline planner "
                             "does not model")
        given = [name for name, default in (("num_microbatches", None), ("microbatch_overhead", 0.0),
                                            ("microbatch_algorithm", "auto"), ("pipeline", None))
                 if getattr(self, name) is not default and getattr(self, name) != default]
        checked = None
        if self.max_tokens_per_microbatch is None:
            if given:
                raise ValueError(f"`{given[0]}` needs `max_tokens_per_microbatch` (the per-micro-batch token budget)")
        else:
            checked = microbatch_options(self.max_tokens_per_microbatch, self.num_microbatches,
                                         self.microbatch_overhead, self.microbatch_algorithm,
                                         algorithm_name="microbatch_algorithm", pipeline=self.pipeline)
            for name in ("max_tokens_per_microbatch", "num_microbatches", "microbatch_overhead"):
                object.__setattr__(self, name, getattr(checked, name))
        object.__setattr__(self, "microbatching", checked)

    def items(self) -> list[tuple[str, object]]:
        """(argument, canonical value) of every option, in declaration order (what ranks must share)."""
        return [(item.name, getattr(self, item.name)) for item in fields(self) if item.init]


@dataclass(frozen=True)
class PlanOptions(StepOptions):
    """How the orchestrator plans a step (the arguments of `Orchestrator`, which documents them)."""

    placement: str | None = LOCALITY
    padded_placement: str | None = None
    makespan_slack: float = 0.002
    seconds_per_cost: float | None = None
    balance_encoders: bool = True
    balance_llm: bool = True
    uniform_algorithm: str | None = None

    def __post_init__(self) -> None:
        for name in ("placement", "padded_placement"):
            value = getattr(self, name)
            if value is not None and value != LOCALITY and value not in PLACEMENTS:
                raise ValueError(f"unknown `{name}` {value!r}; choose None, {LOCALITY!r} or one of "
                                 f"{sorted(PLACEMENTS)}")
        canonical = {"makespan_slack": as_real(self.makespan_slack, "makespan_slack"),
                     "balance_encoders": as_bool(self.balance_encoders, "balance_encoders"),
                     "balance_llm": as_bool(self.balance_llm, "balance_llm")}
        if self.seconds_per_cost is not None:
            canonical["seconds_per_cost"] = as_real(self.seconds_per_cost, "seconds_per_cost", allow_zero=False)
        if self.uniform_algorithm is not None:
            _check_uniform(self.uniform_algorithm)
        for name, value in canonical.items():
            object.__setattr__(self, name, value)
        self.check_step()
        if not self.balance_llm and self.context_parallel is not None:
            raise ValueError("`context_parallel` needs `balance_llm=True` (split items are planned in the LLM "
                             "stage's balance)")
        if not self.balance_llm and self.microbatching is not None:
            raise ValueError("`balance_llm=False` cannot plan micro-batches (the cells balance the LLM stage); to "
                             "keep samples on their ranks, pass cells that do to `plan_cells` (e.g. the study's "
                             "per-rank sequential fill)")


def plan_options(options: dict) -> PlanOptions:
    """`Orchestrator`'s keyword options checked into a `PlanOptions`; a name it does not take is a
    TypeError naming the Orchestrator and its options (not the dataclass, which the user never named)."""
    names = [option.name for option in fields(PlanOptions) if option.init]  # not the derived `microbatching`
    unknown = next((name for name in options if name not in names), None)
    if unknown is not None:
        raise TypeError(f"Orchestrator got an unknown option {unknown!r}; the options are {names}")
    return PlanOptions(**options)


def as_topology(topology) -> Topology:
    """`Orchestrator`'s `topology`: a Topology, or an int number of ranks (>= 1) on one node."""
    if is_int(topology):
        if topology < 1:
            raise ValueError(f"`topology` as a number of ranks must be >= 1; got {topology}")
        return Topology(1, int(topology))
    if not isinstance(topology, Topology):
        raise TypeError(f"`topology` must be a Topology or an int number of ranks; got {type(topology).__name__}")
    return topology


def _check_uniform(name) -> None:
    """The registry's error for an unknown `uniform_algorithm`; ValueError naming it where it cannot balance
    unpadded problems: it balances every stage as if unpadded ('padded' was refused only at the first plan)."""
    if not get_algorithm(name, "uniform_algorithm").solves(False):
        raise ValueError(f"`uniform_algorithm` {name!r} solves the padded cost only, and `uniform_algorithm` balances "
                         f"every stage as if unpadded; choose one of {[r.name for r in algorithms(padded=False)]}")

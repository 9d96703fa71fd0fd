"""`Pipeline`: the pipeline-parallel options of a step, validated once into a frozen spec."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..validation import SizeLimitError, as_int, as_non_negative_reals, as_real

SCHEDULES = ("gpipe", "1f1b", "interleaved")
MAX_MODEL_CHUNKS = 128  # stages × virtual_stages: a chunk holds a layer or more; the deepest LLMs have ~128
MAX_PIPELINE_SLOTS = 1024  # micro-batches × model chunks: the best shape's linear program over the 2·M·P·v
# operations (`profile.best_profile`) grows with their square: at 4096, 40 s CPU (interleaved 4 × 2, M 512; 1F1B
# 8, M 512: 15 s), at 2048 10 s (interleaved 4 × 2, M 256); at 1024 at most ~2.6 s (interleaved 2 × 2, M 256).
# Issue 28's sizes (P 4-8, M <= 32, v 2: <= 512) and P 8 at M 128, P 16 at M 64, P·v = 128 at M 8 stay within.
MAX_BACKWARD_FACTOR = 1e6  # backward / forward is about 2; far beyond, 1 + k swallows the forward share (0 at 1e308)


@dataclass(frozen=True)
class Pipeline:
    """P pipeline stages running one of `SCHEDULES` over every data-parallel replica's micro-batches.

    `virtual_stages` v is the number of model chunks per stage of the interleaved schedule
    (Megatron's virtual pipeline size, >= 2; 1 for the others).  A cell costing c (its items'
    cost plus the micro-batch overhead, the whole model's forward and backward) takes
    c / (P · (1 + k)) forward and k times that backward on every stage, k = `backward_factor`
    (2: a backward pass costs about twice a forward; at most `MAX_BACKWARD_FACTOR` = 1e6).  The model is cut
    into at most `MAX_MODEL_CHUNKS` = 128 chunks (P · v): the schedule's operations grow with P · v · M.
    A plan keeps every cell within its token budget but may leave the last micro-batches empty (1F1B and interleaved,
    where the largest item's chain sets the step: `pipeline.fewer`), so the tokens a replica has in flight over P
    consecutive micro-batches can be higher than an even spread over M would give: size the budget to memory.

    >>> Pipeline(stages=4, schedule="interleaved", virtual_stages=2).check_microbatches(8)
    8
    >>> Pipeline(stages=4, schedule="interleaved", virtual_stages=2).check_microbatches(6)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: `num_microbatches`=6 must be a multiple of the pipeline's `stages`=4 ...; try 8
    """

    stages: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    backward_factor: float = 2.0

    def __post_init__(self):
        stages = as_int(self.stages, "stages", minimum=1)
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise ValueError(f"`schedule` must be one of {list(SCHEDULES)}; got {self.schedule!r}")
        virtual = as_int(self.virtual_stages, "virtual_stages", minimum=1)
        if self.schedule == "interleaved" and virtual < 2:
            raise ValueError(f"`virtual_stages` must be >= 2 for the interleaved schedule (model chunks per stage); "
                             f"got {virtual}")
        if self.schedule != "interleaved" and virtual != 1:
            raise ValueError(f"`virtual_stages`={virtual} needs schedule='interleaved'; the {self.schedule} "
                             f"schedule runs one model chunk per stage")
        if stages * virtual > MAX_MODEL_CHUNKS:
            chunks = f"`stages`={stages}" if virtual == 1 else f"`virtual_stages`={virtual} × `stages`={stages}"
            raise SizeLimitError(f"{chunks} model chunks must be at most MAX_MODEL_CHUNKS = {MAX_MODEL_CHUNKS} "
                                 f"(each chunk holds a layer or more; the deepest LLMs have ~128 layers)")
        factor = as_real(self.backward_factor, "backward_factor", allow_zero=False)
        if factor > MAX_BACKWARD_FACTOR:
            raise ValueError(f"`backward_factor` must be at most MAX_BACKWARD_FACTOR = {MAX_BACKWARD_FACTOR:g} (a "
                             f"backward pass costs about 2 forwards); got {factor:g}")
        object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "virtual_stages", virtual)
        object.__setattr__(self, "backward_factor", factor)

    def plannable(self, num_microbatches: int) -> bool:
        """Whether `num_microbatches` (an int >= 1) × the model chunks are at most `MAX_PIPELINE_SLOTS`."""
        num_microbatches = as_int(num_microbatches, "num_microbatches", minimum=1)
        return num_microbatches * self.stages * self.virtual_stages <= MAX_PIPELINE_SLOTS

    @property
    def max_microbatches(self) -> int:
        """The most micro-batches the schedule runs (interleaved: a multiple of `stages`) within `MAX_PIPELINE_SLOTS`;
        0 when none does (interleaved with stages² × virtual_stages > MAX_PIPELINE_SLOTS)."""
        most = MAX_PIPELINE_SLOTS // (self.stages * self.virtual_stages)
        return most - most % self.stages if self.schedule == "interleaved" else most

    def check_microbatches(self, num_microbatches: int, name: str = "num_microbatches") -> int:
        """`num_microbatches` when the schedule can run it (interleaved: a multiple of `stages`) and it can be
        planned (`MAX_PIPELINE_SLOTS`)."""
        m = as_int(num_microbatches, name, minimum=1)
        chunks, most = self.stages * self.virtual_stages, self.max_microbatches
        if not self.plannable(m):
            runs = " (a multiple of `stages`)" if self.schedule == "interleaved" else ""
            raise SizeLimitError(f"`{name}`={m} micro-batches × {chunks} model chunks must be at most "
                                 f"MAX_PIPELINE_SLOTS = {MAX_PIPELINE_SLOTS} (planning time grows with their square): "
                                 + (self._none_fits() if most == 0 else f"at most {most} micro-batches{runs} with this "
                                    f"pipeline (fewer micro-batches: a larger `max_tokens_per_microbatch`)"))
        if most == 0:  # m fits the slots but is not a multiple of `stages`: no multiple does
            raise SizeLimitError(f"`{name}`={m}: {self._none_fits()}")
        if self.schedule == "interleaved" and m % self.stages:
            raise ValueError(f"`{name}`={m} must be a multiple of the pipeline's `stages`={self.stages} for the "
                             f"interleaved schedule (Megatron-LM runs its micro-batches in groups of P); try "
                             f"{min(self.runnable(m), most)}")
        return m

    def check_some_fit(self) -> None:
        """SizeLimitError where no number of micro-batches can be planned for this pipeline (a free M's plan is
        refused before it starts, naming no count the caller never gave: probe53 F4)."""
        if self.max_microbatches == 0:
            raise SizeLimitError(self._none_fits())

    def _none_fits(self) -> str:
        chunks = self.stages * self.virtual_stages
        return (f"no number of micro-batches fits this pipeline: the interleaved schedule runs a multiple of "
                f"`stages`={self.stages}, and {self.stages} × {chunks} model chunks (`stages` × "
                f"`virtual_stages`) exceed MAX_PIPELINE_SLOTS = {MAX_PIPELINE_SLOTS}; use fewer `stages` or "
                f"`virtual_stages` (stages² × virtual_stages at most {MAX_PIPELINE_SLOTS})")

    def runnable(self, num_microbatches: int) -> int:
        """The fewest micro-batches >= `num_microbatches` (an int >= 1) the schedule runs (interleaved: whole groups
        of P)."""
        num_microbatches = as_int(num_microbatches, "num_microbatches", minimum=1)
        if self.schedule != "interleaved":
            return num_microbatches
        return -(-num_microbatches // self.stages) * self.stages

    @property
    def forward_share(self) -> float:
        """The fraction of a cell's cost that one stage spends in its forward: 1 / (P · (1 + k))."""
        return 1.0 / (self.stages * (1.0 + self.backward_factor))

    def stage_times(self, cell_costs: np.ndarray, first_stage: np.ndarray | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
        """(forward, backward) seconds of every cell: c · share on every stage and k times that, shape of
        `cell_costs` (rows, M); with `first_stage` e, the part of c that the first stage runs alone (the
        encoders, placed before the LLM's layers), (c - e) · share on every stage plus e / (1 + k) on the
        first, shape (rows, P, M).  Both hold finite reals >= 0 and e <= c (ValueError naming the argument: a part
        above its cell's cost would run a negative time on the other stages)."""
        cells = as_non_negative_reals(cell_costs, "cell_costs")
        forward = cells * self.forward_share
        if first_stage is not None:
            first = as_non_negative_reals(first_stage, "first_stage")
            if cells.ndim != 2 or first.shape != cells.shape:
                raise ValueError(f"`cell_costs` must be (rows, M) and `first_stage` of its shape; got shapes "
                                 f"{cells.shape} and {first.shape}")
            if np.any(first > cells):
                at = tuple(np.argwhere(first > cells)[0].tolist())
                raise ValueError(f"`first_stage` must be at most `cell_costs` (the part of a cell's cost the first "
                                 f"stage runs alone); got {float(first[at])!r} > {float(cells[at])!r} at {at}")
            forward = np.repeat(((cells - first) * self.forward_share)[:, None, :], self.stages, axis=1)
            forward[:, 0, :] += first * (self.stages * self.forward_share)
        return forward, forward * self.backward_factor

    def to_json(self) -> dict:
        return {"stages": self.stages, "schedule": self.schedule, "virtual_stages": self.virtual_stages,
                "backward_factor": self.backward_factor}


def as_pipeline(value, name: str = "pipeline") -> Pipeline | None:
    """`value` when it is a `Pipeline` or None, else TypeError naming the argument."""
    if value is not None and not isinstance(value, Pipeline):
        raise TypeError(f"`{name}` must be a Pipeline(stages=..., schedule=...) or None; got {type(value).__name__}")
    return value


def simulated_exactly(pipeline: Pipeline, step_time: float, costs: np.ndarray, num_microbatches: int) -> bool:
    """Whether a step's float rounding (~4·(M + P·v) sums of ~step·eps) stays below the least time a piece of work
    (one of `costs`: the items' and the micro-batch overhead) spends on a stage: only then can a step that meets
    its bound not meet it by rounding, so `optimal` may be said (probe32 P32-01); planners and checkers share it."""
    chunks, k = pipeline.stages * pipeline.virtual_stages, pipeline.backward_factor
    least = float(costs[costs > 0].min(initial=np.inf)) * min(1.0, k) / (chunks * (1.0 + k))
    return step_time * 4 * (num_microbatches + chunks) * np.finfo(np.float64).eps < least

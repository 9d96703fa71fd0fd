"""Stages of a multimodal model, declared as data: one per modality encoder, then the LLM.

A stage's items are the segments of its modality (encoder stages) or the whole samples
(the LLM stage, modality "llm"); an item's length is its encoder units (segment.length)
or its LLM sequence length (text + segment tokens).  Each stage is balanced on its own:

    cost(r) = sum(f(l) for items on r)            unpadded (packed / varlen attention)
    cost(r) = count(r) · f(max l on r)            padded (fixed-shape batch)

with f the stage's `CostModel` (an unpadded encoder's video of F frames: F · f(l / F),
`frames.frame_costs`), its own `algorithm` from `balancers.ALGORITHMS` and its own memory cap
in tokens per rank.  Bytes per unit tell the exchanges what moves: raw input bytes per encoder
unit (per text token for the LLM stage) and embedding bytes per output token (encoder stages).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..balancers import CostModel, get_algorithm
from ..balancers.problem import InfeasibleError
from ..balancers.validation import as_bool, as_real, is_int
from .samples import Batch, constant, counting, every_segment

LLM = "llm"


@dataclass(frozen=True)
class Stage:
    """One stage: items of `modality` ("llm" for the backbone), balanced with its own model.

    With a micro-batch budget (`Orchestrator(max_tokens_per_microbatch=...)`) the LLM stage's `algorithm`
    does not run: its cells come from `microbatch_algorithm` (`check_microbatched_llm`).
    `input_bytes_per_unit`: bytes of raw input per encoder unit (pixels of one patch,
    features of one frame) or per text token (LLM stage).  `output_bytes_per_token`:
    bytes of one embedding sent to the LLM (0 for the LLM stage).
    """

    name: str
    modality: str
    cost: CostModel
    padded: bool = False
    algorithm: str = "lpt"
    max_tokens_per_rank: int | None = None
    input_bytes_per_unit: float = 0.0
    output_bytes_per_token: float = 0.0

    def __post_init__(self) -> None:
        for name in ("name", "modality"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise TypeError(f"`{name}` must be a non-empty str; got {getattr(self, name)!r}")
        if not isinstance(self.cost, CostModel):
            raise TypeError(f"`cost` must be a CostModel; got {type(self.cost).__name__}")
        object.__setattr__(self, "padded", as_bool(self.padded, "padded"))
        try:
            record = get_algorithm(self.algorithm)
        except (TypeError, ValueError) as error:
            raise type(error)(f"stage {self.name!r}: {error}") from None
        if not record.solves(self.padded):
            raise ValueError(f"stage {self.name!r}: {record.why_not(self.padded)}")
        cap = self.max_tokens_per_rank
        if cap is not None and (not is_int(cap) or cap <= 0):
            raise ValueError(f"stage {self.name!r}: `max_tokens_per_rank` must be a positive int or None; got {cap!r}")
        for name in ("input_bytes_per_unit", "output_bytes_per_token"):
            object.__setattr__(self, name, as_real(getattr(self, name), name))
        if self.is_llm and self.output_bytes_per_token:
            raise ValueError("the LLM stage produces no embeddings: `output_bytes_per_token` must be 0")

    @property
    def is_llm(self) -> bool:
        return self.modality == LLM


def check_stages(stages) -> tuple[Stage, ...]:
    """Validate a stage list: Stage objects, distinct names and modalities, exactly one LLM stage, last."""
    stages = tuple(stages)
    for stage in stages:
        if not isinstance(stage, Stage):
            raise TypeError(f"`stages` must hold Stage objects; got {type(stage).__name__}")
    if not stages or not stages[-1].is_llm or sum(stage.is_llm for stage in stages) != 1:
        raise ValueError("`stages` must list the encoder stages followed by exactly one LLM stage (modality 'llm')")
    names = [stage.name for stage in stages]
    modalities = [stage.modality for stage in stages]
    if len(set(names)) != len(names) or len(set(modalities)) != len(modalities):
        raise ValueError(f"`stages` need distinct names and modalities; got names {names}, modalities {modalities}")
    return stages


MICROBATCHED_LLM_ALGORITHMS = ("lpt", "auto")  # Stage's default and the balancers': what a stage names by default


def one_pass_replaced(algorithm: str, defaults: tuple[str, ...], what: str = "`algorithm`",
                      budget: str = "`max_tokens_per_microbatch`", where: str = "") -> str | None:
    """Why `algorithm`, a balancer of one pass per rank, cannot be chosen beside a micro-batch budget: the cells
    come from the micro-batch planner, so a choice other than the caller's `defaults` would be dropped with no word;
    None for a default.  The one rule of the dispatcher, the orchestrator and `orchmllm demo` (each names its
    own argument `what`, budget and defaults)."""
    if algorithm in defaults:
        return None
    return (f"{where}{what} {algorithm!r} plans a step of one pass per rank, which {budget} replaces: its cells come "
            f"from the micro-batch planner (`microbatch_algorithm` in Python); leave {what} at "
            f"{' or '.join(map(repr, defaults))}")


def check_microbatched_llm(stage: Stage, microbatching, uniform_algorithm: str | None = None) -> None:
    """With a micro-batch budget (`microbatching` not None) the LLM stage's own `algorithm` never runs:
    ValueError where it names one other than a default (`one_pass_replaced`); `uniform_algorithm` replaces it
    anyway (probe21: refused by the name of an algorithm that would not have run either way)."""
    problem = None if microbatching is None or uniform_algorithm is not None else one_pass_replaced(
        stage.algorithm, MICROBATCHED_LLM_ALGORITHMS, where=f"stage {stage.name!r}: ")
    if problem is not None:
        raise ValueError(problem)


def stage_named(plan_stage, uniform_algorithm: str | None, batch: Batch, stage: Stage, items, llm):
    """`plan_stage(batch, stage, items, llm)`, a stage of a one-pass step, its InfeasibleError naming the stage and
    the algorithm that ran, and where a heuristic gave up under the cap, the argument to search further (probe22
    P22-10: lpt's bare "found no rank with room ... try algorithm='ilp'", an argument the Orchestrator lacks)."""
    try:
        return plan_stage(batch, stage, items, llm)
    except InfeasibleError as error:
        if str(error).startswith(f"stage {stage.name!r}"):
            raise
        algorithm = uniform_algorithm or stage.algorithm
        further = ""
        if error.heuristic is not None and algorithm != "auto":
            further = ("; uniform_algorithm='auto' searches further" if uniform_algorithm else
                       f"; Stage({stage.name!r}, ..., algorithm='auto') searches further")
        items_are = "the batch's samples" if stage.is_llm else "its segments in batch order"
        raise InfeasibleError(f"stage {stage.name!r} (algorithm {algorithm!r}; its items are {items_are}): "
                              f"{error}{further}", error.min_cap, error.heuristic) from error


def sample_embedding_bytes(batch: Batch, stages) -> np.ndarray:
    """Bytes of every sample's embeddings: its embedding tokens times the bytes per token of the
    encoder `stages`, summed segment by segment only where encoders differ in bytes per token."""
    per_token = np.zeros(len(batch.modalities))
    for stage in stages:
        if not stage.is_llm and stage.modality in batch.modalities:
            per_token[batch.modalities.index(stage.modality)] = stage.output_bytes_per_token
    if np.all(per_token == per_token[:1]):
        return (batch.sample_llm_length - batch.sample_text) * (per_token[0] if per_token.size else 0.0)
    return np.bincount(batch.segment_sample, weights=batch.segment_tokens * per_token[batch.segment_modality],
                       minlength=batch.num_samples)


class StageItems(NamedTuple):
    """A stage's items: the sample of each, its global segment index (-1 for the LLM), its length."""

    sample: np.ndarray
    segment: np.ndarray
    length: np.ndarray


def input_bytes(batch: Batch, stages, stage: Stage) -> np.ndarray:
    """Bytes each item of `stage` (of `stages`) brings into it, float64: an encoder segment its
    length times the stage's input bytes per unit; an LLM sample its text the same way, plus the
    embeddings it receives (`sample_embedding_bytes`).  The LLM stage's items stay near the
    rank that sampled them by these bytes."""
    if stage.is_llm:
        return batch.sample_text * stage.input_bytes_per_unit + sample_embedding_bytes(batch, stages)
    return np.asarray(stage_items(batch, stage).length * stage.input_bytes_per_unit, dtype=np.float64)


def stage_items(batch: Batch, stage: Stage) -> StageItems:
    """The items of `stage`: its modality's segments, or every sample for the LLM (read-only, so that
    the balancer takes the lengths without a copy; the batch's own columns where its segments are all
    of the stage's modality, a micro-batch of videos' frames: no gathers)."""
    if stage.is_llm:
        items = StageItems(counting(batch.num_samples), constant(-1, batch.num_samples),
                           batch.sample_llm_length)
    elif every_segment(batch, segments := batch.segments_of(stage.modality)):
        items = StageItems(batch.segment_sample, segments, batch.segment_length)
    else:
        items = StageItems(batch.segment_sample[segments], segments, batch.segment_length[segments])
    for array in items:
        array.setflags(write=False)
    return items


def item_tokens(batch: Batch, stage: Stage, items: StageItems) -> np.ndarray:
    """The LLM tokens each item produces: a segment's embeddings, or a sample's whole sequence."""
    if stage.is_llm:
        return items.length
    return batch.segment_tokens if every_segment(batch, items.segment) else batch.segment_tokens[items.segment]

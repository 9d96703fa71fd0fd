"""Replay each rank's recorded per-stage work in isolation: busy time without contention.

The demo's concurrent busy times are CPU times of ranks that share the machine's cores
with each other (and, on a shared machine, with everyone else): cache and core
contention inflate them unevenly, and on a 2-core machine that noise exceeds the
imbalance being measured.  So every rank records the exact tensors each stage ran on
(encoder inputs and lengths; the LLM's packed embeddings, sample lengths and labels),
and after the run the ranks take turns, one at a time while the others wait at a
barrier, to re-run the same kernels (forward and backward) on those tensors with one
intra-op thread: a stage's time is the minimum over `repetitions` runs (interleaved
with the other ranks' turns), a rank's busy time the sum over its stages.

>>> work = StageWork("llm", torch.zeros(3, 2), torch.tensor([3]), torch.zeros(3, dtype=torch.int64))
>>> work.stage, work.num_rows
('llm', 3)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from ..balancers.validation import is_int
from .model import TinyMultimodalModel


@dataclass(frozen=True, eq=False)
class StageWork:
    """The tensors one stage of one step ran on, on one rank."""

    stage: str  # a modality ("image", "audio") or "llm"
    inputs: torch.Tensor  # encoder inputs, or the LLM's packed input embeddings
    lengths: torch.Tensor  # int64: items' lengths (encoder units, or sample lengths)
    labels: torch.Tensor | None = None  # the LLM's packed labels

    @property
    def num_rows(self) -> int:
        return int(self.inputs.shape[0])


class WorkRecorder:
    """Collects the StageWork of one pass: wrap the encoders, then add the LLM's input."""

    def __init__(self):
        self.work: list[StageWork] = []

    def encoders(self, model: TinyMultimodalModel) -> dict[str, Callable]:
        def recorded(modality, module):
            def run(inputs, lengths):
                self.work.append(StageWork(modality, inputs.detach().clone(), lengths.clone()))
                return module(inputs, lengths)
            return run

        return {modality: recorded(modality, module) for modality, module in model.encoders().items()}

    def llm(self, embeddings: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor) -> None:
        self.work.append(StageWork("llm", embeddings.detach().clone(), lengths.clone(), labels.clone()))


def run_stage(model: TinyMultimodalModel, work: StageWork) -> None:
    """Forward and backward of one recorded stage (the encoder's output gradient is ones)."""
    if work.stage == "llm":
        embeddings = work.inputs.clone().requires_grad_(True)
        model.loss_sum(model.llm(embeddings, work.lengths), work.labels).backward()
    else:
        model.encoders()[work.stage](work.inputs, work.lengths).sum().backward()


def replay_in_isolation(model: TinyMultimodalModel, recorded: dict, clock: Callable[[], float], rank: int,
                        world_size: int, repetitions: int = 5) -> dict:
    """Ranks take turns replaying their recorded work ({key: [StageWork]}, the same keys
    on every rank) one at a time; {key: busy seconds} (a collective over the world).

    The turns interleave: repetition by repetition and key by key, each rank in turn runs
    that key's stages once, so every rank's repetitions sample the same spells of
    whatever else loads the machine, and the minimum picks each rank's quietest run.
    """
    if not is_int(repetitions) or repetitions < 1:
        raise ValueError(f"`repetitions` must be an int >= 1; got {repetitions!r}")
    keys = sorted(recorded)
    best = {key: [math.inf] * len(recorded[key]) for key in keys}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(repetitions):
            for key in keys:
                for turn in range(world_size):
                    if world_size > 1:
                        dist.barrier()
                    if turn == rank:
                        for index, work in enumerate(recorded[key]):
                            start = clock()
                            run_stage(model, work)
                            best[key][index] = min(best[key][index], clock() - start)
        if world_size > 1:
            dist.barrier()
    finally:
        torch.set_num_threads(threads)
        model.zero_grad(set_to_none=True)
    return {key: float(sum(best[key])) for key in keys}

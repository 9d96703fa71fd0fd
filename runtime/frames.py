"""Videos split between frames at run time: an encoder stage's input route moves parts, not segments.

The planner may run a video of F frames (`Segment(frames=F)`, gathered with the rest of the segment
metadata) as parts of whole frames on several encoder ranks (`orchestrator.frames`); a part of k frames
holds k · length / F input rows and makes k · tokens / F embeddings, which is right only for an encoder
whose frames are independent (no temporal position or merge across frames: they restart at each part).  A stage's parts
are listed segment by segment in frame order, so a home rank's packed inputs (its segments' rows one after the
other) are already its parts' rows in part order, and an encoder rank receives its parts in ascending
order: the order its stage plan runs them (`StagePlan.rank_items`).  The input route over parts is a
plain `ExchangeMeta` in the same fused all-to-all as every other input; each part's embeddings leave
in the embedding exchange as the plan's pieces (`orchestrator.shards.split_pieces`: a part cut where
its sample's LLM chunks start), so frame splits add no collective.  Where no video is split a stage's
parts are its segments, and the route is today's:

    units(stage) = [(segment s, part p) for s in segments of the stage's modality for p in parts(s)]
    source(s, p) = home rank of s's sample;  dest(s, p) = encoder rank of part p in s's micro-batch
    rows(s, p)   = frames(p) · length(s) / frames(s)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class InputUnits:
    """The parts of an encoder stage's segments over a whole step (a whole segment where it runs in one
    part), segment by segment in frame order: `length[u]` input rows of global segment `segment[u]` go
    to encoder rank `destination[u]` in micro-batch `microbatch[u]`."""

    segment: np.ndarray
    length: np.ndarray
    destination: np.ndarray
    microbatch: np.ndarray

    @classmethod
    def of_step(cls, step, index: int) -> "InputUnits":
        """The units of encoder stage `index` of a `StepPlan` (its passes' stage items, by global segment).

        >>> from orchmllm import CostModel
        >>> from orchmllm.orchestrator import Orchestrator, Stage
        >>> from orchmllm.orchestrator.samples import Batch, Sample, Segment
        >>> video = Sample(2, (Segment("video", 8, 4, frames=4),), source=0)  # 4 frames of 2 units
        >>> batch = Batch.from_samples([video, Sample(2, source=1)], num_ranks=2)
        >>> stages = (Stage("vision", "video", CostModel()), Stage("llm", "llm", CostModel()))
        >>> units = InputUnits.of_step(Orchestrator(stages, 2).plan(batch), 0)
        >>> units.segment.tolist(), units.length.tolist(), units.destination.tolist()  # two frames a rank
        ([0, 0], [4, 4], [0, 1])
        """
        columns = []
        for number, (plan, segments) in enumerate(zip(step.microbatches, step.microbatch_segments)):
            stage = plan.stage_plans[index]
            columns.append((segments[stage.item_segment], stage.item_length, stage.destination,
                            np.full(stage.item_segment.size, number, dtype=np.int64)))
        segment, length, destination, microbatch = (np.concatenate(column) for column in zip(*columns))
        order = np.argsort(segment, kind="stable")  # a segment's parts, all in one pass, stay in frame order
        return cls(segment[order], length[order], destination[order], microbatch[order])

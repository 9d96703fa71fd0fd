"""Encoder stages: a video segment split between its frames, its own decision (no group, no communication).

A vision encoder attends within a frame (or window), so a segment of F frames (`Batch.segment_frames`)
may run as parts of whole frames on several ranks; a part of k frames holds k · l / F units, makes
k · tokens / F embeddings and costs k · f(l / F): the segment's encoder works frame by frame, so it
costs F · f(l / F) (`frame_costs`; f(l) where F = 1), however it is split.  Every plan prices an
unpadded encoder stage's videos so (`stage_costs`, `stage_pricing`): its loads, bound and step; a
padded stage prices whole items, count · f(longest), and never splits.  Every part's embeddings go
to the LLM rank(s) holding their positions (`shards.split_pieces`).

    f = F · f(l / F) of every segment (`frame_costs`)
    P = today's plan of the stage, balanced on f
    bound = max(Σ f / D, max f / F: one frame of a segment)
    if P <= bound · (1 + MIN_GAIN): keep P (bit for bit)
    level = max(bound, Σ f / D); every video costing more than it runs as k = min(F, ⌈f / level⌉)
        parts of ⌊F / k⌋ or ⌈F / k⌉ frames (earlier parts larger)
    S = the stage's algorithm on the parts' lengths and costs k · f(l / F) (`balance(..., costs=)`), under its cap
    return S if S · (1 + MIN_GAIN) < P else P (whose bound becomes the bound above: valid for both)
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..balancers import CostModel, balance
from ..balancers.plan import BalancePlan
from ..balancers.problem import InfeasibleError, Status, exact_sum

MIN_GAIN = 0.01
"""A plan of parts replaces today's only when its makespan is below today's / (1 + MIN_GAIN)."""


class FrameParts(NamedTuple):
    """Parts of a stage's items: the item each comes from, its first frame and its frames."""

    item: np.ndarray
    first_frame: np.ndarray
    frames: np.ndarray


def stage_frames(batch, segments: np.ndarray) -> np.ndarray:
    """Frames of the given segments (1 where the batch records none)."""
    if batch.segment_frames is None:
        return np.ones(segments.size, dtype=np.int64)
    return batch.segment_frames[segments]


def frame_costs(cost: CostModel, lengths: np.ndarray, frames: np.ndarray | None = None) -> np.ndarray:
    """The cost of encoder items of `lengths` units in `frames` whole frames each, F · f(l / F): what an
    encoder that works frame by frame does (f(l) where F = 1, bit for bit; `frames` None: every item one frame).

    >>> frame_costs(CostModel(linear=1.0, quadratic=0.5), np.array([64, 32, 8]), np.array([8, 4, 1])).tolist()
    [320.0, 160.0, 40.0]
    """
    if frames is None:
        return cost.item_costs(lengths)
    return frames * cost.item_costs(lengths // frames)


def priced_frames(batch, stage) -> np.ndarray | None:
    """The frames of `stage`'s items in `batch` (its modality's segments) by which plans price them
    (`frame_costs`); None where every item is priced whole, f(l): the LLM stage, a padded stage and a
    stage without a video of F > 1 frames."""
    if stage.is_llm or stage.padded or batch.segment_frames is None:
        return None
    frames = batch.segment_frames[batch.segments_of(stage.modality)]
    return frames if np.any(frames > 1) else None


def stage_costs(batch, stage) -> np.ndarray:
    """The cost of each of `stage`'s items in `batch` (its samples, or its modality's segments) as plans
    count it: f(l), or F · f(l / F) for a video of F frames (which its parts' costs sum to)."""
    lengths = batch.sample_llm_length if stage.is_llm else batch.segment_length[batch.segments_of(stage.modality)]
    return frame_costs(stage.cost, lengths, priced_frames(batch, stage))


def stage_pricing(batch, stage) -> dict:
    """`balance`'s keywords that price `stage`'s items in `batch`: its cost model, or `stage_costs` where
    a video of F > 1 frames costs F · f(l / F), not f(l)."""
    return {"cost": stage.cost} if priced_frames(batch, stage) is None else {"costs": stage_costs(batch, stage)}


def whole_video(batch, segment: int) -> str:
    """What a cap below a video of several frames must be told: frames split it for cost, not for a cap."""
    frames = 1 if batch.segment_frames is None else int(batch.segment_frames[segment])
    if frames == 1:
        return ""
    return (f" (its {frames} frames may run on several ranks to balance cost, but each plan starts from the "
            f"video whole, which must fit the cap)")


def frame_bound(costs: np.ndarray, frames: np.ndarray, num_ranks: int) -> float:
    """max(Σ f / D, max f / F): no plan that splits videos between frames beats it.

    >>> frame_bound(np.array([8.0, 1.0]), np.array([4, 1]), 2)
    4.5
    """
    if not costs.size:
        return 0.0
    return float(max(exact_sum(costs) / num_ranks, float((costs / frames).max())))


def frame_parts(costs: np.ndarray, frames: np.ndarray, level: float) -> FrameParts:
    """Every item in k = min(F, ⌈f / level⌉) parts of whole frames (one part where f <= level).

    >>> frame_parts(np.array([9.0, 2.0]), np.array([3, 4]), 4.0)
    FrameParts(item=array([0, 0, 0, 1]), first_frame=array([0, 1, 2, 0]), frames=array([1, 1, 1, 4]))
    """
    count = np.where(costs > level, np.minimum(frames, np.ceil(costs / level).astype(np.int64)), 1)
    item = np.repeat(np.arange(costs.size), count)
    index = np.arange(item.size) - np.repeat(np.cumsum(count) - count, count)
    quotient, remainder = np.divmod(frames[item], count[item])
    size = quotient + (index < remainder)
    first = index * quotient + np.minimum(index, remainder)
    return FrameParts(item, first, size)


def with_bound(plan: BalancePlan, bound: float) -> BalancePlan:
    """`plan` with a bound valid for plans that split videos (optimal only where its makespan meets it)."""
    bound = min(bound, plan.makespan)
    status = Status.OPTIMAL if plan.makespan == bound else (
        Status.FEASIBLE if plan.status is Status.OPTIMAL else plan.status)
    return replace(plan, lower_bound=bound, status=status)


def split_frames(lengths: np.ndarray, frames: np.ndarray, cost: CostModel, num_ranks: int, today: BalancePlan,
                 algorithm: str, cap: int | None) -> tuple[FrameParts | None, BalancePlan]:
    """(the parts, their plan) when splitting videos between frames beats `today` (a plan of the items priced
    by `frame_costs`) by MIN_GAIN, else (None, today); either plan with the bound of plans that may split
    (`frame_bound`), its `item_costs` those of its items (a part of k frames: k · f(l / F))."""
    costs = frame_costs(cost, lengths, frames)
    bound = frame_bound(costs, frames, num_ranks)
    if today.makespan <= bound * (1 + MIN_GAIN):
        return None, with_bound(today, bound)
    parts = frame_parts(costs, frames, bound)
    part_lengths = lengths[parts.item] // frames[parts.item] * parts.frames
    try:
        plan = balance(part_lengths, num_ranks, costs=frame_costs(cost, part_lengths, parts.frames),
                       algorithm=algorithm, max_tokens_per_rank=cap)
    except InfeasibleError:
        return None, with_bound(today, bound)
    if plan.makespan * (1 + MIN_GAIN) >= today.makespan:
        return None, with_bound(today, bound)
    return parts, with_bound(plan, bound)

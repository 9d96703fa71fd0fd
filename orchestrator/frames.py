"""Encoder stages: a video segment split between its frames, its own decision (no group, no communication).

A vision encoder attends within a frame (or window), so a segment of F frames (`Batch.segment_frames`)
may run as parts of whole frames on several ranks; a part of k frames holds k · l / F units, makes
k · tokens / F embeddings and costs f(l) · k / F (the segment's cost shared by frames: the stage's
work is the same however it is split).  f is the stage's cost model at the video's whole length: for
an encoder whose work is F · f(l / F) the stage's model must say so (README, "Videos split between
frames").  Every part's embeddings go to the LLM rank(s) holding
their positions (`shards.split_pieces`).

    P = today's plan of the stage
    bound = max(Σ f / D, max f of a segment of one frame, max f / F of a video)
    if P <= bound · (1 + MIN_GAIN): keep P (bit for bit)
    level = max(bound, Σ f / D); every video costing more than it runs as k = min(F, ⌈f / level⌉)
        parts of ⌊F / k⌋ or ⌈F / k⌉ frames (earlier parts larger)
    S = the stage's algorithm on the parts' lengths and costs (`balance(..., costs=)`), under its cap
    return S if S · (1 + MIN_GAIN) < P else P (whose bound becomes the bound above: valid for both)
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..balancers import balance
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


def split_frames(lengths: np.ndarray, costs: np.ndarray, frames: np.ndarray, num_ranks: int, today: BalancePlan,
                 algorithm: str, cap: int | None) -> tuple[FrameParts | None, BalancePlan]:
    """(the parts, their plan) when splitting videos between frames beats `today` by MIN_GAIN, else
    (None, today); either plan with the bound of plans that may split (`frame_bound`)."""
    bound = frame_bound(costs, frames, num_ranks)
    if today.makespan <= bound * (1 + MIN_GAIN):
        return None, with_bound(today, bound)
    parts = frame_parts(costs, frames, bound)
    share = parts.frames / frames[parts.item]
    try:
        plan = balance(lengths[parts.item] // frames[parts.item] * parts.frames, num_ranks,
                       costs=costs[parts.item] * share, algorithm=algorithm, max_tokens_per_rank=cap)
    except InfeasibleError:
        return None, with_bound(today, bound)
    if plan.makespan * (1 + MIN_GAIN) >= today.makespan:
        return None, with_bound(today, bound)
    return parts, with_bound(plan, bound)

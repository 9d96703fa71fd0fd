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
    parts(level): every video costing more than level runs as k = min(F, ⌈f / level⌉) parts of ⌊F / k⌋ or
        ⌈F / k⌉ frames (earlier parts larger)
    plans of parts, fewest parts first, until one is within MIN_GAIN of the bound (`part_plans`):
        the stage's algorithm on parts(bound), their lengths and costs k · f(l / F), under its cap
        the wrap-around deal (McNaughton's rule on whole frames, `filled_parts`): below bound + a frame
        the stage's algorithm on parts(bound / 2^j), j = 1 .., then on single frames, each rank's parts
            of a video merged into one (`merged_parts`)
    S = the best of them; return S if S · (1 + MIN_GAIN) < P else P (whose bound becomes the bound above)

Parts of one size chosen apart from the deal can leave D + 1 big parts for D ranks (two 64-frame videos
in 5 + 4 parts of ~0.8 · bound on 8 ranks: 1.62x the bound, probe20 P20-03); the wrap-around deal cuts a
video where a rank fills, so its parts are as many as the ranks it fills, and finer parts dealt then
merged reach a frame-by-frame deal's balance with one part of a video a rank.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from ..balancers import CostModel, balance
from ..balancers.plan import BalancePlan, make_plan
from ..balancers.problem import InfeasibleError, Status, exact_sum, make_problem, rank_tokens

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


def merged_parts(item: np.ndarray, frames: np.ndarray, ranks: np.ndarray, num_ranks: int
                 ) -> tuple[FrameParts, np.ndarray]:
    """(parts, their ranks): pieces of `frames` frames of items `item` on `ranks`, one part per item and rank
    (an item's frames are alike, so a rank runs its share as one run), items in order, an item's parts in
    the order their ranks first received a piece, frames counted on from 0.

    >>> parts, ranks = merged_parts(np.array([1, 0, 1, 1]), np.array([2, 1, 3, 1]), np.array([0, 1, 1, 0]), 2)
    >>> parts.item.tolist(), parts.first_frame.tolist(), parts.frames.tolist(), ranks.tolist()
    ([0, 1, 1], [0, 0, 3], [1, 3, 3], [1, 0, 1])
    """
    unique, first, inverse = np.unique(item * num_ranks + ranks, return_index=True, return_inverse=True)
    size = np.bincount(inverse, frames).astype(np.int64)
    order = np.lexsort((first, unique // num_ranks))
    item, ranks, size = unique[order] // num_ranks, unique[order] % num_ranks, size[order]
    start = np.cumsum(size) - size
    runs = np.flatnonzero(np.diff(item, prepend=-1))
    first_frame = start - np.repeat(start[runs], np.diff(runs, append=item.size))
    return FrameParts(item, first_frame, size), ranks


def filled_parts(costs: np.ndarray, frames: np.ndarray, level: float, num_ranks: int
                 ) -> tuple[FrameParts, np.ndarray]:
    """(parts, their ranks) dealt by McNaughton's wrap-around rule on whole frames: items by cost per frame,
    largest first (the finest grains come last and fill the gaps), each onto the least-loaded rank, whole
    where it fits under `level`, else as many frames as fit (one at least) and the rest onto the next
    least-loaded rank; merged per rank (`merged_parts`).  A rank ends above `level` by less than a frame,
    or by an item of one frame dealt as LPT deals it.

    >>> parts, ranks = filled_parts(np.array([9.0, 2.0]), np.array([3, 2]), 5.5, 2)
    >>> parts.frames.tolist(), ranks.tolist()
    ([2, 1, 2], [0, 1, 1])
    """
    unit = costs / frames
    heap = [(0.0, rank) for rank in range(num_ranks)]
    pieces = []
    for index in np.lexsort((-costs, -unit)).tolist():
        left, each = int(frames[index]), float(unit[index])
        while left:
            load, rank = heapq.heappop(heap)
            fits = each == 0 or load + left * each <= level
            count = left if fits else min(left, max(1, int((level - load) // each)))
            pieces.append((index, count, rank))
            heapq.heappush(heap, (load + count * each, rank))
            left -= count
    item, count, ranks = np.array(pieces, dtype=np.int64).reshape(-1, 3).T
    return merged_parts(item, count, ranks, num_ranks)


def split_frames(lengths: np.ndarray, frames: np.ndarray, cost: CostModel, num_ranks: int, today: BalancePlan,
                 algorithm: str, cap: int | None) -> tuple[FrameParts | None, BalancePlan]:
    """(the parts, their plan) when splitting videos between frames beats `today` (a plan of the items priced
    by `frame_costs`) by MIN_GAIN, else (None, today); either plan with the bound of plans that may split
    (`frame_bound`), its `item_costs` those of its items (a part of k frames: k · f(l / F)).  The plans of
    parts are tried fewest parts first (`part_plans`) until one is within MIN_GAIN of the bound."""
    costs = frame_costs(cost, lengths, frames)
    bound = frame_bound(costs, frames, num_ranks)
    if today.makespan <= bound * (1 + MIN_GAIN):
        return None, with_bound(today, bound)
    parts, plan = None, today
    for candidate in part_plans(lengths, frames, cost, num_ranks, algorithm, cap, bound):
        if candidate is not None and candidate[1].makespan < plan.makespan:
            parts, plan = candidate
        if plan.makespan <= bound * (1 + MIN_GAIN):
            break
    if plan.makespan * (1 + MIN_GAIN) >= today.makespan:
        return None, with_bound(today, bound)
    return parts, with_bound(plan, bound)


def part_plans(lengths: np.ndarray, frames: np.ndarray, cost: CostModel, num_ranks: int, algorithm: str,
               cap: int | None, bound: float):
    """Plans of parts of the items (`frame_parts`), fewest parts first: at level bound dealt by `algorithm`;
    the wrap-around deal at the bound (`filled_parts`); at levels bound / 2^j (j = 1 .. ⌈log2 max F⌉ - 1),
    then at the smallest frame's cost (every video that costs more in single frames), dealt by `algorithm`
    and merged per rank (`merged_parts`).  Levels whose parts are those of a level before are skipped, a
    deal over the cap is left out (None); a plan made here counts the search so far as its solve time."""
    costs = frame_costs(cost, lengths, frames)
    start = time.perf_counter()

    def planned(parts: FrameParts, ranks: np.ndarray | None = None) -> tuple[FrameParts, BalancePlan] | None:
        part_lengths = lengths[parts.item] // frames[parts.item] * parts.frames
        part_costs = frame_costs(cost, part_lengths, parts.frames)
        if ranks is None:
            try:
                return parts, balance(part_lengths, num_ranks, costs=part_costs, algorithm=algorithm,
                                      max_tokens_per_rank=cap)
            except InfeasibleError:
                return None
        problem = make_problem(part_lengths, num_ranks, costs=part_costs, max_tokens_per_rank=cap)
        if cap is not None and rank_tokens(problem, ranks).max() > cap:
            return None
        return parts, make_plan(problem, ranks, Status.FEASIBLE, algorithm, solve_seconds=time.perf_counter() - start)

    splittable = (frames > 1) & (costs > 0)
    levels = [bound]
    if splittable.any():  # halved, then the smallest frame: every video that costs more runs frame by frame
        levels = [bound / 2**step for step in range(int(frames.max() - 1).bit_length())]
        levels.append(float((costs / frames)[splittable].min()))
    counts = set()
    for step, level in enumerate(levels):
        parts = frame_parts(costs, frames, level)
        if parts.item.size in counts:
            continue
        counts.add(parts.item.size)
        candidate = planned(parts)
        if candidate is not None and step:
            candidate = planned(*merged_parts(parts.item, parts.frames, candidate[1].assignment, num_ranks))
        yield candidate
        filled = filled_parts(costs, frames, bound, num_ranks) if not step and splittable.any() else None
        if filled is not None and filled[0].item.size > costs.size:  # a deal that splits no video is today's job
            yield planned(*filled)

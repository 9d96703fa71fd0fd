"""The plan of one pass (a micro-batch of a step): where every item of every stage runs, and how
encoder outputs reach the LLM.

Every rank computes the same `StepPlan` (`step.py`: its micro-batches, each a `PassPlan`) from
the same `Batch` (lengths only), before any compute; a step of one micro-batch holds one
`PassPlan` of the whole batch.  Conventions of a `PassPlan` (all arrays int64, read-only;
ranks 0..D-1):

- Stage s has items k = 0..K_s-1: the segments of its modality in global segment order
  (`item_segment[k]`), or all samples (LLM stage, `item_segment` = -1).  Item k moves from
  `source[k]` (the rank that sampled it) to `destination[k]`.  On each rank the items run
  in ascending item order: `rank_items[rank_offsets[r]:rank_offsets[r+1]]`.
- Encoder rank r concatenates the inputs of its items in that order (input offsets in
  encoder units: `item_input_offset`) and produces the concatenation of their embeddings
  (`item_offset`, in LLM tokens).  LLM rank r packs its samples in that order into one
  sequence; sample k starts at `item_offset[k]` of the LLM stage.
- Composition Π_M ∘ Π_E⁻¹ (`route_*`, one entry per segment, global segment order):
  segment s leaves encoder rank `route_encoder_rank[s]` at output offset
  `route_encoder_offset[s]` and lands directly on LLM rank `route_llm_rank[s]` at packed
  offset `route_llm_offset[s]` = sample offset + segment position, `route_tokens[s]` rows.

How the runtime uses it (per step, on every rank):
    step = Orchestrator(stages, topology).plan(batch)          # identical on all ranks
    1. fused input exchange (`step.input_exchange()`): raw segment inputs to their
       encoder rank and text tokens to their LLM rank, one all-to-all.
    then for each `plan` of `step.microbatches`:
    2. each encoder stage runs on `rank_items` of its `StagePlan` (inputs concatenated
       in that order, offsets `item_input_offset`).
    3. embedding exchange (`plan.embedding_exchange()`): rows
       [route_encoder_offset, +route_tokens) of the encoder output go to `route_llm_rank`;
       the backward pass sends the gradients the same way in reverse.
    4. `plan.assembly(rank)` says where each received embedding and each text span goes
       in the packed LLM sequence of this rank.
A peer-style two-exchange scheme (embeddings home first, then on to the LLM rank) is
available for comparison as `plan.two_exchange_scheme()`.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from ..balancers.plan import relative_gap
from ..balancers.validation import as_index, is_int
from .lazy import Built, Lazy
from .samples import Batch, constant, counting, every_segment, group_order
from .shards import (LaidChunks, SampleChunks, ShardTable, TextPieces, _frozen, _rank_layout, any_nonzero, any_split,
                     lay_chunks, offsets_within_rank, split_layout, split_pieces)
from .stages import Stage


def first_row_ranks(llm: StagePlan, segments: np.ndarray) -> np.ndarray:
    """The LLM rank that receives the first embedding row of each of `segments` of the pass of the LLM stage plan
    `llm` (made by `planner.stage_plan`), whose samples split: its sample's chunk holding that row
    (`SampleChunks.segment_chunk`, `rank`), from the chunks alone (the shards and text are laid out where read)."""
    laid = llm._laid
    return laid.rank[laid.segment_chunk if every_segment(vars(llm)["_batch"], segments) else
                     laid.segment_chunk[segments]]


@dataclass(frozen=True, eq=False)
class StagePlan(Lazy):
    """One stage's items, where they run, and the quality of that balance.

    `loads[r]` is rank r's cost under the stage's cost model (padded or not), `tokens[r]`
    the tokens it holds (count · max length when padded); makespan = max(loads),
    `lower_bound` a makespan no plan can beat; `algorithm` the kernel or strategy used.

    Split items (`Orchestrator(..., context_parallel=)`, `orchestrator.shards`): LLM sample k runs
    on the `degree[k]` ranks `item_ranks(k)` from `destination[k]`, each spending `item_time[k]`
    (an item's own cost f(l) where unsplit; a part of k of a video's F frames k · f(l / F)); `rank_items`
    then lists a split sample on every rank of its group, and `item_offset` / `item_input_offset` are
    its shard's on the first one (`split` holds the shard table and chunks; None without a split).
    An encoder item is a part of segment `item_segment[k]`: input units from `item_first_unit[k]`,
    `item_tokens[k]` embedding rows from `item_first_row[k]` (one part per segment unless a video is
    split by frames).  The layout (`rank_offsets`, `rank_items`, the offsets, `split`) is built on its first read
    (`orchestrator.lazy`): a step is costed without it.
    """

    stage: Stage
    item_sample: np.ndarray
    item_segment: np.ndarray
    item_length: np.ndarray
    source: np.ndarray
    destination: np.ndarray
    loads: np.ndarray
    tokens: np.ndarray
    makespan: float
    lower_bound: float
    algorithm: str
    degree: np.ndarray
    item_time: np.ndarray
    item_first_unit: np.ndarray
    item_first_row: np.ndarray
    item_tokens: np.ndarray
    solve_seconds: float = 0.0
    split: tuple[ShardTable, SampleChunks] | None = Built("_layout")
    rank_offsets: np.ndarray = Built("_layout")
    rank_items: np.ndarray = Built("_layout")
    item_input_offset: np.ndarray = Built("_layout")
    item_offset: np.ndarray = Built("_layout")

    def _layout(self) -> dict[str, np.ndarray]:
        """The stage's items on each rank in item order and their input and output offsets; the LLM stage's (its
        inputs are its samples' text, and its split samples' shards) from its pass's batch, `_batch`, which
        `planner.stage_plan` sets."""
        if not self.stage.is_llm:
            return dict(split=None, **_rank_layout(self.destination, self.loads.size, self.item_length,
                                                   self.item_tokens))
        batch = vars(self).get("_batch")
        if batch is None:
            raise ValueError(f"the LLM stage plan of {self.stage.name!r} needs its rank layout given")
        if not any_split(self.degree):
            return dict(split=None, **_rank_layout(self.destination, batch.num_ranks, batch.sample_text,
                                                   self.item_tokens))
        split = split_layout(batch, self.destination, self.degree, self._laid)
        vars(self).pop("_laid", None)  # what `split` keeps of it lives on there
        shards = split[0]
        first = shards.group_rank == 0
        item_offset, item_input_offset = np.empty_like(self.item_length), np.empty_like(self.item_length)
        item_offset[shards.sample[first]] = shards.offset[first]
        item_input_offset[shards.sample[first]] = shards.text_offset[first]
        return dict(split=split, rank_offsets=shards.rank_offsets, rank_items=shards.sample,
                    item_offset=_frozen(item_offset), item_input_offset=_frozen(item_input_offset))

    @functools.cached_property
    def _laid(self) -> LaidChunks:
        """The LLM stage's chunks (`shards.lay_chunks`), laid out once for the encoders' anchors and its layout."""
        return lay_chunks(vars(self)["_batch"], self.destination, self.degree)

    @property
    def num_items(self) -> int:
        return int(self.item_sample.size)

    def item_ranks(self, item: int) -> np.ndarray:
        """The ranks running item `item` (its group, in shard order; one rank when unsplit)."""
        if not is_int(item) or not 0 <= item < self.num_items:
            raise ValueError(f"`item` must be an int in [0, {self.num_items}); got {item!r}")
        return self.destination[item] + np.arange(self.degree[item], dtype=np.int64)

    @property
    def gap(self) -> float:
        """makespan / lower_bound - 1 (0 when both are 0)."""
        return relative_gap(self.makespan, self.lower_bound)

    def items_on(self, rank: int) -> np.ndarray:
        """Item indices on `rank`, in the order the rank processes them."""
        rank = as_index(rank, "rank", self.rank_offsets.size - 1, "num_ranks")
        return self.rank_items[self.rank_offsets[rank]:self.rank_offsets[rank + 1]]


@dataclass(frozen=True, eq=False)
class Exchange:
    """One all-to-all: item i of `item_bytes[i]` bytes goes from `source[i]` to `destination[i]`."""

    name: str
    source: np.ndarray
    destination: np.ndarray
    item_bytes: np.ndarray

    @property
    def bytes_moved(self) -> float:
        """Bytes that leave their rank."""
        return float(self.item_bytes[self.source != self.destination].sum())


@dataclass(frozen=True, eq=False)
class AssemblyRecipe:
    """How LLM rank `rank` builds its packed sequence of `num_tokens` tokens.

    Samples `samples` (in order) start at `sample_offsets` and span `sample_lengths`.
    Embedding e (sorted by `embedding_llm_offset`) is segment `embedding_segment[e]`,
    encoded by stage `embedding_stage[e]` on rank `embedding_encoder_rank[e]` at output rows
    [embedding_encoder_offset[e], +embedding_tokens[e]), written to packed rows
    [embedding_llm_offset[e], +embedding_tokens[e]).  Text span t copies text tokens
    [text_offset[t], +text_length[t]) of sample `text_sample[t]` to packed rows
    [text_llm_offset[t], +text_length[t]).  Embeddings and text spans tile the sequence.

    With split samples a "sample" here is this rank's shard of it (group rank
    `sample_group_rank`, of `sample_degree`; 0 of 1 when unsplit), an embedding a piece (rows
    from `embedding_row` of its segment's embeddings), and a span's `text_offset` counts from the
    shard's first text row; `text_buffer_offset[t]` is the span's row in the rank's received
    text buffer (`PassPlan.shards.text_offset` + `text_offset`).
    """

    rank: int
    num_tokens: int
    samples: np.ndarray
    sample_offsets: np.ndarray
    sample_lengths: np.ndarray
    embedding_segment: np.ndarray
    embedding_stage: np.ndarray
    embedding_encoder_rank: np.ndarray
    embedding_encoder_offset: np.ndarray
    embedding_llm_offset: np.ndarray
    embedding_tokens: np.ndarray
    text_sample: np.ndarray
    text_offset: np.ndarray
    text_llm_offset: np.ndarray
    text_length: np.ndarray
    sample_group_rank: np.ndarray
    sample_degree: np.ndarray
    embedding_row: np.ndarray
    text_buffer_offset: np.ndarray


@dataclass(frozen=True, eq=False)
class PassPlan(Lazy):
    """Plans of all stages of one pass (a micro-batch, or a step of one) plus the composed
    encoder -> LLM route (see module doc).  `compose` builds the routes; `PassPlan(batch, stages, stage_plans)`
    composes them on the first read of a route column (`orchestrator.lazy`: the planner's passes, whose step is
    costed from the stage plans alone)."""

    batch: Batch
    stages: tuple[Stage, ...]
    stage_plans: tuple[StagePlan, ...]
    route_stage: np.ndarray = Built("_routes")
    route_encoder_rank: np.ndarray = Built("_routes")
    route_encoder_offset: np.ndarray = Built("_routes")
    route_llm_rank: np.ndarray = Built("_routes")
    route_llm_offset: np.ndarray = Built("_routes")
    route_tokens: np.ndarray = Built("_routes")
    route_rank_offsets: np.ndarray = Built("_routes")
    route_rank_order: np.ndarray = Built("_routes")
    route_segment: np.ndarray = Built("_routes")
    route_row: np.ndarray = Built("_routes")

    def _routes(self) -> dict[str, np.ndarray]:
        """The route columns, composed from the stage plans (`compose`'s)."""
        return routes(self.batch, self.stage_plans)

    @property
    def splits(self) -> bool:
        """Whether a sample runs split (LLM) or a segment in parts (encoders) in this pass."""
        return self.llm.split is not None or any(any_nonzero(plan.item_first_unit) for plan in self.stage_plans[:-1])

    @functools.cached_property
    def shards(self) -> ShardTable:
        """The sequences every LLM rank packs (`orchestrator.shards.ShardTable`)."""
        if self.llm.split is not None:
            return self.llm.split[0]
        llm, items = self.llm, self.llm.rank_items
        ones = np.ones(items.size, dtype=np.int64)
        return ShardTable(sample=items, rank=_frozen(llm.destination[items]), group_rank=_frozen(ones - 1),
                          degree=_frozen(ones), tokens=_frozen(llm.item_length[items]),
                          offset=_frozen(llm.item_offset[items]), text_tokens=_frozen(self.batch.sample_text[items]),
                          text_offset=_frozen(llm.item_input_offset[items]), rank_offsets=llm.rank_offsets)

    @functools.cached_property
    def text_pieces(self) -> TextPieces:
        """Where every sample's text goes, piece by piece (`orchestrator.shards.TextPieces`)."""
        llm = self.llm
        if llm.split is not None:
            chunks = llm.split[1]
            return TextPieces(sample=chunks.sample, first=chunks.text_first, tokens=chunks.text_tokens,
                              rank=chunks.rank, offset=chunks.text_offset)
        return TextPieces(sample=_frozen(np.arange(self.batch.num_samples)),
                          first=_frozen(np.zeros(self.batch.num_samples)), tokens=self.batch.sample_text,
                          rank=llm.destination, offset=llm.item_input_offset)

    @property
    def num_ranks(self) -> int:
        return self.batch.num_ranks

    @property
    def llm(self) -> StagePlan:
        """The LLM stage plan (always the last)."""
        return self.stage_plans[-1]

    def stage_plan(self, name: str) -> StagePlan:
        """The plan of the stage called `name`."""
        for plan in self.stage_plans:
            if plan.stage.name == name:
                return plan
        raise ValueError(f"no stage named {name!r}; stages are {[s.name for s in self.stages]}")

    def digest(self) -> str:
        """SHA-256 of every destination and route: equal on ranks that computed the same plan.  Each column's
        little-endian int64 bytes, read in place (no `astype().tobytes()` copies: fresh buffers, page faults)."""
        arrays = [plan.destination for plan in self.stage_plans]
        arrays += [self.route_encoder_rank, self.route_encoder_offset, self.route_llm_rank, self.route_llm_offset]
        if self.splits:  # degrees, parts and pieces; a plan without a split keeps today's digest
            arrays += [self.llm.degree, *[plan.item_first_unit for plan in self.stage_plans[:-1]],
                       self.route_segment, self.route_row]
        digest = hashlib.sha256()
        for array in arrays:
            digest.update(np.ascontiguousarray(array, dtype="<i8"))
        return digest.hexdigest()

    def input_exchange(self) -> Exchange:
        """The fused input exchange: raw inputs of every encoder item and the text of every sample."""
        parts = [(plan.source, plan.destination, plan.item_length * plan.stage.input_bytes_per_unit)
                 for plan in self.stage_plans[:-1]]
        text, per_unit = self.text_pieces, self.llm.stage.input_bytes_per_unit
        parts.append((self.batch.sample_source[text.sample], text.rank, text.tokens * per_unit))
        return _concat("input", parts)

    def embedding_exchange(self) -> Exchange:
        """Encoder outputs straight to the LLM rank of their sample (Π_M ∘ Π_E⁻¹)."""
        return Exchange("embedding", self.route_encoder_rank, self.route_llm_rank, self._embedding_bytes())

    def two_exchange_scheme(self) -> tuple[Exchange, Exchange]:
        """What peers do: embeddings back to the sampling rank (Π_E⁻¹), then on to the LLM rank (Π_M)."""
        home = self.batch.sample_source[self.batch.segment_sample[self.route_segment]]
        item_bytes = self._embedding_bytes()
        return (Exchange("embedding home", self.route_encoder_rank, home, item_bytes),
                Exchange("embedding to llm", home, self.route_llm_rank, item_bytes))

    def _embedding_bytes(self) -> np.ndarray:
        per_token = np.array([stage.output_bytes_per_token for stage in self.stages])
        return _frozen(self.route_tokens * per_token[self.route_stage], np.float64)

    def assembly(self, rank: int) -> AssemblyRecipe:
        """The packed-sequence recipe of LLM rank `rank`."""
        if not is_int(rank) or not 0 <= rank < self.num_ranks:
            raise ValueError(f"`rank` must be an int in [0, {self.num_ranks}); got {rank!r}")
        shards = self.shards
        rows = shards.rows_on(rank)
        samples, lengths, offsets = shards.sample[rows], shards.tokens[rows], shards.offset[rows]
        entries = self.route_rank_order[self.route_rank_offsets[rank]:self.route_rank_offsets[rank + 1]]
        segments = self.route_segment[entries]
        text_sample, text_offset, text_llm_offset, text_length = _text_spans(
            samples, offsets, lengths, self.batch.segment_sample[segments],
            self.route_llm_offset[entries], self.route_tokens[entries])
        text_buffer_offset = shards.text_offset[rows][np.searchsorted(samples, text_sample)] + text_offset
        return AssemblyRecipe(
            rank=int(rank), num_tokens=int(lengths.sum()), samples=samples, sample_offsets=offsets,
            sample_lengths=lengths, embedding_segment=segments, embedding_stage=self.route_stage[entries],
            embedding_encoder_rank=self.route_encoder_rank[entries],
            embedding_encoder_offset=self.route_encoder_offset[entries],
            embedding_llm_offset=self.route_llm_offset[entries], embedding_tokens=self.route_tokens[entries],
            text_sample=text_sample, text_offset=text_offset, text_llm_offset=text_llm_offset,
            text_length=text_length, sample_group_rank=shards.group_rank[rows], sample_degree=shards.degree[rows],
            embedding_row=self.route_row[entries], text_buffer_offset=_frozen(text_buffer_offset))


def _concat(name: str, parts) -> Exchange:
    return Exchange(name, _frozen(np.concatenate([p[0] for p in parts])),
                    _frozen(np.concatenate([p[1] for p in parts])),
                    _frozen(np.concatenate([np.asarray(p[2], dtype=np.float64) for p in parts]), np.float64))


def _text_spans(samples, sample_offsets, sample_lengths, embedding_sample, embedding_offset, embedding_tokens):
    """Gaps between the embeddings inside each sample, in packed order: the text spans.

    A gap starts at a sample start or an embedding end and stops at the next embedding
    start or the end of its sample (samples ascend and are packed in that order).
    """
    nonempty = embedding_tokens > 0  # an empty embedding bounds no gap
    embedding_offset = embedding_offset[nonempty]
    starts = np.concatenate([sample_offsets, embedding_offset + embedding_tokens[nonempty]])
    owners = np.concatenate([samples, embedding_sample[nonempty]])
    order = np.argsort(starts, kind="stable")
    starts, owners = starts[order], owners[order]
    sample_end = (sample_offsets + sample_lengths)[np.searchsorted(samples, owners)]
    following = np.searchsorted(embedding_offset, starts, side="left")
    next_embedding = np.append(embedding_offset, np.iinfo(np.int64).max)[following]
    lengths = np.minimum(next_embedding, sample_end) - starts
    keep = lengths > 0
    starts, owners, lengths = starts[keep], owners[keep], lengths[keep]
    running = np.cumsum(lengths) - lengths
    first = np.flatnonzero(np.diff(owners, prepend=-1) != 0)  # first span of each sample
    group = np.repeat(first, np.diff(np.append(first, lengths.size)))
    return _frozen(owners), _frozen(running - running[group]), _frozen(starts), _frozen(lengths)


def compose(batch: Batch, stages: tuple[Stage, ...], stage_plans: tuple[StagePlan, ...]) -> PassPlan:
    """Build the PassPlan: route every segment from its encoder rank to its sample's LLM rank."""
    return PassPlan(batch=batch, stages=stages, stage_plans=stage_plans, **routes(batch, stage_plans))


def routes(batch: Batch, stage_plans: tuple[StagePlan, ...]) -> dict[str, np.ndarray]:
    """The route columns of a `PassPlan` of `stage_plans` (by field name): every segment (a piece of it, where a
    sample is split or a segment in parts) from its encoder rank to its sample's LLM rank."""
    num_segments = batch.num_segments
    stage_of_modality = np.full(len(batch.modalities), -1, dtype=np.int64)
    for index, plan in enumerate(stage_plans[:-1]):
        if plan.stage.modality in batch.modalities:
            stage_of_modality[batch.modalities.index(plan.stage.modality)] = index
    sole = _sole_stage(batch, stage_plans[:-1], stage_of_modality)
    if sole is not None:  # one stage holds every segment, in order: its columns are the routes' (no scatter)
        plan = stage_plans[sole]
        route_stage, encoder_rank, encoder_offset = constant(sole, num_segments), plan.destination, plan.item_offset
    else:
        route_stage = stage_of_modality[batch.segment_modality]  # a stage's items are the segments of its modality
        encoder_rank = np.full(num_segments, -1, dtype=np.int64)
        encoder_offset = np.empty(num_segments, dtype=np.int64)
        for plan in stage_plans[:-1]:
            encoder_rank[plan.item_segment] = plan.destination
            encoder_offset[plan.item_segment] = plan.item_offset
    if sole is None and num_segments and route_stage.min() < 0:
        segment = int(np.argmin(route_stage))
        raise ValueError(f"segment {segment} has modality {batch.modalities[batch.segment_modality[segment]]!r}, "
                         f"which no stage encodes")
    if sole is None and num_segments and encoder_rank.min() < 0:
        segment = int(np.argmin(encoder_rank))
        raise ValueError(f"segment {segment} ({batch.modalities[batch.segment_modality[segment]]!r}) is in no "
                         f"stage plan: a stage plan must hold every segment of its modality")
    llm = stage_plans[-1]
    if llm.split is not None or any(any_nonzero(plan.item_first_unit) for plan in stage_plans[:-1]):
        return _compose_pieces(batch, stage_plans, (route_stage, encoder_rank, encoder_offset))
    owner = batch.segment_sample
    llm_rank = llm.destination[owner]
    llm_offset = llm.item_offset[owner]
    llm_offset += batch.segment_position
    # Segments are listed sample by sample in order of position, so walking the LLM ranks'
    # samples in packed order and listing each sample's segments sorts by packed offset.
    first = batch.sample_segment_offsets  # first segment of each sample
    counts = np.diff(first)[llm.rank_items]
    packed_end = np.concatenate(([0], np.cumsum(counts)))  # segments of the samples before, in packed order
    starts = first[llm.rank_items]
    starts -= packed_end[:-1]
    order = np.repeat(starts, counts)
    segment = counting(num_segments)
    order += segment
    route_rank_offsets = packed_end[llm.rank_offsets]
    return dict(route_stage=_frozen(route_stage), route_encoder_rank=_frozen(encoder_rank),
                route_encoder_offset=_frozen(encoder_offset), route_llm_rank=_frozen(llm_rank),
                route_llm_offset=_frozen(llm_offset), route_tokens=batch.segment_tokens,
                route_rank_offsets=_frozen(route_rank_offsets), route_rank_order=_frozen(order),
                route_segment=_frozen(segment), route_row=constant(0, segment.size))  # whole segments: row 0


def _sole_stage(batch: Batch, encoder_plans, stage_of_modality: np.ndarray) -> int | None:
    """The encoder stage whose plan holds every segment of `batch` in order (`counting`'s items), all of its
    modality, the other stages none; None where there is no such stage."""
    sole = None if batch.sole_modality is None else int(stage_of_modality[batch.sole_modality])
    if sole is None or sole < 0 or not every_segment(batch, encoder_plans[sole].item_segment):
        return None
    return sole if sum(plan.item_segment.size for plan in encoder_plans) == batch.num_segments else None


def _compose_pieces(batch: Batch, stage_plans: tuple[StagePlan, ...],
                    whole: tuple[np.ndarray, np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """`routes` of a pass with split samples or segments in parts: one route per piece
    (`orchestrator.shards.split_pieces`; `whole`: every segment's stage, encoder rank and output offset)."""
    llm = stage_plans[-1]
    chunks = llm.split[1] if llm.split is not None else split_layout(batch, llm.destination, llm.degree)[1]
    pieces = split_pieces(batch, stage_plans[:-1], chunks, whole)
    # Pieces run segment by segment in row order, so each rank's in packed order (its samples ascend; a shard's
    # chunk j precedes chunk 2c - 1 - j) are the pieces of its chunks, the chunks taken in order: a stable sort
    # of the chunks by LLM rank, each chunk's run of pieces spread in its place (not a sort of the pieces).
    chunk_offsets, chunk_order = group_order(chunks.rank, batch.num_ranks)
    per_chunk = np.bincount(pieces.chunk, minlength=chunks.rank.size)
    counts = per_chunk[chunk_order]
    before = np.concatenate(([0], np.cumsum(counts)))  # pieces of the chunks before, rank by rank
    order = np.repeat((np.cumsum(per_chunk) - per_chunk)[chunk_order] - before[:-1], counts) + np.arange(before[-1])
    offsets = before[chunk_offsets]
    return dict(route_stage=pieces.stage, route_encoder_rank=pieces.encoder_rank,
                route_encoder_offset=pieces.encoder_offset, route_llm_rank=pieces.llm_rank,
                route_llm_offset=pieces.llm_offset, route_tokens=pieces.tokens, route_rank_offsets=_frozen(offsets),
                route_rank_order=_frozen(order), route_segment=pieces.segment, route_row=pieces.row)

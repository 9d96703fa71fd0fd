"""Split samples in a pass: which rank holds which zigzag chunk of which sample, and where its rows go.

A sample of LLM length l run at degree c on the group of ranks s .. s + c − 1 (the LLM
`StagePlan`'s `destination` and `degree`) is cut into 2c chunks (`balancers.context_parallel.
layout`); group rank j holds chunks j and 2c − 1 − j back to back.  Everything that moves is a
piece, a contiguous run of rows of one item, and an item's pieces in order tile its rows:

    shards       one row per (sample, group rank), packed order rank by rank (samples ascend)
    text pieces  one row per (sample, chunk): the sample's text rows in that chunk, to its rank
    routes       one row per (segment part) ∩ (chunk): embedding rows, encoder rank -> LLM rank

An unsplit sample is one shard of one chunk (its whole sequence) and one text piece, so a plan
without a split reads exactly as before (`PassPlan` keeps today's arrays).  The interface the
runtime reads is written out in /tmp/orch/cp_interface.md and the `PassPlan` docstring.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..balancers.validation import as_index
from .samples import Batch, constant, group_order


def _frozen(array, dtype=np.int64) -> np.ndarray:
    """`array` as a read-only contiguous `dtype` column; a `constant` (read-only, stride 0) as it is (no memory)."""
    if isinstance(array, np.ndarray) and array.strides == (0,) and array.dtype == dtype and not array.flags.writeable:
        return array
    array = np.ascontiguousarray(array, dtype=dtype)
    array.setflags(write=False)
    return array


def rank_starts(rank_offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Exclusive running sums of `sizes` (rows in packed order), restarted at every rank's first row.

    >>> rank_starts(np.array([0, 2, 2, 3]), np.array([4, 5, 6])).tolist()
    [0, 4, 0]
    """
    starts = np.cumsum(sizes) - sizes
    counts = np.diff(rank_offsets)
    used = counts > 0
    return starts - np.repeat(starts[rank_offsets[:-1][used]], counts[used])


def offsets_within_rank(rank_offsets: np.ndarray, order: np.ndarray, *sizes: np.ndarray) -> list[np.ndarray]:
    """Offset of every item in its rank's buffer, for each array of item `sizes`: the sum of
    the sizes of the items before it on its rank.

    One running sum over all ranks in `order`, restarted at each rank's first item by
    subtracting the previous rank's total there; the offset of an item is the running sum
    of the item before it.  Works in one scratch buffer: fresh large arrays (page faults)
    dominate the cost.  Integer sizes all equal (a micro-batch of one video size's frames): an item's
    place on its rank times the size, the places found once for every such column (no running sums).
    """
    dtype = np.result_type(*sizes)
    starts = rank_offsets[:-1][rank_offsets[:-1] < rank_offsets[1:]]  # first position of each non-empty rank
    first_items = order[starts]
    running, places = None, None
    columns = []
    for size in sizes:
        size = np.asarray(size, dtype=dtype)
        if dtype.kind == "i" and size.size and size[0] == size[-1] and size.min() == size.max():
            places = _places(rank_offsets, order) if places is None else places
            columns.append(_frozen(places * size[0], dtype=dtype))
            continue
        running = np.empty(order.size, dtype=dtype) if running is None else running
        np.take(size, order, out=running)
        if starts.size > 1:
            running[starts[1:]] -= np.add.reduceat(running, starts)[:-1]
        np.cumsum(running, out=running)
        offsets = np.empty_like(running)
        offsets[order[1:]] = running[:-1]
        offsets[first_items] = 0
        columns.append(_frozen(offsets, dtype=dtype))
    return columns


def _places(rank_offsets: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Each item's place on its rank (0 for its first item): its position in `order` less its rank's first."""
    ranked = np.arange(order.size)
    ranked -= np.repeat(rank_offsets[:-1], np.diff(rank_offsets))
    places = np.empty(order.size, dtype=np.int64)
    places[order] = ranked
    return places


def _rank_layout(destination: np.ndarray, num_ranks: int, inputs: np.ndarray, outputs: np.ndarray) -> dict:
    """Items per rank in item order (`group_order`) and their offsets in the ranks' input and output buffers."""
    rank_offsets, rank_items = group_order(destination, num_ranks)
    item_input_offset, item_offset = offsets_within_rank(rank_offsets, rank_items, inputs, outputs)
    return dict(rank_offsets=rank_offsets, rank_items=rank_items, item_input_offset=item_input_offset,
                item_offset=item_offset)


@dataclass(frozen=True, eq=False)
class ShardTable:
    """The sequences every LLM rank packs in a pass: one row per (sample, group rank), rank by
    rank (rank q's rows are `rank_offsets[q]:rank_offsets[q + 1]`), samples ascending on a rank.

    Row r: `sample[r]` (of the pass), on `rank[r]`, as group rank `group_rank[r]` of `degree[r]`
    (an unsplit sample: 0 of 1, its whole sequence); `tokens[r]` packed rows from `offset[r]`;
    `text_tokens[r]` text rows from `text_offset[r]` of the rank's received text buffer.
    """

    sample: np.ndarray
    rank: np.ndarray
    group_rank: np.ndarray
    degree: np.ndarray
    tokens: np.ndarray
    offset: np.ndarray
    text_tokens: np.ndarray
    text_offset: np.ndarray
    rank_offsets: np.ndarray

    @property
    def num_rows(self) -> int:
        return int(self.sample.size)

    def rows_on(self, rank: int) -> np.ndarray:
        """Row indices of `rank`, in packed order."""
        rank = as_index(rank, "rank", self.rank_offsets.size - 1, "num_ranks")
        return np.arange(self.rank_offsets[rank], self.rank_offsets[rank + 1])


@dataclass(frozen=True, eq=False)
class TextPieces:
    """Where every sample's text goes: one row per (sample, chunk), sample by sample in chunk order
    (so a sample's pieces tile its text in order): text rows [first, first + tokens) of `sample`
    go to LLM rank `rank`, at row `offset` of its received text buffer."""

    sample: np.ndarray
    first: np.ndarray
    tokens: np.ndarray
    rank: np.ndarray
    offset: np.ndarray


def _embedded(batch: Batch, sample: np.ndarray, start: np.ndarray, size: np.ndarray, split: np.ndarray,
              keyed: tuple[int, np.ndarray] | None = None) -> np.ndarray:
    """Embedding rows inside each chunk [start, start + size) of `sample` (0 where not `split`); `keyed`: the
    batch's `_segment_keys`, where the caller has them.

    Segments are listed by sample, then position, without overlap, so their keys sample · K + position ascend: the
    rows before a key q are the tokens of the segments starting before q less the part of the last one past q, one
    binary search per chunk end (a sample of 512 frame segments split into 16 chunks costs 17 searches, not 8192
    overlaps): a chunk that ends where the next one starts (a split sample's chunks tile it) reads the next one's
    start, so only the last chunk of each run of them searches its end."""
    embedded = np.zeros(sample.size, dtype=np.int64)
    rows = np.flatnonzero(split)
    if rows.size == 0 or batch.segment_tokens.size == 0:
        return embedded
    scale, keys = _segment_keys(batch) if keyed is None else keyed
    tokens = batch.segment_tokens
    tokens_before = np.zeros(tokens.size + 1, dtype=np.int64)
    np.cumsum(tokens, out=tokens_before[1:])

    def before(key: np.ndarray) -> np.ndarray:
        k = np.searchsorted(keys, key, side="left")
        last = np.maximum(k - 1, 0)  # the last segment starting before `key` (where k > 0), read at its end
        past = np.where(k > 0, np.maximum(keys[last] + tokens[last] - key, 0), 0)
        return tokens_before[k] - past

    first = sample[rows] * scale + start[rows]
    end = first + size[rows]
    at_first = before(first)
    at_end = np.empty_like(at_first)
    tiles = np.append(end[:-1] == first[1:], False)  # the next chunk starts where this one ends
    at_end[tiles] = at_first[1:][tiles[:-1]]
    at_end[~tiles] = before(end[~tiles])
    embedded[rows] = at_end - at_first
    return embedded


def text_before(batch: Batch, sample: int, positions: np.ndarray) -> np.ndarray:
    """Text rows of `sample` before each of `positions` (LLM positions, ascending or not)."""
    segments = slice(batch.sample_segment_offsets[sample], batch.sample_segment_offsets[sample + 1])
    starts, tokens = batch.segment_position[segments], batch.segment_tokens[segments]
    inside = np.clip(positions[:, None] - starts[None, :], 0, tokens[None, :]).sum(axis=1)
    return positions - inside


@dataclass(frozen=True, eq=False)
class SampleChunks:
    """The chunks of every sample of a pass, one row per (sample, chunk), sample by sample
    (an unsplit sample: one chunk, its whole sequence): `position` and `tokens` in the sample's
    LLM sequence, `text_first` and `text_tokens` its text rows, `rank` and `row` the shard row
    holding it, `packed` its first packed row on that rank, `text_offset` its first row of the
    rank's text buffer; `first[k]` the first chunk of sample k (size num_samples + 1); `segment_chunk[s]` the
    chunk holding segment s's first embedding row (one per segment of the pass: its pieces and anchors read it)."""

    sample: np.ndarray
    position: np.ndarray
    tokens: np.ndarray
    text_first: np.ndarray
    text_tokens: np.ndarray
    rank: np.ndarray
    packed: np.ndarray
    text_offset: np.ndarray
    first: np.ndarray
    segment_chunk: np.ndarray


def _segment_keys(batch: Batch) -> tuple[int, np.ndarray]:
    """(K, every segment's key sample · K + position): K exceeds every LLM length, so the keys ascend with the
    segments and a chunk keyed the same way (sample · K + its position) sorts among them."""
    scale = int(max(batch.sample_llm_length.max(initial=0), 1)) + 1
    keys = batch.segment_sample * scale
    keys += batch.segment_position
    return scale, keys


class LaidChunks(NamedTuple):
    """The chunks of a pass, one row per (sample, chunk) (`SampleChunks`' sample, position, tokens, rank, first and
    segment_chunk), with each chunk's index in its sample, its sample's degree c and group rank, the chunks per
    sample, and the batch's `_segment_keys`."""

    sample: np.ndarray
    position: np.ndarray
    tokens: np.ndarray
    rank: np.ndarray
    first: np.ndarray
    segment_chunk: np.ndarray
    index: np.ndarray
    degree: np.ndarray
    group_rank: np.ndarray
    per_sample: np.ndarray
    keyed: tuple[int, np.ndarray]


def lay_chunks(batch: Batch, destination: np.ndarray, degree: np.ndarray) -> LaidChunks:
    """The chunks of a pass whose samples run on groups (start, degree), and the chunk of each segment's first row."""
    n, lengths = batch.num_samples, batch.sample_llm_length
    chunks = np.where(degree > 1, 2 * degree, 1)
    first = np.concatenate(([0], np.cumsum(chunks)))
    sample = np.repeat(np.arange(n, dtype=np.int64), chunks)
    index = np.arange(sample.size) - first[sample]  # chunk index within its sample
    c = degree[sample]
    quotient, remainder = np.divmod(lengths[sample], np.where(c > 1, 2 * c, 1))
    sizes = quotient + (index < remainder)  # `layout.chunk_sizes`: the first l mod 2c chunks one token longer
    positions = np.cumsum(sizes) - sizes
    positions -= positions[first[:-1]][sample]
    group_rank = np.where(index < c, index, 2 * c - 1 - index)
    scale, segment_keys = keyed = _segment_keys(batch)
    segment_chunk = _searched(sample * scale + positions, segment_keys, "right") - 1  # the last start at or before
    return LaidChunks(sample, positions, sizes, destination[sample] + group_rank, first, segment_chunk, index, c,
                   group_rank, chunks, keyed)


def split_layout(batch: Batch, destination: np.ndarray, degree: np.ndarray,
                 laid: LaidChunks | None = None) -> tuple[ShardTable, SampleChunks]:
    """The shard table and the chunks of a pass whose samples run on groups (start, degree); `laid`: its
    `lay_chunks`, where the caller has them."""
    n, num_ranks = batch.num_samples, batch.num_ranks
    laid = lay_chunks(batch, destination, degree) if laid is None else laid
    sample, positions, sizes, chunk_rank, first = laid.sample, laid.position, laid.tokens, laid.rank, laid.first
    index, c, group_rank, chunks = laid.index, laid.degree, laid.group_rank, laid.per_sample
    text_sizes = np.where(c > 1, sizes - _embedded(batch, sample, positions, sizes, c > 1, laid.keyed),
                          batch.sample_text[sample])
    # Shards: one per (sample, group rank); its chunks are j then 2c - 1 - j.
    shard_of_chunk = np.repeat(np.cumsum(degree) - degree, chunks) + group_rank
    num_shards = int(degree.sum())
    shard_tokens = np.bincount(shard_of_chunk, weights=sizes, minlength=num_shards).astype(np.int64)
    shard_text = np.bincount(shard_of_chunk, weights=text_sizes, minlength=num_shards).astype(np.int64)
    shard_sample = np.repeat(np.arange(n, dtype=np.int64), degree)
    shard_group_rank = np.arange(num_shards) - np.repeat(np.cumsum(degree) - degree, degree)
    shard_rank = destination[shard_sample] + shard_group_rank
    rank_offsets, order = group_order(shard_rank, num_ranks)  # stable: samples ascend on a rank
    tokens, text = shard_tokens[order], shard_text[order]
    offset, text_offset = rank_starts(rank_offsets, tokens), rank_starts(rank_offsets, text)
    table = ShardTable(sample=_frozen(shard_sample[order]), rank=_frozen(shard_rank[order]),
                       group_rank=_frozen(shard_group_rank[order]), degree=_frozen(degree[shard_sample[order]]),
                       tokens=_frozen(tokens), offset=_frozen(offset), text_tokens=_frozen(text),
                       text_offset=_frozen(text_offset), rank_offsets=_frozen(rank_offsets))
    position_of_row = np.empty(num_shards, dtype=np.int64)
    position_of_row[order] = np.arange(num_shards)
    row = position_of_row[shard_of_chunk]
    mirror = index >= c  # the second chunk of its shard: after the first one's rows
    partner = np.where(mirror, first[sample] + 2 * c - 1 - index, 0)
    packed = offset[row] + np.where(mirror, sizes[partner], 0)
    text_offset_chunk = text_offset[row] + np.where(mirror, text_sizes[partner], 0)
    text_first = np.cumsum(text_sizes) - text_sizes
    text_first -= text_first[first[:-1]][sample] if sample.size else 0
    return table, SampleChunks(sample=_frozen(sample), position=_frozen(positions), tokens=_frozen(sizes),
                               text_first=_frozen(text_first), text_tokens=_frozen(text_sizes),
                               rank=_frozen(chunk_rank), packed=_frozen(packed), text_offset=_frozen(text_offset_chunk),
                               first=_frozen(first), segment_chunk=_frozen(laid.segment_chunk))


@dataclass(frozen=True, eq=False)
class Pieces:
    """Embedding pieces, one row per (segment part) ∩ (chunk), segment by segment in row order:
    rows [row, row + tokens) of `segment`'s embeddings leave encoder `stage` on `encoder_rank` at
    output row `encoder_offset` and land on LLM rank `llm_rank` at packed row `llm_offset`, inside `chunk`
    (a row of the pass's `SampleChunks`; non-decreasing: a chunk's pieces are contiguous)."""

    segment: np.ndarray
    row: np.ndarray
    tokens: np.ndarray
    stage: np.ndarray
    encoder_rank: np.ndarray
    encoder_offset: np.ndarray
    llm_rank: np.ndarray
    llm_offset: np.ndarray
    chunk: np.ndarray


def _distinct(column: np.ndarray) -> np.ndarray:
    """`column`, or its one value where it is a `constant` (stride 0: read once)."""
    return column[:1] if column.strides == (0,) else column


def any_nonzero(column: np.ndarray) -> bool:
    """Whether `column` holds a non-zero entry."""
    return bool(np.any(_distinct(column)))


def any_split(degree: np.ndarray) -> bool:
    """Whether a degree of `degree` exceeds 1."""
    return bool(np.any(_distinct(degree) > 1))


def _parts(encoder_plans) -> tuple[np.ndarray, ...]:
    """(segment, first row, stage, rank, output offset) of the parts of segments in several parts, by segment
    then row (a stage whose `item_first_unit` is a stride-0 column of zeros has none: read once)."""
    split = [[] for _ in range(5)]
    for index, plan in enumerate(encoder_plans):
        if any_nonzero(plan.item_first_unit):  # some segment in parts
            mine = np.bincount(plan.item_segment)[plan.item_segment] > 1
            for column, values in zip(split, (plan.item_segment[mine], plan.item_first_row[mine],
                                              np.full(int(mine.sum()), index), plan.destination[mine],
                                              plan.item_offset[mine])):
                column.append(values)
    split = [np.concatenate(column).astype(np.int64) if column else np.zeros(0, dtype=np.int64) for column in split]
    order = np.lexsort((split[1], split[0]))
    return tuple(column[order] for column in split)


def split_pieces(batch: Batch, encoder_plans, chunks: SampleChunks,
                 whole: tuple[np.ndarray, np.ndarray, np.ndarray]) -> Pieces:
    """The embedding pieces of a pass: each segment cut where its encoder parts and its sample's
    chunks start (a segment in one part of an unsplit sample: one piece, as before).  `whole` holds
    every segment's (stage, encoder rank, output offset), read where it is one part.

    A segment's first piece starts at its row 0; its other pieces ("cuts", E of them) where a chunk
    of its sample or a part starts inside it.  Pieces run segment by segment in row order, so with
    the cuts sorted by (segment, row), cut j is piece segment[j] + j + 1 and the segments' first
    pieces fill the other places: every column is the segments' column with the cuts' spread in."""
    stage, rank, offset = whole
    part_segment, part_row, part_stage, part_rank, part_offset = _parts(encoder_plans)
    owner, size, position = batch.segment_sample, batch.segment_tokens, batch.segment_position
    scale, first_key = _segment_keys(batch)
    starts = chunks.sample * scale + chunks.position  # ascending
    # A chunk at its sample's position 0 (an unsplit sample's one chunk, a split one's first) starts no segment's
    # inside: it starts the sample, before all of its segments; only the others are searched.
    inner = np.flatnonzero(chunks.position)
    cut_segment, cut_row, cut_at, at = _chunk_cuts(first_key, size, starts[inner], chunks.segment_chunk)
    cut_at = inner[cut_at]
    if part_segment.size:  # parts starting inside their segment cut it too (where no chunk start does already)
        inside = part_row > 0
        part_key = owner[part_segment[inside]] * scale + position[part_segment[inside]] + part_row[inside]
        keys = np.concatenate((cut_segment * scale + cut_row, part_segment[inside] * scale + part_row[inside]))
        order = np.argsort(keys, kind="stable")
        distinct = np.ones(keys.size, dtype=bool)
        distinct[1:] = keys[order][1:] != keys[order][:-1]
        order = order[distinct]
        cut_segment = np.concatenate((cut_segment, part_segment[inside]))[order]
        cut_row = np.concatenate((cut_row, part_row[inside]))[order]
        cut_at = np.concatenate((cut_at, np.searchsorted(starts, part_key, side="right") - 1))[order]
    num_pieces = batch.num_segments + cut_segment.size
    cut_piece = cut_segment + np.arange(1, cut_segment.size + 1)
    piece_segment = np.empty(num_pieces, dtype=np.int64)
    if cut_piece.size:
        first_piece = np.ones(num_pieces, dtype=bool)
        first_piece[cut_piece] = False
        piece_segment[first_piece] = np.arange(batch.num_segments)
        piece_segment[cut_piece] = cut_segment
    else:
        piece_segment[:] = np.arange(batch.num_segments)
    # Every other column is its segment's value, gathered, where a cut changes it (E cuts) set after.
    piece_row = np.zeros(num_pieces, dtype=np.int64)
    piece_row[cut_piece] = cut_row
    piece_tokens = size[piece_segment]
    piece_tokens[cut_piece - 1] = cut_row  # a piece followed by a cut ends there
    piece_tokens[cut_piece] -= cut_row  # and a cut piece starts there (the others at row 0: no pass over them)
    one_stage = stage.strides == (0,) and stage.size and not part_segment.size  # a `constant`: one too
    piece_stage = constant(int(stage[0]), num_pieces) if one_stage else stage[piece_segment]
    piece_rank = rank[piece_segment]
    piece_offset = offset[piece_segment]
    piece_offset[cut_piece] += cut_row
    if part_segment.size:
        in_parts = np.zeros(batch.num_segments, dtype=bool)
        in_parts[part_segment] = True
        parted = np.flatnonzero(in_parts[piece_segment])
        part = np.searchsorted(part_segment * scale + part_row, piece_segment[parted] * scale + piece_row[parted],
                               side="right") - 1
        piece_stage[parted], piece_rank[parted] = part_stage[part], part_rank[part]
        piece_offset[parted] = part_offset[part] + piece_row[parted] - part_row[part]
    piece_chunk = at[piece_segment]
    piece_chunk[cut_piece] = cut_at
    llm_offset = (chunks.packed - chunks.position)[piece_chunk]  # a row's packed offset less its position in its sample
    llm_offset += position[piece_segment]
    llm_offset[cut_piece] += cut_row
    return Pieces(segment=_frozen(piece_segment), row=_frozen(piece_row), tokens=_frozen(piece_tokens),
                  stage=_frozen(piece_stage), encoder_rank=_frozen(piece_rank), encoder_offset=_frozen(piece_offset),
                  llm_rank=_frozen(chunks.rank[piece_chunk]), llm_offset=_frozen(llm_offset), chunk=piece_chunk)


def _chunk_cuts(first_key: np.ndarray, size: np.ndarray, starts: np.ndarray,
                at: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(segment, row, chunk) of every chunk start inside a segment (past its first row), by segment then row,
    and every segment's chunk holding its first row (`at`, where the caller has it: `SampleChunks.segment_chunk`);
    segments keyed sample · K + position (`first_key`, ascending) as the chunks' `starts`.

    A segment begins at or after the end of the one before it, so a chunk start lies inside at most the last
    segment starting at or before it: one binary search per chunk, not per segment (an unsplit sample's one
    chunk starts at its position 0, inside no segment)."""
    at = _searched(starts, first_key, "right") - 1 if at is None else at  # the last chunk starting at or before it
    if not first_key.size:
        return at, at, at, at
    last = np.searchsorted(first_key, starts, side="right") - 1  # per chunk, the last segment starting at or before it
    clamped = np.maximum(last, 0)
    row = starts - first_key[clamped]
    chunk = np.flatnonzero((last >= 0) & (row > 0) & (row < size[clamped]))
    return last[chunk], row[chunk], chunk, at


def _searched(starts: np.ndarray, keys: np.ndarray, side: str) -> np.ndarray:
    """`np.searchsorted(starts, keys, side)` (`starts` ascending): where `keys` ascend too (segments run in sample,
    position order), by one binary search per start over the keys and each count repeated over the keys up to the
    next start's, not one search per key (a pass's segments outnumber its chunk starts ~10 to 1)."""
    if keys.size < 2 or np.any(keys[1:] < keys[:-1]):
        return np.searchsorted(starts, keys, side=side)
    first = np.searchsorted(keys, starts, side="left" if side == "right" else "right")  # the first key each counts for
    return np.repeat(np.arange(starts.size + 1), np.diff(first, prepend=0, append=keys.size))

"""Sample metadata of one training step: what every rank sampled, as lengths only.

A sample is `text` text tokens plus zero or more modality segments.  Segment j of a sample has `length` encoder input
units (image patches, audio frames), produces `tokens` embeddings for the LLM, and those embeddings occupy LLM positions
[position, position + tokens) of the sample's LLM sequence, whose length is text + sum(tokens).  Text tokens fill the
remaining positions in their original order.

`Batch` is the columnar form every rank holds after the all-gather of lengths: flat
int64 arrays per sample and per segment, so planning 16 384 ranks × 16 samples stays
vectorised.  Sample i is row i; segments are stored sample by sample, in each sample's
order of position.  `Batch.from_samples` builds it from `Sample` objects;
`Batch.from_arrays` from arrays (what the runtime gathers).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..balancers.validation import as_array, as_index, as_int, as_non_negative_integers


MAX_TOKENS = 2**53  # a count and a sample's LLM sequence: exact in float64 costs, int64 sums of them never wrap


def _count(value, name: str) -> int:
    """`value` as a token count: an int in [0, MAX_TOKENS)."""
    value = as_int(value, name, minimum=0)
    if value >= MAX_TOKENS:
        raise ValueError(f"`{name}` must be below 2**53 (token counts stay exact in float64 costs); got {value}")
    return value


def _check_sequence(llm_length: int, text: int, sample: str) -> None:
    if llm_length >= MAX_TOKENS:
        raise ValueError(f"{sample} LLM sequence (text {text} + segment tokens) holds {llm_length} tokens, at or "
                         f"beyond 2**53 (token counts stay exact in float64 costs)")


def _check_name(name: str, value) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"`{name}` must be a non-empty str; got {value!r}")
    if value == "llm":
        raise ValueError(f"`{name}` must not be 'llm' (the name of the LLM stage)")
    return value


@dataclass(frozen=True)
class Segment:
    """One modality sub-sequence: `length` encoder units -> `tokens` LLM embeddings at `position`.

    `frames` > 1: a video of `frames` independent units (`length / frames` input units and
    `tokens / frames` embeddings each), so the encoder stage may split it between them: each unit's
    embeddings must depend on its own input rows only (no temporal position, frame index or merge
    across units, which would restart at every part; README "Videos split between frames").

    `position` is the offset of the first embedding in the sample's LLM sequence; None
    means "right after the previous segment" (0 for the first), so segments without
    positions sit in order before the text.
    """

    modality: str
    length: int
    tokens: int
    position: int | None = None
    frames: int = 1

    def __post_init__(self) -> None:
        _check_name("modality", self.modality)
        object.__setattr__(self, "length", _count(self.length, "length"))
        object.__setattr__(self, "tokens", _count(self.tokens, "tokens"))
        if self.position is not None:
            object.__setattr__(self, "position", _count(self.position, "position"))
        object.__setattr__(self, "frames", as_int(self.frames, "frames", minimum=1))
        if self.length % self.frames or self.tokens % self.frames:
            raise ValueError(f"a segment of {self.frames} frames must have a length and tokens divisible by its "
                             f"frames; got length {self.length}, tokens {self.tokens}")


@dataclass(frozen=True)
class Sample:
    """`text` text tokens, modality `segments`, sampled by rank `source`, identified by `id`."""

    text: int
    segments: tuple[Segment, ...] = ()
    source: int = 0
    id: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", _count(self.text, "text"))
        object.__setattr__(self, "source", as_int(self.source, "source", minimum=0))
        object.__setattr__(self, "id", as_int(self.id, "id", minimum=0))
        if isinstance(self.segments, (Segment, str, bytes)) or not hasattr(self.segments, "__iter__"):
            wrap = " (wrap one in a tuple: segments=(Segment(...),))" if isinstance(self.segments, Segment) else ""
            raise TypeError(f"`segments` must be a sequence of Segment objects{wrap}; got "
                            f"{type(self.segments).__name__}")
        segments = tuple(self.segments)
        for segment in segments:
            if not isinstance(segment, Segment):
                raise TypeError(f"`segments` must hold Segment objects; got {type(segment).__name__}")
        object.__setattr__(self, "segments", segments)
        _check_sequence(self.llm_length, self.text, "the sample's")
        resolve_positions(segments, self.text)

    @property
    def llm_length(self) -> int:
        """Length of the sample's LLM sequence: text + sum of segment tokens."""
        return self.text + sum(segment.tokens for segment in self.segments)


def resolve_positions(segments: tuple[Segment, ...], text: int) -> list[int]:
    """Positions of `segments` (None -> right after the previous one), validated.

    Segments must be listed in order of position, must not overlap, and must end inside
    the LLM sequence of length text + sum(tokens).
    """
    total = text + sum(segment.tokens for segment in segments)
    positions, end = [], 0
    for j, segment in enumerate(segments):
        position = end if segment.position is None else segment.position
        if position < end:
            raise ValueError(f"segment {j} starts at position {position}, inside the previous segment "
                             f"(which ends at {end}); segments must be in order and must not overlap")
        if position + segment.tokens > total:
            raise ValueError(f"segment {j} spans LLM positions [{position}, {position + segment.tokens}) "
                             f"past the sample's LLM sequence of {total} tokens (text {text} + segments)")
        positions.append(position)
        end = position + segment.tokens
    return positions


def _frozen_int(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array, dtype=np.int64)
    array.setflags(write=False)
    return array


_COUNT = _frozen_int(np.arange(0))


def counting(n: int) -> np.ndarray:
    """0, 1, ..., n - 1 (int64, read-only): a view of one array the process keeps, so that plans hold
    no copy of it per pass (the LLM stage's items, the routes of a pass that splits nothing, the segments of a
    micro-batch of one modality): planning time goes into the page faults of memory a plan keeps."""
    global _COUNT
    count = _COUNT
    if count.size < n:
        count = _COUNT = _frozen_int(np.arange(n))
    return count[:n]


def is_counting(array: np.ndarray) -> bool:
    """Whether `array` is a view `counting` made (0, 1, ..., n - 1), told without reading it (False for
    other arrays of those values: a caller then reads them as any other)."""
    return (array.base is _COUNT and array.ndim == 1 and array.strides == (8,)
            and array.__array_interface__["data"][0] == _COUNT.__array_interface__["data"][0])


def every_segment(batch, segments: np.ndarray) -> bool:
    """Whether `segments` are every segment of `batch` in order, told without reading them (`counting`'s)."""
    return is_counting(segments) and segments.size == batch.num_segments


_CONSTANTS: dict[int, np.ndarray] = {}


def constant(value: int, n: int) -> np.ndarray:
    """n copies of the int64 `value`, read-only, in no memory (stride 0): a column every item shares (an
    unsplit item's degree 1, a whole segment's first unit 0); built directly, as np.broadcast_to takes
    several times longer, once per stage and pass."""
    if value not in _CONSTANTS:
        _CONSTANTS[value] = _frozen_int(np.array([value]))
    return np.ndarray((n,), dtype=np.int64, buffer=_CONSTANTS[value], strides=(0,))


def _segment_offsets(segment_sample: np.ndarray, num_samples: int) -> np.ndarray:
    """CSR of the segments per sample (segments listed sample by sample): offsets (num_samples + 1,)."""
    offsets = np.zeros(num_samples + 1, dtype=np.int64)
    np.cumsum(np.bincount(segment_sample, minlength=num_samples), out=offsets[1:])
    offsets.setflags(write=False)
    return offsets


def _llm_lengths(text: np.ndarray, segment_tokens: np.ndarray, segment_offsets: np.ndarray) -> np.ndarray:
    """text + the tokens of each sample's segments (exact integer sums)."""
    tokens_before = np.concatenate(([0], np.cumsum(segment_tokens)))
    return _frozen_int(text + (tokens_before[segment_offsets[1:]] - tokens_before[segment_offsets[:-1]]))


def group_order(groups: np.ndarray, num_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of items per group (a rank, a micro-batch), ascending item order within a group:
    (offsets (num_groups + 1,), order (K,)), read-only int64.

    A stable sort by group: where group << bits | index fits 32 bits (bits: those of the largest index), one
    sort of those unique keys (the unstable sort is the stable order), else the radix argsort of 16-bit groups
    below 65 536 groups, else the stable argsort.  Which is faster depends on numpy's SIMD sort: with AVX-512
    (numpy 2.4.6, measured 2026-12-06 17:40 UTC, CPU time) the packed sort takes the 76 calls of four long CP
    steps (T 16k/32k) in 32.3 ms where the radix argsort takes 49.3 (360k items of 2560 groups: 5.6 vs 10.5 ms);
    b0f7700 had measured the opposite (radix 3-4x faster) on another box earlier that day.
    """
    bits = max(groups.size - 1, 0).bit_length()
    if num_groups << bits <= 2**32:
        keys = groups.astype(np.uint32)
        keys <<= bits
        keys |= np.arange(groups.size, dtype=np.uint32)
        keys.sort()
        keys &= (1 << bits) - 1
        order = keys.astype(np.int64)
    else:
        order = np.argsort(groups.astype(np.uint16) if num_groups <= 2**16 else groups, kind="stable")
    offsets = np.concatenate(([0], np.cumsum(np.bincount(groups, minlength=num_groups))))
    return _frozen_int(offsets), _frozen_int(order)


def _as_int_array(name: str, values, size: int | None = None) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D; got shape {array.shape}")
    if size is not None and array.size != size:
        raise ValueError(f"`{name}` must have {size} entries; got {array.size}")
    array = as_non_negative_integers(array, name)
    array.setflags(write=False)
    return array


def _as_frames(frames, length: np.ndarray, tokens: np.ndarray) -> np.ndarray | None:
    """`segment_frames` validated: positive, dividing every segment's length and tokens (None stays None)."""
    if frames is None:
        return None
    frames = _as_int_array("segment_frames", frames, length.size)
    bad = np.flatnonzero((frames < 1) | (length % np.maximum(frames, 1) != 0) | (tokens % np.maximum(frames, 1) != 0))
    if bad.size:
        s = int(bad[0])
        raise ValueError(f"`segment_frames` must be positive and divide the segment's length and tokens; segment {s} "
                         f"has {frames[s]} frames, length {length[s]}, tokens {tokens[s]}")
    return frames


@dataclass(frozen=True, eq=False)
class Batch:
    """Columnar metadata of a global batch (all ranks); arrays are read-only int64.

    Per sample i: `sample_text[i]`, `sample_source[i]` (rank that sampled it), `sample_id[i]`.  Per segment s:
    `segment_sample[s]` (its sample, non-decreasing), `segment_modality[s]` (index into `modalities`),
    `segment_length[s]`, `segment_tokens[s]`, `segment_position[s]` (offset in the sample's LLM sequence),
    `segment_frames[s]` (frames of a video the encoder may split between; None: every segment 1).  Derived per
    sample, computed at construction unless given: `sample_llm_length`, `sample_segment_offsets`.  `from_arrays`
    and `from_samples` validate the columns (`validated`); `planner.checked`, a batch made otherwise.
    """

    num_ranks: int
    modalities: tuple[str, ...]
    sample_text: np.ndarray
    sample_source: np.ndarray
    sample_id: np.ndarray
    segment_sample: np.ndarray
    segment_modality: np.ndarray
    segment_length: np.ndarray
    segment_tokens: np.ndarray
    segment_position: np.ndarray
    segment_frames: np.ndarray | None = None
    sample_segment_offsets: np.ndarray | None = field(default=None, repr=False)
    """Sample i owns segments [offsets[i], offsets[i + 1]) (read-only)."""
    sample_llm_length: np.ndarray | None = field(default=None, repr=False)
    """text + sum of segment tokens, per sample (read-only)."""

    def __post_init__(self) -> None:
        if self.sample_segment_offsets is None:
            object.__setattr__(self, "sample_segment_offsets", _segment_offsets(self.segment_sample, self.num_samples))
        if self.sample_llm_length is None:
            object.__setattr__(self, "sample_llm_length",
                               _llm_lengths(self.sample_text, self.segment_tokens, self.sample_segment_offsets))

    @property
    def num_samples(self) -> int:
        return int(self.sample_text.size)

    @property
    def num_segments(self) -> int:
        return int(self.segment_sample.size)

    def segments_of(self, modality: str) -> np.ndarray:
        """Global indices of the segments of `modality`, ascending, read-only (empty if none: a modality no sample
        of this batch holds, which a stage may declare; `counting` where every segment is of it)."""
        if not isinstance(modality, str):
            raise TypeError(f"`modality` must be a str (one of {list(self.modalities)}, or another with no "
                            f"segment here); got {type(modality).__name__}")
        if modality not in self.modalities:
            return np.zeros(0, dtype=np.int64)
        code, sole = self.modalities.index(modality), self.sole_modality
        if sole is not None:  # every segment of one modality (a micro-batch of videos' frames): no pass, no copy
            return counting(self.num_segments) if code == sole else np.zeros(0, dtype=np.int64)
        return np.flatnonzero(self.segment_modality == code)

    @functools.cached_property
    def sole_modality(self) -> int | None:
        """The modality (its index in `modalities`) of every segment where they share one, else None (none too)."""
        codes = self.segment_modality
        return int(codes[0]) if codes.size and codes.min() == codes.max() else None

    def segments_of_samples(self, samples) -> np.ndarray:
        """Global indices of every segment of the given samples (ascending distinct indices), in order."""
        return self._segments_of(self._sample_indices(samples))

    def _segments_of(self, samples: np.ndarray) -> np.ndarray:
        """`segments_of_samples` of indices already checked (`_sample_indices`)."""
        offsets = self.sample_segment_offsets
        counts = offsets[samples + 1] - offsets[samples]
        return np.repeat(offsets[samples] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))

    def _sample_indices(self, samples) -> np.ndarray:
        """`samples` as ascending distinct int64 sample indices in [0, num_samples): integral floats read as
        ints, other floats and boolean masks refused naming the argument (numpy's cast truncated 0.5 to 0)."""
        array = as_array(samples, "samples", "sample indices")
        if array.ndim == 0:
            raise TypeError(f"`samples` must be a 1-D sequence of sample indices; got one index {samples!r}: pass "
                            f"[{samples!r}]")
        if array.dtype == bool:
            raise TypeError("`samples` is a boolean mask; pass `np.flatnonzero(mask)`, the indices it selects")
        indices = as_non_negative_integers(array, "samples", integral_floats=True)
        if indices.ndim != 1 or (indices.size and (np.any(np.diff(indices) <= 0) or indices[-1] >= self.num_samples)):
            raise ValueError(f"`samples` must be ascending distinct sample indices in [0, {self.num_samples})")
        return indices

    def take(self, samples) -> "Batch":
        """The batch of the given samples (ascending global indices) with all their segments, in order.

        Sample k of the result is sample `samples[k]` of this batch, from the same source rank.
        """
        samples = self._sample_indices(samples)
        segments = self._segments_of(samples)
        counts = np.diff(self.sample_segment_offsets)[samples]
        batch = Batch(num_ranks=self.num_ranks, modalities=self.modalities, sample_text=self.sample_text[samples],
                      sample_source=self.sample_source[samples], sample_id=self.sample_id[samples],
                      segment_sample=np.repeat(np.arange(samples.size, dtype=np.int64), counts),
                      segment_modality=self.segment_modality[segments], segment_length=self.segment_length[segments],
                      segment_tokens=self.segment_tokens[segments], segment_position=self.segment_position[segments],
                      segment_frames=None if self.segment_frames is None else self.segment_frames[segments])
        for array in (batch.sample_text, batch.sample_source, batch.sample_id, batch.segment_sample,
                      batch.segment_modality, batch.segment_length, batch.segment_tokens, batch.segment_position,
                      *(() if batch.segment_frames is None else (batch.segment_frames,))):
            array.setflags(write=False)
        return batch

    def split(self, group, num_groups: int) -> tuple[tuple[np.ndarray, "Batch"], ...]:
        """For every group g < `num_groups`: its samples (`np.flatnonzero(group == g)`) and their
        batch, equal to `take` of them, from one stable permutation of this batch's arrays.

        Every sample's group is given (`group`, int, one per sample).  The batches are views
        into one permuted copy: M takes would each read all of every segment array (a group's
        segments lie spread over it), the permutation reads it once.
        """
        group = np.asarray(group)
        if group.shape != (self.num_samples,) or (group.size and group.dtype.kind not in "iu"):
            raise ValueError(f"`group` must hold one int per sample ({self.num_samples}); got shape {group.shape}, "
                             f"dtype {group.dtype}")
        num_groups = as_int(num_groups, "num_groups", minimum=1)
        if group.size and (group.min() < 0 or group.max() >= num_groups):
            raise ValueError(f"`group` must hold groups in [0, {num_groups}); got {group.min()}..{group.max()}")
        sample_bounds, order = group_order(group, num_groups)
        offsets = self.sample_segment_offsets
        counts = np.diff(offsets)[order]
        segment_offsets = np.concatenate(([0], np.cumsum(counts)))
        segments = np.repeat(offsets[:-1][order] - segment_offsets[:-1], counts) + np.arange(segment_offsets[-1])
        local_sample = np.repeat(np.arange(order.size) - sample_bounds[group[order]], counts)
        columns = dict(sample_text=self.sample_text[order], sample_source=self.sample_source[order],
                       sample_id=self.sample_id[order], segment_sample=local_sample,
                       segment_modality=self.segment_modality[segments], segment_length=self.segment_length[segments],
                       segment_tokens=self.segment_tokens[segments], segment_position=self.segment_position[segments])
        if self.segment_frames is not None:
            columns["segment_frames"] = self.segment_frames[segments]
        llm_length = self.sample_llm_length[order]
        for array in (llm_length, *columns.values()):
            array.setflags(write=False)
        parts = []
        for first, end in zip(sample_bounds[:-1].tolist(), sample_bounds[1:].tolist()):
            first_segment, end_segment = int(segment_offsets[first]), int(segment_offsets[end])
            part_offsets = segment_offsets[first:end + 1] - first_segment
            part_offsets.setflags(write=False)
            part = Batch(num_ranks=self.num_ranks, modalities=self.modalities, **{
                name: column[first:end] if name.startswith("sample_") else column[first_segment:end_segment]
                for name, column in columns.items()}, sample_segment_offsets=part_offsets,
                sample_llm_length=llm_length[first:end])
            parts.append((order[first:end], part))
        return tuple(parts)

    def sample(self, index: int) -> Sample:
        """Sample `index` as a `Sample` object (for tests and inspection)."""
        index = as_index(index, "index", self.num_samples, "num_samples")
        rows = np.flatnonzero(self.segment_sample == index)
        frames = np.ones(self.num_segments, dtype=np.int64) if self.segment_frames is None else self.segment_frames
        segments = tuple(Segment(self.modalities[self.segment_modality[s]], int(self.segment_length[s]),
                                 int(self.segment_tokens[s]), int(self.segment_position[s]), int(frames[s]))
                         for s in rows)
        return Sample(int(self.sample_text[index]), segments, int(self.sample_source[index]),
                      int(self.sample_id[index]))

    @classmethod
    def from_samples(cls, samples, num_ranks: int) -> "Batch":
        """Columnar batch of `samples` (sample i is row i) on `num_ranks` ranks."""
        samples = list(samples)
        for index, sample in enumerate(samples):
            if not isinstance(sample, Sample):
                raise TypeError(f"`samples` must hold Sample objects; got {type(sample).__name__} at index {index}")
        modalities: list[str] = []
        rows = []
        for index, sample in enumerate(samples):
            positions = resolve_positions(sample.segments, sample.text)
            for segment, position in zip(sample.segments, positions):
                if segment.modality not in modalities:
                    modalities.append(segment.modality)
                rows.append((index, modalities.index(segment.modality), segment.length, segment.tokens, position,
                             segment.frames))
        table = np.array(rows, dtype=np.int64).reshape(-1, 6)
        return cls.from_arrays(
            num_ranks=num_ranks, modalities=tuple(modalities),
            sample_text=[s.text for s in samples], sample_source=[s.source for s in samples],
            sample_id=[s.id for s in samples], segment_sample=table[:, 0], segment_modality=table[:, 1],
            segment_length=table[:, 2], segment_tokens=table[:, 3], segment_position=table[:, 4],
            segment_frames=table[:, 5] if np.any(table[:, 5] > 1) else None)

    @classmethod
    def from_arrays(cls, *, num_ranks, modalities, sample_text, sample_source, sample_id=None,
                    segment_sample=(), segment_modality=(), segment_length=(), segment_tokens=(),
                    segment_position=None, segment_frames=None) -> "Batch":
        """Validated batch from flat arrays; `segment_position` None packs segments before the text;
        `segment_frames` None: every segment one frame."""
        num_ranks = as_int(num_ranks, "num_ranks", minimum=1)
        if isinstance(modalities, str):
            raise TypeError(f"`modalities` must be a sequence of modality names, not one str; got {modalities!r} "
                            f"(write ({modalities!r},) for one modality)")
        modalities = tuple(modalities)
        for name in modalities:
            _check_name("modalities", name)
        if len(set(modalities)) != len(modalities):
            raise ValueError(f"`modalities` must be distinct; got {modalities}")
        text = _as_int_array("sample_text", sample_text)
        n = text.size
        source = _as_int_array("sample_source", sample_source, n)
        if n and source.max() >= num_ranks:
            index = int(np.argmax(source))
            raise ValueError(f"`sample_source` must be ranks in [0, {num_ranks}); got {source[index]} at index {index}")
        ids = _as_int_array("sample_id", np.arange(n) if sample_id is None else sample_id, n)
        owner = _as_int_array("segment_sample", segment_sample)
        m = owner.size
        modality = _as_int_array("segment_modality", segment_modality, m)
        length = _as_int_array("segment_length", segment_length, m)
        tokens = _as_int_array("segment_tokens", segment_tokens, m)
        if m:
            if owner.max() >= n:
                index = int(np.argmax(owner))
                raise ValueError(f"`segment_sample` must index samples in [0, {n}); "
                                 f"got {owner[index]} at index {index}")
            if np.any(np.diff(owner) < 0):
                raise ValueError("`segment_sample` must be non-decreasing (segments listed sample by sample)")
            if modality.max() >= len(modalities):
                index = int(np.argmax(modality))
                raise ValueError(f"`segment_modality` must index `modalities` (size {len(modalities)}); "
                                 f"got {modality[index]} at index {index}")
        offsets = _segment_offsets(owner, n)
        if segment_position is None:
            cumulative = np.cumsum(tokens) - tokens  # tokens of all earlier segments
            position = cumulative - cumulative[offsets[owner]]
            position.setflags(write=False)
        else:
            position = _as_int_array("segment_position", segment_position, m)
        for name, counts in (("sample_text", text), ("segment_length", length), ("segment_tokens", tokens),
                             ("segment_position", position)):
            if counts.size and counts.max() >= MAX_TOKENS:
                index = int(np.argmax(counts >= MAX_TOKENS))
                raise ValueError(f"`{name}` must be below 2**53 (token counts stay exact in float64 costs); got "
                                 f"{counts[index]} at index {index}")
        if float(text.sum(dtype=np.float64)) + float(tokens.sum(dtype=np.float64)) >= 2.0**62:
            raise ValueError("the batch's text and segment tokens sum past 2**62: int64 sums of them would wrap")
        llm_length = _llm_lengths(text, tokens, offsets)
        if n and llm_length.max() >= MAX_TOKENS:
            index = int(np.argmax(llm_length))
            _check_sequence(int(llm_length[index]), int(text[index]), f"sample {index}'s")
        end = position + tokens
        past = np.flatnonzero(end > llm_length[owner]) if m else owner
        if past.size:
            s = int(past[0])
            raise ValueError(f"segment {s} (sample {owner[s]}) spans LLM positions [{position[s]}, {end[s]}) past "
                             f"the sample's LLM sequence of {llm_length[owner[s]]} tokens "
                             f"(text {text[owner[s]]} + segment tokens)")
        same = owner[1:] == owner[:-1]
        overlap = np.flatnonzero(same & (position[1:] < end[:-1])) if m else owner
        if overlap.size:
            s = int(overlap[0]) + 1
            raise ValueError(f"segment {s} (sample {owner[s]}) starts at position {position[s]}, inside the "
                             f"previous segment (ending at {end[s - 1]}); segments must be in order and not overlap")
        batch = cls(num_ranks=num_ranks, modalities=modalities, sample_text=text, sample_source=source,
                    sample_id=ids, segment_sample=owner, segment_modality=modality, segment_length=length,
                    segment_tokens=tokens, segment_position=position,
                    segment_frames=_as_frames(segment_frames, length, tokens),
                    sample_segment_offsets=offsets, sample_llm_length=llm_length)  # validation computed them
        object.__setattr__(batch, "validated", True)  # not a field: dataclasses.replace's new columns lack it
        return batch

"""A synthetic vision + audio + text dataset with modality composition incoherence.

Every rank draws `samples_per_rank` i.i.d. samples per step, as random data-parallel
sampling does, so one rank may get three image-heavy samples and another only chat.
Kinds (probability; lengths in encoder units, `pool` patches or `stride` frames per LLM
token; every length is drawn uniformly between the bounds given):

- chat (0.35): text only, lognormal text (median 160 tokens, σ = 0.6), clipped to [16, 640]
- image_qa (0.30): 1–3 images of 8–48 tokens each; text 24–120
- audio_qa (0.20): one clip of 10–80 tokens; text 16–96
- interleaved (0.15): 1–2 images and one clip, 32–200 text tokens between them

Segments sit at random insertion points of the text.  Sample i of rank r at step s has id
s·10⁹ + r·10⁵ + i, and its content (token ids, labels, patch and frame features) comes
from a generator seeded by (seed, id) alone, so a sample is bit-identical whichever rank
ends up processing it.  Labels are the next token; the first quarter of the text
(the prompt) and each sample's last token carry -100 (no loss).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...balancers.validation import is_int
from ...orchestrator.samples import Sample, Segment
from .model import ModelConfig

KINDS = (("chat", 0.35), ("image_qa", 0.30), ("audio_qa", 0.20), ("interleaved", 0.15))
IGNORE = -100


def sample_id(step: int, rank: int, index: int) -> int:
    """Globally unique id of sample `index` of `rank` at `step`."""
    return step * 10**9 + rank * 10**5 + index


@dataclass(frozen=True, eq=False)
class LocalBatch:
    """One rank's samples: metadata and the tensors the runtime exchanges."""

    samples: tuple[Sample, ...]
    text: dict  # input_ids, labels: packed over text tokens (int64)
    per_sample: dict  # sample_id: one row per sample (int64)
    inputs: dict  # "image": (patches, patch_dim), "audio": (frames, frame_dim), floating

    def to(self, device) -> "LocalBatch":
        """The same batch with every tensor on `device`."""
        return LocalBatch(self.samples, *[{key: value.to(device) for key, value in part.items()}
                                          for part in (self.text, self.per_sample, self.inputs)])


class SyntheticMultimodal:
    """Deterministic synthetic mini-batches for `samples_per_rank` samples per rank and step."""

    def __init__(self, config: ModelConfig = ModelConfig(), samples_per_rank: int = 16, seed: int = 0):
        if not is_int(samples_per_rank) or samples_per_rank < 0:
            raise ValueError(f"`samples_per_rank` must be a non-negative int; got {samples_per_rank!r}")
        self.config, self.samples_per_rank, self.seed = config, samples_per_rank, int(seed)

    def _sample(self, step: int, rank: int, index: int) -> Sample:
        identifier = sample_id(step, rank, index)
        rng = np.random.default_rng([self.seed, identifier, 0])
        kind = KINDS[int(rng.choice(len(KINDS), p=[p for _, p in KINDS]))][0]
        segments: list[tuple[str, int]] = []  # (modality, tokens)
        if kind == "chat":
            text = int(np.clip(np.rint(160 * np.exp(0.6 * rng.standard_normal())), 16, 640))
        elif kind == "image_qa":
            segments = [("image", int(rng.integers(8, 49))) for _ in range(int(rng.integers(1, 4)))]
            text = int(rng.integers(24, 121))
        elif kind == "audio_qa":
            segments = [("audio", int(rng.integers(10, 81)))]
            text = int(rng.integers(16, 97))
        else:
            segments = [("image", int(rng.integers(8, 49))) for _ in range(int(rng.integers(1, 3)))]
            segments.insert(int(rng.integers(0, len(segments) + 1)), ("audio", int(rng.integers(10, 81))))
            text = int(rng.integers(32, 201))
        inserts = np.sort(rng.integers(0, text + 1, len(segments)))
        built, before = [], 0
        for (modality, tokens), insert in zip(segments, inserts.tolist()):
            units = tokens * (self.config.pool if modality == "image" else self.config.stride)
            built.append(Segment(modality, units, tokens, int(insert) + before))
            before += tokens
        return Sample(text, tuple(built), rank, identifier)

    def samples(self, step: int, rank: int) -> tuple[Sample, ...]:
        """Metadata of rank `rank`'s samples at `step` (cheap: what the planner needs)."""
        return tuple(self._sample(step, rank, index) for index in range(self.samples_per_rank))

    def local_batch(self, step: int, rank: int, dtype: torch.dtype = torch.float32) -> LocalBatch:
        """Metadata and tensors of rank `rank`'s samples at `step`."""
        return self.tensors(self.samples(step, rank), dtype)

    def tensors(self, samples, dtype: torch.dtype = torch.float32) -> LocalBatch:
        """Tensors for any samples' metadata, content seeded by (seed, sample id) alone."""
        samples = tuple(samples)
        ids, labels, patches, frames = [], [], [], []
        for sample in samples:
            rng = np.random.default_rng([self.seed, sample.id, 1])
            tokens = rng.integers(0, self.config.vocab, sample.text + 1)
            target = tokens[1:].copy()
            target[: sample.text // 4] = IGNORE
            target[-1:] = IGNORE
            ids.append(tokens[:-1])
            labels.append(target)
            for segment in sample.segments:
                if segment.modality == "image":
                    patches.append(rng.standard_normal((segment.length, self.config.patch_dim)))
                else:
                    frames.append(rng.standard_normal((segment.length, self.config.frame_dim)))

        def packed(parts, width, tensor_dtype):
            array = np.concatenate(parts) if parts else np.zeros((0, width) if width else 0)
            return torch.from_numpy(np.ascontiguousarray(array)).to(tensor_dtype)

        return LocalBatch(
            samples=samples,
            text={"input_ids": packed(ids, 0, torch.int64), "labels": packed(labels, 0, torch.int64)},
            per_sample={"sample_id": torch.tensor([s.id for s in samples], dtype=torch.int64)},
            inputs={"image": packed(patches, self.config.patch_dim, dtype),
                    "audio": packed(frames, self.config.frame_dim, dtype)})


"""A rank's samples as the multi-stage runtime gathers them: two int64 tables, checked before the all-gather."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..orchestrator.samples import Sample, resolve_positions
from .metadata import as_table

SAMPLE_COLUMNS = 4  # text tokens, number of segments, sample id, loss tokens
SEGMENT_COLUMNS = 5  # modality code, length, tokens, position, frames


def sample_tables(samples: Sequence[Sample], modalities: Sequence[str], loss_tokens=None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """This rank's metadata as two int64 tables: samples (text, #segments, id, loss tokens) and
    segments (modality code, length, tokens, position, frames), segments sample by sample.

    `loss_tokens[k]` is how many tokens of sample k count in the loss (default: its text)."""
    if loss_tokens is not None:
        loss_tokens = as_table(loss_tokens, "loss_tokens")[:, 0]
        if loss_tokens.size != len(samples):
            raise ValueError(f"`loss_tokens` must have one count per sample ({len(samples)}); got {loss_tokens.size}")
    sample_rows, segment_rows = [], []
    for index, sample in enumerate(samples):
        if not isinstance(sample, Sample):
            raise TypeError(f"`samples` must hold orchestrator Sample objects; got {type(sample).__name__} "
                            f"at index {index}")
        losses = sample.text if loss_tokens is None else int(loss_tokens[index])
        if losses > sample.llm_length:
            raise ValueError(f"`loss_tokens` must be at most each sample's LLM tokens: sample {index} has {losses} "
                             f"loss tokens of {sample.llm_length}")
        sample_rows.append((sample.text, len(sample.segments), sample.id, losses))
        positions = resolve_positions(sample.segments, sample.text)
        for j, (segment, position) in enumerate(zip(sample.segments, positions)):
            if segment.modality not in modalities:
                raise ValueError(f"sample {index} segment {j} has modality {segment.modality!r}; the stages "
                                 f"encode {list(modalities)}")
            segment_rows.append((modalities.index(segment.modality), segment.length, segment.tokens, position,
                                 segment.frames))
    return (np.array(sample_rows, dtype=np.int64).reshape(-1, SAMPLE_COLUMNS),
            np.array(segment_rows, dtype=np.int64).reshape(-1, SEGMENT_COLUMNS))

"""Flat variable-split all-to-all of one packed 1-D buffer.

Every rank holds a buffer whose segment for destination d has `splits[rank, d]` elements,
segments in destination order; afterwards it holds `splits[s, rank]` elements from each
source s, in source order.  `splits` is the full D×D matrix, known on every rank because
the metadata was all-gathered before any payload moves; the hierarchical transport
(`hierarchical.py`) needs all of it, the flat one only its own row and column.

gloo (torch 2.13) supports `all_to_all_single` with uneven splits on CPU, including
zero-size segments; NCCL supports it on CUDA.  A group of one rank is a no-op.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from .comm import group_rank, group_size


def check_splits(buffer: torch.Tensor, splits: np.ndarray, rank: int, size: int) -> None:
    """Validate a 1-D buffer against the D×D split matrix of a transport."""
    if buffer.dim() != 1:
        raise ValueError(f"`buffer` must be 1-D; got shape {tuple(buffer.shape)}")
    if splits.shape != (size, size):
        raise ValueError(f"`splits` must be {size}×{size} for a group of {size} ranks; got {splits.shape}")
    if buffer.numel() != int(splits[rank].sum()):
        raise ValueError(f"`buffer` has {buffer.numel()} elements but rank {rank}'s splits send "
                         f"{int(splits[rank].sum())}")


class FlatAllToAll:
    """One `all_to_all_single` over `group` (default: the world)."""

    def __init__(self, group=None):
        self.group = group

    @property
    def size(self) -> int:
        return group_size(self.group)

    @property
    def rank(self) -> int:
        return group_rank(self.group)

    def __call__(self, buffer: torch.Tensor, splits: np.ndarray) -> torch.Tensor:
        """Send `buffer`'s segments to their ranks; return what arrives, in source order."""
        rank, size = self.rank, self.size
        splits = np.asarray(splits, dtype=np.int64)
        check_splits(buffer, splits, rank, size)
        if size == 1:
            return buffer
        output = buffer.new_empty(int(splits[:, rank].sum()))
        dist.all_to_all_single(output, buffer, splits[:, rank].tolist(), splits[rank].tolist(),
                               group=self.group)
        return output

"""Flat variable-split all-to-all of one packed 1-D buffer, and the flows that size it.

Every rank holds a buffer whose segment for destination d has S[rank, d] elements,
segments in destination order; afterwards it holds S[s, rank] elements from each source
s, in source order.  S is never materialised (D×D int64 is 52 MB at D = 2560): `Flows`
keeps the per-item (source, destination, size) triples every rank knows from the
all-gathered metadata and answers the rows, columns or blocks of S a transport needs in
O(items).  The flat transport needs its own row and column; the node-wise one
(`hierarchical.py`) a few blocks around its node.

gloo (torch 2.13) supports `all_to_all_single` with uneven splits on CPU, including
zero-size segments; NCCL supports it on CUDA.  A group of one rank is a no-op.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from .comm import checked_group, finish, group_rank, group_size


class Flows:
    """Elements moving from `source[i]` to `dest[i]`, `size[i]` of them, on `world_size` ranks, and `pair`
    elements from every rank to every rank (itself included: a guarded exchange's header) before them."""

    def __init__(self, source, dest, size, world_size: int, pair: int = 0):
        self.source = np.asarray(source, dtype=np.int64)
        self.dest = np.asarray(dest, dtype=np.int64)
        self.size = np.asarray(size, dtype=np.int64)
        if not self.source.shape == self.dest.shape == self.size.shape or self.source.ndim != 1:
            raise ValueError("`source`, `dest` and `size` must be 1-D arrays of equal length")
        self.world_size, self.pair = int(world_size), int(pair)

    @classmethod
    def from_matrix(cls, splits) -> "Flows":
        """Flows of a dense D×D matrix (small groups, tests)."""
        splits = np.asarray(splits, dtype=np.int64)
        if splits.ndim != 2 or splits.shape[0] != splits.shape[1]:
            raise ValueError(f"`splits` must be a square matrix; got shape {splits.shape}")
        source, dest = np.nonzero(splits >= 0)
        return cls(source, dest, splits[source, dest], splits.shape[0])

    def row(self, rank: int) -> np.ndarray:
        """Elements `rank` sends to each rank."""
        mine = self.source == rank
        return np.bincount(self.dest[mine], weights=self.size[mine], minlength=self.world_size).astype(np.int64) + \
            self.pair

    def column(self, rank: int) -> np.ndarray:
        """Elements `rank` receives from each rank."""
        mine = self.dest == rank
        return np.bincount(self.source[mine], weights=self.size[mine], minlength=self.world_size).astype(np.int64) + \
            self.pair

    def pairs(self, sources, dests) -> dict:
        """{(s, d): elements} for sources in `sources` and destinations in `dests` (non-zero only)."""
        keep = np.isin(self.source, sources) & np.isin(self.dest, dests) & (self.size > 0)
        keys = self.source[keep] * self.world_size + self.dest[keep]
        unique, inverse = np.unique(keys, return_inverse=True)
        totals = np.bincount(inverse, weights=self.size[keep]).astype(np.int64)
        pairs = {divmod(int(k), self.world_size): int(t) for k, t in zip(unique, totals)}
        if self.pair:
            pairs.update(((int(s), int(d)), pairs.get((int(s), int(d)), 0) + self.pair)
                         for s in np.unique(sources) for d in np.unique(dests))
        return pairs


def check_buffer(buffer: torch.Tensor, flows: Flows, rank: int, size: int) -> np.ndarray:
    """Validate a 1-D buffer against the flows of a transport; returns this rank's row."""
    if buffer.dim() != 1:
        raise ValueError(f"`buffer` must be 1-D; got shape {tuple(buffer.shape)}")
    if flows.world_size != size:
        raise ValueError(f"flows are for {flows.world_size} ranks but the group has {size}")
    row = flows.row(rank)
    if buffer.numel() != int(row.sum()):
        raise ValueError(f"`buffer` has {buffer.numel()} elements but rank {rank}'s flows send {int(row.sum())}")
    return row


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

    def __call__(self, buffer: torch.Tensor, flows: Flows) -> torch.Tensor:
        """Send `buffer`'s segments to their ranks; return what arrives, in source order."""
        rank, size = self.rank, self.size
        send = check_buffer(buffer, flows, rank, size)
        if size == 1:
            return buffer
        receive = flows.column(rank)
        output = buffer.new_empty(int(receive.sum()))
        finish(dist.all_to_all_single(output, buffer, receive.tolist(), send.tolist(), group=self.group, async_op=True),
               self.group)
        return output


def runtime_transport(group, transport):
    """The transport a runtime over `group` uses: `transport`, or `FlatAllToAll(group)` where None; a TypeError
    naming the argument where `group` is not a ProcessGroup (or None: the default group) or `transport` not an
    exchange (a callable with `size`, `rank` and `group`, as `FlatAllToAll` and `HierarchicalAllToAll`).

    >>> runtime_transport(None, None).group is None
    True
    """
    checked_group(group)
    if transport is None:
        return FlatAllToAll(group)
    if not callable(transport) or not all(hasattr(transport, name) for name in ("size", "rank", "group")):
        raise TypeError(f"`transport` must be an exchange such as FlatAllToAll(group) or HierarchicalAllToAll("
                        f"gpus_per_node, group), or None for FlatAllToAll(group); got {type(transport).__name__}" + (
                            f" (a name: build it with runtime.hierarchical.make_transport({transport!r}, group, "
                            f"gpus_per_node))" if isinstance(transport, str) else ""))
    return transport

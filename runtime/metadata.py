"""Metadata exchange: all-gather every rank's per-item integers, and check plan agreement.

Each rank holds a (n_r, K) int64 table (lengths of its items, one column per stage or
per packed tensor; n_r may be 0).  Two small all-gathers give every rank the whole
(sum n_r, K) table, rows listed rank by rank: first the (n_r, K) shapes (a `call_header`, so
a rank in another orchmllm call is named), then the tables padded to max n_r.  Every rank
then runs the same deterministic solver on the same table, so every rank computes the same
plan without sending a single payload byte.

`gather_metadata(..., fingerprint=...)` carries a 32-byte fingerprint of each rank's
configuration in the first (shape) all-gather, at no extra round trip, and raises
`ConfigMismatchError` on every rank naming the ranks that plan with other settings; a `planner` word (the
code a rank plans with, `routes.planner_word`) rides there too, so every rank knows before planning whether
every rank's plan will be the same (an exchange may then carry its header in its payload all-to-all).
`check_agreement` all-gathers a digest of each rank's plan, for solvers that may differ
between ranks even with the same configuration (time-limited exact solvers).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch
import torch.distributed as dist

from ..balancers.validation import as_non_negative_integers, tensor_values
from .agreement import (ConfigMismatchError, PlanMismatchError, call_header, disagreement, fingerprint,
                        options_that_differ, words_of)
from .comm import collective, comm_device, finish, group_rank, group_size

__all__ = ["ConfigMismatchError", "GatheredMetadata", "PeerInputError", "PlanMismatchError", "as_table",
           "check_agreement", "fingerprint", "gather_metadata", "join_failed"]


@dataclass(frozen=True, eq=False)
class GatheredMetadata:
    """Every rank's per-item table, rows listed rank by rank."""

    values: np.ndarray  # (n, K) int64
    counts: np.ndarray  # (D,) int64 rows contributed by each rank
    planner: int = 0  # the `planner` word every rank sent (`gather_metadata`); 0 where their words differ
    state_agreed: bool = True  # whether every rank sent the same `state` word (`gather_metadata`)

    @property
    def num_items(self) -> int:
        return int(self.values.shape[0])

    @property
    def source_ranks(self) -> np.ndarray:
        """Rank that contributed each row."""
        return np.repeat(np.arange(self.counts.size, dtype=np.int64), self.counts)

    def column(self, index: int = 0) -> np.ndarray:
        return self.values[:, index]


def as_table(local, name: str = "lengths") -> np.ndarray:
    """Validate a rank's per-item integers: (n,) or (n, K), may be empty; int64 (n, K)."""
    if isinstance(local, torch.Tensor):
        local = tensor_values(local, name)  # a TypeError naming `name` where it has no dense values
    if isinstance(local, (str, bytes)) or local is None:
        raise TypeError(f"`{name}` must be integers, one row per item; got {type(local).__name__}")
    array = np.asarray(local)
    if array.ndim not in (1, 2):
        raise ValueError(f"`{name}` must be 1-D or 2-D (items × columns); got shape {array.shape}")
    table = as_non_negative_integers(array, name)  # checked as given: a 1-D one's errors name the item
    return table.reshape(-1, 1) if array.ndim == 1 else table


def gather_metadata(local, group=None, num_columns: int | None = None, *, fingerprint: bytes | None = None,
                    what: str = "configuration", options: Mapping[str, object] | None = None,
                    planner: int = 0, state: int = 0) -> GatheredMetadata:
    """All-gather each rank's (n_r, K) integer table (n_r may differ and be 0).

    A collective: every rank of `group` must call it.  `num_columns` fixes K for a rank
    with no items whose input is an empty 1-D array.  `fingerprint` (32 bytes, e.g.
    `fingerprint(algorithm, cost, caps)`) rides with the table's shape; ranks whose
    fingerprints differ raise `ConfigMismatchError` on every rank, naming them and, with `options`
    (the options the fingerprint was computed from, by name), the options that differ: only then
    are they gathered.  `planner` (a signed 64-bit word: what this rank plans with, 0 for no claim) rides in the
    same all-gather: `.planner` is it where every rank sent the same, else 0 (no error: ranks may plan alike
    with other words).  `state` (a signed 64-bit word of the caller's exchange state, which every rank should hold
    alike: `SchemaGuard.state`) rides there as well: `.state_agreed` says whether every rank sent the same.

    >>> gather_metadata([3, 1, 2]).values[:, 0].tolist()  # one process: no communication
    [3, 1, 2]
    """
    table = as_table(local)
    if num_columns is not None and table.shape[0] == 0:
        table = table.reshape(0, num_columns)
    words = np.zeros(4, dtype=np.int64) if fingerprint is None else words_of(fingerprint)
    size = group_size(group)
    if size == 1:
        table.setflags(write=False)
        return GatheredMetadata(table, np.array([table.shape[0]], dtype=np.int64), int(planner))
    device = comm_device(group)
    header = call_header("metadata table" if fingerprint is None else "metadata",
                         [*table.shape, *words, planner, state], group, f"metadata all-gather ({what})")
    shapes, planners, states = header[:, :6], header[:, 6], header[:, 7]
    if fingerprint is not None:
        failed = [rank for rank, row in enumerate(shapes) if not row[2:].any()]
        if failed:
            raise PeerInputError(f"ranks {failed} failed their own input checks (each raised why); rank "
                                 f"{group_rank(group)} stops with them")
        problem = disagreement([row[2:].tobytes() for row in shapes], what, group_rank(group),
                               show=lambda value: value.hex()[:12])
        if problem:
            if options is not None:  # every rank saw the mismatch: all of them gather the options
                shown = [None] * size
                with collective(f"options all-gather ({what})", group):
                    dist.all_gather_object(shown, {name: repr(value) for name, value in options.items()}, group=group)
                problem += f"; options that differ: {options_that_differ(shown)}"
            raise ConfigMismatchError(f"{problem}; every rank must plan with the same algorithm, cost model, "
                                      f"caps and stage declarations")
    columns = shapes[:, 1]
    if np.any(columns != columns[0]):
        detail = ", ".join(f"rank {r}: {c}" for r, c in enumerate(columns.tolist()))
        raise ValueError(f"ranks sent metadata with different numbers of columns ({detail}); "
                         f"pass `num_columns` on ranks with no items")
    counts = shapes[:, 0]
    longest = int(counts.max())
    padded = torch.zeros((longest, int(columns[0])), dtype=torch.int64, device=device)
    padded[: table.shape[0]] = torch.from_numpy(table).to(device)
    tables = [torch.empty_like(padded) for _ in range(size)]
    with collective(f"metadata all-gather ({what})", group):
        finish(dist.all_gather(tables, padded, group=group, async_op=True), group)
    values = np.concatenate([t.cpu().numpy()[:c] for t, c in zip(tables, counts.tolist())])
    values.setflags(write=False)
    counts.setflags(write=False)
    return GatheredMetadata(values, counts, int(planners[0]) if np.all(planners == planners[0]) else 0,
                            bool(np.all(states == states[0])))


FAILED_INPUT = bytes(32)  # the fingerprint of a rank whose own input failed its checks


class PeerInputError(ValueError):
    """Another rank's input failed its checks: that rank raised the reason; this one stops too."""


def join_failed(group, num_columns: int) -> None:
    """Take part in the `gather_metadata` of a step whose input failed this rank's checks, as
    `FAILED_INPUT`, so that the other ranks raise `PeerInputError` instead of waiting for it
    (the caller then raises its own error)."""
    if group_size(group) > 1:
        with contextlib.suppress(PeerInputError):
            gather_metadata(np.zeros((0, num_columns), dtype=np.int64), group, num_columns, fingerprint=FAILED_INPUT)


def gather_digests(digest: bytes, group=None, phase: str = "digest all-gather", call: str = "digest") -> list[bytes]:
    """Every rank's digest of equal length (at most 64 bytes), in rank order: one `call_header` of `call` (its
    name in a mispairing), `phase` naming it in errors."""
    words = np.frombuffer(digest.ljust(-(-len(digest) // 8) * 8, b"\0"), dtype=np.int64)
    return [row.tobytes()[:len(digest)] for row in call_header(call, words, group, phase)]


def _digest_bytes(digest) -> tuple[bytes | None, ValueError | None]:
    """`digest` as 32 bytes, or the error naming what it is instead."""
    try:
        own = bytes(memoryview(digest).cast("B"))
    except TypeError:
        return None, ValueError(f"`digest` must be 32 bytes (SHA-256); got a {type(digest).__name__}")
    if len(own) != 32:
        return None, ValueError(f"`digest` must be 32 bytes (SHA-256); got {len(own)}")
    return own, None


def check_agreement(digest: bytes, group=None, what: str = "plan") -> None:
    """All-gather each rank's 32-byte digest (any bytes-like object); raise PlanMismatchError naming disagreeing
    ranks.  A rank whose `digest` is not 32 bytes joins the gather all the same (probe55: its peers waited in it),
    flagged in a status word beside the digest (no digest value means "failed": rev55), and raises after it; the
    others raise PeerInputError naming it."""
    own, wrong = _digest_bytes(digest)
    if group_size(group) == 1:
        if wrong is not None:
            raise wrong
        return
    rows = gather_digests(bytes([wrong is not None]).ljust(8, b"\0") + (own or bytes(32)), group, call="plan digest")
    failed = [rank for rank, row in enumerate(rows) if row[0]]
    if wrong is not None:
        raise wrong
    if failed:
        raise PeerInputError(f"ranks {failed} passed check_agreement a digest that is not 32 bytes (each raised why); "
                             f"rank {group_rank(group)} stops with them")
    digests = [row[8:] for row in rows]
    problem = disagreement(digests, what, group_rank(group), show=lambda value: value.hex()[:12])
    if problem:
        raise PlanMismatchError(f"{problem}; every rank must run the same solver, version and configuration "
                                f"on the same metadata")

"""Context-parallel attention over a packed varlen batch: split items attend over their whole item, exactly.

A rank's packed micro-batch holds sequences one after another along dim 0: whole (unsplit)
sequences, and shards of split items. A split item of length l runs on a group of c ranks in
the zigzag layout of `balancers.context_parallel.layout` (group rank k holds chunks k and
2c − 1 − k, with their unsplit positions), so causal attention work is equal across the group.

    out = context_parallel_attention(q, k, v, layout)        # q: (tokens, heads, dim), packed
    # every token of a split item attends to every earlier token of the WHOLE item;
    # unsplit sequences attend within themselves, as the ordinary varlen path does

How: the K/V all-gather of the Llama 3 paper, by point-to-point sends on the existing process
group. Each rank sends the K/V rows of its shard to the other ranks of the group in one
`batch_isend_irecv` per call (one message per peer, all split items of the call together),
then runs SDPA for each of its two chunks against the gathered keys up to the chunk's end
(a lower-right causal mask: positions are the unsplit ones). An autograd.Function wraps the
exchange: its backward sends each peer the gradient of the keys it sent, and sums what comes
back into the owner's rows, so the gradients are the unsplit item's up to summation order.
Causally, group rank k needs keys only up to the end of its last chunk, so only that prefix of
each shard is sent: a quarter of the all-gather's bytes saved. The key padding mask rides in
the same message as one column, so the group ranks' messages always agree in size.

Why all-gather, not ring: one round per layer instead of c − 1 dependent rounds (each a
latency, and on gloo a blocking step), shards of unequal length (the layout's ±1 token) and
several items per call are natural, and the backward is plain autograd through SDPA. Ring
would hold two shards of K/V per rank instead of the item's prefix (l · 2 · d_kv per layer);
with grouped-query attention K/V is small next to Q, which is why Llama 3 chose the
all-gather for document masks too. Why not torch's `context_parallel`
(`torch.distributed.tensor.experimental._context_parallel`): it shards whole fixed-length
batches (every sequence divisible by 2c, the same c) over a DeviceMesh by monkey-patching
SDPA, and its rotaters and `flex_cp_allgather` are collectives over the mesh's process group;
we need one item of a packed varlen batch over a per-item group of ranks, with unsplit
sequences beside it, and no process group per step. We use its head–tail layout (as the
zigzag) and SDPA's `causal_lower_right` bias, and write the exchange.

Safety: `ContextParallelLayout.build` is a collective on the process group (one all-gather of
a digest, once per micro-batch, not per layer): every rank, in a group or not, checks its own
sequences against the split items (a rank named in a group holds exactly its shard), and the
split items must agree on every rank; a failure is an error on every rank (the failing rank
says why, the others raise `PeerInputError` naming it), never a hang. During attention only a
group's ranks exchange, each with the peers the agreed layout names; a peer that died or
never reached the call surfaces at the process group's timeout as `ContextParallelError`
naming the items and groups; peers whose keys and values differ in dtype or shape raise it at
once, before any payload (one header row per peer at a layout's first call, and at an earlier layout's
first call in a new epoch of its group, where a stale layout is named: `cp_rows.py`); peers of a group calling
with other `causal`s or in other grad modes raise it at the first call in that mode (`cp_flags.py`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ..balancers.context_parallel.layout import chunk_sizes, shard_positions
from ..balancers.validation import as_bool, as_index, as_int, is_int
from .agreement import PlanMismatchError, disagreement, fingerprint
from .comm import group_rank, group_size
from .cp_flags import flag_column, gathered_valid
from .cp_rows import ContextParallelError, check_rows, epoch, note_epoch
from .metadata import FAILED_INPUT, PeerInputError, gather_digests

__all__ = ["ContextParallelError", "ContextParallelLayout", "SplitItem", "context_parallel_attention"]


# ~1000x the longest trained sequences: a wrong unit or an overflowed count, caught before positions are allocated
MAX_TOKENS = 2**32  # not a memory bound: positions are made whole, 8 bytes a token (32 GiB here) on each group rank


def _as_length(value, name: str) -> int:
    """A sequence's length: an int in [0, MAX_TOKENS], refused before its positions are allocated (probe55 N4: a split
    item of 2**40 tokens raised MemoryError making 8 TiB of them)."""
    length = as_int(value, name, minimum=0)
    if length > MAX_TOKENS:
        raise ValueError(f"`{name}` must be at most 2**32 tokens (its positions are made whole, 8 bytes a token: a "
                         f"split item's on each rank of its group); got {length}")
    return length


@dataclass(frozen=True)
class SplitItem:
    """An item split over a group of ranks: its id, its unsplit length, the ranks holding shards 0..c−1.

    >>> SplitItem(item=7, length=10, group=(2, 3)).degree
    2
    >>> SplitItem(item=7, length=10, group=(2, 2))
    Traceback (most recent call last):
    ...
    ValueError: `group` of split item 7 must hold one or more distinct ranks; got (2, 2)
    """

    item: int
    length: int
    group: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "item", as_int(self.item, "item"))
        object.__setattr__(self, "length", _as_length(self.length, f"length of split item {self.item}"))
        if isinstance(self.group, (str, bytes)) or not hasattr(self.group, "__iter__"):
            raise TypeError(f"`group` of split item {self.item} must be a sequence of ranks; got "
                            f"{type(self.group).__name__}")
        group = tuple(as_int(rank, f"group of split item {self.item}", minimum=0) for rank in self.group)
        if not group or len(set(group)) != len(group):
            raise ValueError(f"`group` of split item {self.item} must hold one or more distinct ranks; got {group}")
        object.__setattr__(self, "group", group)

    @property
    def degree(self) -> int:
        return len(self.group)


@dataclass(frozen=True)
class _Run:
    """Query rows [start, end) attending to key rows [key_start, key_start + key_end) of the local
    K/V (`gathered` False) or of the gathered buffer (True), under a lower-right causal mask."""

    start: int
    end: int
    key_start: int
    key_end: int
    gathered: bool


@dataclass(frozen=True, eq=False)
class _Exchange:
    """What one rank sends and receives for one attention call, and its query runs (numpy indices)."""

    runs: tuple[_Run, ...]
    send_rows: dict  # peer -> packed rows sent to it (its keys), int64
    recv_index: dict  # peer -> buffer rows its keys fill, int64
    own_rows: np.ndarray  # packed rows of this rank's shards ...
    own_index: np.ndarray  # ... and the buffer rows they fill
    buffer_rows: int
    peer_items: dict  # peer -> "split item 7 on group (0, 1), ..." for error messages
    cache: dict = field(default_factory=dict)
    agreed: dict = field(default_factory=dict)  # grad mode -> its first call's "mask", whether its keys had "padding"
    schemas: dict = field(default_factory=dict)  # row schema its peers agreed on -> the group's builds then

    def indices(self, device) -> dict:
        """The index arrays as int64 tensors on `device` (made once per device)."""
        if device not in self.cache:
            tensor = functools.partial(torch.as_tensor, dtype=torch.int64, device=device)
            self.cache[device] = {"own_rows": tensor(self.own_rows), "own_index": tensor(self.own_index),
                                  "send_rows": {p: tensor(rows) for p, rows in self.send_rows.items()},
                                  "recv_index": {p: tensor(rows) for p, rows in self.recv_index.items()}}
        return self.cache[device]


@dataclass(frozen=True, eq=False)
class ContextParallelLayout:
    """This rank's packed sequences (an int: an unsplit sequence of that length; a `SplitItem`: this
    rank's shard of it) and the micro-batch's split items (the same on every rank). Build it with
    `build`, which checks it on every rank.

    >>> split = SplitItem(item=0, length=4, group=(0,))
    >>> layout = ContextParallelLayout.build([3, split], [split])
    >>> layout.lengths, layout.positions().tolist()
    ((3, 4), [0, 1, 2, 0, 1, 2, 3])
    """

    rank: int
    sequences: tuple
    splits: tuple[SplitItem, ...]
    lengths: tuple[int, ...]
    group: object = None  # the process group whose ranks `splits` names (None: the world)
    epoch: int = 0  # the group's layout epoch when it was made (`cp_rows`: a stale layout is named)
    exchanges: dict = field(default_factory=dict)  # causal -> _Exchange, made on first use

    @classmethod
    def build(cls, sequences, splits, *, group=None) -> "ContextParallelLayout":
        """Check this rank's `sequences` against `splits` (every split item of the micro-batch, the same on
        every rank), then agree on every rank of `group`: a collective, every rank calls it, in a split
        group or not.  It begins a layout epoch of `group` (a layout is valid in its epoch only: `planned`)."""
        rank = group_rank(group)
        try:
            sequences, splits = _checked(rank, group_size(group), sequences, splits)
            digest = fingerprint(tuple((s.item, s.length, s.group) for s in splits))
        except (TypeError, ValueError) as error:
            _agree(FAILED_INPUT, group)
            raise type(error)(f"rank {rank}: {error}") from None
        _agree(digest, group)
        note_epoch(group)  # an exchange of an earlier layout swaps its header again (a stale layout: `cp_rows`)
        return cls(rank, sequences, splits, _shard_lengths(rank, sequences), group, epoch(group))

    @classmethod
    def planned(cls, rank: int, world_size: int, sequences, splits, *, group=None) -> "ContextParallelLayout":
        """Rank `rank`'s layout (of `world_size` ranks of `group`) from a plan every rank already agreed on
        (the dispatcher's: the groups, degrees and chunks ride in the plan word its exchange checks on
        every rank): no collective.  Valid in its group's layout epoch when made (a recompute within it stays exact):
        kept on one rank past a `build` or a runtime's input exchange it is refused (an equal one too), past a
        micro-batch a loop reached where its split items differ; with no epoch since, it is not caught (`cp_rows`)."""
        world_size = as_int(world_size, "world_size", minimum=1)  # (probe55: rank 3 of 2 and 0 ranks were taken)
        rank = as_index(rank, "rank", world_size, "world_size")
        sequences, splits = _checked(rank, world_size, sequences, splits)
        return cls(rank, sequences, splits, _shard_lengths(rank, sequences), group, epoch(group))

    @property
    def num_tokens(self) -> int:
        return sum(self.lengths)

    def positions(self, device=None) -> torch.Tensor:
        """Each packed token's position in its unsplit item (RoPE / position ids), int64."""
        parts = [np.arange(entry, dtype=np.int64) if is_int(entry) else
                 shard_positions(entry.length, entry.degree, entry.group.index(self.rank))
                 for entry in self.sequences]
        return torch.as_tensor(np.concatenate(parts) if parts else np.zeros(0, np.int64), device=device)

    def exchange(self, causal: bool) -> _Exchange:
        """Sends, receives and query runs of an attention call (made once per layout and mask kind)."""
        if causal not in self.exchanges:
            self.exchanges[causal] = _plan_exchange(self, causal)
        return self.exchanges[causal]


def _shard_lengths(rank: int, sequences: tuple) -> tuple[int, ...]:
    """Tokens of each packed sequence on `rank`: its length, or its shard's."""
    return tuple(entry if is_int(entry) else len(shard_positions(entry.length, entry.degree, entry.group.index(rank)))
                 for entry in sequences)


def _as_tuple(values, name: str, what: str) -> tuple:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"`{name}` must be a sequence of {what}; got {type(values).__name__}")
    return tuple(values)


def _checked(rank: int, world_size: int, sequences, splits) -> tuple[tuple, tuple]:
    """This rank's sequences (ints, SplitItems) and the split items, checked against each other."""
    sequences = tuple(entry if isinstance(entry, SplitItem) else _as_length(entry, "sequences entry")
                      for entry in _as_tuple(sequences, "sequences", "lengths and SplitItems"))
    splits = _as_tuple(splits, "splits", "SplitItems")
    if not all(isinstance(split, SplitItem) for split in splits):
        raise TypeError("`splits` must hold SplitItems")
    ids = [split.item for split in splits]
    if len(set(ids)) != len(ids):
        raise ValueError(f"`splits` must name each item once; got items {ids}")
    for split in splits:
        if max(split.group) >= world_size:
            raise ValueError(f"split item {split.item}'s group {split.group} names ranks beyond the "
                             f"{world_size} ranks of the process group")
    held = [entry for entry in sequences if isinstance(entry, SplitItem)]
    for entry in held:
        if entry not in splits:
            raise ValueError(f"`sequences` holds a shard of split item {entry.item} that `splits` does not list")
        if rank not in entry.group:
            raise ValueError(f"`sequences` holds a shard of split item {entry.item}, whose group "
                             f"{entry.group} does not name rank {rank}")
    for split in splits:
        count = held.count(split)
        if rank in split.group and count != 1:
            raise ValueError(f"rank {rank} is named in the group {split.group} of split item {split.item} "
                             f"but `sequences` holds {count} shards of it (must hold exactly one)")
    return sequences, splits


def _agree(digest: bytes, group) -> None:
    """All-gather each rank's digest of the split items (FAILED_INPUT: its own checks failed); raise
    PeerInputError naming failed ranks, PlanMismatchError naming ranks with other split items."""
    if group_size(group) == 1:
        return
    digests = gather_digests(digest, group)
    failed = [rank for rank, value in enumerate(digests) if value == FAILED_INPUT]
    if failed and digest != FAILED_INPUT:
        raise PeerInputError(f"ranks {failed} failed their own context-parallel layout checks (each raised why); "
                             f"rank {group_rank(group)} stops with them")
    problem = None if failed else disagreement(digests, "context-parallel `splits`", group_rank(group),
                                               show=lambda value: value.hex()[:12])
    if problem:
        raise PlanMismatchError(f"{problem}; every rank must pass the same `splits` (the plan's split items)")


def _plan_exchange(layout: ContextParallelLayout, causal: bool) -> _Exchange:
    """Per split shard: send each group peer the prefix of this shard's keys it needs (all of it when
    not causal), receive theirs into a buffer of this item's keys up to this shard's last position."""
    runs, send, recv, peer_items, own_rows, own_index = [], {}, {}, {}, [], []
    buffer_rows, start = 0, 0
    for entry, length in zip(layout.sequences, layout.lengths):
        if is_int(entry):
            if length:
                runs.append(_Run(start, start + length, start, length, False))
            start += length
            continue
        me = entry.group.index(layout.rank)
        positions = [shard_positions(entry.length, entry.degree, rank) for rank in range(entry.degree)]
        need = [0 if not p.size else int(p[-1]) + 1 if causal else entry.length for p in positions]
        mine, base = positions[me], buffer_rows
        buffer_rows += need[me]
        own_rows.append(start + np.arange(mine.size))
        own_index.append(base + mine)
        for other, peer in enumerate(entry.group):
            sent = np.searchsorted(mine, need[other])  # a shard's keys are its positions, ascending
            received = positions[other][positions[other] < need[me]]
            if other != me and (sent or received.size):  # keyed by item: a peer may pack its shards in another order
                send.setdefault(peer, []).append((entry.item, start + np.arange(sent)))
                recv.setdefault(peer, []).append((entry.item, base + received))
                peer_items.setdefault(peer, []).append((entry.item, f"split item {entry.item} on group {entry.group}"))
        # one run per chunk, also where the two chunks meet (group rank c - 1): one run over both would attend a
        # rectangle of (c + 1) / c times the others' area wherever SDPA computes the masked part (CPU, math kernel)
        chunk = int(chunk_sizes([entry.length], entry.degree)[0, me])
        for first, last in ((0, chunk), (chunk, mine.size)):
            if last > first:
                key_end = int(mine[last - 1]) + 1 if causal else entry.length
                runs.append(_Run(start + int(first), start + int(last), base, key_end, True))
        start += length
    return _Exchange(tuple(runs), {p: _concat(_by_item(v)) for p, v in send.items()},
                     {p: _concat(_by_item(v)) for p, v in recv.items()}, _concat(own_rows), _concat(own_index),
                     buffer_rows, {p: ", ".join(_by_item(v)) for p, v in peer_items.items()})


def _by_item(keyed: list) -> list:
    """The values of (item, value) pairs in item order: the order both ends of a peer pair agree on, whatever order
    each packed its shards in (probe23 P23-01: rows were sent in the sender's packing order and read in the
    receiver's)."""
    return [value for _, value in sorted(keyed, key=lambda pair: pair[0])]


def _concat(parts: list) -> np.ndarray:
    return np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, np.int64)


def _p2p(sends: dict, recvs: dict, exchange: _Exchange, group, phase: str) -> None:
    """Post every send and receive of one call at once (`batch_isend_irecv`) and wait for them."""
    ops = []
    for peer in sorted(sends):  # the same peers both ways (some messages may be empty)
        target = peer if group is None else dist.get_global_rank(group, peer)
        if sends[peer].numel():
            ops.append(dist.P2POp(dist.isend, sends[peer], target, group))
        if recvs[peer].numel():
            ops.append(dist.P2POp(dist.irecv, recvs[peer], target, group))
    if not ops:
        return
    try:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    except RuntimeError as error:  # DistBackendError, gloo's closed connection or timeout
        partners = "; ".join(f"rank {peer}: {exchange.peer_items[peer]}" for peer in sorted(sends))
        raise ContextParallelError(f"context-parallel attention on rank {group_rank(group)}: the K/V exchange "
                                   f"({phase}) with its group peers failed ({partners}); a peer died or did not "
                                   f"reach this call within the process group's timeout: {error}") from error


class _GatherKeys(torch.autograd.Function):
    """Forward: this rank's buffer of every split item's keys it attends to (own rows + peers').
    Backward: each peer gets the gradient of the rows it sent; the owners sum what comes back.  `anchor`, a scalar
    that needs grad wherever grad is on, makes every rank record alike: a rank whose own keys need no grad (a frozen
    LLM's text shard beside a peer's image tokens) still sends its peers the gradient of the keys it received."""

    @staticmethod
    def forward(ctx, rows: torch.Tensor, exchange: _Exchange, group, anchor: torch.Tensor) -> torch.Tensor:
        index = exchange.indices(rows.device)
        sends = {p: rows[index["send_rows"][p]] for p in exchange.send_rows}
        recvs = {p: rows.new_empty(len(exchange.recv_index[p]), rows.shape[1]) for p in exchange.recv_index}
        _p2p(sends, recvs, exchange, group, "forward")
        buffer = rows.new_empty(exchange.buffer_rows, rows.shape[1])
        buffer[index["own_index"]] = rows[index["own_rows"]]
        for peer, received in recvs.items():
            buffer[index["recv_index"][peer]] = received
        ctx.exchange, ctx.group, ctx.shape = exchange, group, rows.shape
        return buffer

    @staticmethod
    def backward(ctx, grad_buffer: torch.Tensor):
        exchange, index = ctx.exchange, ctx.exchange.indices(grad_buffer.device)
        keys = ctx.shape[1] - 1  # the padding column takes no gradient and is not sent back
        grad = grad_buffer[:, :keys]
        sends = {p: grad[index["recv_index"][p]] for p in exchange.recv_index}
        recvs = {p: grad.new_empty(len(exchange.send_rows[p]), keys) for p in exchange.send_rows}
        _p2p(sends, recvs, exchange, ctx.group, "backward")
        grad_rows = grad.new_zeros(ctx.shape)
        grad_rows[:, :keys].index_add_(0, index["own_rows"], grad[index["own_index"]])
        for peer, received in recvs.items():
            grad_rows[:, :keys].index_add_(0, index["send_rows"][peer], received)
        return grad_rows, None, None, None


def _attend(query, key, value, valid, run: _Run, causal: bool, scale) -> torch.Tensor:
    """SDPA of one run's queries (the last end − start positions before key_end) against its keys."""
    length = run.end - run.start
    keys = slice(run.key_start, run.key_start + run.key_end)
    q, k, v = query[run.start:run.end].transpose(0, 1), key[keys].transpose(0, 1), value[keys].transpose(0, 1)
    if valid is not None:  # padding: an explicit mask (fully masked rows give zeros, as SDPA does)
        mask = valid[keys].unsqueeze(0).expand(length, -1)
        if causal:
            lower_right = torch.ones(length, run.key_end, dtype=torch.bool, device=mask.device)
            mask = mask & lower_right.tril(run.key_end - length)
    else:
        mask = causal_lower_right(length, run.key_end) if causal else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[0] != k.shape[0])
    return out.transpose(0, 1)


def context_parallel_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               layout: ContextParallelLayout, *, causal: bool = True,
                               key_padding_mask: torch.Tensor | None = None,
                               scale: float | None = None) -> torch.Tensor:
    """Attention of this rank's packed sequences, each split item over its whole item; (tokens, heads, dim_v).

    `query` (tokens, heads, dim), `key` (tokens, kv_heads, dim), `value` (tokens, kv_heads, dim_v),
    packed in `layout`'s order; kv_heads divides heads (grouped-query attention). `key_padding_mask`
    (tokens,) bool, True where a token is padding: no query attends to it (a query with no key left
    gets zeros). The ranks of a split item's group call it together, with the same `causal` (else every
    one of them raises ContextParallelError); a rank may pass no mask where its shard has no padding
    (each key's validity travels with it).  The first call with a layout and `causal` checks both on the
    host (one sync per micro-batch, not per layer: a rank that calls a layout with both `causal`s checks
    every call); later calls must pad no token the first did not (the same mask, or None), else that rank
    raises ContextParallelError and its peers do at their next exchange with it.  The ranks of a group must also
    run it in one grad mode (grad enabled on all of them, or on none; a rank whose keys need no grad, a frozen LLM's
    text shard, still sends its peers the gradient of the keys it received): the first call with a layout in each
    mode reads the peers' mode with the flags, and ranks that differ there raise ContextParallelError, not a later
    abort or misread keys (what is caught on one side only: `cp_flags`).

    >>> split = SplitItem(item=0, length=4, group=(0,))
    >>> layout = ContextParallelLayout.build([2, split], [split])
    >>> q = k = v = torch.ones(6, 1, 2)
    >>> context_parallel_attention(q, k, v, layout).shape
    torch.Size([6, 1, 2])
    """
    tokens = _check_inputs(query, key, value, layout, key_padding_mask)
    causal = as_bool(causal, "causal")
    exchange = layout.exchange(causal)
    valid = None if key_padding_mask is None else ~key_padding_mask
    local = gathered = (key, value, valid)
    if exchange.buffer_rows or exchange.send_rows:
        # each row's flag column carries its padding, `causal` and grad mode to the peers (`cp_flags`)
        check_rows(key, value, exchange, layout, _p2p)  # before a payload of another size aborts (`cp_rows`)
        records = torch.is_grad_enabled()  # _GatherKeys records wherever grad is on: its anchor needs grad
        rows = torch.cat([key.reshape(tokens, -1), value.reshape(tokens, -1),
                          flag_column(tokens, valid, causal, records, key)], dim=1)
        buffer = _GatherKeys.apply(rows, exchange, layout.group, rows.new_zeros(()).requires_grad_(records))
        gathered = (buffer[:, :key[0].numel()].reshape(-1, *key.shape[1:]),
                    buffer[:, key[0].numel():-1].reshape(-1, *value.shape[1:]),
                    gathered_valid(buffer[:, -1].detach(), causal, records, exchange, layout.group,
                                   key_padding_mask, every_call=len(layout.exchanges) > 1))
    outputs = [_attend(query, *(gathered if run.gathered else local), run, causal, scale) for run in exchange.runs]
    if not outputs:  # no token: an empty output that keeps q, k, v in the graph (every parameter gets a gradient)
        return (query.sum() + key.sum() + value.sum()) * value.new_zeros(0, query.shape[1], value.shape[2])
    return torch.cat(outputs)


def _check_inputs(query, key, value, layout, key_padding_mask) -> int:
    """The packed rows' count and shapes against `layout`; the number of tokens."""
    if not isinstance(layout, ContextParallelLayout):
        raise TypeError(f"`layout` must be a ContextParallelLayout; got {type(layout).__name__}")
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor) or tensor.ndim != 3:
            raise ValueError(f"`{name}` must be a (tokens, heads, dim) tensor; got "
                             f"{tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__}")
        if tensor.shape[0] != layout.num_tokens:
            raise ValueError(f"rank {layout.rank}: `{name}` has {tensor.shape[0]} rows but the layout packs "
                             f"{layout.num_tokens} tokens (sequences of {list(layout.lengths)})")
        if min(tensor.shape[1:]) < 1:
            raise ValueError(f"`{name}` must have at least one head and a head dim >= 1; got shape "
                             f"{tuple(tensor.shape)}")
    if len({query.dtype, key.dtype, value.dtype}) > 1 or len({query.device, key.device, value.device}) > 1:
        raise ValueError(f"`query`, `key` and `value` must share one dtype and device; got "
                         f"{', '.join(f'{t.dtype} on {t.device}' for t in (query, key, value))}")
    if key.shape[:2] != value.shape[:2] or query.shape[2] != key.shape[2] or query.shape[1] % key.shape[1]:
        raise ValueError(f"`key` {tuple(key.shape)} and `value` {tuple(value.shape)} must have the same heads, "
                         f"`query` {tuple(query.shape)} a multiple of them and key's dim")
    if key_padding_mask is not None and (not isinstance(key_padding_mask, torch.Tensor)
                                         or key_padding_mask.dtype != torch.bool
                                         or key_padding_mask.shape != (layout.num_tokens,)):
        raise ValueError(f"`key_padding_mask` must be a bool tensor of shape ({layout.num_tokens},)")
    return layout.num_tokens

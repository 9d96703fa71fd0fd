"""Payload exchange: move packed per-item tensors along a route, in one all-to-all.

A route is a frozen `ExchangeMeta`: item i (global index, items listed rank by rank as the
metadata all-gather lists them) sits on `source_ranks[i]` and must reach
`dest_ranks[i]`.  On every rank, the items it holds are laid out in ascending global index
(for the home layout that is the order the rank sampled them), both before and after an
exchange.  A tensor is packed over items along dim 0: item i owns `item_rows[i]` rows
(its tokens, patches or frames; 1 for per-item tensors such as grid sizes), any dtype,
any trailing shape.

    send: rows of local items sorted by (dest, index) -> bytes -> one all_to_all_single
    recv: segments arrive by source rank -> reorder rows to ascending global index

Because every rank knows the whole route and every item's row count from the metadata,
all splits are computed locally before any payload moves (the split "exchange" is the
metadata all-gather), and the inverse route (`meta.inverse()`) needs no communication to
set up.  Several tensors, even on different routes (raw images to vision ranks, audio to
audio ranks, text to LLM ranks), are fused into a single all-to-all of bytes.
`exchange_with_grad` wraps the same exchange in an autograd Function whose backward
sends the gradients back along the inverse route (one fused all-to-all).

A route carries the identity of the plan it was built from (`plan_id`, which the runtime
derives from what the metadata all-gather gathered), so a guarded exchange can check, before
any payload moves, that every rank follows the same plan (see `agreement.py`): a rank that
exchanges along an earlier step's plan would otherwise move wrong rows silently when the row
counts happen to match, and abort every process in gloo when they do not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, NamedTuple, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..balancers.validation import EXACT_INTEGERS, as_array, as_non_negative_integers, is_int
from .agreement import PieceSchema, SchemaGuard
from .alltoall import FlatAllToAll, Flows
from .comm import collective, comm_device, group_rank, group_size

RIDE_MAX_RANKS = 8
"""Largest group whose exchange headers ride in the payload all-to-all.  A riding header (24 bytes) goes to every
peer, so a sparse plan's all-to-all over more ranks would message peers it never reaches (probe24 P24-06: 16 -> 511
peers a rank at D = 512 x 16 items; NCCL posts one send and receive a non-empty split); the header all-reduce
is one collective of O(log D) steps instead."""


def _as_ranks(values, name: str, world_size: int) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D; got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"`{name}` must hold integer ranks; got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.int64)
    bad = np.flatnonzero((array < 0) | (array >= world_size))
    if bad.size:
        raise ValueError(f"`{name}` must be ranks in [0, {world_size}); got {array[bad[0]]} at index {bad[0]}")
    array.setflags(write=False)
    return array


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for every (s, l), int64."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    block_starts = np.cumsum(lengths) - lengths
    return np.repeat(starts - block_starts, lengths) + np.arange(total, dtype=np.int64)


def home_ranks(counts) -> np.ndarray:
    """Source rank of every item when rank r contributed counts[r] items, rank by rank."""
    counts = np.asarray(counts, dtype=np.int64)
    return np.repeat(np.arange(counts.size, dtype=np.int64), counts)


@dataclass(frozen=True, eq=False)
class ExchangeMeta:
    """A frozen route: item i moves from `source_ranks[i]` to `dest_ranks[i]`.

    Built identically on every rank; `rank` says which end this copy serves; `plan_id` is the
    identity of the plan it follows (a signed 64-bit word; 0: none given), equal on every rank
    for the same step, checked by guarded exchanges.
    """

    source_ranks: np.ndarray
    dest_ranks: np.ndarray
    rank: int
    world_size: int
    plan_id: int = 0
    send_items: np.ndarray = field(init=False, repr=False)  # global ids of my items, send order
    source_items: np.ndarray = field(init=False, repr=False)  # global ids of my items before
    dest_items: np.ndarray = field(init=False, repr=False)  # global ids of my items after
    arrival_order: np.ndarray = field(init=False, repr=False)  # dest_items[arrival_order] = arrival sequence

    def __post_init__(self) -> None:
        for name in ("rank", "world_size", "plan_id"):
            value = getattr(self, name)
            if not is_int(value):
                raise TypeError(f"`{name}` must be an int; got {type(value).__name__}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"`rank` must be in [0, world_size={self.world_size}); got {self.rank}")
        source = _as_ranks(self.source_ranks, "source_ranks", self.world_size)
        dest = _as_ranks(self.dest_ranks, "dest_ranks", self.world_size)
        if source.shape != dest.shape:
            raise ValueError(f"`source_ranks` and `dest_ranks` must have one entry per item; "
                             f"got {source.size} and {dest.size}")
        mine = np.flatnonzero(source == self.rank)
        send_items = mine[np.argsort(dest[mine], kind="stable")]
        dest_items = np.flatnonzero(dest == self.rank)
        arrival_order = np.argsort(source[dest_items], kind="stable")
        for name, value in (("source_ranks", source), ("dest_ranks", dest), ("send_items", send_items),
                            ("source_items", mine), ("dest_items", dest_items),
                            ("arrival_order", arrival_order)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)
        object.__setattr__(self, "rank", int(self.rank))
        object.__setattr__(self, "world_size", int(self.world_size))
        object.__setattr__(self, "plan_id", int(self.plan_id))

    @classmethod
    def from_assignment(cls, assignment, counts, rank: int, plan_id: int = 0) -> "ExchangeMeta":
        """Route from the home layout (rank r holds counts[r] items) to a plan's assignment."""
        counts = as_non_negative_integers(as_array(counts, "counts", "item counts, one per rank"), "counts")
        if counts.ndim != 1:
            raise ValueError(f"`counts` must be 1-D, one item count per rank; got shape {counts.shape}")
        source = home_ranks(counts)
        if np.asarray(assignment).shape != source.shape:
            raise ValueError(f"`assignment` has {np.asarray(assignment).size} entries but `counts` "
                             f"sum to {source.size} items")
        return cls(source, assignment, rank, int(counts.size), plan_id)

    @property
    def num_items(self) -> int:
        return int(self.source_ranks.size)

    def inverse(self) -> "ExchangeMeta":
        """The route back: every item returns to where it came from, in the same layout."""
        return ExchangeMeta(self.dest_ranks, self.source_ranks, self.rank, self.world_size, self.plan_id)

    def item_rows(self, rows) -> np.ndarray:
        """Rows per item as a global int64 array (an int means that many rows per item), of fewer than 2**53 rows
        in all (offsets and counts stay exact, in int64 and in float64 weights: probe55 N3, 2 items of 2**62 rows
        summed to -2**63)."""
        if is_int(rows):
            if rows < 0:
                raise ValueError(f"`item_rows` must be >= 0; got {rows}")
            _check_total(int(rows) * self.num_items, f"{self.num_items} items of {int(rows)} rows")
            return np.full(self.num_items, int(rows), dtype=np.int64)
        array = np.asarray(rows)
        if array.shape != (self.num_items,) or (array.size and array.dtype.kind not in "iu"):
            raise ValueError(f"`item_rows` must be an int or one integer row count per item "
                             f"({self.num_items}); got shape {array.shape}, dtype {array.dtype}")
        if array.size and array.min() < 0:
            raise ValueError("`item_rows` must be non-negative")
        rough = float(array.sum(dtype=np.float64))  # no wrap-around, and a bound of the exact sum below 2**62
        _check_total(rough if rough >= 2.0**62 else int(array.sum(dtype=np.uint64)), f"{array.size} items")
        return array.astype(np.int64, copy=False)

    def send_counts(self, rows: np.ndarray) -> np.ndarray:
        """Rows this rank sends to each rank."""
        return np.bincount(self.dest_ranks[self.send_items], weights=rows[self.send_items],
                           minlength=self.world_size).astype(np.int64)

    def receive_counts(self, rows: np.ndarray) -> np.ndarray:
        """Rows this rank receives from each rank."""
        return np.bincount(self.source_ranks[self.dest_items], weights=rows[self.dest_items],
                           minlength=self.world_size).astype(np.int64)

    def send_row_index(self, rows: np.ndarray) -> np.ndarray:
        """Rows of this rank's packed tensor, in the order they are sent."""
        local_rows = rows[self.source_items]
        offsets = np.cumsum(local_rows) - local_rows
        position = np.searchsorted(self.source_items, self.send_items)
        return ranges(offsets[position], local_rows[position])

    def arrival_row_index(self, rows: np.ndarray) -> np.ndarray:
        """For the output (ascending global index), the row of the arrival buffer to take."""
        arrived_rows = rows[self.dest_items[self.arrival_order]]
        arrival_offsets = np.cumsum(arrived_rows) - arrived_rows
        offset_of_item = np.empty_like(arrival_offsets)
        offset_of_item[self.arrival_order] = arrival_offsets
        return ranges(offset_of_item, rows[self.dest_items])


def _check_total(total, what: str) -> None:
    if total >= EXACT_INTEGERS:
        raise ValueError(f"`item_rows` must total fewer than 2**53 rows over the plan's items; got {total:.6g} "
                         f"({what})")


class Piece(NamedTuple):
    """One tensor to move: its route, the packed tensor, rows per item (int or array), a name (for
    the schema check and its messages), and whether an array `item_rows` counts a per-item tensor's
    rows (split items: a row per group rank) rather than tokens (schema messages say which)."""

    meta: ExchangeMeta
    tensor: torch.Tensor
    item_rows: object = 1
    name: str = ""
    per_item: bool = False


def _take_rows(tensor: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    if index.size == tensor.shape[0] and np.array_equal(index, np.arange(index.size)):
        return tensor
    return tensor.index_select(0, torch.from_numpy(index).to(tensor.device))


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """(rows, *trailing) -> (rows, bytes_per_row) uint8 view."""
    row_elements = int(np.prod(tensor.shape[1:], dtype=np.int64))
    if tensor.numel() == 0:  # empty tensors may carry any strides (e.g. expanded gradients)
        return torch.empty((tensor.shape[0], row_elements * tensor.element_size()), dtype=torch.uint8,
                           device=tensor.device)
    rows = tensor.contiguous().reshape(tensor.shape[0], row_elements)
    if rows.stride(-1) != 1:  # torch calls a tensor contiguous whatever the strides of its size-1 dims
        rows = rows.clone(memory_format=torch.contiguous_format)
    return rows.view(torch.uint8)


def schema_of(pieces: Sequence[Piece]) -> tuple[PieceSchema, ...]:
    """The schema of `pieces` (unnamed pieces are named by position)."""
    return tuple(PieceSchema.of(piece.name or f"#{number}", piece.tensor, piece.item_rows, piece.per_item)
                 for number, piece in enumerate(pieces))


class Reference(NamedTuple):
    """What a guarded exchange expects every rank to pass (`exchange`'s `reference`): pieces along the plan
    `plan_id`, of the schema its guard agreed at its latest exchange; `pieces(schema)` builds zero pieces of a
    schema along that plan (what a rank that passes other pieces sends instead, so every segment has the size
    its peers expect).  Every rank must give the same, from what every rank shares (a plan whose identity
    every rank knows to be one)."""

    plan_id: int
    pieces: Callable


def exchange(pieces: Sequence[Piece], transport=None, stats: dict | None = None, *,
             guard: SchemaGuard | None = None, problem: Exception | None = None,
             reference: Reference | None = None) -> list[torch.Tensor]:
    """Move every piece along its route in one fused all-to-all; returns one tensor per piece.

    Output tensors hold the rows of the items that now sit on this rank, in ascending
    global index, with the input's dtype and trailing shape.  Every rank must pass the
    same pieces in the same order (same dtypes and trailing shapes), along routes of the same
    plan: give a `guard` (one `SchemaGuard` per call site) to have that checked on every rank
    before any payload is taken (see `agreement.py`); `problem` is this rank's own reason not to
    exchange (e.g. an encoder that broke its contract): with a guard, every rank then raises,
    naming this rank.  With a `reference` (the same on every rank), once the guard's latest exchange
    followed its reference, the header rides in the payload all-to-all itself (no collective of its
    own), on groups of up to RIDE_MAX_RANKS ranks.  `transport` is a `FlatAllToAll` (default) or a
    `HierarchicalAllToAll`.
    `stats`, if given, accumulates "exchange_seconds" (wall, packing included) and
    "exchange_bytes_sent" (to other ranks).
    """
    if transport is None:
        transport = FlatAllToAll()
    pieces = _pieces(pieces)
    if not pieces:
        if problem is not None:
            raise problem
        return []
    problem = _problem(pieces, transport) if problem is None else problem
    if guard is None or transport.size == 1:
        if problem is not None:
            raise problem
        return _exchange(pieces, transport, stats)[1]
    schema, plan_id = schema_of(pieces) if problem is None else (), pieces[0].meta.plan_id
    expected = None if reference is None else reference.plan_id
    if transport.size <= RIDE_MAX_RANKS and guard.speculates(expected):  # the header in the payload: pieces of the
        # expected sizes, ours or zeros
        follows = problem is None and schema == guard.schema and plan_id == expected
        sent = pieces if follows else reference.pieces(guard.schema)
        rows, moved = _exchange(sent, transport, stats, guard.what, guard.words(schema, plan_id, problem))
        if guard.settle(rows, schema, expected, transport.group, problem):
            return moved  # else every rank passed the same other pieces (another plan or schema): move them now
    else:
        guard.agree(schema, plan_id, transport.group, problem, expected)
    return _exchange(pieces, transport, stats, guard.what)[1]


DIFFERENTIABLE_FIX = ("but `differentiable` is False: the exchange would move it without its graph, and what made it "
                      "would get no gradient; pass differentiable=True to let its gradient flow back (every rank then "
                      "runs the backward exchange), or .detach() it")

RAW_INPUTS_FIX = ("but the runtime moves raw inputs, text and per-sample tensors without their graph, and what made it "
                  "would get no gradient: compute it inside an encoder (`encoders=`, whose output moves with its "
                  "graph), or .detach() it")


def detached_problem(sources: Mapping[str, object], rank: int, fix: str = DIFFERENTIABLE_FIX) -> RuntimeError | None:
    """Why tensors may not move without their graph (`sources`: name -> a mapping of tensors, e.g. {"batch":
    batch}): one requires grad while autograd records, and what made it would get no gradient, silently (`fix`
    says what to do); or None."""
    if not torch.is_grad_enabled():
        return None
    for source, tensors in sources.items():
        for key, value in (tensors.items() if isinstance(tensors, Mapping) else ()):
            if isinstance(value, torch.Tensor) and value.requires_grad:
                return RuntimeError(f"rank {rank}'s `{source}[{key!r}]` requires grad {fix}")
    return None


def _rows_problem(number: int, piece: Piece, rows: np.ndarray) -> str | None:
    """What is wrong with piece `number`'s row count on this rank (its items own `rows[item]`), or None."""
    expected, items = int(rows[piece.meta.source_items].sum()), piece.meta.source_items.size
    if piece.tensor.shape[0] == expected:
        return None
    hint = ""
    if piece.tensor.shape[0] == items and not (piece.per_item or is_int(piece.item_rows)):  # per item, taken per token
        text = piece.name.startswith("text:")
        hint = (" (one per token: a tensor of one row per sample goes in `per_sample`)" if text
                else " (one per token: every key not in `per_item_keys` is per-token; a tensor of one row per item "
                     "must be listed there)")
    return (f"piece {number} ({piece.name or '?'}): tensor has {piece.tensor.shape[0]} rows but this rank's "
            f"{items} items own {expected} rows{hint}")


def _pieces(pieces) -> list[Piece]:
    """`pieces` as a list of Pieces; else a TypeError (one Piece alone is a tuple of its fields: its route was read
    as piece 0, "'ExchangeMeta' object has no attribute 'meta'")."""
    if isinstance(pieces, Piece) or not hasattr(pieces, "__iter__"):
        got = "one Piece (pass [piece])" if isinstance(pieces, Piece) else type(pieces).__name__
        raise TypeError(f"`pieces` must be a sequence of Pieces; got {got}")
    pieces = list(pieces)
    wrong = next((piece for piece in pieces if not isinstance(piece, Piece)), None)
    if wrong is not None:
        raise TypeError(f"`pieces` must be a sequence of Pieces; got a {type(wrong).__name__} among them")
    return pieces


def _problem(pieces: Sequence[Piece], transport) -> Exception | None:
    """Why this rank's pieces cannot be exchanged (routes for another rank or plan than piece 0's,
    no tensor, the wrong row count), or None."""
    first = pieces[0].meta
    for number, piece in enumerate(pieces):
        meta, tensor = piece.meta, piece.tensor
        label = f"piece {number} ({piece.name or '?'})"  # the key: the user never saw the pieces' order
        if not isinstance(tensor, torch.Tensor):
            return TypeError(f"{label}: expected a torch.Tensor; got {type(tensor).__name__}")
        if tensor.layout != torch.strided:
            return TypeError(f"{label}: a {tensor.layout} tensor cannot be exchanged; "
                             f"pass a dense (strided) tensor (`.to_dense()`)")
        if tensor.is_meta or tensor.device != pieces[0].tensor.device:  # probe29 P29-01: torch.cat's raw error
            other = "" if number == 0 else f", piece 0 ({pieces[0].name or '?'}) on {pieces[0].tensor.device}"
            return ValueError(f"{label}: tensor is on {tensor.device}{other}: every tensor of one exchange must be "
                              f"on one device, the group's ({comm_device(transport.group)}), with data (not `meta`)")
        if (meta.rank, meta.world_size) != (first.rank, first.world_size):
            return ValueError(f"{label}: route is for rank {meta.rank} of {meta.world_size}, "
                              f"piece 0's for rank {first.rank} of {first.world_size}")
        if (meta.world_size, meta.rank) != (transport.size, transport.rank):
            return ValueError(f"{label}: route is for rank {meta.rank} of {meta.world_size} but the "
                              f"transport's group has this process as rank {transport.rank} of {transport.size}")
        if meta.plan_id != first.plan_id:
            return ValueError(f"{label}: route follows plan {meta.plan_id}, piece 0's plan {first.plan_id}: "
                              f"the pieces of one exchange follow one step's plan")
        if tensor.dim() == 0:
            return ValueError(f"{label}: tensor must have a leading item-row dimension; got a scalar")
        try:
            problem = _rows_problem(number, piece, meta.item_rows(piece.item_rows))
        except ValueError as error:
            return error
        if problem is not None:
            return ValueError(problem)
    return None


def _exchange(pieces: Sequence[Piece], transport, stats: dict | None, what: str = "exchange",
              header: np.ndarray | None = None) -> tuple[np.ndarray | None, list[torch.Tensor]]:
    """The fused exchange of pieces `_problem` found nothing wrong with (`what` names it if a peer fails): every
    rank's `header` (int64 words, sent to every rank ahead of its segment; None: none) and the moved tensors."""
    start = time.perf_counter()
    rank, size = pieces[0].meta.rank, pieces[0].meta.world_size
    plans = []
    for piece in pieces:
        meta, tensor = piece.meta, piece.tensor
        rows = meta.item_rows(piece.item_rows)
        row_bytes = int(np.prod(tensor.shape[1:], dtype=np.int64)) * tensor.element_size()
        sent = _as_bytes(_take_rows(tensor, meta.send_row_index(rows)))
        plans.append((meta, tensor, rows, sent, row_bytes))

    chunks = [list(torch.split(sent, meta.send_counts(rows).tolist())) for meta, _, rows, sent, _ in plans]
    head = [] if header is None else [torch.from_numpy(header.view(np.uint8)).to(pieces[0].tensor.device)]
    buffer = torch.cat([part for d in range(size) for part in head + [chunk[d].reshape(-1) for chunk in chunks]])
    flows = Flows(np.concatenate([meta.source_ranks for meta, *_ in plans]),
                  np.concatenate([meta.dest_ranks for meta, *_ in plans]),
                  np.concatenate([rows * row_bytes for _, _, rows, _, row_bytes in plans]), size,
                  sum(part.numel() for part in head))
    with collective(f"{what} payload all-to-all", transport.group):
        arrived = transport(buffer, flows)

    received = np.stack([meta.receive_counts(rows) * row_bytes for meta, _, rows, _, row_bytes in plans], axis=1)
    per_source = torch.split(arrived, (received.sum(axis=1) + flows.pair).tolist())
    headers = None if header is None else torch.stack([segment[:flows.pair] for segment in per_source]).cpu(
        ).numpy().view(np.int64)  # one device-to-host copy for every source's header
    parts = [torch.split(segment[flows.pair:], received[s].tolist()) for s, segment in enumerate(per_source)]
    outputs = []
    for number, (meta, tensor, rows, _, row_bytes) in enumerate(plans):
        num_rows = int(rows[meta.dest_items].sum())
        if row_bytes == 0:
            shaped = tensor.new_empty((num_rows, *tensor.shape[1:]))
        else:
            raw = torch.cat([parts[s][number] for s in range(size)])
            shaped = raw.reshape(num_rows, row_bytes).view(tensor.dtype).reshape(num_rows, *tensor.shape[1:])
        outputs.append(_take_rows(shaped, meta.arrival_row_index(rows)))
    if stats is not None:
        sent = int(buffer.numel() - flows.pair - sum(chunks[p][rank].numel() for p in range(len(plans))))
        stats["exchange_seconds"] = stats.get("exchange_seconds", 0.0) + time.perf_counter() - start
        stats["exchange_bytes_sent"] = stats.get("exchange_bytes_sent", 0) + sent
    return headers, outputs


class _Exchange(torch.autograd.Function):
    """Fused exchange whose backward sends gradients along the inverse routes."""

    @staticmethod
    def forward(ctx, routes, transport, stats, guard, problem, reference, *tensors):
        outputs = exchange([Piece(meta, tensor, rows, name, per_item)
                            for (meta, rows, name, per_item), tensor in zip(routes, tensors)],
                           transport, stats, guard=guard, problem=problem, reference=reference)
        ctx.routes, ctx.transport, ctx.stats, ctx.anchored = routes, transport, stats, len(tensors) > len(routes)
        ctx.shapes = [(output.shape, output.dtype, output.device) for output in outputs]
        ctx.mark_non_differentiable(*[o for o in outputs if not (o.is_floating_point() or o.is_complex())])
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        # Every rank exchanges the gradient of every floating piece (zeros where autograd
        # has none), so all ranks issue the same collective whatever their local graph.
        differentiable = [n for n, (_, dtype, _) in enumerate(ctx.shapes)
                          if dtype.is_floating_point or dtype.is_complex]
        pieces = []
        for n in differentiable:
            shape, dtype, device = ctx.shapes[n]
            grad = grads[n] if grads[n] is not None else torch.zeros(shape, dtype=dtype, device=device)
            meta, rows, *_ = ctx.routes[n]
            pieces.append(Piece(meta.inverse(), grad, rows))
        returned = exchange(pieces, ctx.transport, ctx.stats)
        input_grads = [None] * len(ctx.shapes)
        for n, grad in zip(differentiable, returned):
            input_grads[n] = grad
        return (None, None, None, None, None, None, *input_grads, *[None] * ctx.anchored)


def exchange_with_grad(pieces: Sequence[Piece], transport=None, stats: dict | None = None, *,
                       guard: SchemaGuard | None = None, problem: Exception | None = None,
                       reference: Reference | None = None, record: bool = True) -> list[torch.Tensor]:
    """`exchange` that autograd can differentiate: backward moves the gradients home.

    torch's functional `all_to_all_single_autograd` moves one tensor along one split
    vector; this fuses several tensors on several routes, reorders rows, and runs the
    inverse route (one all-to-all) in backward.  Every rank must backpropagate through
    the outputs (an empty output included, e.g. a rank left with no items), or the
    others wait for its backward collective until the process-group timeout.  `record` (the default;
    where autograd records): the floating outputs require grad also where no input does, so that this
    rank's backward runs the reverse exchange its peers' gradients need, whatever each rank's inputs'
    `requires_grad` (a rank of no items passing fresh zeros beside peers' encoder outputs recorded
    none, and its peers waited in its backward); its cost, where no input on any rank
    requires grad, is the reverse exchange in a backward through the outputs.  `record=False` records
    a node only where an input requires grad: for callers whose inputs agree on `requires_grad` on
    every rank (the multi-stage runtime's encoder outputs: frozen encoders then pay no reverse
    exchange); a rank that disagrees leaves its peers waiting (the runtime tells its `guard` whether it
    records, `SchemaGuard.tell`, and every rank raises where the header says that they differ).
    """
    if transport is None:
        transport = FlatAllToAll()
    pieces = _pieces(pieces)
    if not pieces:
        return exchange(pieces, transport, stats, guard=guard, problem=problem, reference=reference)
    routes = tuple((piece.meta, piece.item_rows, piece.name, piece.per_item) for piece in pieces)
    tensors = [piece.tensor for piece in pieces]
    anchor = [_ANCHOR] if record and torch.is_grad_enabled() and not any(
        isinstance(tensor, torch.Tensor) and tensor.requires_grad for tensor in tensors) else []
    return list(_Exchange.apply(routes, transport, stats, guard, problem, reference, *tensors, *anchor))


def grad_mode_problem(what: str, records: bool, group) -> RuntimeError:
    """The error every rank raises where `what`'s exchange header said that some ranks record its backward (`records`:
    whether this one does) and others do not, so that those would wait in their backward's reverse exchange until
    the collective timeout.  One all-gather, on this error path only, names the ranks."""
    modes = [None] * group_size(group)
    with collective(f"{what} grad mode all-gather", group):
        dist.all_gather_object(modes, (records, torch.is_grad_enabled()), group=group)
    on, off, plain = ([rank for rank, mode in enumerate(modes) if mode == kind] for kind in ((1, 1), (0, 0), (0, 1)))
    why = " and ".join(f"ranks {ranks} {how}" for ranks, how in (
        (off, "under torch.no_grad (or inference_mode)"), (plain, "with differentiable=False")) if ranks)
    return RuntimeError(f"{what} (seen from rank {group_rank(group)}): ranks {on} run it with grad enabled and {why}, "
                        f"so ranks {on} would wait in their backward's reverse exchange until the collective timeout; "
                        f"run it in the same grad mode on every rank, and with the same `differentiable` (in "
                        f"evaluation too: the exchange cannot know whether a backward follows)")


_ANCHOR = torch.zeros((), requires_grad=True)  # an input that records the exchange's node where none other would

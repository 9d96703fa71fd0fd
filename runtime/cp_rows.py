"""The rows a context-parallel attention call sends its group peers, agreed before the first payload.

Each message of the K/V exchange is rows of this rank's keys and values flattened, in their dtype, so
its size follows from the dtype and the key and value shapes (kv heads × head dim), which the plan
does not fix.  A peer whose rows are of another size makes gloo abort its process ("Received data size
doesn't match expected size"), and one of the same size but another layout (bfloat16 beside float16,
2 heads of 4 beside 4 heads of 2) is read as wrong keys without a word (probe55).  So before the first
payload of every row schema an exchange sees, each peer pair swaps one header row: the schema's words
(dtype, key and value shape) and, in the last column where the payload rows carry their flags, a digest
of them, which decides; every rank of a pair whose schemas differ raises `ContextParallelError` naming
both.  A float64 row of a fixed size: it never aborts, whatever the schemas.  A schema agreed once is
not swapped again (the layers of a model share theirs: one header round per micro-batch) until a new
layout epoch of the group (`note_epoch`, counted alike on every rank): a collective (`ContextParallelLayout.build`,
a dispatcher's or multi-stage runtime's input exchange), or a micro-batch that a loop reaches (every rank yields
every micro-batch of a step, in order).  Then an exchange swaps the header again at its next call, and the
header's words carry the layout's epoch (the collectives counted when it was made; the micro-batches reached are
not, as a rank may list a step's micro-batches alone) and a digest of its split items: a rank that kept an
earlier micro-batch's layout (of an earlier step, or another micro-batch of the same step: other split items)
while its peers made new ones swaps its header where they swap theirs, and every rank of the pair raises naming
the stale layout, instead of misreading or aborting on the payload.  A layout used again on every rank (a
recompute) swaps alike and agrees.

Not caught, and not catchable without a header round at every call (one more point-to-point round per layer): a
layout kept by one rank with no epoch since its last call while its peers make new ones (`planned` layouts made
by hand, with no collective and no loop between): the stale rank has no reason to swap a header, so it sends its
payload where its peers send their header, and each posts receives sized from its own layout (gloo aborts the
process on sizes that differ).  Make every rank's layouts alike: after a collective, or in the loops of the
dispatcher and the multi-stage runtime, which count the epochs.  Nor, for the same reason: a rank that lists a
step's micro-batches alone between a forward and its activation-checkpoint recompute (its reached count moves, so
its recompute swaps a header where its peers' does not: gloo aborts; list them before the loop, after the backward,
or on every rank alike).  A rank of a split item's group that runs the attention in another grad mode than its
peers (under `torch.no_grad` where they record: their backward would send gradient rows it never receives,
misread or aborting at its next call) is caught by the flags its rows carry
(`cp_flags`), at the first call on a layout in each grad mode: on every rank of the pair where that call is the
first in their modes for all of them (a pass in another mode on layouts made for the micro-batch), on the changed
rank only past it (a layout kept across passes, one layer in another mode); run a group's attention in one grad mode.
"""

from __future__ import annotations

import weakref
import zlib

import torch

from .comm import group_rank

__all__ = ["ContextParallelError", "agree_rows", "check_rows", "epoch", "note_epoch", "row_schema"]

EPOCHS = weakref.WeakKeyDictionary()  # process group -> its layout epochs (`note_epoch`) here, not keeping it alive
KEPT_EPOCHS: dict = {}  # the same for the world (None) and a group object that takes no weak reference


class ContextParallelError(RuntimeError):
    """A peer of a context-parallel group died, never reached the attention call, or exchanges other rows."""


DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128)


def row_schema(key: torch.Tensor, value: torch.Tensor) -> tuple[int, ...]:
    """The words that fix a row's layout: the dtype's code and the key and value shapes past the tokens."""
    code = DTYPES.index(key.dtype) if key.dtype in DTYPES else 100 + zlib.crc32(str(key.dtype).encode()) % 10**6
    return (code, *key.shape[1:], *value.shape[1:])


def note_epoch(group, collective: bool = True) -> None:
    """A new layout epoch of `group`: a collective after which its layouts are new (a `ContextParallelLayout.build`,
    a dispatcher's or multi-stage runtime's input exchange), which every rank of the group counts alike; or, where
    not `collective`, a micro-batch that a loop reaches, after which an earlier layout's exchange swaps its header
    again but which a layout made then does not carry (`epoch`): a rank that lists a step's micro-batches alone,
    for logging, counts more of them than its peers."""
    counts = _epochs_of(group)
    made, reached = counts.get(group, (0, 0))
    counts[group] = (made + bool(collective), reached + 1)


def epoch(group) -> int:
    """The layout epoch of `group` in this process: how many collectives began one (`note_epoch`); a layout made
    now carries it, and peers compare it at their first exchange."""
    return _epochs_of(group).get(group, (0, 0))[0]


def _events(group) -> int:
    """How many epochs (of either kind) `group` has begun here: an exchange swaps its header again once it grows."""
    return _epochs_of(group).get(group, (0, 0))[1]


def _epochs_of(group):
    """The table that counts `group`'s epochs: EPOCHS, or KEPT_EPOCHS where `group` takes no weak reference."""
    try:
        weakref.ref(group)
    except TypeError:  # None (the world)
        return KEPT_EPOCHS
    return EPOCHS


def splits_digest(layout) -> int:
    """A digest of a layout's split items (the same on every rank of a micro-batch), below 2**32."""
    return zlib.crc32(repr([(split.item, split.length, split.group) for split in layout.splits]).encode())


def check_rows(key: torch.Tensor, value: torch.Tensor, exchange, layout, p2p) -> None:
    """Before an attention call's payload: swap the header with `exchange`'s peers where its row schema is new
    to it, or the layout's group began an epoch since it last swapped (`exchange.schemas`: schema -> `_events`)."""
    schema, now = row_schema(key, value), _events(layout.group)
    if exchange.schemas.get(schema) != now:
        agree_rows(schema, exchange, layout.group, p2p, key.device, splits_digest(layout), layout.epoch)
        exchange.schemas[schema] = now


def _shown(words: list[int]) -> str:
    code, key, value = words[0], words[1:3], words[3:5]
    dtype = DTYPES[code] if 0 <= code < len(DTYPES) else "another dtype"
    return f"{str(dtype).removeprefix('torch.')} keys {tuple(key)}, values {tuple(value)} (heads, dim)"


def agree_rows(schema: tuple[int, ...], exchange, group, p2p, device: torch.device, splits: int, made: int
               ) -> None:
    """Swap `schema`'s header row (with the layout's epoch, `made`, and `splits`, its `splits_digest`) with every
    peer of `exchange` through `p2p` (the call's point-to-point exchange), on `device` (the payload rows': NCCL
    moves no CPU tensor); ContextParallelError naming the peers whose rows, epoch or split items differ, on both
    ranks of each pair.  One host read for all peers' digests."""
    words = torch.tensor((*schema, made, splits), dtype=torch.float64)
    digest = float(zlib.crc32(words.numpy().tobytes()))  # below 2**32: exact in float64
    header = torch.cat([words, torch.tensor([digest], dtype=torch.float64)])[None, :].to(device)
    peers = sorted(exchange.send_rows)
    sends = {peer: header for peer in peers}
    recvs = {peer: torch.zeros_like(header) for peer in peers}
    p2p(sends, recvs, exchange, group, "forward")
    rows = torch.cat([recvs[peer] for peer in peers]).cpu().tolist() if peers else []
    differ = [(peer, row) for peer, row in zip(peers, rows) if row[-1] != digest]
    if stale := [(peer, int(row[-3])) for peer, row in differ if [int(w) for w in row[:-3]] == list(schema)]:
        when = ("other split items, made in the same layout epoch" if all(there == made for _, there in stale) else
                f"this rank's was made in layout epoch {made}: a `build` or an input exchange came between")
        shown = ", ".join(f"rank {peer} ({exchange.peer_items[peer]}; layout epoch {there})" for peer, there in stale)
        raise ContextParallelError(f"context-parallel attention on rank {group_rank(group)}: group peers {shown} "
                                   f"attend with a layout of another micro-batch ({when}); a layout kept from an "
                                   f"earlier micro-batch on some rank? every rank must attend with this micro-batch's "
                                   f"layout")
    if differ:
        theirs = "; ".join(f"rank {peer} ({exchange.peer_items[peer]}): {_shown([int(w) for w in row[:-3]])}"
                           for peer, row in differ)
        raise ContextParallelError(f"context-parallel attention on rank {group_rank(group)}: group peers pass keys "
                                   f"and values of another dtype or shape (here {_shown(list(schema))}; {theirs}); "
                                   f"every rank of a split item's group must run the same model in the same dtype "
                                   f"(the K/V rows they exchange would be misread, or abort the process)")

"""The flag column of a context-parallel K/V exchange's rows: made on the sender, read on the receiver.

Each row a rank sends its group peers ends in one flag: 1 where the row is a key (0: padding), + 2 under a causal
mask, + 4 where the exchange records its backward (grad enabled: `_GatherKeys` records there, whether or not this
rank's keys need grad, so that a rank whose keys need none, a frozen LLM's text shard, still returns its peers'
part).  So a peer's padding reaches ranks that pass no mask, and a peer of the group calling with another `causal`
or in another grad mode is found, with no message of its own: the first call of an exchange (a
layout and `causal`) in a grad mode reads the gathered flags on the host (one sync per micro-batch and grad mode,
not per layer).  The flags are small integers, exact in every floating dtype the rows may have (bfloat16 included).

Why the grad mode: a rank that records sends, in its backward, each peer the gradient of the keys it received; a
peer that did not record never runs that backward, so its next call's receive takes those gradient rows (gloo aborts
the process where the sizes differ, and reads them as keys where they match; fix62). Where the ranks of a pair
differ at such a first call, each raises ContextParallelError in the forward, naming the other and the fix, before
any backward: the common case, a rank running its whole micro-batch pass in another mode on layouts made for that
micro-batch (a `build`, the dispatcher's or the multi-stage runtime's). `agreed` is kept per grad mode, so a rank
whose mode changed on a kept layout reads again. Caught on one side only (a complete catch needs a host read at
every call: one device sync per layer): a rank whose mode differs at a call that is not its peers' first in their
mode (a layout kept across passes, as an RL loop's no-grad log-prob pass and then its training pass on the same
micro-batch with one rank in the other mode; or one layer of a pass under no_grad on one rank) raises at its first
call on the layout in that mode (not at all where it read the layout in that mode before, with its peers alike),
while its peers go on: a recording peer's backward then sends gradient rows that the raising rank's next call
receives (gloo aborts, or misreads). And a pair whose exchange carries keys one way only (only a causal split item
shorter than twice its group's size can make one): only the receiving rank raises, and its peer goes on to its next
exchange.
"""

from __future__ import annotations

import torch

from .comm import group_rank
from .cp_rows import ContextParallelError

__all__ = ["flag_column", "gathered_valid"]


def flag_column(tokens: int, valid, causal: bool, records: bool, like: torch.Tensor) -> torch.Tensor:
    """The (tokens, 1) flags of this rank's rows in `like`'s dtype and device (`valid`: which tokens are keys,
    None: all; `records`: whether the exchange records its backward)."""
    flags = (torch.ones(tokens, 1) if valid is None else valid[:, None]) + (2.0 * causal + 4.0 * records)
    return flags.to(like.dtype).to(like.device)


def gathered_valid(flags: torch.Tensor, causal: bool, records: bool, exchange, group, mask, every_call: bool
                   ) -> torch.Tensor | None:
    """Which gathered keys are no padding (None: all, the unmasked path), from their `flags` as sent.  The first
    call of an exchange (a layout and `causal`) in this rank's grad mode (`records`), or `every_call` (a rank calling
    the layout with both `causal`s), reads the flags on the host: ContextParallelError where a peer's flags say
    another `causal` or grad mode, and whether there is padding.  Other calls read nothing (no host sync per
    layer), but a `mask` other than the first call's is compared with it: a peer that found no padding then
    attends unmasked, so no token may be padded that was not."""
    mode = 2.0 * causal + 4.0 * records
    agreed = exchange.agreed.get(records)
    if agreed and not every_call:
        if mask is not agreed["mask"] and _pads_more(mask, agreed["mask"]):
            raise ContextParallelError(
                f"context-parallel attention on rank {group_rank(group)}: `key_padding_mask` pads tokens that it did "
                f"not pad at the first call with this layout (causal={causal}), where its split items' groups "
                f"({_partners(exchange)}) found their padding; pass every call of a micro-batch the same padding")
        return flags == mode + 1 if agreed["padding"] else None
    bad, padded = torch.stack([((flags != mode) & (flags != mode + 1)).any(), (flags == mode).any()]).tolist()
    if bad:
        raise ContextParallelError(_other_mode(flags, causal, records, exchange, group))
    if not agreed:
        exchange.agreed[records] = {"mask": mask, "padding": bool(padded)}
    return flags == mode + 1 if padded else None


def _other_mode(flags: torch.Tensor, causal: bool, records: bool, exchange, group) -> str:
    """Why a peer's flags differ from this rank's mode (host reads: the error path only)."""
    index = exchange.indices(flags.device)["recv_index"]
    peers = {peer: int(flags[rows[0]]) for peer, rows in sorted(index.items()) if rows.numel()}
    calling = f"context-parallel attention on rank {group_rank(group)}"
    if any((code >> 1) % 2 != causal for code in peers.values()):
        return (f"{calling} with causal={causal}: a peer of its split items' groups ({_partners(exchange)}) called it "
                f"with causal={not causal}; every rank of a split item's group must pass the same `causal`")
    other = sorted(peer for peer, code in peers.items() if code >> 2 != records)
    mine, theirs = ("records", "do not") if records else ("does not record", "do")
    return (f"{calling} {mine} its backward (grad enabled) but ranks {other} of its split items' groups "
            f"({_partners(exchange)}) {theirs}: a recording rank's backward would send gradient rows that its peer "
            f"never receives, misread as keys (or aborting the process) at its next call; run a group's attention in "
            f"one grad mode on every rank (torch.no_grad or inference_mode alike; keys and values that need no grad "
            f"beside a peer's that do are fine)")


def _pads_more(mask, first) -> bool:
    """Whether key padding `mask` pads a token that `first` did not (None: no padding); a host read."""
    if mask is None:
        return False
    return bool((mask if first is None else mask & ~first).any())


def _partners(exchange) -> str:
    return "; ".join(f"rank {peer}: {items}" for peer, items in sorted(exchange.peer_items.items()))

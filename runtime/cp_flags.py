"""The flag column of a context-parallel K/V exchange's rows: made on the sender, read on the receiver.

Each row a rank sends its group peers ends in one flag: 1 where the row is a key (0: padding), + 2 under a causal
mask.  So a peer's padding reaches ranks that pass no mask, and a peer of the group calling with another `causal`
is found, with no message of its own: the first call of an exchange (a layout and `causal`) reads the gathered
flags on the host (one sync per micro-batch, not per layer).  The flags are small integers, exact in every
floating dtype the rows may have (bfloat16 included).
"""

from __future__ import annotations

import torch

from .comm import group_rank
from .cp_rows import ContextParallelError

__all__ = ["flag_column", "gathered_valid"]


def flag_column(tokens: int, valid, causal: bool, like: torch.Tensor) -> torch.Tensor:
    """The (tokens, 1) flags of this rank's rows in `like`'s dtype and device (`valid`: which tokens are keys,
    None: all)."""
    flags = (torch.ones(tokens, 1) if valid is None else valid[:, None]) + 2.0 * causal
    return flags.to(like.dtype).to(like.device)


def gathered_valid(flags: torch.Tensor, causal: bool, exchange, group, mask, every_call: bool) -> torch.Tensor | None:
    """Which gathered keys are no padding (None: all, the unmasked path), from their flags (1 key, 0 padding,
    as `causal` is on every rank of the group).  The first call of an exchange (a layout and `causal`), or
    `every_call` (a rank calling the layout with both `causal`s), reads the flags on the host: ContextParallelError
    where a peer's flags say another `causal`, and whether there is padding.  Other calls read nothing (no host
    sync per layer), but a `mask` other than the first call's is compared with it: a peer that found no padding
    then attends unmasked, so no token may be padded that was not."""
    agreed = exchange.agreed
    if agreed and not every_call:
        if mask is not agreed["mask"] and _pads_more(mask, agreed["mask"]):
            raise ContextParallelError(
                f"context-parallel attention on rank {group_rank(group)}: `key_padding_mask` pads tokens that it did "
                f"not pad at the first call with this layout (causal={causal}), where its split items' groups "
                f"({_partners(exchange)}) found their padding; pass every call of a micro-batch the same padding")
        return flags == 1 if agreed["padding"] else None
    bad, padded = torch.stack([((flags != 0) & (flags != 1)).any(), (flags == 0).any()]).tolist()
    if bad:
        raise ContextParallelError(f"context-parallel attention on rank {group_rank(group)} with causal={causal}: a "
                                   f"peer of its split items' groups ({_partners(exchange)}) called it with "
                                   f"causal={not causal}; every rank of a split item's group must pass the same "
                                   f"`causal`")
    if not agreed:
        agreed.update(mask=mask, padding=bool(padded))
    return flags == 1 if padded else None


def _pads_more(mask, first) -> bool:
    """Whether key padding `mask` pads a token that `first` did not (None: no padding); a host read."""
    if mask is None:
        return False
    return bool((mask if first is None else mask & ~first).any())


def _partners(exchange) -> str:
    return "; ".join(f"rank {peer}: {items}" for peer, items in sorted(exchange.peer_items.items()))

"""A rank's items in a dispatcher's step: its lengths and loss tokens checked before the gather (`local_tables`) and
against a plan (`items_problem`), and an item of the gathered batch named by the rank that sampled it (`named_by_rank`).
"""

from __future__ import annotations

import re

import numpy as np

from .agreement import kept_plan_problem
from .metadata import as_table

GATHERED_ITEM = re.compile(r"(?<!split )\b(item|index) (\d+)\b")  # "item 4", "at index 4" (not "split item 4")


def _given_shape(value, table: np.ndarray) -> tuple:
    """The shape the caller passed (`as_table` makes a 1-D sequence a column: (n,) reads as (n, 1))."""
    try:
        return tuple(np.shape(value))
    except (TypeError, ValueError):  # ragged: `as_table` refused it before this is asked
        return table.shape


def local_tables(lengths, loss_tokens) -> tuple[np.ndarray, np.ndarray]:
    """This rank's (n, 1) lengths and loss tokens, checked: one count per item, each at most the
    item's length (a loss token is one of its tokens)."""
    lengths = as_table(lengths)
    if lengths.shape[1] != 1:
        raise ValueError(f"`lengths` must be 1-D, one length per item; got shape {lengths.shape}")
    losses = lengths if loss_tokens is None else as_table(loss_tokens, "loss_tokens")
    if losses.shape != lengths.shape:
        raise ValueError(f"`loss_tokens` must have one count per item ({lengths.shape[0]}); got shape "
                         f"{_given_shape(loss_tokens, losses)}")
    over = np.flatnonzero(losses[:, 0] > lengths[:, 0])
    if over.size:
        item = int(over[0])
        raise ValueError(f"`loss_tokens` must be at most each item's length: item {item} has {int(losses[item, 0])} "
                         f"loss tokens of {int(lengths[item, 0])}")
    return lengths, losses


def items_problem(plan, lengths, loss_tokens) -> Exception | None:
    """Why this rank's items, of `lengths` and `loss_tokens` now (as given to `plan`; None: not checked),
    are not those `plan` was made from (a plan kept from another step whose row totals happen to match),
    or None."""
    rank, home = plan.route.rank, plan.sharding.home_items
    for column, given, name, what in ((0, lengths, "lengths", "length"),
                                      (1, loss_tokens, "loss_tokens", "loss tokens")):
        if given is None:
            continue
        try:
            local = as_table(given, name)
        except (TypeError, ValueError) as error:
            return error
        if local.shape[1] != 1:
            return ValueError(f"`{name}` must be 1-D, one count per item; got shape {local.shape}")
        problem = kept_plan_problem(rank, local[:, 0], plan.metadata.column(column)[home], "item", what)
        if problem is not None:
            return problem
    return None


def named_by_rank(error: Exception, counts: np.ndarray) -> Exception:
    """`error`, raised planning the gathered batch of ranks that sampled `counts[r]` items each, with every item it
    names by its index there ("item 4", "at index 4") named by its rank and local index too ("rank 1's item 0 (item
    4 of the step)"): the user never sees the gathered batch.  The same type and attributes (an `InfeasibleError`'s
    `min_cap`); `error` itself where it names no item."""
    ends = np.cumsum(counts)

    def name(match: re.Match) -> str:
        item = int(match.group(2))
        if not ends.size or item >= ends[-1]:
            return match.group(0)
        rank = int(np.searchsorted(ends, item, side="right"))
        return f"rank {rank}'s item {item - int(ends[rank] - counts[rank])} ({match.group(0)} of the step)"

    message = GATHERED_ITEM.sub(name, str(error))
    if message == str(error):
        return error
    renamed = type(error).__new__(type(error), message)
    renamed.__dict__.update(error.__dict__)
    return renamed

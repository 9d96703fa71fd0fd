"""The rows of a step's micro-batches: a tensor packed over a rank's items split per micro-batch (`split_rows`) and
merged back (`merge_rows`), which micro-batch each output of a loop belongs to (`PostBalancingDispatcher.combine`
takes a list of `(micro, mapping)` pairs in any order and needs them in micro-batch order, each checked to be of the
plan and step it sends home), and what of a split item's per-item output rows comes home (`split_sums`)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

from .exchange import ranges
from .microbatch import MicroBatch
from .sharding import StepSharding
from .steps import StepToken

SPLIT_REDUCTIONS = ("sum", "first")  # what of a split item's per-item rows `combine` sends home


def in_microbatch_order(outputs, plan, step: StepToken) -> tuple[list, Exception | None]:
    """The list `combine` got for `plan` (a `DispatchPlan`), `(micro, mapping)` pairs in any order (or, with one
    micro-batch, mappings), as one mapping per micro-batch in micro-batch order; and why it does not fit the plan's
    micro-batches (None when it does): a bare list where several micro-batches make its order unknowable, a
    micro-batch of another plan or of another `step` than the latest dispatch's (kept from an earlier step's loop),
    one missing or given twice."""
    pairs = isinstance(outputs, Sequence) and bool(outputs) and all(
        isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], MicroBatch) and isinstance(pair[1], Mapping)
        for pair in outputs)
    if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence) or not outputs or not pairs and \
            not all(isinstance(part, Mapping) for part in outputs):
        raise TypeError(f"`outputs` must be a mapping of names to tensors, or a list of one `(micro, mapping)` pair "
                        f"per micro-batch; got {type(outputs).__name__}")
    count = plan.num_microbatches
    if not pairs:
        wrong = len(outputs) != count or count > 1
        return list(outputs), None if not wrong else ValueError(
            f"`outputs` is a list of {len(outputs)} mappings but the plan has {count} micro-batches: its order cannot "
            f"be checked (micro-batches of equal row counts would go home to each other's items); pass one "
            f"`(micro, mapping)` pair per micro-batch, in any order: `outputs.append((micro, {{...}}))`")
    items = plan.local_items
    microbatch = plan.item_microbatch[items]
    parts = {}
    for micro, part in outputs:
        if micro.num_microbatches != count or not 0 <= micro.index < count or \
                not np.array_equal(micro.items, items[microbatch == micro.index]):
            return [part], ValueError(f"`outputs` pairs micro-batch {micro.index} of {micro.num_microbatches} "
                                      f"(items {micro.items.tolist()}), which is not a micro-batch of `plan` on rank "
                                      f"{plan.route.rank}: pass the micro-batches `microbatches(plan, ...)` yielded")
        if micro.step is not step:
            return [part], ValueError(f"`outputs` pairs micro-batch {micro.index} of another step than the latest "
                                      f"dispatch's (a micro-batch kept from an earlier step's loop?): pair each output "
                                      f"with the micro-batch of this step's `microbatches(plan, ...)` it came from")
        if micro.index in parts:
            return [part], ValueError(f"`outputs` pairs micro-batch {micro.index} twice")
        parts[micro.index] = part
    missing = sorted(set(range(count)) - set(parts))
    return [parts.get(index, outputs[0][1]) for index in range(count)], None if not missing else \
        ValueError(f"`outputs` lacks micro-batches {missing} of the plan's {count}")


def owned_rows(num_rows: int, rows, name: str = "tensor") -> np.ndarray:
    """`rows` (item k owns `rows[k]` rows of a packed tensor) as int64, where the items own the tensor's `num_rows`;
    else a ValueError naming the tensor (`name`)."""
    rows = np.asarray(rows, dtype=np.int64)
    if num_rows != int(rows.sum()):
        raise ValueError(f"{name} has {num_rows} rows but its {rows.size} items own {int(rows.sum())}")
    return rows


def row_parts(rows: np.ndarray, microbatch: np.ndarray, num_microbatches: int) -> list[np.ndarray]:
    """The rows of each micro-batch's part of a tensor packed over items (item k owns `rows[k]` rows, in order):
    for micro-batch m, the rows of its items (`microbatch[k] == m`), in item order."""
    starts = np.cumsum(rows) - rows
    return [ranges(starts[members], rows[members])
            for members in (np.flatnonzero(microbatch == index) for index in range(num_microbatches))]


def split_rows(tensor: torch.Tensor, rows: np.ndarray, microbatch: np.ndarray, num_microbatches: int,
               name: str = "tensor") -> list[torch.Tensor]:
    """Split a tensor packed over items (item k owns `rows[k]` rows, in order) by `microbatch[k]`,
    keeping the item order within each part; one (possibly empty) tensor per micro-batch (`name`: the
    tensor, as errors name it)."""
    indices = part_indices(tensor, rows, microbatch, num_microbatches, name)
    if num_microbatches == 1:  # a step of one pass: the tensor itself, not a copy
        return [tensor]
    return [tensor.index_select(0, index) for index in indices]


def part_indices(tensor: torch.Tensor, rows: np.ndarray, microbatch: np.ndarray, num_microbatches: int,
                 name: str) -> list[torch.Tensor]:
    """The rows of each micro-batch's part of `tensor` (`split_rows`), on its device (none for one micro-batch,
    after the rows are checked)."""
    rows = owned_rows(tensor.shape[0], rows, name)
    if num_microbatches == 1:
        return []
    return [torch.from_numpy(part).to(tensor.device) for part in row_parts(rows, microbatch, num_microbatches)]


def merge_rows(parts, rows: np.ndarray, microbatch: np.ndarray, name: str) -> torch.Tensor:
    """The inverse of `split_rows`: one tensor packed over items in order (item k owns `rows[k]` rows)
    from one part per micro-batch (part m: the rows of micro-batch m's items, in item order); a
    ValueError naming `name` and the micro-batch whose part has other rows."""
    index = row_parts(np.asarray(rows, dtype=np.int64), microbatch, len(parts))
    for number, (part, expected) in enumerate(zip(parts, index)):
        if not isinstance(part, torch.Tensor) or part.dim() == 0 or part.shape[0] != expected.size:
            got = f"shape {tuple(part.shape)}" if isinstance(part, torch.Tensor) else f"a {type(part).__name__}"
            raise ValueError(f"{name} of micro-batch {number} must be a tensor of {expected.size} rows (its "
                             f"{np.count_nonzero(microbatch == number)} items' rows, in the order of "
                             f"`micro.data`); got {got}")
    if len(parts) == 1:
        return parts[0]
    order = np.concatenate(index)  # the row of the merged tensor each row of the parts becomes
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return torch.cat(list(parts)).index_select(0, torch.from_numpy(inverse).to(parts[0].device))


def split_sums(split_reduce, keys: list, sharding: StepSharding) -> tuple[frozenset, Exception | None]:
    """The per-item output `keys` whose split items' rows come home added (`combine`'s `split_reduce`:
    None, one of SPLIT_REDUCTIONS, or a mapping key -> one), and why `split_reduce` does not fit them
    (raised on every rank by the exchange; None when it fits)."""
    if split_reduce is None or isinstance(split_reduce, str):
        modes = dict.fromkeys(keys, split_reduce)
    elif isinstance(split_reduce, Mapping):
        modes = {key: split_reduce.get(key) for key in keys}
        others = sorted(map(str, set(split_reduce) - set(keys)))
        if others:
            return frozenset(), ValueError(f"`split_reduce` names {others}, which are not per-item outputs of "
                                           f"`outputs` ({keys})")
    else:
        return frozenset(), TypeError(f"`split_reduce` must be None, one of {SPLIT_REDUCTIONS} or a mapping of "
                                      f"per-item output names to one; got {type(split_reduce).__name__}")
    bad = sorted({repr(mode) for mode in modes.values() if mode is not None and mode not in SPLIT_REDUCTIONS})
    if bad:
        return frozenset(), ValueError(f"`split_reduce` must be one of {SPLIT_REDUCTIONS}; got {', '.join(bad)}")
    missing = [key for key, mode in modes.items() if mode is None]
    if missing and sharding.any_split:
        item = int(np.flatnonzero(sharding.degree > 1)[0])
        return frozenset(), ValueError(
            f"combine: item {item} is split over ranks {list(sharding.group(item))} and its per-item outputs "
            f"{missing} have a row on each: pass split_reduce='sum' to add the group's rows (e.g. a score summed "
            f"over the item's tokens) or 'first' to keep group rank 0's (a value every rank of the group holds, "
            f"e.g. an id), or a mapping of output name to either")
    return frozenset(key for key, mode in modes.items() if mode == "sum"), None

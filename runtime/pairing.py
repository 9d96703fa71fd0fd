"""Which micro-batch each output of a micro-batch loop belongs to: `PostBalancingDispatcher.combine` takes a list of
`(micro, mapping)` pairs in any order and needs them in micro-batch order, each checked to be of the plan and step
it sends home."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from .microbatch import MicroBatch, StepToken


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

"""Micro-batches of a differentiable dispatch: exact gradients with one reverse exchange per step.

`dispatch(..., differentiable=True)` returns tensors whose gradients go home through one all-to-all
(`exchange_with_grad`) and on through what made them (an encoder run before the dispatch).  Micro-batches cut from
them as plain slices share that graph: the first micro-batch's backward runs the reverse exchange and frees it, and
the next dies in torch's "backward through the graph a second time" (with `retain_graph=True`: M all-to-alls and M
encoder backwards per step).  Instead (`split_step`), the micro-batches before the last are cut from a detached leaf
of each tensor, whose `.grad` accumulates their gradients, and the last micro-batch's rows come out of
`_CarryGradients`, whose backward hands the exchange the accumulated gradient plus the last micro-batch's: the
reverse exchange and the graph before it run once, in the last micro-batch's backward (the one that synchronises
gradients under `accumulate`), with the gradient of one pass over the step.  So the last micro-batch's loss must
reach its rows on every rank (an empty micro-batch's too), as the loss of a step without micro-batches must reach
the dispatched tensors, and its backward runs last: a rank whose last `accumulate` block ends with no backward
through them raises there (`StepToken.unsent`, noted by `_Carried.sent`), as its peers wait in the exchange.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import torch

from .pairing import part_indices, split_rows

LATE = ("a micro-batch's backward reached rows of a differentiable dispatch (`dispatch(..., differentiable=True)`) "
        "after the backward of the step's last micro-batch, which sent the step's gradients home through the "
        "dispatch's reverse exchange (once per step): this gradient would be lost; run the micro-batches' backwards "
        "in order, the last micro-batch's last")


@dataclass(eq=False)
class _Carried:
    """One loop's tensors of a differentiable dispatch (`StepToken.carried`): their autograd nodes (`roots`), the leaves
    the micro-batches before the last are cut from and the rows of the last micro-batch in each (none with one
    micro-batch), and whether the step's gradient was sent home (a later one is refused: `LATE`; none sent after the
    last micro-batch's block, `StepToken.unsent`)."""

    roots: tuple
    leaves: list
    last_rows: list
    sent: bool = False


class _CarryGradients(torch.autograd.Function):
    """The last micro-batch's rows of each tensor; backward: the tensors' whole gradients, the earlier micro-batches'
    (accumulated in the leaves) plus the last one's."""

    @staticmethod
    def forward(ctx, carried: _Carried, *tensors):
        ctx.carried = carried
        return tuple(tensor.index_select(0, rows) for tensor, rows in zip(tensors, carried.last_rows))

    @staticmethod
    def backward(ctx, *grads):
        carried, totals = ctx.carried, []
        carried.sent = True
        for leaf, rows, grad in zip(carried.leaves, carried.last_rows, grads):
            total = torch.zeros_like(leaf) if leaf.grad is None else leaf.grad  # the leaf's own: added to in place
            totals.append(total if grad is None else total.index_add_(0, rows, grad))
            leaf.grad = None
        return (None, *totals)


def _refuse_late(carried: _Carried, grad: torch.Tensor) -> None:
    if carried.sent:
        raise RuntimeError(LATE)


def _sending(carried: _Carried, grad: torch.Tensor) -> None:
    carried.sent = True


def split_step(moved: Mapping[str, torch.Tensor], rows: Mapping[str, np.ndarray], microbatch: np.ndarray,
               count: int) -> tuple[dict[str, list[torch.Tensor]], _Carried | None]:
    """Each tensor of `moved` (item k owns `rows[key][k]` rows) split by `microbatch[k]` into `count` parts
    (`split_rows`); with several micro-batches, those that require grad (while autograd records) are cut so that
    the graph before them runs backward once, in the last micro-batch's backward, with every micro-batch's
    gradient (see the module docstring).  And the record of the tensors that require grad (`_Carried`, None where
    none does), which notes when their gradient goes home."""
    grad = [key for key, tensor in moved.items() if tensor.requires_grad and torch.is_grad_enabled()]
    carried = grad if count > 1 else []
    names = {key: f"`moved[{key!r}]` (what `dispatch` returned)" for key in moved}
    parts = {key: split_rows(tensor, rows[key], microbatch, count, names[key]) for key, tensor in moved.items()
             if key not in carried}
    if not carried:
        state = _Carried(tuple(moved[key].grad_fn for key in grad), [], []) if grad else None
        for key in grad:  # one micro-batch: the gradient goes home as its backward reaches these
            moved[key].register_hook(functools.partial(_sending, state))
        return parts, state
    indices = {key: part_indices(moved[key], rows[key], microbatch, count, names[key]) for key in carried}
    state = _Carried(tuple(moved[key].grad_fn for key in carried), [moved[key].detach().requires_grad_() for key in
                                                                    carried], [indices[key][-1] for key in carried])
    last = _CarryGradients.apply(state, *[moved[key] for key in carried])
    for key, leaf, part in zip(carried, state.leaves, last):
        leaf.register_hook(functools.partial(_refuse_late, state))
        parts[key] = [leaf.index_select(0, index) for index in indices[key][:-1]] + [part]
    return parts, state

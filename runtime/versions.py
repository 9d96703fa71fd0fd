"""Writes to the trainable parameters of a model whose gradient sync `accumulate` holds.

`accumulate` holds DDP's and FSDP2's gradient sync to a step's last micro-batch; a parameter update before it (an
optimizer step between micro-batches, or after a loop left early) updates each rank on its own gradients, and a
forward that writes a trainable parameter in place writes it differently on each rank (each runs other rows).  Three
witnesses, none a collective: the version counters of the trainable parameters (in-place writes bump them); the
optimizer steps taken on each (fused optimizers, `Adam(fused=True)`, write without bumping them), counted by a global
step hook registered on first use; and, for writes that bump neither (through `.data`, `vector_to_parameters`), a
fingerprint of their contents (`contents`) taken at a step's first held block and compared at its last.  Frozen
parameters are left out: a forward may write them (a momentum encoder's update) and they hold no gradient to sync."""
from __future__ import annotations

import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from .model_check import ModelContractError, fsdp_param_groups, kind

_listed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (name, parameter) (listing costs 15x)
_stepped: dict[int, int] = {}  # id(parameter) -> optimizer steps taken on it since the hook was registered
_taken = [0]  # optimizer steps taken in this process since the hook was registered
_hook: list = []
_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # an element's bits as an integer


def _count_step(optimizer, args, kwargs) -> None:
    """The global optimizer step post-hook: one more step on every parameter of `optimizer`."""
    _taken[0] += 1
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            _stepped[id(parameter)] = _stepped.get(id(parameter), 0) + 1


def _listing(model) -> tuple:
    """`model`'s parameters, (name, parameter); under FSDP2 its sharded ones (what the optimizer holds), from FSDP2's
    own record of each, never what a module holds now: after a forward without resharding (`reshard_after_forward=
    False` and no backward, as a no-grad pass) it holds unsharded ones, whose storage FSDP2 frees as it reshards
    (a tied parameter is recorded under one of its modules; parameters FSDP2 does not manage are not watched)."""
    if not hasattr(model, "set_requires_gradient_sync"):
        return tuple(model.named_parameters())
    prefixes = {id(module): f"{prefix}." if prefix else "" for prefix, module in model.named_modules()}
    try:  # FSDP2's own record of each parameter's module and sharded form
        held = [held for group in fsdp_param_groups(model) for held in group.fsdp_params]
        listed = {id(entry.sharded_param): (prefixes.get(id(entry._module_info.module), "?.") +
                                           entry._module_info.param_name, entry.sharded_param) for entry in held}
    except AttributeError:  # another torch's FSDP2: nothing watched, rather than freed storage read
        return ()
    return tuple(listed.values())


def _trainable(model) -> list:
    """`model`'s trainable parameters, (name, parameter)."""
    if not _hook:
        _hook.append(register_optimizer_step_post_hook(_count_step))
    named = _listed.get(model)
    if named is None:
        named = _listed[model] = _listing(model)
    return [(name, parameter) for name, parameter in named if parameter.requires_grad]


def trainable_versions(model) -> tuple:
    """The version counter plus the optimizer steps of each of `model`'s trainable parameters."""
    return tuple(parameter._version + _stepped.get(id(parameter), 0) for _, parameter in _trainable(model))


def optimizer_steps() -> int:
    """The optimizer steps taken in this process so far (by any optimizer; counted from the first watched block)."""
    return _taken[0]


def _steps(model) -> tuple:
    """The optimizer steps taken on each of `model`'s trainable parameters."""
    return tuple(_stepped.get(id(parameter), 0) for _, parameter in _trainable(model))


def _local(parameter) -> torch.Tensor:
    """A parameter's entries on this rank (its shard under FSDP2), flat."""
    return (parameter.to_local() if hasattr(parameter, "to_local") else parameter).detach().reshape(-1)


def _sum(local: torch.Tensor) -> torch.Tensor:
    """The sum, wrapping in int64, of `local`'s entries read as integers of their width: its run of entries aligned
    on 8 bytes read in place as int64 words (no copy: an upcast copy of a 1 G-entry embedding is 8 GB), the few on
    either side one by one.  Any one entry changed changes it (by its change shifted within a word, nonzero modulo
    2^64); entries wider than 8 bytes (complex128) are read as their two words."""
    ints = local.view(torch.int64) if local.element_size() > 8 else local
    ints = ints.view(_BITS[ints.element_size()])
    per = 8 // ints.element_size()
    head = min(-ints.storage_offset() % per, ints.numel())
    body = (ints.numel() - head) // per * per
    ends = torch.cat((ints[:head], ints[head + body:])).to(torch.int64)
    return ends.sum() + (ints[head:head + body].view(torch.int64).sum() if body else 0)


def contents(model) -> dict:
    """A fingerprint of the contents of `model`'s trainable parameters (this rank's shards under FSDP2): the sum of
    each one's entries read as integers (`_sum`), so a change of any one entry changes it (changes cancel only where
    they keep a parameter's sum of words modulo 2^64, as swapping entries of one position in a word does).  One
    read of each, no copy; the sums stay on their parameters' devices (a model may span several): one tensor per
    device."""
    sums: dict = {}
    for _, parameter in _trainable(model):
        local = _local(parameter)
        sums.setdefault(local.device, []).append(_sum(local))
    return {device: torch.stack(part) for device, part in sums.items()}


def _changed(model, before: dict, after: dict) -> list[bool] | None:
    """None where two fingerprints of `model` (`contents`) are equal, else whether each trainable parameter changed."""
    if before.keys() == after.keys() and all(torch.equal(before[device], after[device]) for device in before):
        return None
    flags = {device: iter((before[device] != after[device]).tolist() if device in before and
                          before[device].shape == after[device].shape else ()) for device in after}
    return [next(flags[_local(parameter).device], True) for _, parameter in _trainable(model)]


def _names(model, changed) -> str:
    """The trainable parameters of `model` at the places `changed`, as a message lists them."""
    names = [name for (name, _), moved in zip(_trainable(model), changed) if moved]
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def unstepped(micro, model, check: bool) -> tuple | None:
    """Under DDP or FSDP2, with grad: a ValueError before `micro`'s block where `model`'s trainable parameters were
    written since the step's first held block (an optimizer step on gradients each rank kept for itself, a write
    in place outside one, or, at the step's last block, one through `.data`; every rank writes alike, so every
    rank raises); else their versions now (None where not watched).  0.03 ms a block on 242 modules, every step,
    and at a step's first and last held blocks a read of the parameters (`contents`)."""
    step = micro.step
    if not check or not torch.is_grad_enabled():
        return None
    now = trainable_versions(model)
    if step is None:
        return now
    first, versions, steps, fingerprint = step.versions.get(id(model), (None, now, None, None))
    where = f"between micro-batches {first} and {micro.index} of a step, while `accumulate` held its gradient sync"
    advice = ("update them once per dispatched step, after its last micro-batch (plan each mini-batch as a step of "
              "its own), or pass check=False knowingly")
    if versions != now and steps != _steps(model):
        raise ValueError(
            f"the parameters of {kind(model)} changed {where} to the step's last micro-batch (an optimizer step inside "
            f"the step, as mini-batches do): each rank stepped on its own unsynchronised gradients (under FSDP2 on "
            f"none: the held ones are not in .grad), and DDP's replicas drift apart; step the optimizer once per "
            f"dispatched step, after its last micro-batch (plan each mini-batch as a step of its own), or pass "
            f"check=False knowingly")
    if versions != now:
        raise ValueError(
            f"trainable parameters {_names(model, [old != new for old, new in zip(versions, now)])} of {kind(model)} "
            f"were written in place {where}, by no optimizer step: a forward that writes them (as nn.Embedding("
            f"max_norm=...) renormalises the rows it looks up) writes each rank's replica differently, each rank "
            f"running other rows, and a write by hand updates each rank on its own unsynchronised gradients; the "
            f"replicas drift apart: renormalise out of place in the forward (F.embedding without max_norm on a "
            f"renormalised weight), or {advice}")
    uncleared(micro, model)
    if micro.is_last:  # a pass over the step ends (the next starts afresh)
        step.versions.pop(id(model), None)
        changed = None if fingerprint is None else _changed(model, fingerprint, contents(model))
        if changed is not None:
            raise ValueError(
                f"trainable parameters {_names(model, changed)} of {kind(model)} "
                f"were written {where}, by no in-place operation or optimizer step (through `.data`, or "
                f"`torch.nn.utils.vector_to_parameters`): each rank updated them on its own unsynchronised "
                f"gradients, and the replicas drift apart; {advice}")
    elif first is None:
        step.versions[id(model)] = (micro.index, now, _steps(model), contents(model))
    return now


def unwritten(micro, model, versions: tuple, steps: int) -> None:
    """In `accumulate(model, micro)`'s body as a loss is normalised (after the forward, before its backward): a
    `ModelContractError` where the forward wrote a trainable parameter of `model` in place since the block began
    (`versions`), no optimizer having stepped since (`steps`, `optimizer_steps()` then): each rank runs other
    rows, so each replica is written differently."""
    now = trainable_versions(model)
    if now == versions or optimizer_steps() != steps:
        return
    raise ModelContractError(
        f"the forward in the `accumulate` block of micro-batch {micro.index} of {micro.num_microbatches} wrote "
        f"trainable parameters {_names(model, [old != new for old, new in zip(versions, now)])} of {kind(model)} in "
        f"place (as nn.Embedding(max_norm=...) renormalises the rows it looks up): under post-balancing each rank "
        f"runs other rows, so each rank's replica is written differently and the replicas drift apart, which no "
        f"gradient sync undoes; renormalise out of place in the forward (F.embedding without max_norm on a "
        f"renormalised weight), or write trainable parameters only in the optimizer step, alike on every rank; "
        f"`accumulate(model, micro, check=False)` knowingly")


def discarded(held) -> bool:
    """Whether the model whose sync a loop left early held (`held`) has nothing to synchronise: a DDP module whose every
    gradient is None or zero (`zero_grad()`: the step dropped on purpose) and whose parameters are the held block's (no
    optimizer step took the unsynchronised gradients first).  Not FSDP2's: it keeps them out of `zero_grad`'s reach."""
    model = held[2]()
    return model is not None and not hasattr(model, "set_requires_gradient_sync") and \
        trainable_versions(model) == held[3] and all(parameter.grad is None or not bool(parameter.grad.any())
                                                     for _, parameter in _trainable(model))


def uncleared(micro, model) -> None:
    """A ValueError where a gradient that `accumulate` held from an earlier block of `micro`'s step (`held_gradient`)
    was cleared since, before `micro`'s block or its loss: every rank runs the same loop, so every rank raises."""
    kept = None if micro.step is None else micro.step.graded.get(id(model))
    if kept is not None and kept[1].grad is None:
        raise ValueError(
            f"the gradients of {kind(model)} that `accumulate` held from micro-batch {kept[0]} of a step were cleared "
            f"before micro-batch {micro.index}'s backward (`zero_grad()` inside the micro-batch loop?): the step "
            f"would train on its later micro-batches' gradients only; clear gradients once per step, after the "
            f"optimizer step (or before the loop), or pass check=False knowingly")


def held_gradient(micro, model) -> None:
    """After the body of a held block of DDP `model` (not its step's last): note a trainable parameter holding a
    gradient, whose gradient cleared before the step's later blocks' backward `uncleared` refuses; after the last,
    forget it.  FSDP2 keeps the held ones out of `.grad`."""
    step = micro.step
    if step is None or hasattr(model, "set_requires_gradient_sync"):
        return
    if micro.is_last:
        step.graded.pop(id(model), None)
        return
    if id(model) in step.graded:  # noted at an earlier block of the step
        return
    held = next((parameter for _, parameter in _trainable(model) if parameter.grad is not None), None)
    if held is not None:
        step.graded.setdefault(id(model), (micro.index, held))

"""The model check of `accumulate`: on a micro-batch whose backward reduces gradients, the loss depends on every
trainable parameter of the model on every rank (`check_model_contract`, one all-gather of a call header per rank as the
backward starts).  What it checks is recorded by `runtime.microbatch.accumulate` (`_Contract`); the walk and the
recording of reentrant checkpoints are `runtime.encoders`'.
"""

from __future__ import annotations

import warnings
import weakref

import numpy as np
import torch

from .agreement import call_header
from .comm import group_rank, group_size
from .encoders import _CHECKPOINT_NODE, EncoderContractError, module_of, reached_leaves


class ModelContractError(EncoderContractError):
    """The loss of the micro-batch whose backward reduces gradients did not depend on some parameters of the
    model (DDP, FSDP2) on some rank."""


DECLINED = -2  # a rank's first word in the model check's all-gather where it passed check=False


def check_model_contract(contract, backward: bool = True, raised: Exception | None = None) -> None:
    """Raise `ModelContractError` on every rank (one all-gather of a call header, as the backward of the
    micro-batch that reduces gradients starts, before any reduction) when, on some rank, the loss parts given to
    `normalize_loss` in the body of `accumulate(model, micro)` do not reach, through the autograd graph, every
    trainable parameter of `model` (or had no `backward` in the body: every parameter left out).  A model that
    returns early or a constant on an empty micro-batch (which every rank runs, to take part in every collective),
    or a loss that is a constant there or uses part of the outputs, leaves parameters out of the backward that
    reduces gradients: DDP then leaves their gradients unreduced without an error, or the ranks' reductions pair up
    different buckets.  A term added to the normalised loss outside `normalize_loss` is not seen (normalise it too,
    or check=False).  Parameters a reentrant checkpoint that runs no module may hide (made in the model's forward)
    are not refused: every rank warns once that the check cannot tell (`ModelCheckWarning`).  Under DDP a body that
    ran modules inside the DDP module but not its own forward (`model.module(x)`) is refused: DDP would not reduce.
    A rank whose body `raised` before its backward joins as such: every rank raises, naming the ranks whose body
    raised (their backward, which reduces with the others', never runs), unless every rank's did (the callers
    re-raise their own; under FSDP2 one that raised before the forward stops alone: `_no_forward_under_fsdp2`)."""
    micro, model, names = contract.micro, contract.model, contract.names
    wanted = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    reached, opaque = (wanted, False) if contract.declined else reached_leaves(
        contract.parts, names, wanted, contract.hidden, _may_hide(contract)) if backward else (set(), False)
    unused, unseen = ([], sorted(wanted - reached)) if opaque else (sorted(wanted - reached), [])
    bypassed = hasattr(model, "no_sync") and not hasattr(model, "set_requires_gradient_sync") and contract.ran \
        and "" not in contract.ran  # modules inside DDP ran, its own forward (which readies the reduction) not
    unused = sorted(wanted) if bypassed else unused
    group = micro.contract[0]
    if not contract.ran and not contract.declined and hasattr(model, "set_requires_gradient_sync"):
        if raised is not None:
            return
        raise _no_forward_under_fsdp2(micro, group)
    size, rank = group_size(group), group_rank(group)
    mine = (-1, 0) if raised is not None else (DECLINED, 0) if contract.declined else (len(unused), len(unseen))
    rows = np.array([mine]) if size == 1 else call_header(
        "model check", mine, group, f"model check all-gather of micro-batch {micro.index} (as its backward starts: "
        f"every rank passes its loss through normalize_loss(loss, micro) and runs the backward, an empty micro-batch "
        f"too)")[:, :2]
    flags = torch.from_numpy(np.ascontiguousarray(rows.T)).reshape(-1)  # every rank's first word, then its second
    declined = torch.nonzero(flags[:size] == DECLINED).flatten().tolist()
    if declined and raised is None:  # the check's all-gather was joined to pair with it, not to check
        _declined(micro, rank, declined, size)
        return
    failed, blind = (torch.nonzero(part).flatten().tolist() for part in flags.split(size))
    raising = torch.nonzero(flags[:size] < 0).flatten().tolist()
    if raised is not None and len(raising) == size:  # nobody waits: the error itself
        return
    if raising:
        raise _raised_problem(micro, rank, raising, raised) from raised
    if not failed:
        if blind:
            _warn_unseen(contract, unseen, blind)
        return
    where = (f"micro-batch {micro.index} of {micro.num_microbatches} (whose backward reduces gradients; "
             f"{len(micro.items)} items on rank {rank})")
    advice = ("DDP and FSDP reduce every parameter's gradient in that backward on every rank, and a rank's "
              "micro-batch may be empty (every rank runs every micro-batch): compute the output through every "
              "parameter and the loss from the output on empty micro-batches too (run the layers on the empty "
              "tensors instead of returning early or a constant; e.g. `output.sum() * 0` for an empty loss) and "
              "normalise every part of it with `normalize_loss`, set requires_grad=False on parameters never used, "
              "or pass `accumulate(model, micro, check=False)` on every rank where unused parameters are harmless")
    if bypassed:
        raise ModelContractError(f"rank {rank}: the body of `accumulate` in {where} called modules inside the DDP "
                                 f"module ({named(contract)}; `model.module(...)` or a method of it) but not the DDP "
                                 f"module itself: DDP reduces gradients only after its own forward, so every rank "
                                 f"would keep its own gradients; call `model(...)`, the DDP module, in the body")
    if unused and not contract.parts:
        raise ModelContractError(f"rank {rank}: no loss passed through `normalize_loss(loss, micro)` in {where}, "
                                 f"so its backward gives the model's parameters no gradient: {advice}; {AT_HOME}")
    if unused and not backward:
        raise ModelContractError(f"rank {rank}: the loss given to `normalize_loss` in {where} had no backward inside "
                                 f"the `with accumulate` block (skipped on an empty micro-batch, or run after the "
                                 f"block), so the model's parameters got no gradient there: run it inside the block "
                                 f"on every micro-batch, an empty one too; {advice}")
    if unused:
        shown = ", ".join(unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "")
        raise ModelContractError(f"rank {rank}: the loss given to `normalize_loss` in {where} does not depend on "
                                 f"parameters {shown} of the model given to `accumulate` ({named(contract)}): "
                                 f"{advice}")
    raise ModelContractError(f"rank {rank}: on ranks {failed} the loss of micro-batch {micro.index} leaves out "
                             f"parameters of the model given to `accumulate` ({named(contract)}; each rank named "
                             f"them); this rank stops with them: {advice}")


def _declined(micro, rank: int, declined: list[int], size: int) -> None:
    """Where ranks `declined` the model check (check=False) and others did not, a ModelContractError on every rank."""
    if len(declined) < size:
        raise ModelContractError(f"rank {rank}: ranks {declined} passed `accumulate(model, micro, check=False)` and "
                                 f"the others check=True in micro-batch {micro.index} of {micro.num_microbatches}, "
                                 f"a step due the model check: `check` must be the same on every rank (a rank that "
                                 f"checks posts a collective its peers must join)")


def _raised_problem(micro, rank: int, raising: list[int], raised: Exception | None) -> ModelContractError:
    """The refusal, on every rank, of a check that `raising` ranks joined because their body raised (`raised` here)."""
    return ModelContractError(
        f"rank {rank}: ranks {raising} raised inside the body of `accumulate` in micro-batch {micro.index} of "
        f"{micro.num_microbatches}, before its backward ({type(raised).__name__ if raised else 'see theirs'}; an "
        f"exception caught outside the block, e.g. an out-of-memory batch skipped, would leave the other ranks "
        f"waiting in that backward's gradient reduction): every rank stops here; skip a failing micro-batch alike "
        f"on every rank (all-reduce the failure first), or let the exception stop the run")


def named(contract) -> str:
    """The checked model as an error names it: its class (a wrapper's and its module's) and, where nested
    `accumulate` blocks check several models, which block gave it."""
    model, nested = kind(contract.model), contract.nest
    if len(nested) < 2:
        return model
    return f"{model}, block {nested.index(contract) + 1} of {len(nested)} nested `accumulate` blocks, outermost first"


def _may_hide(contract):
    """Whether a reentrant checkpoint that ran no module (its node) may hide parameters of `contract`'s model: it was
    made in a forward of that model's modules, or in none of the models' the nested blocks check (`spans`)."""
    def blind(node) -> bool:
        number = node._sequence_nr()
        inside = [other is contract for other in contract.nest for first, end in other.spans if first <= number < end]
        return not inside or any(inside)
    return blind


class ModelCheckWarning(UserWarning):
    """The model check cannot tell whether the loss depends on some parameters (a reentrant checkpoint that runs no
    module hides which parameters it uses)."""


_WARNED: set = set()  # (the model's kind, the parameters) already warned about in this process


def _warn_unseen(contract, unseen: list[str], ranks: list[int]) -> None:
    """Warn, once per model and parameters on this rank, that the check cannot tell about `unseen` (on `ranks`)."""
    key = (kind(contract.model), tuple(unseen))
    if key in _WARNED:
        return
    _WARNED.add(key)
    micro = contract.micro
    shown = ", ".join(unseen[:6]) + (f" and {len(unseen) - 6} more" if len(unseen) > 6 else "")
    which = f"parameters {shown}" if unseen else f"parameters the ranks {ranks} name"
    warnings.warn(ModelCheckWarning(
        f"rank {group_rank(micro.contract[0])}: the model check of micro-batch {micro.index} of "
        f"{micro.num_microbatches} cannot tell whether the loss depends on {which} of the model given to "
        f"`accumulate` ({named(contract)}; on ranks {ranks}): a reentrant checkpoint whose function runs no module "
        f"(it uses parameters directly, as `checkpoint(lambda x: F.linear(x, w), x, use_reentrant=True)`) ran in "
        f"the model's forward, and the autograd graph does not show which parameters it uses; if the loss leaves "
        f"one of them out on an empty micro-batch, DDP and FSDP2 give wrong gradients without an error.  Checkpoint "
        f"with use_reentrant=False or checkpoint a module (the check sees through both); "
        f"`accumulate(model, micro, check=False)` on every rank turns the check and this warning off"), stacklevel=2)


def kind(model) -> str:
    """A model's class as errors name it: a wrapper's and its module's (`DistributedDataParallel of Net`)."""
    inner = getattr(model, "module", None)
    return type(model).__name__ + (f" of {type(inner).__name__}" if isinstance(inner, torch.nn.Module) else "")


def _no_forward_under_fsdp2(micro, group) -> ModelContractError:
    """The error of a rank that ran no forward of an FSDP2 model inside `accumulate(model, micro)`: a forward before
    the block is not seen, and where a rank skipped it its peers wait in the forward's parameter all-gather, which
    no check of this rank can pair with, so it stops alone, saying why.  A body that raised before the forward
    stops alone the same way, with its own exception (the peers fail as its process exits, or at the group's
    timeout); an `except` that goes on sends its next collective into the peers' all-gather, and gloo aborts a rank:
    such an exception must stop the run, or the skip be decided alike on every rank before the block."""
    return ModelContractError(
        f"rank {group_rank(group)}: no forward of the model ran inside `with accumulate(model, micro):` in "
        f"micro-batch {micro.index} of {micro.num_microbatches} (whose backward reduces gradients; "
        f"{len(micro.items)} items on this rank): the model's forward must run inside the block, on every "
        f"micro-batch, an empty one too (run the layers on the empty tensors, e.g. `output.sum() * 0` for an empty "
        f"loss): the check records the parameters FSDP2 gathers during the forward, so a forward run before the "
        f"block is not seen; and a rank that does not call the model leaves the ranks that did waiting in the "
        f"forward's parameter all-gather until it stops or the process group's timeout (NCCL: its watchdog), which "
        f"no check can turn into an error on every rank")


def fsdp_param_groups(model) -> list:
    """FSDP2's parameter groups of every module of `model` it manages (its private record: AttributeError where
    another torch's FSDP2 keeps it otherwise)."""
    return [group for _, group in named_fsdp_param_groups(model)]


def named_fsdp_param_groups(model) -> list:
    """(the managing module's path and class, group) of every FSDP2 parameter group of `model` (`fsdp_param_groups`)."""
    return [(f"{repr(name) if name else 'the root'} ({type(module).__name__})", group)
            for name, module in model.named_modules()
            if hasattr(module, "_get_fsdp_state") for group in module._get_fsdp_state()._fsdp_param_groups]


def _model_reduction(model, size: int) -> str | None:
    """How `model` combines gradients across `size` ranks, where it can be told: "mean" (DDP without a comm hook,
    FSDP2 with its default divide factor or one of `size`), "sum" (FSDP2 with a divide factor of 1); else None (a
    comm hook, a plain model reduced by hand).  FSDP2 modules that average where others sum, or a divide factor
    that does neither: a ValueError (`set_gradient_divide_factor` sets the module it is called on only, and no
    loss scale suits such a model)."""
    if hasattr(model, "set_requires_gradient_sync"):
        try:  # FSDP2 keeps the factor of `set_gradient_divide_factor` in each parameter group
            groups = named_fsdp_param_groups(model)
        except AttributeError:
            return None
        ways = {}
        for name, group in groups:
            factor = group.gradient_divide_factor
            way = "mean" if factor is None or factor == size else "sum" if factor == 1 else None
            if way is None:
                raise ValueError(f"the FSDP2 unit at {name} of {kind(model)} divides its gradients by "
                                 f"set_gradient_divide_factor({factor}), neither 1 (a sum) nor the world size {size} "
                                 f"(a mean), which no normalize_loss scale pairs with: set 1.0 with "
                                 f"gradient_reduction='sum', or leave the default with 'mean'")
            ways.setdefault(way, name)
        if len(ways) > 1:
            raise ValueError(
                f"the FSDP2 modules of {kind(model)} reduce gradients two ways: {ways['mean']} averages them and "
                f"{ways['sum']} sums them (set_gradient_divide_factor(1.0)), so no loss scale is right for both; "
                f"`set_gradient_divide_factor` sets the module it is called on only: call it on every fully_shard-ed "
                f"module (each `FSDPModule` in `model.modules()`), or on none")
        return next(iter(ways), None)
    return "mean" if hasattr(model, "no_sync") and getattr(model, "_comm_hooks", None) == [] else None


def check_reduction(models, micro, reduction: str, loss: torch.Tensor, nested: bool) -> None:
    """A ValueError where `normalize_loss(loss, micro, gradient_reduction=reduction)` in `accumulate` blocks of
    `models` scales for another reduction than theirs: in `nested` blocks, those of the models whose parameters `loss`
    reaches (every rank runs the same models and call: every rank raises); where a reentrant checkpoint hides what
    the loss reaches (`_leaves`), the models it visibly reaches, and the others left unchecked with a warning
    (`ModelCheckWarning`: never a refusal of a scale that may be right)."""
    size = micro.world_size
    # a plain model's reduction is the caller's (None: left out)
    combines = [(model, way) for model in models if (way := _model_reduction(model, size)) is not None]
    if nested:  # an actor's block and a critic's (a plain one's too): the loss's own models
        reached, blind = _leaves(loss)
        seen = [(model, way) for model, way in combines
                if any(id(parameter) in reached for parameter in _graph_parameters(model))]
        unseen = [f"{kind(model)} (which reduces by {way})" for model, way in combines
                  if way != reduction and (model, way) not in seen]
        if blind and unseen:
            _warn_hidden(micro, reduction, unseen)
        combines = seen
    two_ways = len({way for _, way in combines}) > 1
    if two_ways:
        raise ValueError(f"normalize_loss(loss, micro, ...) in nested `accumulate` blocks: the loss reaches "
                         f"{' and '.join(f'{kind(model)}, which reduces by {way}' for model, way in combines)}, so "
                         f"no gradient_reduction is right for both: normalise each model's part of the loss on its "
                         f"own, with its reduction")
    wrong = [(model, way) for model, way in combines if way != reduction]
    if not wrong:
        return
    model, way = wrong[0]
    how = ("averages gradients across ranks (DDP, FSDP2 by default or dividing by the world size)" if way == "mean"
           else "sums gradients across ranks (FSDP2 after set_gradient_divide_factor(1.0))")
    off = f"too {'large' if reduction == 'mean' else 'small'}"
    what = (f"the gradients would come out {size} times {off} (the world size)" if size > 1 else
            f"the same gradients on this one rank, but D times {off} on D ranks, so refused here too")
    raise ValueError(
        f"normalize_loss(loss, micro, gradient_reduction={reduction!r}) in `accumulate` of {kind(model)}, which "
        f"{how}: {what}; pass gradient_reduction={way!r}")


def _leaves(tensor: torch.Tensor) -> tuple[set[int], bool]:
    """The ids of the leaf tensors the autograd graph of `tensor` accumulates gradients into, and whether it is blind
    there: a reentrant checkpoint's node hides the parameters its function uses; where that function is a module or
    a module's method (`module_of`), that module's parameters count as reached, else the walk is blind."""
    leaves, seen, stack, blind = set(), set(), [tensor.grad_fn], False
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # an AccumulateGrad node
            leaves.add(id(node.variable))
        if type(node).__name__ == _CHECKPOINT_NODE:
            module = module_of(getattr(node, "run_function", None))
            leaves.update(id(parameter) for parameter in ([] if module is None else _graph_parameters(module)))
            blind |= module is None
        stack.extend(following for following, _ in node.next_functions)
    return leaves, blind


def _warn_hidden(micro, reduction: str, unseen: list[str]) -> None:
    """Warn, once per reduction and models on this rank, that a reentrant checkpoint hides whether a loss normalised
    for `reduction` reaches the `unseen` models, which reduce otherwise (its scale is not checked against them)."""
    key = ("reduction", reduction, tuple(unseen))
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(ModelCheckWarning(
        f"rank {group_rank(micro.contract[0])}: normalize_loss(loss, micro, gradient_reduction={reduction!r}) in "
        f"nested `accumulate` blocks: a reentrant checkpoint of a function that is not a module (a lambda, a "
        f"function) in the loss's graph hides whether the loss reaches {' or '.join(unseen)}, so its scale is not "
        f"checked there; checkpoint with use_reentrant=False or checkpoint the module itself (the check sees through "
        f"both)"), stacklevel=3)


def _graph_parameters(model) -> list:
    """The tensors a forward of `model` puts in the autograd graph as leaves: its parameters, and under FSDP2 the
    unsharded ones it gathers (private to FSDP2: none where another torch keeps them otherwise)."""
    try:
        gathered = [fsdp_param._unsharded_param for group in fsdp_param_groups(model)
                    for fsdp_param in group.fsdp_params if hasattr(fsdp_param, "_unsharded_param")]
    except AttributeError:
        gathered = []
    return [*model.parameters(), *gathered]


def outside_blocks(micro, models, forwards) -> None:
    """A `ModelContractError` where a body of `accumulate` blocks for `micro` (of `models`) ran a forward with grad of
    a DDP or FSDP2 module (`forwards`, weak references) that none of them is or holds: its sync is not held and it
    is not checked (the block given `ddp.module`, a block forgotten for one of several sharded modules).  Every
    rank runs the same body, so every rank raises, before the backward."""
    held = {module for model in models for module in model.modules()}
    for noted in forwards:
        module = noted()
        if module is None or module in held:
            continue
        wrapped = any(getattr(module, "module", None) is model for model in models)
        given = ("the module the block was given, its `.module`: pass the DDP module itself, `accumulate(ddp, micro)`"
                 if wrapped else f"given no block of its own (the blocks here are given "
                 f"{', '.join(type(model).__name__ for model in models)}): nest one `accumulate` block per DDP or "
                 f"FSDP2 module, or `fully_shard` a root holding them and pass it; freeze a reference model "
                 f"(requires_grad_(False)) or run it under torch.no_grad()")
        raise ModelContractError(
            f"rank {group_rank(micro.contract[0])}: the body of `accumulate` in micro-batch {micro.index} of "
            f"{micro.num_microbatches} ran the forward of {kind(module)}, whose gradients DDP or FSDP2 reduce, "
            f"{'wrapping ' if wrapped else ''}{given}; `accumulate` holds the gradient sync of the module it is given "
            f"and checks it, so here neither (every micro-batch's backward would reduce, and a layer skipped on an "
            f"empty micro-batch leaves the ranks' reductions waiting on each other)")


AT_HOME = ("where the loss is made at home after `combine` (each micro-batch's outputs sent home, one backward for "
           "the step), run each forward in `with accumulate(model, micro, check=False):` on every rank: the check "
           "cannot follow a loss made after the exchange, so keep every parameter in the graph on empty micro-batches "
           "yourself")


def bare_loop_problem(what: str, micro, synced: str) -> ModelContractError:
    """The refusal of a loop body without `accumulate` (`what` it did) in a step due the check, after a forward
    with grad of the DDP or FSDP2 module `synced`."""
    return ModelContractError(
        f"{what} on micro-batch {micro.index} of {micro.num_microbatches}, in a step due the model check (until its "
        f"runtime's first training loop, or a step where a rank's last micro-batch is empty), after a forward with "
        f"grad of a DDP or FSDP2 module ({synced}): wrap each micro-batch's body (forward, normalize_loss, "
        f"backward) in `with accumulate(model, micro):`, as the loop of `runtime.microbatch` shows; it runs the "
        f"check (a layer skipped on an empty micro-batch trains wrong under DDP without an error) and holds DDP's "
        f"gradient sync to the last micro-batch, and is right under FSDP2 and for a plain model too; if that "
        f"{synced} is a reference model "
        f"whose output the loss does not depend on, run it under torch.no_grad() (a forward with grad is taken for "
        f"the trained model's); where unused parameters are harmless, `accumulate(model, micro, check=False)` on "
        f"every rank skips the check; {AT_HOME}")


def out_of_order(micro, model, missing: list, again: bool) -> ValueError:
    """The refusal of a step's last micro-batch whose block runs before micro-batches `missing` of its step ran in
    blocks for `model` (`again`: it ran already, and no other block since)."""
    where = ("again, after its block synchronised the step's gradients (a pass runs each micro-batch once)" if again
             else f"before micro-batches {missing[:8]}{' ...' if len(missing) > 8 else ''} of its step")
    return ValueError(
        f"micro-batch {micro.index} of {micro.num_microbatches}, the step's last, runs in `accumulate` {where}: its "
        f"block synchronises the gradients of {kind(model)}, so those of micro-batches run after it would stay each "
        f"rank's own; run a step's micro-batches in index order (as `microbatches` yields them), the last one last")


def skipped_problem(micro) -> ModelContractError:
    """The refusal, on the rank alone, of a training loop that ran no `accumulate` block for `micro`, the last
    micro-batch of a step due the check (an empty one skipped): its peers wait in the model check's all-gather."""
    return ModelContractError(
        f"rank {group_rank(micro.contract[0])}: micro-batch {micro.index} of {micro.num_microbatches}, the last of a "
        f"step due the model check ({len(micro.items)} items on this rank), ran no `with accumulate(model, micro):` "
        f"block with grad here (skipped as empty, `if micro.items.size == 0: continue`?): every rank runs every "
        f"micro-batch's block, an empty one too, since its backward runs the model check's all-gather and the "
        f"gradient reduction with the peers, which now wait for this rank; run the model on the empty tensors (e.g. "
        f"`output.sum() * 0` for the loss) instead of skipping")


def unrecorded_static_graph(micro, model) -> None:
    """A ValueError before the block's forward where `model` is a DDP built with static_graph=True that records its
    graph in this step's backward (its first) and `micro`'s step carries a differentiable dispatch's tensors whose
    graph reaches parameters of `model` (a module of it run before the dispatch): the dispatch's backward runs in the
    last micro-batch's only (`runtime.carry`), so the graph the first backward records leaves them out and torch
    fails in the last one's ("Your training graph has changed").  Every rank runs the same model and dispatch: every
    rank raises."""
    if micro.step.carried is None or not micro.step.carried.leaves or not getattr(model, "static_graph", False) or \
            getattr(model, "_static_graph_delay_allreduce_enqueued", True):
        return
    names = {id(parameter): name for name, parameter in model.named_parameters() if parameter.requires_grad}
    reached = sorted(reached_leaves(micro.step.carried.roots, names, set(names.values()))[0])
    if reached:
        raise ValueError(
            f"{kind(model)} is built with static_graph=True and records its graph in this step, whose micro-batches "
            f"come from a differentiable dispatch whose graph reaches its parameters {reached[:4]}"
            f"{' ...' if len(reached) > 4 else ''} (a module of it run before the dispatch): that dispatch's backward "
            f"runs once, in the step's last micro-batch's (`runtime.carry`), so the graph the first backward records "
            f"(micro-batch {micro.index}'s) leaves them out and torch fails in the last; run that module outside the "
            f"static-graph DDP (a module of its own, or a DDP of its own), build the DDP without static_graph, or make "
            f"the first step one micro-batch")


_REDUCED_BY_DDP: dict = {}  # id -> weak reference of the parameters of DDP models run in `accumulate`
_ARMED = weakref.WeakKeyDictionary()  # DDP module -> [block micro-batch (weak), forward, reduced, kind, reached]
_FORWARDS = weakref.WeakKeyDictionary()  # a DDP module -> [its forwards with grad since `one_synced_backward` met it]


def reduced_by_ddp(parameter) -> bool:
    """Whether `parameter` is one of a DDP model run in `accumulate`, whose gradients DDP reduces there."""
    kept = _REDUCED_BY_DDP.get(id(parameter))
    return kept is not None and kept() is parameter


def _forwards(model) -> list:
    counted = _FORWARDS.get(model)
    if counted is None:
        counted = _FORWARDS[model] = [0]

        @torch.compiler.disable  # run eagerly inside a compiled forward
        def count(module, args):
            counted[0] += torch.is_grad_enabled()
        model.register_forward_pre_hook(count)
    return counted


def one_synced_backward(model, micro, normalized: torch.Tensor) -> None:
    """Under DDP (`model` has `no_sync`), in the block of a step's last micro-batch, where DDP reduces the gradients
    at the first backward that reaches the model after each forward: any later backward reaching it from the same
    forward (a loss in two parts, each `.backward()`ed, an auxiliary loss's) would leave its gradients on this rank
    unreduced, so it raises ModelContractError (DDP decides at the forward: a `no_sync()` around the first backward
    alone does not hold its reduction; a new forward, a second pass over the step's micro-batches, reduces again).
    A backward through `normalized` (a hook at that root) marks, as it ends, whether it reached the model (a hook on
    each trainable parameter's gradient, registered once per model); a reentrant checkpoint's inner backward runs
    inside it, and another model's backward in nested blocks reaches none of these.  Not seen: a first backward that
    does not pass through a `normalize_loss(..., micro)` result."""
    forward, record = _forwards(model), _ARMED.get(model)
    if record is None:
        record = _ARMED[model] = [None, None, False, kind(model), False]
        for each in model.parameters():  # (a tensor's == is elementwise: no WeakSet)
            _REDUCED_BY_DDP[id(each)] = weakref.ref(each, lambda _, key=id(each): _REDUCED_BY_DDP.pop(key, None))
            if each.requires_grad:
                each.register_post_accumulate_grad_hook(lambda _: _reached(record, forward))
    if record[0] is None or record[0]() is not micro or record[1] != forward[0]:
        record[:3], record[4] = [weakref.ref(micro), forward[0], False], False

    def ended():
        record[2] = record[2] or record[4]  # the reducing backward is over where it reached the model

    def started(grad):
        if record[1] == forward[0]:
            torch.autograd.Variable._execution_engine.queue_callback(ended)
    normalized.register_hook(started)


def _reached(record: list, forward: list) -> None:
    """The parameters' hook of `one_synced_backward`: note that a backward reached the model, refuse one after the
    reducing backward of the armed forward ended."""
    micro = None if record[0] is None else record[0]()
    if micro is None or record[1] != forward[0]:  # not armed for the model's latest forward
        return
    record[4] = True
    if record[2]:
        raise ModelContractError(
            f"a second backward reaching the model in the block of micro-batch {micro.index} of "
            f"{micro.num_microbatches}, the step's last, under DDP ({record[3]}): DDP reduced the gradients at the "
            f"first backward, so this one's would stay on this rank, unreduced; sum the loss parts and call backward "
            f"once per model in the step's last micro-batch (earlier ones may backward several times)")

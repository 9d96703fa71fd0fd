"""The encoder contract: on every rank, every parameter of an encoder takes part in its output.

The runtime calls every encoder on every rank, with empty inputs where a rank holds none of
its modality (so that every rank takes part in the embedding exchange and its backward).  An
encoder that returns early on empty input (`if x.numel() == 0: return x.new_zeros(0, d)`)
leaves its parameters out of that rank's graph, and the gradient reduction then goes wrong
without a word: DDP reduces gradients bucket by bucket as they become ready, so the ranks'
all-reduces pair up different buckets (gradients off by a relative 2.16 in the issue's trial,
and the reducer fails a step later); FSDP2's reduce-scatters differ in size and gloo aborts.

`checked_call` runs an encoder and says which of its parameters its output does not reach
through the autograd graph (a walk of `grad_fn`, a few milliseconds once).  Under FSDP2 the
graph holds the unsharded parameters the module uses during its forward, not the sharded ones
it holds afterwards: a global forward hook records, while the encoder runs, the parameters
each of its modules holds as its forward returns.  The runtime checks each encoder's first
call and every call with empty inputs, and carries the verdict in the header of the embedding
exchange, so every rank raises `EncoderContractError` naming the rank, the encoder and the
parameters (see `MultiStageRuntime`'s `check_encoders`).  An encoder whose module cannot be
seen (a lambda or function calling it) is refused there too (`unseen_module`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import weakref
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import BackwardCFunction

from .comm import collective, group_rank, group_size


class EncoderContractError(ValueError):
    """An encoder's output did not depend on some of its parameters on some rank."""


def _unwrapped(encoder: Callable) -> tuple[nn.Module | None, bool]:
    """(the module whose parameters `encoder` uses, whether it runs that module whole): the module
    itself or its `forward` run it whole; another bound method (a root model's `encode_image`) may
    use part of its module.  Looked for under functools.partial and `__wrapped__` (functools.wraps);
    (None, False) for other callables (a lambda, a function: the runtime cannot see their parameters)."""
    seen = set()
    while id(encoder) not in seen:
        seen.add(id(encoder))
        if isinstance(encoder, nn.Module):
            return encoder, True
        owner = getattr(encoder, "__self__", None)
        if isinstance(owner, nn.Module):
            return owner, getattr(encoder, "__func__", None) is getattr(type(owner), "forward", None)
        encoder = encoder.func if isinstance(encoder, functools.partial) else getattr(encoder, "__wrapped__", None)
    return None, False


def module_of(encoder: Callable) -> nn.Module | None:
    """The module whose parameters `encoder` uses (see `_unwrapped`), or None."""
    return _unwrapped(encoder)[0]


def _reentrant_checkpoints() -> list:
    """The nodes of the autograd Functions whose forwards run the caller (a checkpoint inside a checkpointed
    function runs in both), found up the stack of frames: frames whose `ctx` is a Function's node (its ctx is
    the output's grad_fn).  Reentrant checkpoints are such Functions, whatever their name (torch's, Megatron-LM's
    and DeepSpeed's `CheckpointFunction`, a framework's recompute Function): they run their function without
    grad and again in the backward."""
    nodes, frame = [], sys._getframe(2)
    while frame is not None:
        if "ctx" in frame.f_code.co_varnames:
            node = frame.f_locals.get("ctx")
            if isinstance(node, BackwardCFunction):
                nodes.append(node)
        frame = frame.f_back
    return nodes


_CHECKPOINT_NODE = "CheckpointFunctionBackward"  # a reentrant checkpoint's node: its parameters are not in the graph
_PROBE = torch.zeros((), requires_grad=True)


def sequence_number() -> int:
    """The autograd sequence number of the next node this thread creates (nodes are numbered as they are made, per
    thread), read from a node made and dropped: a checkpoint's node made in a model's forward falls in its span."""
    return _PROBE.view(()).grad_fn._sequence_nr() + 1


@contextlib.contextmanager
def recording(module: nn.Module, hidden: weakref.WeakKeyDictionary | None = None, ran: set | None = None,
              spans: list | None = None):
    """Yield {id(parameter): name}: `module`'s parameters now, and those each of its modules holds
    as its forward returns while the body runs (FSDP2 swaps unsharded ones in for the forward).
    `hidden` maps each reentrant checkpoint's node to the names of the parameters of the modules its forward
    ran (the graph does not show them; a `torch.no_grad()` pass elsewhere hides nothing; a module the checkpointed
    function calls under its own `torch.no_grad()` counts too, as the whole function runs without grad in that
    forward and cannot be told apart, though its recomputation gives that module no gradient); `ran` gets the
    names of the modules whose forward returned (a DDP module's, "", also where its forward is called without its
    hooks, `model.forward(...)`); `spans` the (first, end) sequence numbers of the nodes made in
    each outermost forward with grad of its modules (where a checkpoint that runs no module may hide its
    parameters)."""
    names = {id(parameter): name for name, parameter in module.named_parameters()}
    prefixes = {submodule: f"{prefix}." if prefix else "" for prefix, submodule in module.named_modules()}
    outermost: list = [None, 0]  # the module of the open span and its first sequence number
    inner = getattr(module, "module", None)  # a DDP module's

    def own(submodule) -> list[str]:  # a module of another model hides none of these
        prefix = prefixes.get(submodule) if isinstance(submodule, nn.Module) else None
        return [] if prefix is None else [prefix + name for name, _ in submodule.named_parameters(recurse=False)]

    @torch.compiler.disable  # run eagerly inside a compiled forward (dynamo fails tracing these closures)
    def enter(submodule, args):
        if torch.is_grad_enabled():  # a checkpointed function runs without grad
            if spans is not None and outermost[0] is None and submodule in prefixes:
                outermost[:] = submodule, sequence_number()
            return
        mine = own(submodule)  # each module that runs credits its own parameters
        for node in _reentrant_checkpoints():
            if node not in hidden:  # and a checkpointed method's module its own (`self.pos`), once
                hidden[node] = set(own(getattr(getattr(node, "run_function", None), "__self__", None)))
            hidden[node].update(mine)

    @torch.compiler.disable
    def record(submodule, args, output):
        prefix = prefixes.get(submodule)
        if prefix is not None:
            if ran is not None:
                ran.add(prefix)
                if submodule is inner and getattr(nn.parallel.DistributedDataParallel, "_active_ddp_module", None) \
                        is module:  # DDP's own forward runs its module: called as `model.forward(...)` too
                    ran.add("")
            names.update((id(parameter), prefix + name) for name, parameter in submodule.named_parameters())
            if submodule is outermost[0] and torch.is_grad_enabled():
                spans.append((outermost[1], sequence_number()))
                outermost[0] = None

    handles = [nn.modules.module.register_module_forward_hook(record)]
    if hidden is not None:
        handles.append(nn.modules.module.register_module_forward_pre_hook(enter))
    try:
        yield names
    finally:
        for handle in handles:
            handle.remove()


def reached_leaves(outputs, names: dict[int, str], wanted: set[str], hidden=None, blind=None
                   ) -> tuple[set[str], bool]:
    """(the names in `wanted` of the leaves the graphs of `outputs` (tensors, or autograd nodes) reach, whether a
    reentrant checkpoint met on the way may hide others); the walk stops once all are found.  A reentrant checkpoint
    hides the parameters it used: with `hidden` (`recording`'s: those of the modules each checkpoint ran) they count
    as reached at its node; a checkpoint whose forward ran no module (a function using parameters directly), or any
    without `hidden`, may hide any, unless `blind(node)` says it cannot hide these (made in another model's forward)."""
    reached: set[str] = set()
    stack = [output.grad_fn if isinstance(output, torch.Tensor) else output for output in outputs]
    seen, opaque = set(), False
    while stack and reached != wanted:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hidden is not None and node in hidden:  # a Function whose forward ran modules (a reentrant checkpoint)
            reached |= hidden[node] & wanted
        elif type(node).__name__ == _CHECKPOINT_NODE and (blind is None or blind(node)):
            opaque = True
        variable = getattr(node, "variable", None)
        if variable is not None and names.get(id(variable)) in wanted:
            reached.add(names[id(variable)])
        stack.extend(function for function, _ in node.next_functions)
    return reached, opaque and reached != wanted


def checked_call(encoder: Callable, *args, expected: set[str] | None = None
                 ) -> tuple[torch.Tensor, list[str], set[str] | None]:
    """`encoder(*args)`, the names of the trainable parameters of its module that the output does not depend
    on ([] when it cannot tell: no module, no gradient recorded, a reentrant checkpoint), and those it does
    depend on (None when it cannot tell).  A module run whole is flagged on every parameter left out; a
    method that may use part of its module when its output depends on none of it (the early return on empty
    input), or on less than `expected` (what a call of it with items reached: a tower skipped beside its
    projector)."""
    module, whole = _unwrapped(encoder)
    if module is None or not torch.is_grad_enabled():
        return encoder(*args), [], None
    wanted = {name for name, parameter in module.named_parameters() if parameter.requires_grad}
    with recording(module) as names:
        output = encoder(*args)
    if not wanted or not isinstance(output, torch.Tensor):
        return output, [], None
    reached, opaque = reached_leaves([output], names, wanted)
    if opaque:
        return output, [], None
    return output, sorted((wanted if whole or not reached else (expected or set()) & wanted) - reached), reached


def output_problem(what: str, output, rows: int, width: int | None) -> Exception | None:
    """Why an encoder's (or the text embedding's) output is not a (rows, width) tensor, or None."""
    if not isinstance(output, torch.Tensor):
        return TypeError(f"{what} returned a {type(output).__name__}; expected a tensor of shape ({rows}, hidden) "
                         f"(take the embeddings out of a tuple or ModelOutput)")
    if output.dim() != 2 or output.shape[0] != rows:
        return ValueError(f"{what} returned shape {tuple(output.shape)}; expected ({rows}, hidden): one row per "
                          f"output token of its items")
    if width is not None and output.shape[1] != width:
        return ValueError(f"{what} returned rows of width {output.shape[1]}; the text embedding's rows are {width} "
                          f"wide (the embeddings are packed together into the LLM's sequences)")
    return None


def unseen_module(what: str, encoder: Callable) -> EncoderContractError | None:
    """The error refusing `encoder` when the contract cannot be checked on it (`module_of` finds no
    module: a lambda calling the module hides its parameters, and an early return there went
    unnoticed); None when it can."""
    if module_of(encoder) is not None:
        return None
    return EncoderContractError(
        f"{what} is a {type(encoder).__name__}, not an nn.Module, a bound method of one or a functools.partial of "
        f"either, so the runtime cannot find its parameters to check that its output depends on every one of them "
        f"on every rank (one left out gives wrong DDP gradients without an error); pass the module itself or its "
        f"bound method (`encoders={{'image': vision}}`, `vision.forward`), set `__wrapped__ = vision` on a wrapping "
        f"function, or pass check_encoders=False")


def contract_problem(what: str, rank: int, num_items: int, unused: list[str]) -> EncoderContractError:
    """The error naming an encoder whose output left out parameters `unused` on `rank`."""
    shown = ", ".join(unused[:6]) + (f" and {len(unused) - 6} more" if len(unused) > 6 else "")
    return EncoderContractError(
        f"{what} on rank {rank} ({num_items} items) returned an output that does not depend on its parameters "
        f"{shown}: the runtime calls every encoder on every rank, with empty inputs where a rank holds none of its "
        f"modality, and DDP and FSDP reduce every parameter's gradient on every rank (one left out gives wrong "
        f"gradients under DDP, aborts FSDP); compute the output from every parameter on empty inputs too (run the "
        f"layers on the empty tensor instead of returning early); set requires_grad=False on parameters it never "
        f"uses, or pass check_encoders=False where unused parameters are harmless (gradients reduced by hand, DDP "
        f"with find_unused_parameters=True)")


def unrecorded_problem(records: bool, outputs, modalities, group) -> EncoderContractError:
    """The error every rank raises where the embedding exchange's header said that some ranks record its backward
    and others do not (`records`: whether this rank does; `outputs`: its encoders' outputs, by modality): the
    recording ranks would wait in their backward's reverse exchange until the collective timeout.  One all-gather,
    on this error path only, names the ranks and the encoders whose outputs need no grad."""
    needs = [m for m, output in zip(modalities, outputs) if output.requires_grad]
    mine = (records, needs if torch.is_grad_enabled() else None)
    shown = [None] * group_size(group)
    with collective("encoder outputs' grad all-gather", group):
        dist.all_gather_object(shown, mine, group=group)
    recording = [rank for rank, (record, _) in enumerate(shown) if record]
    needed = {m for record, needs in shown if record for m in needs or ()}
    why = "; ".join(f"rank {rank}: " + ("grad mode is off (torch.no_grad or inference_mode)" if needs is None else
                                         ", ".join(f"encoder {m!r}'s output needs no grad" for m in modalities
                                                   if m in needed and m not in needs) or "no output needs grad")
                    for rank, (record, needs) in enumerate(shown) if not record)
    return EncoderContractError(
        f"encoder outputs (seen from rank {group_rank(group)}): ranks {recording} record the embedding exchange's "
        f"backward and ranks {sorted(set(range(len(shown))) - set(recording))} do not ({why}), so ranks {recording} "
        f"would wait in their backward until the collective timeout; an encoder's output must need grad alike on "
        f"every rank: reach every trainable parameter on every call (no `.detach()`, no output kept from another "
        f"call, no torch.no_grad inside it), and every rank runs the pass in the same grad mode")


def sharded_problem(what: str, function: Callable, error: RuntimeError) -> RuntimeError:
    """The error naming `what` when its call failed on FSDP2-sharded parameters (torch's "mixed
    torch.Tensor and DTensor": FSDP2 gathers a module's parameters only inside that module's own
    forward, and `what` ran outside it); any other `error` is raised again as it is (call it in the
    `except` block that caught it)."""
    if "mixed torch.Tensor and DTensor" not in str(error):
        raise error
    module = module_of(function)
    kind = f" ({type(module).__name__})" if module is not None else ""
    problem = RuntimeError(
        f"{what}{kind} ran on FSDP2-sharded parameters (torch: {str(error).splitlines()[0]}): FSDP2 gathers a "
        f"module's parameters only inside that module's own forward, and the runtime calls {what} directly, outside "
        f"the forward of the module that shards it; `fully_shard` it on its own (`fully_shard(llm.embed)` for the text "
        f"embedding, `fully_shard(vision)` for an encoder), then the modules holding it, then the root, whose "
        f"forward calls the runtime (README, FSDP2)")
    problem.__cause__ = error
    return problem


def call_problem(what: str, function, arguments: str, count: int) -> TypeError | None:
    """TypeError naming `what` unless `function` is callable with `count` positional arguments (`arguments`
    says which): a vision tower's `forward(pixel_values)` as an encoder fails here, not inside torch."""
    if not callable(function):
        return TypeError(f"{what} must be callable with {arguments}; got {type(function).__name__}")
    target = function.forward if isinstance(function, nn.Module) else function
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # no signature to read (a builtin): its call says
        return None
    try:
        signature.bind(*range(count))
    except TypeError:
        name = getattr(target, "__qualname__", type(function).__name__)
        return TypeError(f"{what} must accept {count} positional argument{'s' * (count > 1)} {arguments}; "
                         f"got {name}{signature}")
    return None

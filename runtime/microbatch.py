"""Gradient accumulation over post-balanced micro-batches: iteration, loss scale, gradient sync.

A micro-batched step (`max_tokens_per_microbatch` on the dispatcher or the multi-stage runtime) is planned once from
the gathered metadata: every item gets a cell (rank, micro-batch), every rank runs the same number M of
micro-batches (different counts deadlock FSDP), and a rank whose micro-batch is empty still runs it, with empty
tensors, so it takes part in every collective.  The right loop:

    plan = dispatcher.plan(lengths, loss_tokens=loss_tokens)  # one all-gather, the whole step
    moved = dispatcher.dispatch(batch, plan)                  # one all-to-all, the whole step
    for micro in dispatcher.microbatches(plan, moved):
        with accumulate(model, micro):                        # no gradient sync but on the last
            loss_sum = model(micro.data["input_ids"], micro.lengths)  # packed: one length per sample
            normalize_loss(loss_sum, micro).backward()        # / the step's global loss tokens

The loss of every micro-batch is divided by the loss tokens of the whole step (all ranks, all micro-batches), which
the metadata all-gather already carried, so no collective is needed and the accumulated gradient equals that of one
pass over the global batch.  Dividing each micro-batch by its own count (what `normalize_loss(loss, local_count)`
would do) weights tokens by the size of the micro-batch they happen to sit in: inside a micro-batch loop of M > 1
that call raises, and so it does for a loss that requires grad after the step's micro-batches were handed out (e.g.
collected by `list(...)` first), while they are held and until the next `plan()` or `microbatches()` (an evaluation
under `torch.no_grad()` takes a count).

The model must compute the loss through every trainable parameter on an empty micro-batch too: the last
micro-batch's backward reduces every parameter's gradient (DDP, FSDP2) on every rank.  `accumulate` checks it where
it matters (`check_model_contract`: until the runtime's first training loop, and where a rank's last micro-batch is
empty), as that micro-batch's backward starts, raising `ModelContractError` on every rank: every rank must then pass its
loss through `normalize_loss(loss, micro)` (not `micro.loss_scale()` or `total_loss_tokens=`, which the check does
not see: a body that ran no backward through a `normalize_loss(loss, micro)` result is refused) and run the backward
inside the block (the check is a collective); a metric normalised there for logging only counts as a loss part, so
`.detach()` it first (else parameters it reaches count as reached)."""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from ..balancers.validation import as_bool
from .encoders import recording
from .model_check import (ModelContractError, bare_loop_problem, check_model_contract, check_reduction, kind,
                          one_synced_backward, out_of_order, outside_blocks, skipped_problem, unrecorded_static_graph)
from .steps import StepToken
from .versions import discarded, held_gradient, optimizer_steps, uncleared, unstepped, unwritten

_active = threading.local()


@dataclass(frozen=True, eq=False)
class MicroBatch:
    """Micro-batch `index` of `num_microbatches` on this rank.

    `data` is what the rank runs (a dict of tensors for the dispatcher, a `Dispatched` for the multi-stage runtime);
    `items` the global indices of its items (ascending); `routes` the multi-stage routes of this micro-batch (None
    for the dispatcher); `num_loss_tokens` the loss tokens of the whole step on all ranks, the denominator of every
    micro-batch's loss; `lengths` the tokens of each of `items` (their LLM tokens in the multi-stage runtime), an
    int64 CPU tensor: the per-sample lengths packed attention needs (cu_seqlens = 0 then their cumsum); a split
    item's entry is this rank's shard.  `layout` (with context parallelism) is the micro-batch's
    `ContextParallelLayout`: which sequences are shards of which item on which group, their unsplit positions, what
    `context_parallel_attention` takes.  `step` is the step the micro-batch belongs to (None where it is not
    tracked): `combine` and `normalize_loss` refuse a micro-batch of a step its runtime has since ended
    (`StepToken`).  `contract` is `(group,)` on every micro-batch of a step due the model check on `group` (a
    runtime's steps until one trained, and every step where a rank's last micro-batch is empty; else None): the last
    one's backward checks (`check_model_contract`), and from the first a loop body without `accumulate` is watched
    (`watch_model_contract`)."""

    index: int
    num_microbatches: int
    items: np.ndarray
    data: object
    num_loss_tokens: int
    world_size: int
    routes: object = None
    lengths: torch.Tensor | None = None  # None only in a MicroBatch built by hand without them
    layout: object = None  # a ContextParallelLayout with context parallelism, else None
    step: StepToken | None = None
    contract: tuple | None = None

    @property
    def is_last(self) -> bool:
        return self.index == self.num_microbatches - 1

    def loss_scale(self, gradient_reduction: str = "mean") -> float:
        """Factor turning a locally summed loss into its share of the step's global mean loss (`gradient_reduction` as
        `normalize_loss`'s).  The model check of `accumulate` does not see a loss scaled by hand: on checked
        micro-batches use `normalize_loss(loss, micro)` (a backward through none of its results is refused there)."""
        scale = self.world_size if checked_reduction(gradient_reduction, "gradient_reduction") == "mean" else 1
        return scale / max(self.num_loss_tokens, 1)


REDUCTIONS = ("mean", "sum")  # how gradients are combined across ranks


def checked_reduction(reduction, name: str) -> str:
    """`reduction` if it is one of REDUCTIONS, else a ValueError naming `name`."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"`{name}` must be one of {REDUCTIONS}; got {reduction!r}")
    return reduction


def active_microbatch() -> tuple[int, int] | None:
    """(index, count) of the micro-batch the current thread's loop body runs, or None."""
    return getattr(_active, "current", None)


def step_microbatches() -> int | None:
    """The number of micro-batches of the step whose micro-batches this thread was handed and still
    holds (its last one is referenced: a loop variable, a list of them), or None."""
    last = getattr(_active, "step", None)
    micro = last() if last is not None else None
    return None if micro is None else micro.num_microbatches


def iterate(microbatches):
    """Yield the micro-batches, recording which one runs (so per-micro-batch loss normalisation raises).

    A loop left by `break` keeps its last micro-batch recorded until the generator is closed or the next `plan()` or
    `microbatches()` on this thread (`new_step`); `accumulate` records its micro-batch for its body whatever the loop.
    The step's last micro-batch stays recorded (weakly) until `new_step`, so a loop over the micro-batches collected
    in a list, after the generator has ended, is known to run inside a step of M micro-batches too; from the first
    micro-batch of a step due the model check, forwards are noted the same way (`_noting_synced_forwards`)."""
    previous, blocked, opened = active_microbatch(), False, None  # a block ran for an earlier micro-batch; the step
    try:
        for micro in microbatches:
            if opened is None and micro.step is not None:
                opened = micro.step
                opened.looping += 1
            _active.current = (micro.index, micro.num_microbatches)
            _active.step = weakref.ref(micro)
            if micro.contract is not None and getattr(_active, "noting", None) is None:
                _active.noting = _noting_synced_forwards()
            _active.forwarded, _active.forwards = None, ()
            yield micro
            _after_body(micro, blocked)
            blocked = blocked or micro in getattr(_active, "ran", ())
    finally:
        _active.current = previous
        if opened is not None:
            opened.looping -= 1


def _after_body(micro: MicroBatch, blocked: bool) -> None:
    """As the loop over the generator asks for the micro-batch after `micro`: a `ModelContractError` where `micro` is
    of a step due the check and its body ran a forward with grad of a DDP or FSDP2 module but no `accumulate` block
    of `micro` (a bare loop whose loss `normalize_loss(loss, micro)` did not see: divided by a count of its own,
    which weights tokens by the micro-batch they sit in, or scaled by hand; a body that skips an empty micro-batch
    runs no forward).  Every rank runs the same loop and decides alike, after the body's backward: no collective
    waits.  And where `micro`, the last of such a step, ran no block, with grad, in a pass whose earlier micro-batches
    ran blocks (`blocked`): a guard skipping an empty micro-batch, whose peers wait in the model check
    (`skipped_problem`, this rank alone: it fails at once, not at the group's timeout)."""
    synced, ran = getattr(_active, "forwarded", None), getattr(_active, "ran", ())
    if micro.contract is not None and micro.is_last and blocked and micro not in ran and torch.is_grad_enabled():
        raise skipped_problem(micro)
    if micro.contract is not None and synced is not None and micro not in ran:
        raise bare_loop_problem("a micro-batch loop body without `with accumulate(model, micro):`, its loss normalised "
                         "otherwise than by `normalize_loss(loss, micro)` (by a count of its own, or by hand),", micro,
                         synced)


def _noting_synced_forwards():
    """From the first micro-batch of a step due the model check until the next `plan()` or `microbatches()` on this
    thread (`new_step`), until none of its micro-batches is held, or until the step's last `accumulate` block ends
    (`_stop_noting`): note (`_active.synced`, the module as errors name it) the first forward with grad, on this
    thread, of a module whose backward reduces every parameter's gradient (DDP, FSDP2), so that
    `normalize_loss(loss, micro)` outside `accumulate` refuses the step from its first micro-batch, before any
    backward reduces, whether the loop runs over the generator or over a list of the micro-batches (a plain module
    with a hand-made all-reduce, which takes a missing gradient as zeros, is fine without).  The hook handle."""
    thread = threading.get_ident()

    @torch.compiler.disable  # run eagerly inside a compiled forward (dynamo fails tracing this closure)
    def note(module, args):
        if threading.get_ident() != thread:
            return
        if step_microbatches() is None:  # the step's micro-batches were dropped
            handle.remove()
            _active.noting = None
        elif _syncing_class(type(module)) and torch.is_grad_enabled() and _reduces_every_parameter(module):
            _active.forwarded = kind(module)  # in the body running now (`_after_body`), and the module DDP wraps
            _active.forwards = getattr(_active, "forwards", ()) + (weakref.ref(module),)  # (`outside_blocks`)
            _active.synced = getattr(_active, "synced", None) or _active.forwarded

    handle = torch.nn.modules.module.register_module_forward_pre_hook(note)
    return handle


class Sampling:
    """A budgeted sampler iterated in this process, steps of up to `num_microbatches` micro-batches, while this
    object lives (the sampler holds it: dropped with the sampler, or replaced at its next epoch), on any thread
    (`normalize_loss` then refuses a per-micro-batch count for a loss that requires grad)."""

    def __init__(self, num_microbatches: int):
        self.num_microbatches = num_microbatches
        _SAMPLING.add(self)


_SAMPLING: weakref.WeakSet = weakref.WeakSet()


def sampled_microbatches() -> int:
    """The most micro-batches a step has in the budgeted samplers iterated in this process (`Sampling`); 1 when none."""
    return max((live.num_microbatches for live in list(_SAMPLING)), default=1)


def new_step(planning: bool = False) -> None:
    """Forget the micro-batches this thread recorded in an earlier step (each `plan()` and `microbatches()` starts
    afresh).  `plan()` (`planning`), and `microbatches()` under no_grad, keep a gradient sync held in the loop of a
    step that has not ended: the next step may be planned inside the loop, a no-grad pass (a teacher's) run there
    (its runtime's next dispatch ends the step and decides, `loop_left`), and the loop's next micro-batch records
    itself again.  `microbatches()` with grad raises where this thread's last loop was left with its sync held."""
    held = getattr(_active, "held", None)
    live = (planning or not torch.is_grad_enabled()) and held is not None and held[0].step is not None and \
        not held[0].step.ended
    _stop_noting()
    _active.current = _active.step = _active.synced = None
    _active.held = held if live else None
    if held is not None and not live and not discarded(held):
        raise _left_early(held, None if planning else "loop")


def loop_left(step: StepToken | None) -> ValueError | None:
    """Why `step` may not end now (its runtime dispatches the next step): this thread's loop of it was left before
    its last micro-batch while `accumulate` held the gradient sync, and its gradients were not dropped on purpose
    (`discarded`); else None.  The held sync is forgotten either way; the runtime raises the error on every rank
    from its exchange header."""
    held = getattr(_active, "held", None)
    if step is None or held is None or held[0].step is not step:
        return None
    _active.held = None
    return None if discarded(held) else _left_early(held, "dispatch")


_BEGAN = {  # what began while a loop held the gradient sync (`_left_early`), and its fix
    "loop": ("a micro-batch loop with grad began (`microbatches()`)", "run a frozen model's micro-batch loop there (a "
             "teacher's, an evaluation's) under `torch.no_grad()`, and a second model's training loop after the step's "
             "last micro-batch, or interleave the two loops (`zip`)"),
    "dispatch": ("the next step was dispatched", "plan the next step inside the loop if you wish, but dispatch it "
                 "after the loop's last micro-batch (or alternate two dispatchers, one per step)")}


def _left_early(held, began: str | None = None) -> ValueError:
    """The refusal of a step whose loop was left with the gradient sync of `held` (micro-batch, model kind) held; where
    what `began` then (a key of `_BEGAN`: a loop with grad, the next step's dispatch) began while that loop's generator
    is open (inside the loop, unless it was left with its generator kept), that first, with its fix."""
    micro, model = held[0], held[1]
    if began is not None and micro.step is not None and micro.step.looping:
        began, fix = _BEGAN[began]
        return ValueError(
            f"{began} while this thread's micro-batch loop of a step that has not ended is open after its micro-batch "
            f"{micro.index} of {micro.num_microbatches}, where `accumulate` holds {model}'s gradient sync to the "
            f"step's last micro-batch: {fix}; if that loop was left early (`break`, an exception, its generator "
            f"kept), run every micro-batch of a step, or leave the rest knowingly with `accumulate(model, micro, "
            f"check=False)`, or drop the step on purpose (its gradients cleared, with no optimizer step)")
    return ValueError(
        f"the micro-batch loop of the previous step on this thread ended after micro-batch {held[0].index} of "
        f"{held[0].num_microbatches} (left by `break`, an exception or a slice, the next step dispatched inside it, "
        f"or a micro-batch loop run with grad inside it) while `accumulate` held {held[1]}'s gradient sync to the "
        f"step's last micro-batch, which never ran: that step's gradients were never synchronised across ranks (an "
        f"optimizer step on them lets the replicas drift "
        f"apart); run every micro-batch of a step, an empty one too, or leave the rest knowingly with "
        f"`accumulate(model, micro, check=False)`; to drop a step on purpose, clear its gradients first, with no "
        f"optimizer step (`model.zero_grad()`, under DDP), at the same micro-batch on every rank")


def _stop_noting() -> None:
    """Remove this thread's forward-noting hook (`_noting_synced_forwards`), if any."""
    noting = getattr(_active, "noting", None)
    if noting is not None:
        noting.remove()
    _active.noting = None


@contextlib.contextmanager
def gradient_sync(model, enabled: bool):
    """Run the body with gradient synchronisation on or off, for DDP (`no_sync()`; on, whatever `enabled`, in the
    first backward of a DDP built with static_graph=True) and FSDP2 (`set_requires_gradient_sync`); other modules
    (plain or hand-reduced) are left alone."""
    if enabled:
        yield
    elif hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    elif hasattr(model, "no_sync") and getattr(model, "static_graph", False) and \
            not getattr(model, "_static_graph_delay_allreduce_enqueued", True):
        yield  # a static-graph DDP's first backward synchronises (it records the graph; under no_sync torch asserts):
        # every rank then holds the mean of these gradients, which the last micro-batch's all-reduce averages again
    elif hasattr(model, "no_sync"):
        with model.no_sync():
            yield
    else:
        yield


class _Contract:
    """What `accumulate` records for the model check of its micro-batch: its parameter names (`recording`),
    the loss parts given to `normalize_loss`, whether the check ran, and the checks of the nested `accumulate`
    blocks it belongs to, outermost first (kept here: the check runs in the backward, on autograd's thread)."""

    def __init__(self, micro: MicroBatch, model, outer: tuple = (), declined: bool = False):
        self.micro, self.model, self.names, self.parts, self.checked = micro, model, {}, [], False
        self.declined = declined  # check=False: joins the check's all-reduce only, so a rank that checks never waits
        self.nest: list[_Contract] = outer[0].nest if outer else []
        self.nest.append(self)
        self.hidden = weakref.WeakKeyDictionary()  # reentrant checkpoint -> the parameters it ran (`recording`)
        self.ran: set[str] = set()  # modules of the model whose forward ran in the body (`recording`)
        self.spans: list = []  # the sequence numbers of the nodes made in the model's forwards (`recording`)

    def on_backward(self, grad):
        """The hook of every normalised part: the first to run (as the micro-batch's backward starts, before it
        reaches the model and any gradient reduction) checks the parts given so far (`check_model_contract`)."""
        if not self.checked:
            self.checked = True
            check_model_contract(self)
        return grad


def _in_order(micro: MicroBatch, model, check: bool) -> None:
    """Record that `micro`'s block for `model` runs; a ValueError, before its forward, where it is its step's last
    (whose block synchronises the gradients of DDP or FSDP2 `model`) and micro-batches of the step have not run in
    blocks for `model` since its last one's: run out of order, theirs would stay unsynchronised on each rank (every
    rank runs the same order, so every rank raises).  A pass in index order after another is a new pass."""
    step = micro.step
    if step is None or not check or not torch.is_grad_enabled():
        return
    blocked = step.blocked.setdefault(id(model), set())
    if not micro.is_last:
        blocked.add(micro.index)
        return
    missing = sorted(set(range(micro.num_microbatches - 1)) - blocked - step.empty)  # an empty one: as if run
    again = blocked == {-1}  # the last ran (-1), and no other block since
    blocked.clear()
    blocked.add(-1)
    if missing:
        raise out_of_order(micro, model, missing, again)


def _syncs(model) -> bool:
    """Whether `model` reduces its gradients itself: a DDP or FSDP2 module."""
    return hasattr(model, "no_sync") or hasattr(model, "set_requires_gradient_sync")


@functools.lru_cache(maxsize=None)
def _syncing_class(cls) -> bool:
    """Whether modules of class `cls` reduce their gradients themselves (DDP, FSDP2's classes): once per class."""
    return hasattr(cls, "no_sync") or hasattr(cls, "set_requires_gradient_sync")


def _synced_inside(model) -> list[str]:
    """The outermost DDP and FSDP2 modules inside `model`, by name and kind (`accumulate` given a plain root)."""
    if not any(_syncing_class(type(module)) for module in model.modules()):  # the usual answer, cheaply
        return []
    found: list[str] = []
    for name, module in model.named_modules():
        if name and _syncs(module) and not any(name.startswith(other.split(" ")[0] + ".") for other in found):
            found.append(f"{name} ({kind(module)})")
    return found


def _reduces_every_parameter(model) -> bool:
    """Whether `model`'s gradient sync expects a gradient of every trainable parameter on every rank: FSDP2,
    and DDP unless built with find_unused_parameters=True; not where it has none (a frozen reference model)."""
    syncs = hasattr(model, "set_requires_gradient_sync") or \
        hasattr(model, "no_sync") and not getattr(model, "find_unused_parameters", False)
    return syncs and any(parameter.requires_grad for parameter in model.parameters())


@contextlib.contextmanager
def accumulate(model, micro: MicroBatch, *, check: bool = True):
    """`gradient_sync(model, micro.is_last)`: gradients are reduced once, in the last micro-batch; the body runs as
    micro-batch `micro` (`normalize_loss` with a count raises there).  Where `micro` is the last of a step due the check
    (`contract`) and `model` reduces every parameter's gradient (DDP, FSDP2), the backward through the body's
    `normalize_loss(loss, micro)` results checks, as it starts, that the loss parts given there depend on every
    trainable parameter of `model` on every rank (`check_model_contract`, a collective); `check=False` (on every rank)
    skips it, its rank joining the check's all-reduce only (ranks passing different `check` are told so on every
    rank).  A loop body without the block that, in a step due the check, runs a DDP or FSDP2 forward with grad and
    normalises with `micro` is refused on every rank (`watch_model_contract`): the block is the rule under both.  A loop
    left before the step's last micro-batch (its gradients never synchronised) is refused by its dispatcher's or
    runtime's next dispatch (`loop_left`; a step dropped on purpose, every gradient zeroed, is not: drop it alike on
    every rank, whose last block's reduction would wait for one that left alone), a step's last block run before its
    others here, and on steps due the check a plain `model` holding DDP or FSDP2 modules (it could hold neither their
    sync nor check them); under DDP and FSDP2, with `check`, trainable parameters written while the sync is held
    (`versions.unstepped`: an optimizer step or a write between the step's blocks, at the next; through `.data`, at
    the last) or in place by the forward (`versions.unwritten`, as the body normalises its loss) are refused on
    every rank.  The backward runs inside the block: where none did there, the exit joins the check with every
    parameter left out.  A metric normalised with `micro` for logging only counts as a loss part: `.detach()` it
    first (or log it unnormalised).  The parameters
    of every module a reentrant checkpoint's forward runs count as reached at its node, those of a module called under
    an explicit `torch.no_grad()` inside the checkpointed function too (that forward runs wholly without grad: they
    cannot be told apart), so a parameter used only there and by a part of the loss left out is not refused; where a
    checkpointed function runs no module, the check cannot tell and warns (`ModelCheckWarning`).  Under FSDP2 the
    forward runs inside the block: a rank whose body runs none there raises alone (its peers wait in the forward's
    all-gather, which no check can pair with)."""
    if not isinstance(micro, MicroBatch):
        raise TypeError(f"`micro` must be a MicroBatch of `microbatches()`; got {type(micro).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"`model` must be the nn.Module whose gradients the micro-batches accumulate (the DDP or "
                        f"FSDP2 module itself, or a plain one); got {type(model).__name__}")
    check = as_bool(check, "check")
    syncs = _syncs(model)
    inside = [] if syncs or micro.contract is None else _synced_inside(model)  # on steps due the check
    if inside:
        raise ValueError(
            f"`model` ({type(model).__name__}) holds modules whose gradients DDP or FSDP2 reduce: {', '.join(inside)}; "
            f"`accumulate` holds the gradient sync of the module it is given and checks that module, so around them "
            f"it does neither (their gradients would be reduced in every micro-batch, and a layer skipped on an empty "
            f"micro-batch would train wrong without an error): pass that module itself, `accumulate(model."
            f"{inside[0].split(' ')[0]}, micro)`, nest one `accumulate` block per such module, or under FSDP2 "
            f"`fully_shard` the root as well")
    if syncs:
        _in_order(micro, model, check)
        if check and micro.step is not None and torch.is_grad_enabled():
            unrecorded_static_graph(micro, model)
        versions = unstepped(micro, model, check)
    previous, outer, blocks = active_microbatch(), getattr(_active, "contracts", ()), accumulated()
    written = getattr(_active, "written", ())  # the blocks `normalize_loss` checks (`unwritten`, `outside_blocks`)
    _active.written = written + ((micro, model, versions if syncs else None, optimizer_steps(),
                                  len(getattr(_active, "forwards", ()))),)  # the forwards noted before it
    _active.current, _active.blocks = (micro.index, micro.num_microbatches), blocks + (micro,)
    if not hasattr(_active, "ran"):  # the micro-batches blocks ran for (`_after_body`; loops may interleave, `zip`)
        _active.ran = weakref.WeakSet()
    _active.ran.add(micro)
    if syncs and torch.is_grad_enabled():  # its sync held to the last (a no-grad block holds nothing, keeps all)
        _active.held = (micro, kind(model), weakref.ref(model), versions) if check and not micro.is_last else None
    contract = _Contract(micro, model, outer, declined=not check) if micro.contract is not None and micro.is_last \
        and _reduces_every_parameter(model) else None
    watching = recording(model, contract.hidden, contract.ran, contract.spans) if contract is not None and check \
        else contextlib.nullcontext({})
    try:
        with gradient_sync(model, micro.is_last), watching as names:
            if contract is not None:
                contract.names = names
            _active.contracts = outer + ((contract,) if contract is not None else ())
            yield
        if syncs and versions is not None:
            held_gradient(micro, model)
        _join_unchecked(contract)
        if micro.is_last and micro.step is not None and torch.is_grad_enabled():
            if check and (unsent := micro.step.unsent()) is not None:
                raise unsent
            micro.step.trained[0] = True  # a training loop ran: later steps are due only where one's last is empty
    except Exception as error:  # the body raised (an out-of-memory batch skipped by a caller): its peers learn it
        _join_unchecked(contract, error)
        raise
    finally:
        _active.current, _active.contracts, _active.blocks, _active.written = previous, outer, blocks, written
        if micro.is_last and not blocks:  # the step's last block: nothing left to note
            _stop_noting()


def _join_unchecked(contract: _Contract | None, raised: Exception | None = None) -> None:
    """Where the model check of `contract` is owed and no backward in the block ran it (none ran there, or the block
    left by `raised`), join the peers' check, which runs as their backward starts: with every parameter left out, or
    as a rank whose body raised (`check_model_contract`); the peers then raise at once instead of waiting."""
    if contract is not None and not contract.checked and torch.is_grad_enabled():
        contract.checked = True
        check_model_contract(contract, backward=False, raised=raised)


def accumulated() -> tuple:
    """The micro-batches of the `accumulate` blocks this thread's code runs in, outermost first."""
    return getattr(_active, "blocks", ())


def watch_model_contract(loss_sum: torch.Tensor, normalized: torch.Tensor, micro: MicroBatch,
                         reduction: str = "mean") -> None:
    """In the body of `accumulate(model, micro)` (one model or several, nested) where a check is due: keep
    `loss_sum` (a part of the loss) and check the parts when the backward through `normalized` (its normalised
    form) starts.  Outside any `accumulate(model, micro)`, in a step due the check whose loop ran a forward with
    grad of a DDP or FSDP2 module (`_noting_synced_forwards`), it raises on every rank alike, from the step's first
    micro-batch (before any backward reduces): every rank runs the same micro-batches and the same model, and
    which steps are due is decided from the plan (`contract_of`)."""
    if not normalized.requires_grad:
        return
    mine = [entry for entry in getattr(_active, "written", ()) if entry[0] is micro]
    if mine and micro.contract is not None:  # DDP and FSDP2 forwards in the blocks, each inside its own
        outside_blocks(micro, [entry[1] for entry in mine], getattr(_active, "forwards", ())[mine[0][4]:])
    checked = [entry for entry in mine if entry[2] is not None]
    for _, model, versions, steps, _ in checked:
        unwritten(micro, model, versions, steps)
        uncleared(micro, model)
    if checked and micro.contract is not None:  # the models' reductions against the loss's scale (`reduction`)
        check_reduction([entry[1] for entry in checked], micro, reduction, loss_sum, len(mine) > 1)
    for _, model, _, _, _ in mine:
        if micro.is_last and hasattr(model, "no_sync"):
            one_synced_backward(model, micro, normalized)
    synced = getattr(_active, "synced", None)
    if micro.contract is not None and synced is not None and not any(block is micro for block in accumulated()):
        raise bare_loop_problem("normalize_loss(loss, micro) outside `with accumulate(model, micro):`", micro, synced)
    for contract in getattr(_active, "contracts", ()):
        if contract.micro is micro and not contract.checked:
            contract.parts.append(loss_sum)
            normalized.register_hook(contract.on_backward)


"""Global reductions that keep post-balancing exact: loss normalisation and gradient sync.

Why the loss must be normalised globally.  Data-parallel training minimises
L = (1/N) · sum of per-token losses over the *global* batch (N loss tokens on all ranks).
Its gradient is a plain sum over tokens, so it does not care which rank computed which
token: moving samples between ranks changes only the order of additions.  A per-rank
mean, L' = (1/D) · sum_r (1/N_r) · sum of rank r's token losses, weights every token by
1/N_r, the token count of the rank it happens to sit on; rearranging samples changes the
N_r and hence the gradient, so balanced and unbalanced runs would train different
models.  `normalize_loss` divides the local sum by the all-reduced global count N, and
scales it for the gradient reduction in use (DDP averages over D ranks, so "mean" multiplies
by D), after which the reduced gradient is exactly that of L.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import torch
import torch.distributed as dist

from ..balancers.validation import as_bool, as_int
from .agreement import TAG_MAGIC, disagreement, fingerprint
from .comm import checked_group, collective, comm_device, finish, group_rank, group_size, is_distributed
from .metadata import FAILED_INPUT, PeerInputError, gather_digests
from .model_check import reduced_by_ddp
from .microbatch import (REDUCTIONS, MicroBatch, active_microbatch, checked_reduction, sampled_microbatches,
                         step_microbatches, watch_model_contract)

INT64_MAX = 2**63 - 1
SAME_CHECK = "every rank passes the same `check`: with it a rank gathers a digest first"  # (probe18 P18-13)


def _count_value(value, name: str, num_ranks: int) -> int:
    """`value` as an int in [0, INT64_MAX // num_ranks]: the sum over `num_ranks` ranks fits int64."""
    value = as_int(value, name, minimum=0)
    if value > INT64_MAX // num_ranks:
        raise ValueError(f"`{name}` must be at most (2**63 - 1) // {num_ranks} rank(s) = {INT64_MAX // num_ranks}, "
                         f"so that the sum over the ranks fits int64; got {value}")
    return value


def as_count(count, name: str, num_ranks: int = 1) -> torch.Tensor:
    """A rank's count checked: a non-negative int, or a one-element tensor of an integer dtype, small
    enough that the sum over `num_ranks` ranks fits int64; an int64 scalar tensor.  A tensor on an
    accelerator is not read back (that would cost a device sync), so it is left unchecked there.

    >>> as_count(torch.tensor([3]), "count").tolist()
    3
    >>> as_count(2.5, "count")
    Traceback (most recent call last):
    ...
    TypeError: `count` must be an int; got float
    """
    if not isinstance(count, torch.Tensor):
        return torch.tensor(_count_value(count, name, num_ranks), dtype=torch.int64)
    if count.numel() != 1:
        raise ValueError(f"`{name}` must be one count; got a tensor of shape {tuple(count.shape)}")
    if count.dtype.is_floating_point or count.dtype.is_complex or count.dtype == torch.bool:
        raise TypeError(f"`{name}` must be an integer count; got a {count.dtype} tensor (count with an integer "
                        f"dtype, e.g. `mask.sum()`)")
    if count.device.type == "cpu":
        _count_value(int(count.item()), name, num_ranks)
    return count.detach().reshape(()).to(torch.int64)


def global_count(local_count, group=None, *, name: str = "local_count") -> torch.Tensor:
    """Sum over the ranks of `group` of a per-rank count (a non-negative int or a one-element integer
    tensor, checked by `as_count` under `name`); an int64 tensor.  A rank whose count fails the check
    still joins the reduction, flagged, so every rank raises (it its own error, the others
    PeerInputError) instead of its peers waiting for the process group's timeout.

    The all-reduce is of four int64 words, the third a tag of `name`, the fourth `normalize_loss`'s
    `gradient_reduction` (ranks that disagree on it raise on every rank naming it, probe27 P27-04).  Paired on
    some rank with another collective of the same size (another count's, a normalisation done otherwise there) it is
    a PeerInputError on every rank;
    paired with a collective of another size (a DDP bucket), gloo aborts the process in its own size check (other
    backends may hang) before this function can look, and telling that apart would cost a second collective on every
    call: every rank must normalise the same way at the same point.  Paired with the all-gather that opens another
    orchmllm call (`agreement.call_header`: a plan, a sampler's epoch agreement), gloo waits out the group's timeout
    on every rank (`PeerFailureError`; no process aborts)."""
    return _summed_count(local_count, group, name, None)


def _summed_count(local_count, group, name: str, reduction: str | None) -> torch.Tensor:
    """`global_count` of `local_count`, whose all-reduce also checks that every rank normalises for the same
    `reduction` (`normalize_loss`'s `gradient_reduction`; None: `global_count`'s own call, no reduction)."""
    if not is_distributed(checked_group(group)):
        return as_count(local_count, name)
    try:
        count, failure = as_count(local_count, name, group_size(group)), None
    except (TypeError, ValueError) as error:
        count, failure = torch.tensor(0, dtype=torch.int64), error
    ranks = group_size(group)
    code = _reduction_code(reduction, ranks)
    words = torch.stack((count, torch.zeros_like(count) + int(failure is not None),
                         torch.zeros_like(count) + (tag := _count_tag(name)),
                         torch.zeros_like(count) + code)).to(comm_device(group))
    with collective(f"`{name}` all-reduce", group):
        finish(dist.all_reduce(words, group=group, async_op=True), group)
    if int(words[2]) != tag * group_size(group):  # paired with another collective, another count's
        raise PeerInputError(f"rank {group_rank(group)}: the all-reduce of `{name}` was paired with another "
                             f"collective on some rank (its words came back {words.tolist()}): every rank must "
                             f"normalise the same way at the same point (all with a count, or all with "
                             f"total_loss_tokens=, or all with the micro-batch)")
    if int(words[3]) != code * ranks:
        means, sums = int(words[3]) % (ranks + 1), int(words[3]) // (ranks + 1)
        kinds = (f"{means} of {ranks} ranks normalise for 'mean', {sums} for 'sum' and {ranks - means - sums} call "
                 f"global_count")
        if reduction is None:
            raise PeerInputError(f"rank {group_rank(group)}: `global_count` of `{name}` here was paired with "
                                 f"normalize_loss's count on some rank ({kinds}): every rank must normalise the "
                                 f"same way")
        raise ValueError(f"rank {group_rank(group)}: normalize_loss with gradient_reduction={reduction!r} here, but "
                         f"{kinds}: each rank scales its loss for its own reduction, so the reduced gradient mixes "
                         f"factors 1 and {ranks}; pass the same `gradient_reduction` on every rank")
    if failure is not None:
        raise failure
    failed = int(words[1])
    if failed:
        raise PeerInputError(f"{failed} rank(s) passed an invalid `{name}` (each raised why); rank "
                             f"{group_rank(group)} stops with them")
    return words[0]


def _reduction_code(reduction: str | None, ranks: int) -> int:
    """`global_count`'s fourth word on a rank: 0 for its own call, 1 for normalize_loss's 'mean', ranks + 1 for
    'sum', so the sum over the ranks reads how many passed each (review R19-01: codes 1 and 2 let a mix with
    global_count sum to D x 1)."""
    return 0 if reduction is None else 1 if reduction == REDUCTIONS[0] else ranks + 1


def _count_tag(name: str) -> int:
    """`global_count`'s third word for a count named `name` (so two counts paired across ranks are told apart)."""
    return TAG_MAGIC + zlib.crc32(name.encode())  # with the name's CRC, each rank's third word of `global_count`


def _per_microbatch_count(where: str, way_out: str = "") -> ValueError:
    """The error of `normalize_loss` given a count `where` a micro-batched step runs."""
    return ValueError(f"normalize_loss with a count {where}: dividing each micro-batch by its own loss tokens "
                      f"weights tokens by the micro-batch they sit in; pass the micro-batch instead, "
                      f"`normalize_loss(loss_sum, micro)`, which divides by the loss tokens of the whole step "
                      f"(all ranks, all micro-batches) with no collective{way_out}")


def normalize_loss(loss_sum: torch.Tensor, num_loss_tokens=None, group=None, *, gradient_reduction: str = "mean",
                   total_loss_tokens=None) -> torch.Tensor:
    """Local loss summed over tokens (a floating-point tensor), divided by the global number of loss tokens.

    `gradient_reduction` is how gradients are then combined across ranks: "mean" (DDP,
    FSDP: the result is multiplied by the world size to undo the average) or "sum"
    (a plain all-reduce sum, as `all_reduce_gradients(..., op="sum")`).  Either way the
    reduced gradient equals that of (sum of all token losses) / (global token count).
    `num_loss_tokens` is this rank's count: a non-negative int or a one-element integer tensor,
    summed over the ranks (one all-reduce); or `total_loss_tokens`, the global count that every
    rank knows already (no collective; e.g. a `BalancedDistributedSampler`'s `step_tokens()`).
    A global count of 0 (no loss token on any rank: a step whose targets are all masked) divides by 1,
    not 0: a loss summed over no token is 0, and so are its gradients, never NaN; a `loss_sum` that is
    not 0 there (an auxiliary term added to the token sum) comes back as it is.  This is chosen over an
    error, which such a step would raise in the middle of a training run.

    In a micro-batched step pass the `MicroBatch` as `num_loss_tokens`: its loss is divided
    by the loss tokens of the whole step, known from the gathered metadata, with no
    collective (see `runtime.microbatch`); a plain count there raises inside the micro-batch
    loop, and for a loss that requires grad from the step's first micro-batch until the next
    `plan()` or `microbatches()` on the thread while its micro-batches are held (a loop over them
    collected in a list);
    a loss computed under `torch.no_grad()` there (an evaluation, a logged value) takes a count.  Inside
    `accumulate(model, micro)` the model check walks every result of `normalize_loss(..., micro)` that
    requires grad: `.detach()` a metric before normalising it for a log line, and normalise the loss
    itself this way (not `micro.loss_scale()` or `total_loss_tokens=`, which the check does not see).  Outside
    `accumulate`, a micro-batch due the check whose loop body ran a DDP or FSDP2 forward raises here.
    """
    checked_reduction(gradient_reduction, "gradient_reduction")
    checked_group(group)
    if not isinstance(loss_sum, torch.Tensor):
        empty = isinstance(num_loss_tokens, MicroBatch) and not len(num_loss_tokens.items)
        raise TypeError(f"`loss_sum` must be a torch.Tensor; got {type(loss_sum).__name__}" + (
            f" (micro-batch {num_loss_tokens.index} of {num_loss_tokens.num_microbatches} holds no item on this rank: "
            f"every rank runs every micro-batch, so compute its loss from the model's output on the empty tensors, "
            f"e.g. `output.sum() * 0`)" if empty else ""))
    if not (loss_sum.is_floating_point() or loss_sum.is_complex()):  # the quotient would be truncated
        raise TypeError(f"`loss_sum` must be a floating-point (or complex) tensor; got a {loss_sum.dtype} tensor (a "
                        f"sum of integers, e.g. a count of correct predictions: .double() it first)")
    if (num_loss_tokens is None) == (total_loss_tokens is None):
        raise TypeError("normalize_loss takes `num_loss_tokens` (this rank's count, or a MicroBatch) or "
                        "`total_loss_tokens` (the global count every rank knows), one of them")
    if isinstance(num_loss_tokens, MicroBatch):
        if num_loss_tokens.step is not None and num_loss_tokens.step.ended:
            raise ValueError(f"normalize_loss with micro-batch {num_loss_tokens.index} of an earlier step (its "
                             f"runtime has run another since): it would divide by that step's "
                             f"{num_loss_tokens.num_loss_tokens} loss tokens; pass this step's micro-batch (a loop "
                             f"variable kept from an earlier step?)")
        normalized = loss_sum * num_loss_tokens.loss_scale(gradient_reduction)
        watch_model_contract(loss_sum, normalized, num_loss_tokens, gradient_reduction)  # a no-op without grad
        return normalized
    if total_loss_tokens is not None:
        return _divided(loss_sum, as_count(total_loss_tokens, "total_loss_tokens"), group, gradient_reduction)
    inside, step, sampled = active_microbatch(), step_microbatches() or 1, sampled_microbatches()
    if inside is not None and inside[1] > 1:
        raise _per_microbatch_count(f"inside micro-batch {inside[0]} of {inside[1]}")
    if step > 1 and loss_sum.requires_grad:
        raise _per_microbatch_count(f"for a loss that requires grad in a step of {step} micro-batches (this thread "
                                    f"was handed them and holds them; until the next `plan()` or `microbatches()`)",
                                    "; a loss of another batch (an evaluation) takes a count under torch.no_grad(), or "
                                    "divide it by `global_count(count)` yourself")
    if sampled > 1 and loss_sum.requires_grad:
        raise ValueError(f"normalize_loss with a count while a BalancedDistributedSampler with "
                         f"`max_tokens_per_microbatch` yields micro-batches in this process "
                         f"(steps of up to {sampled}): "
                         f"dividing each micro-batch by its own loss tokens weights tokens by the micro-batch they sit "
                         f"in; divide by the step's, `normalize_loss(loss_sum, total_loss_tokens="
                         f"sampler.step_tokens()[step])` (or your sum of the loss tokens of its "
                         f"`global_batches()[step]`); a loss of another batch (another loader's, not split into "
                         f"micro-batches) takes `total_loss_tokens=global_count(count)`, the same sum over the ranks")
    return _divided(loss_sum, _summed_count(num_loss_tokens, group, "num_loss_tokens", gradient_reduction), group,
                    gradient_reduction)


def _divided(loss_sum: torch.Tensor, total: torch.Tensor, group, gradient_reduction: str) -> torch.Tensor:
    """`loss_sum` over the global count `total`, times the group's size for a "mean" gradient reduction."""
    total = total.to(loss_sum.device)
    scale = group_size(group) if gradient_reduction == "mean" else 1
    # at least float32 arithmetic: in float16 a count past 65504 is inf (the loss came back 0) and 1 / count subnormal
    wide = torch.promote_types(loss_sum.dtype, torch.float32)
    return (loss_sum.to(wide) * (scale / total.clamp(min=1).to(wide))).to(loss_sum.dtype)


def all_reduce_gradients(parameters, group=None, *, op: str | None = None, check: bool = True) -> None:
    """All-reduce `.grad` of every parameter in place ("sum" or "mean"), one flat buffer per dtype.

    `parameters`: an iterable of a model's parameters (leaf tensors), a Module (its parameters) or one tensor; one
    that yields none (a `model.parameters()` generator iterated already) is refused.
    `op` is required: the `gradient_reduction` that `normalize_loss` scaled these parameters' losses for ("mean",
    its default, multiplies them by the world size; "sum"), or "sum" for losses divided by the global count by hand
    (`global_count`); another gives gradients the world size off.

    Parameters without a gradient contribute zeros, so every rank issues the same
    collectives even when a module saw no items on some rank.  Every rank must pass the same
    parameters (count, and dtype and shape at each position; those that require grad), with dense
    gradients: with `check` (on every rank alike), one all-gather of a 64-byte digest checks it first
    (a fingerprint of every parameter's dtype and shape, and of SAMPLED values spread over the gradients and the sums
    of SAMPLED runs of them: ~1-5 ms a call for 300-2000 parameters on gloo),
    and a difference is a ValueError on every rank naming the ranks and their parameter counts (never a
    reduction of mismatched buffers); `check=False` skips it for a list known to agree.  Parameters
    that DDP reduces (of a DDP model run in `accumulate`) or FSDP2's DTensors are refused before any
    collective: their gradients were reduced already, and so is an FSDP2 model given as the module and, with
    `check`, a DDP one (DDP reduced them at the backward, unless every backward ran under `no_sync()`; a module
    holding either is told to pass the other parameters, and how); a DDP model's parameters
    given otherwise reduce again, which op "mean" keeps and op "sum" multiplies by the world size: with `check`, a
    sum of gradients that are the same on every rank (the sampled values and run sums, in the digest) is refused.
    """
    if op is None:  # no default: "sum" once silently multiplied normalize_loss's default scale by the world size
        raise TypeError("all_reduce_gradients takes `op`, the gradient_reduction that normalize_loss scaled these "
                        "parameters' losses for: op='mean' after normalize_loss(loss, count) (its default), op='sum' "
                        "after normalize_loss(..., gradient_reduction='sum') or a loss divided by global_count(count)")
    checked_reduction(op, "op")
    check = as_bool(check, "check")
    checked_group(group)
    module, given = parameters, _parameter_list(parameters, check)
    problem = _empty_problem(parameters, group) if not given else None
    parameters = [p for p in given if p.requires_grad]
    problem = problem or _sparse_problem(parameters)
    reduced = [p for p in parameters if _dtensor(p) or reduced_by_ddp(p)]
    if reduced:  # the same on every rank (the same model): no collective needed to agree
        raise TypeError(
            f"all_reduce_gradients reduces plain models' gradients; a parameter of shape {tuple(reduced[0].shape)} is "
            + ("a DTensor of FSDP2 (fully_shard), which reduces its gradients itself" if _dtensor(reduced[0])
               else "a DistributedDataParallel model's, whose last `accumulate` block reduced its gradients already")
            + (": drop this call (a second reduction" if len(reduced) == len(parameters) else ": pass the other "
               "parameters only (those of plain modules; a second reduction of these")
            + " would multiply them by the world size with op='sum')")
    flats = _flat_gradients(parameters) if problem is None and is_distributed(group) else {}
    if check and is_distributed(group):  # a Module's names are digested too, so that an order is checked
        names = {id(p): name for name, p in module.named_parameters()} if isinstance(module, torch.nn.Module) else {}
        _same_parameters(parameters, problem, group, op, flats, names)
    if problem is not None:
        raise problem
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    for dtype in sorted(flats, key=str):
        params, flat = flats[dtype]
        with collective(f"gradient all-reduce of all_reduce_gradients ({SAME_CHECK})", group):
            finish(dist.all_reduce(flat, group=group, async_op=True), group)
        if op == "mean":
            flat /= group_size(group)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset: offset + p.numel()].view_as(p.grad))
            offset += p.numel()


def _parameter_list(parameters, check: bool) -> list:
    """`all_reduce_gradients`' `parameters` as a list of leaf tensors (TypeError naming `parameters` otherwise); a
    Module that is or holds an FSDP2 module, or, with `check`, a DDP one, refused (`_module_problem`)."""
    if isinstance(parameters, torch.nn.Module) and (problem := _module_problem(parameters, check)) is not None:
        raise problem
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    elif isinstance(parameters, torch.nn.Module):
        parameters = parameters.parameters()
    try:
        listed = list(parameters)
    except TypeError as error:
        raise TypeError(f"`parameters` must be a model's parameters (an iterable of tensors), a Module or one tensor; "
                        f"got a {type(parameters).__name__}") from error
    for index, p in enumerate(listed):
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"`parameters` must hold tensors (a model's parameters); item {index} is a "
                            f"{type(p).__name__}")
        if p.grad_fn is not None:
            raise TypeError(f"`parameters` must hold leaf tensors (a model's parameters), whose .grad backward "
                            f"sets; item {index} of shape {tuple(p.shape)} was computed (grad_fn "
                            f"{type(p.grad_fn).__name__}): pass the parameters themselves")
    return listed


def _module_problem(module: torch.nn.Module, check: bool) -> TypeError | None:
    """The refusal of a `module` given to `all_reduce_gradients` that is or holds modules reducing their gradients
    themselves at the backward: FSDP2 ones, and with `check` DDP ones (unless every backward ran under `no_sync()`);
    a holder is told which parameters are left to pass.  None where it holds neither."""
    ddp = torch.nn.parallel.DistributedDataParallel
    held = [(name, part) for name, part in module.named_modules()
            if isinstance(part, ddp) and check or hasattr(part, "set_requires_gradient_sync")]
    held = [(name, part) for name, part in held if not any(other and name.startswith(f"{other}.") for other, _ in held)]
    if not held:
        return None
    if any(isinstance(part, ddp) for _, part in held):
        what = ("a DistributedDataParallel model" if held[0][0] == "" else
                f"a module holding DistributedDataParallel {', '.join(repr(name) for name, _ in held)}")
        fix = "drop this call" if held[0][0] == "" else "pass the other parameters only"
        return TypeError(f"all_reduce_gradients was given {what}, whose gradients DDP all-reduced at the backward: "
                         f"{fix} (a second reduction multiplies them by the world size with op='sum'); if every "
                         f"backward ran under `no_sync()`, pass check=False")
    what = ("an FSDP2 (fully_shard) model" if held[0][0] == "" else f"a module holding FSDP2 (fully_shard) "
            f"{', '.join(f'{name!r} ({type(part).__name__})' for name, part in held)}")
    prefixes = tuple(f"{name}." for name, _ in held)
    fix = "drop this call" if held[0][0] == "" else (
        f"pass the other parameters only, `[p for name, p in model.named_parameters() if not "
        f"name.startswith({prefixes!r})]`")
    return TypeError(f"all_reduce_gradients was given {what}, whose gradients FSDP2 reduces itself at the backward "
                     f"(sharded, as DTensors): {fix}")


def _empty_problem(parameters, group) -> ValueError:
    """The refusal of `all_reduce_gradients`' `parameters` that yielded no tensor."""
    cause = (" (a generator such as `model.parameters()` yields its parameters once: one iterated already, by an "
             "optimizer built from it or an earlier call, yields none; pass the module itself or "
             "`list(model.parameters())`)" if isinstance(parameters, Iterator) else "")
    return ValueError(f"`parameters` passed to all_reduce_gradients on rank {group_rank(group)} holds no tensor, so "
                      f"nothing would be reduced{cause}")


def _sparse_problem(parameters: list) -> TypeError | None:
    """The refusal of a parameter among `parameters` whose gradient is not dense (None where all are)."""
    sparse = next((p for p in parameters if p.grad is not None and p.grad.layout != torch.strided), None)
    return None if sparse is None else TypeError(
        f"all_reduce_gradients reduces dense gradients; a parameter of shape {tuple(sparse.shape)} has a "
        f"{sparse.grad.layout} one (a sparse embedding: reduce it yourself, or use a dense embedding)")


def _dtensor(tensor) -> bool:
    """Whether `tensor` is a DTensor (by class name: its module moved between torch versions)."""
    return any(cls.__name__ == "DTensor" for cls in type(tensor).__mro__)


def _flat_gradients(parameters: list) -> dict[torch.dtype, tuple[list, torch.Tensor]]:
    """{dtype: (its parameters, their gradients in one flat tensor)}, a missing gradient as zeros."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in parameters:
        by_dtype.setdefault(p.dtype if p.grad is None else p.grad.dtype, []).append(p)
    return {dtype: (params, torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).reshape(-1)
                                       for p in params])) for dtype, params in by_dtype.items()}


def _same_parameters(parameters: list, problem: Exception | None, group, op: str, flats: dict, names: dict) -> None:
    """All-gather each rank's digest of its parameters' dtypes, shapes and `names` (by id; a Module's, where one was
    given: probe55, a ModuleDict built from a set in another order on each process had its encoders' gradients summed
    into each other's) (FAILED_INPUT where its own `problem` stops it), prefixed by their count, and of their
    gradients' sample and run sums (`_gradient_sample`); raise on every rank where one failed or they differ, or, for
    op "sum", where every rank holds the same nonzero gradients (reduced already: a DDP model's parameters as a list,
    a second call)."""
    count = len(parameters).to_bytes(8, "little")
    digest = FAILED_INPUT if problem is not None else count + fingerprint(
        *((names.get(id(p), ""), str(p.dtype), tuple(p.shape)) for p in parameters))[8:]
    sample = bytes(32) if problem is not None else _gradient_sample(flats)
    digests = gather_digests(digest + sample, group, f"digest all-gather of all_reduce_gradients ({SAME_CHECK})",
                             "gradient digest")
    failed = [rank for rank, value in enumerate(digests) if value[:32] == FAILED_INPUT]
    if problem is not None:
        return
    if failed:
        raise PeerInputError(f"ranks {failed} passed all_reduce_gradients a parameter it cannot reduce (each raised "
                             f"why); rank {group_rank(group)} stops with them")
    differ = disagreement([value[:32] for value in digests], "the parameter list passed to all_reduce_gradients",
                          group_rank(group), show=lambda value: f"{int.from_bytes(value[:8], 'little')} parameters, "
                                                                f"dtypes and shapes {value[8:].hex()[:8]}")
    if differ:
        raise ValueError(f"{differ}; every rank must pass the same parameters that require grad (count, dtype and "
                         f"shape at each position, and a Module's names): pass them all (one without a gradient counts "
                         f"as zeros), not only those with a gradient on this rank, in one order (a ModuleDict filled "
                         f"from a set is ordered by each process's string hashes)")
    if op == "sum" and sample != bytes(32) and all(value[32:] == sample for value in digests):
        raise ValueError(f"all_reduce_gradients(op='sum') of gradients that are the same on all {len(digests)} ranks "
                         f"({SAMPLED} values spread over them, bit for bit): reduced already (a DDP model's "
                         f"parameters passed as a list, a second call), and a sum multiplies them by the world size; "
                         f"drop this call, or, where every rank truly computed the same gradients, pass check=False")


SAMPLED = 64  # gradient values per dtype that `_gradient_sample` reads, and runs it sums


def _gradient_sample(flats: dict) -> bytes:
    """A fingerprint of each dtype's flat gradients (`_flat_gradients`): SAMPLED values spread evenly over them and the
    sums of SAMPLED equal runs of them (and of the few values left after), so gradients zero but for a few rows (an
    embedding's) are read too; bytes(32) where all are zero.  One pass over the gradients and one copy to the host
    per dtype."""
    parts = []
    for dtype in sorted(flats, key=str):
        flat = flats[dtype][1]
        run = max(1, flat.numel() // SAMPLED)
        runs = min(SAMPLED, flat.numel())
        parts.append(torch.cat((flat[::run][:SAMPLED], flat[:run * runs].view(runs, run).sum(1),
                                flat[run * runs:].sum().reshape(1))).cpu())
    if not any(bool(part.any()) for part in parts):  # by value: a -0.0 is zero too
        return bytes(32)
    return fingerprint(*(part.view(torch.uint8).numpy() for part in parts))

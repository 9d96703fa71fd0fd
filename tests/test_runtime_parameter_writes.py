"""Writes to trainable parameters while `accumulate` holds the gradient sync of a step, in real gloo groups (DDP and
FSDP2 `fully_shard` on CPU): refused on every rank where the replicas would drift apart, with what happened; the
usual loops (two passes, EMA, two optimizers, clipping, a scheduler, tied weights) pass with equal replicas.  And the
first training loop of a runtime is due the model check whatever ran before it (a no-grad pass, other steps)."""

import sys
import warnings

import pytest
import torch
from torch import nn

from orchmllm.runtime import PostBalancingDispatcher, all_reduce_gradients, normalize_loss
from orchmllm.runtime.launch import spawn
from orchmllm.runtime.microbatch import ModelContractError, accumulate
from orchmllm.runtime.model_check import ModelCheckWarning

STEPS = ({0: [5, 3, 4, 2], 1: [6, 1, 1, 2]}, {0: [2, 6, 3], 1: [4, 4, 1, 1]}, {0: [1, 5, 5], 1: [6, 2, 3]})
BUDGET = 6  # tokens per rank and micro-batch: every step of STEPS runs M >= 2 micro-batches


def features(step, rank):
    generator = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(sum(STEPS[step][rank]), 3, generator=generator, dtype=torch.float64)


def token_ids(step, rank):
    return torch.randint(0, 20, (sum(STEPS[step][rank]),), generator=torch.Generator().manual_seed(7 * step + rank))


def same_on_every_rank(parameters) -> bool:
    """Whether `parameters` (full tensors) equal rank 0's."""
    weights = torch.cat([parameter.detach().flatten() for parameter in parameters])
    first = weights.clone()
    torch.distributed.broadcast(first, 0)
    return bool(torch.equal(weights, first))


def run_steps(model, body, between=lambda step, micro: None, after=lambda step: None, data=features, steps=2,
              budget=BUDGET):
    """`steps` steps of STEPS through a dispatcher: `body(micro)` in each micro-batch's `accumulate` block,
    `between(step, micro)` after each block, `after(step)` after each step's loop; what the first rank raised as
    'ErrorType: message', else None."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=budget)
    rank = torch.distributed.get_rank()
    try:
        for step in range(steps):
            plan = dispatcher.plan(STEPS[step][rank])
            for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": data(step, rank)}, plan)):
                with accumulate(model, micro):
                    body(micro)
                between(step, micro)
            after(step)
    except ValueError as error:
        return f"{type(error).__name__}: {error}"
    return None


def squared(model):
    return lambda micro: normalize_loss(model(micro.data["x"]).pow(2).sum(), micro).backward()


def written_job(rank, size, how):
    """Two DDP steps (M >= 2) with SGD after each; in step 1 (not due the model check), after micro-batch 0's block,
    an update by hand on the gradients held unsynchronised (`how`: through `.data`, `vector_to_parameters`, or in
    place under no_grad): what the ranks raised, and whether the replicas are equal."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

    def between(step, micro):
        if step == 1 and micro.index == 0:
            if how == "data":
                for parameter in net.parameters():
                    parameter.data.add_(parameter.grad, alpha=-0.1)
            elif how == "vector":
                vector = nn.utils.parameters_to_vector(net.parameters())
                grads = torch.cat([parameter.grad.flatten() for parameter in net.parameters()])
                nn.utils.vector_to_parameters(vector - 0.1 * grads, net.parameters())
            else:
                with torch.no_grad():
                    for parameter in net.parameters():
                        parameter.add_(parameter.grad, alpha=-0.1)
        if micro.is_last:
            optimizer.step()
            optimizer.zero_grad()

    return run_steps(model, squared(model), between), same_on_every_rank(net.parameters())


@pytest.mark.parametrize("how", ["data", "vector"])
def test_regression_an_update_through_data_between_micro_batches_let_the_replicas_drift(how):
    """Cause (probe14 P14-02): a parameter update written through `.data` or `vector_to_parameters` between
    micro-batches bumps no version counter and takes no optimizer step, so each rank's replica was updated on its
    own unsynchronised gradients and they drifted apart, no error.  A fingerprint of the trainable parameters taken
    at a step's first held block is compared at its last, before its forward: every rank raises."""
    for message, _ in spawn(written_job, 2, args=(how,), timeout_s=60):
        assert message is not None and message.startswith(
            "ValueError: trainable parameters module.weight, module.bias of DistributedDataParallel of Linear were "
            "written between micro-batches 0 and 1 of a step, while `accumulate` held its gradient sync, by no "
            "in-place operation or optimizer step (through `.data`, or `torch.nn.utils.vector_to_parameters`)"), message


def test_an_update_in_place_by_hand_between_micro_batches_is_named_as_no_optimizer_step():
    """An update by hand in place under torch.no_grad() bumps the version counters but is no optimizer step: the
    refusal names the parameters and says so (it blamed an optimizer step)."""
    for message, _ in spawn(written_job, 2, args=("in_place",), timeout_s=60):
        assert message is not None and message.startswith(
            "ValueError: trainable parameters module.weight, module.bias of DistributedDataParallel of Linear were "
            "written in place between micro-batches 0 and 1 of a step, while `accumulate` held its gradient sync, by "
            "no optimizer step"), message


class RenormalisedEmbedding(nn.Module):
    """An embedding with max_norm (its forward renormalises the rows it looks up, in place) and a head."""

    def __init__(self, trainable=True):
        super().__init__()
        self.embed, self.head = nn.Embedding(20, 4, max_norm=1.0).double(), nn.Linear(4, 1).double()
        self.embed.weight.requires_grad_(trainable)

    def forward(self, ids):
        return self.head(self.embed(ids))


def max_norm_job(rank, size, budget, trainable=True):
    """Two DDP steps of a RenormalisedEmbedding (`budget`: M = 1 without one), SGD after each: what the ranks raised
    and whether the replicas are equal."""
    torch.manual_seed(0)
    net = RenormalisedEmbedding(trainable)
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.1)

    def after(step):
        optimizer.step()
        optimizer.zero_grad()

    message = run_steps(model, squared(model), after=after, data=token_ids, budget=budget)
    return message, same_on_every_rank(net.parameters())


@pytest.mark.parametrize("budget", [None, BUDGET], ids=["one_micro_batch", "micro_batched"])
def test_regression_an_embedding_renormalising_its_rows_in_the_forward_drifted_or_blamed_an_optimizer_step(budget):
    """Cause (probe14 P14-07): `nn.Embedding(max_norm=...)` renormalises, in place, the rows its forward looks up; under
    post-balancing each rank looks up other rows, so each replica of the trainable weight is written differently and
    the replicas drift apart, which no gradient sync undoes.  With one micro-batch nothing was said; with several the
    next block blamed an optimizer step.  The loss's `normalize_loss` in the block refuses it on every rank, naming
    the parameter and the forward's write."""
    for message, _ in spawn(max_norm_job, 2, args=(budget,), timeout_s=60):
        assert message is not None and message.startswith(
            "ModelContractError: the forward in the `accumulate` block of micro-batch 0 of ") and (
            "wrote trainable parameters module.embed.weight of DistributedDataParallel of RenormalisedEmbedding in "
            "place (as nn.Embedding(max_norm=...) renormalises the rows it looks up)") in message, message


def test_a_frozen_embedding_with_max_norm_is_not_refused():
    """A frozen weight holds no gradient to synchronise: its forward's writes are not refused."""
    assert [message for message, _ in spawn(max_norm_job, 2, args=(BUDGET, False), timeout_s=60)] == [None, None]


class Tied(nn.Module):
    """A linear layer used twice (tied weights) and a second layer trained by a second optimizer."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(3, 3).double(), nn.Linear(3, 1).double()

    def forward(self, x):
        return self.second(torch.tanh(self.first(torch.tanh(self.first(x)))))


def usual_loop_job(rank, size, loop):
    """Three DDP steps of a usual loop (`loop`): what the ranks raised, and whether the replicas are equal."""
    torch.manual_seed(0)
    net = Tied()
    model = nn.parallel.DistributedDataParallel(net)
    optimizers = [torch.optim.SGD(net.first.parameters(), lr=0.1), torch.optim.Adam(net.second.parameters(), lr=0.1)]
    scheduler = torch.optim.lr_scheduler.StepLR(optimizers[0], step_size=1, gamma=0.5)
    ema = [parameter.detach().clone() for parameter in net.parameters()]
    kept = []

    def between(step, micro):
        if not micro.is_last:
            return
        if loop == "sam" and not kept:  # ascend to the neighbourhood's worst point, then a second pass from there
            kept.extend(parameter.detach().clone() for parameter in net.parameters())
            with torch.no_grad():
                for parameter in net.parameters():
                    parameter.add_(parameter.grad, alpha=0.05)
            model.zero_grad()
            return
        if kept:  # SAM restores the parameters as davda54/sam does, through .data
            for parameter, old in zip(net.parameters(), kept):
                parameter.data = old
            kept.clear()
        nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
        scheduler.step()
        torch._foreach_lerp_(ema, [parameter.detach() for parameter in net.parameters()], 0.1)

    def after(step):  # SAM's second pass over the step's micro-batches (the same plan, dispatched once)
        assert not kept

    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET)
    try:
        for step in range(3):
            plan = dispatcher.plan(STEPS[step][rank])
            moved = dispatcher.dispatch({"x": features(step, rank)}, plan)
            for _ in range(2 if loop == "sam" else 1):
                for micro in dispatcher.microbatches(plan, moved):
                    with accumulate(model, micro):
                        squared(model)(micro)
                    between(step, micro)
    except ValueError as error:
        return f"{type(error).__name__}: {error}"
    return same_on_every_rank(list(net.parameters()) + ema)


@pytest.mark.parametrize("loop", ["sam", "ema_two_optimizers_clipping_scheduler"])
def test_usual_loops_writing_parameters_outside_the_held_sync_pass(loop):
    """SAM (an ascent step between two passes over a step, undone through `.data`), EMA, two optimizers, gradient
    clipping, a scheduler and tied weights write parameters only outside the held sync: not refused, replicas equal."""
    assert spawn(usual_loop_job, 2, args=(loop,), timeout_s=60) == [True, True]


def fsdp2_stepped_inside_job(rank, size, inside):
    """Two FSDP2 steps (M >= 2) with Adam after each, and with `inside` after micro-batch 0's block of step 1 too:
    what the ranks raised."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()
    fully_shard(net[0])
    fully_shard(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)

    def between(step, micro):
        if micro.is_last or (inside and step == 1):
            optimizer.step()
            optimizer.zero_grad()

    return run_steps(net, squared(net), between)


def test_regression_under_fsdp2_an_optimizer_step_between_micro_batches_went_unseen():
    """Cause (issue 24, FSDP2): the parameter check ran under DDP only (FSDP2 keeps the held gradients out of .grad),
    so an optimizer step between micro-batches (mini-batches inside the step) stepped on no gradient at all, no
    error.  The optimizer step hook counts steps on FSDP2's sharded parameters too: every rank raises."""
    assert spawn(fsdp2_stepped_inside_job, 2, args=(False,), timeout_s=60) == [None, None]
    for message in spawn(fsdp2_stepped_inside_job, 2, args=(True,), timeout_s=60):
        assert message is not None and message.startswith(
            "ValueError: the parameters of FSDPSequential changed between micro-batches 0 and 1 of a step"), message


class Unused(nn.Module):
    """A layer trained and one never called (its parameters get no gradient on any rank)."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(3, 1).double(), nn.Linear(3, 1).double()

    def forward(self, x):
        return self.used(x)


def first_training_loop_job(rank, size, before):
    """DDP of Unused: before the first training loop, `before`: 'no_grad_pass' (PPO's old log-probs: a no-grad pass
    over the step, then the step's training batch dispatched as its own plan) or 'evaluation' (an evaluation step of
    its own plan, under no_grad, with `accumulate`); then one training step: what the ranks raised."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Unused())
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET)
    plan = dispatcher.plan(STEPS[0][rank])
    with torch.no_grad():
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": features(0, rank)}, plan)):
            if before == "evaluation":
                with accumulate(model, micro):
                    model(micro.data["x"])
            else:
                model(micro.data["x"])
    plan = dispatcher.plan(STEPS[1][rank])
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": features(1, rank)}, plan)):
            with accumulate(model, micro):
                squared(model)(micro)
    except ValueError as error:
        return f"{type(error).__name__}: {error}"
    return None


@pytest.mark.parametrize("before", ["no_grad_pass", "evaluation"])
def test_regression_the_first_training_loop_after_a_no_grad_step_got_no_model_check(before):
    """Cause (probe14 P14-10, P14-06): only a runtime's first step was due the model check, so a loop whose first
    step ran no training (PPO's no-grad pass, then the training batch dispatched; an evaluation first) trained every
    later step unchecked: a parameter left out of the loss (here one never called) went unnamed, DDP failing later in
    its reducer.  Steps are due until a training loop (its last block, with grad) ran: every rank raises."""
    for message in spawn(first_training_loop_job, 2, args=(before,), timeout_s=60):
        assert message is not None and message.startswith("ModelContractError: rank ") and \
            "does not depend on parameters module.unused.bias, module.unused.weight" in message, message


def sequential():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1)).double()


def fsdp2_unresharded_job(rank, size, layout):
    """Two FSDP2 steps (M >= 2, SGD after each) of `sequential()` sharded with reshard_after_forward=False (the root,
    or torchtitan's way: the last layer), after one no-grad forward (an evaluation first): the full parameters, or
    what was raised."""
    from torch.distributed.fsdp import fully_shard

    net = sequential()
    if layout == "root":
        fully_shard(net, reshard_after_forward=False)
    else:
        fully_shard(net[0])
        fully_shard(net[2], reshard_after_forward=False)
        fully_shard(net)
    return unresharded_steps(net, rank, features)


def unresharded_steps(net, rank, data):
    """One no-grad forward of FSDP2 `net` (an evaluation first), then two steps of `data` (M >= 2, SGD after each):
    the full parameters, or what was raised."""
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    with torch.no_grad():
        net(data(2, rank))

    def after(step):
        optimizer.step()
        optimizer.zero_grad()

    message = run_steps(net, squared(net), after=after, data=data)
    return message or [parameter.full_tensor().detach() for parameter in net.parameters()]


@pytest.mark.parametrize("layout", ["root", "torchtitan"])
def test_regression_fsdp2_kept_unsharded_by_a_no_grad_forward_made_the_parameter_check_read_freed_storage(layout):
    """Cause (probe15 P15-11, a regression of ab2980a): the parameter check listed the model's parameters at its
    first block, and after a no-grad forward of a module sharded with reshard_after_forward=False FSDP2 holds the
    unsharded ones, whose storage it frees as it reshards: every rank died of SIGSEGV reading them.  Under FSDP2
    the check reads the sharded parameters (what the optimizer holds).  Parameters as two float64 SGD steps."""
    net = sequential()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(2):
        batch = torch.cat([features(step, rank) for rank in STEPS[step]])
        (net(batch).pow(2).sum() / batch.shape[0]).backward()
        optimizer.step()
        optimizer.zero_grad()
    for parameters in spawn(fsdp2_unresharded_job, 2, args=(layout,), timeout_s=60):
        assert not isinstance(parameters, str), parameters
        for got, want in zip(parameters, net.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-12)


def assert_reference_gradients(job, *args, copies=1):
    """`job(*args)` on 2 ranks gives, on each, the gradients of one float64 pass of `sequential()` over step 0's rows
    of every rank (`copies` times over: a model per copy)."""
    net = sequential()
    batch = torch.cat([features(0, rank) for rank in STEPS[0]])
    (net(batch).pow(2).sum() / batch.shape[0]).backward()
    for gradients in spawn(job, 2, args=args, timeout_s=60):
        assert not isinstance(gradients, str), gradients
        for got, parameter in zip(gradients, [*net.parameters()] * copies, strict=True):
            torch.testing.assert_close(got, parameter.grad, rtol=0, atol=1e-12)


def reduction_job(rank, size, wrap, reduction):
    """One step (M >= 2) of `sequential()` under `wrap` ('fsdp2_sum': FSDP2 told to sum, set_gradient_divide_factor(1);
    'ddp': averaging), its loss normalised for `reduction`: the full gradients, or what was raised."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    net = sequential()
    if wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(net)
    else:
        if wrap != "fsdp2_sum":  # the torchtitan layout: the first layer a unit of its own
            fully_shard(net[0])
        model = fully_shard(net)
        units = (model,) if wrap == "fsdp2_sum_root" else [m for m in net.modules() if isinstance(m, FSDPModule)]
        factor = {"fsdp2_world": float(size), "fsdp2_odd": 2.0 * size}.get(wrap, 1.0)  # an explicit mean; neither
        for unit in units:
            unit.set_gradient_divide_factor(factor)
    body = lambda micro: normalize_loss(model(micro.data["x"]).pow(2).sum(), micro,  # noqa: E731
                                        gradient_reduction=reduction).backward()
    message = run_steps(model, body, steps=1)
    return message or [getattr(p.grad, "full_tensor", lambda: p.grad)().detach() for p in net.parameters()]


@pytest.mark.parametrize("wrap, wrong, right", [("fsdp2_sum", "mean", "sum"), ("ddp", "sum", "mean")])
def test_regression_a_loss_scaled_for_another_reduction_than_the_models_gave_gradients_off_by_the_world_size(
        wrap, wrong, right):
    """Cause (probe15 P15-10): `normalize_loss(loss, micro)` scales for averaging ranks (DDP, FSDP2 by default), so
    FSDP2 told to sum (`set_gradient_divide_factor(1.0)`, as a trainer normalising by the global token count does)
    gave gradients D times too large, no error (and `gradient_reduction='sum'` under DDP D times too small).  In
    `accumulate`, on steps due the check, the model's reduction is read: the wrong scale raises on every rank, the
    right one gives one float64 pass's gradients."""
    for message in spawn(reduction_job, 2, args=(wrap, wrong), timeout_s=60):
        assert isinstance(message, str) and message.startswith(
            f"ValueError: normalize_loss(loss, micro, gradient_reduction={wrong!r}) in `accumulate` of ") and \
            message.endswith(f"the gradients would come out 2 times too {'large' if wrong == 'mean' else 'small'} "
                             f"(the world size); pass gradient_reduction={right!r}"), message
    assert_reference_gradients(reduction_job, wrap, right)


def test_regression_a_root_told_to_sum_over_a_unit_that_averages_gave_that_units_gradients_one_world_size_off():
    """Cause (probe18 P18-08): `set_gradient_divide_factor(1.0)` on the root of the torchtitan layout (a layer
    `fully_shard`ed on its own, then the root) sets the root's unit only; the check read the mixed factors as a
    reduction it cannot tell and passed, and the layer's gradients came out 1/D of the reference.  Now refused on
    every rank, naming both units; the factor set on every unit gives one float64 pass's gradients."""
    for message in spawn(reduction_job, 2, args=("fsdp2_sum_root", "sum"), timeout_s=60):
        assert isinstance(message, str) and message.startswith(
            "ValueError: the FSDP2 modules of FSDPSequential reduce gradients two ways: '0' (FSDPLinear) averages them "
            "and the root (FSDPSequential) sums them (set_gradient_divide_factor(1.0))"), message
    assert_reference_gradients(reduction_job, "fsdp2_sum_every", "sum")


def test_regression_an_fsdp2_divide_factor_other_than_1_was_taken_for_a_reduction_the_check_cannot_tell():
    """Cause (probe18 P18-16): a divide factor of the world size (an explicit mean) or of any other number than 1 was
    read as "cannot tell" and every loss scale passed: 'sum' under a factor of D gave gradients 1/D of the reference,
    no error.  A factor of D averages (takes 'mean'), 1 sums, another fits no scale and is refused naming it."""
    for message in spawn(reduction_job, 2, args=("fsdp2_world", "sum"), timeout_s=60):
        assert isinstance(message, str) and message.endswith("the gradients would come out 2 times too small (the "
                                                             "world size); pass gradient_reduction='mean'"), message
    for message in spawn(reduction_job, 2, args=("fsdp2_odd", "mean"), timeout_s=60):
        assert isinstance(message, str) and message.startswith(
            "ValueError: the FSDP2 unit at the root (FSDPSequential) of FSDPSequential divides its gradients by "
            "set_gradient_divide_factor(4.0), neither 1 (a sum) nor the world size 2 (a mean)"), message
    assert_reference_gradients(reduction_job, "fsdp2_world", "mean")


def nested_job(rank, size, critic_reduction):
    """One step of nested blocks: a DDP actor (averages) and an FSDP2 critic told to sum (a plain one reduced by hand
    with op 'sum' where `critic_reduction` is "plain"), each loss normalised, the critic's with `critic_reduction`
    ('sum' for the plain one): what was raised, else both models' full gradients."""
    from torch.distributed.fsdp import fully_shard

    actor, critic_net = sequential(), sequential()
    ddp, critic = nn.parallel.DistributedDataParallel(actor), critic_net
    plain = critic_reduction.startswith("plain")
    if not plain:
        critic = fully_shard(critic_net)
        critic.set_gradient_divide_factor(1.0)
    if critic_reduction == "checkpointed actor lambda":  # what the check cannot see, said
        warnings.simplefilter("error", ModelCheckWarning)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET)
    plan = dispatcher.plan(STEPS[0][rank])
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": features(0, rank)}, plan)):
            with accumulate(ddp, micro), accumulate(critic, micro):
                x = micro.data["x"]
                if critic_reduction == "one loss":  # both models' parts normalised once: no scale fits both
                    normalize_loss(ddp(x).pow(2).sum() + critic(x).pow(2).sum(), micro).backward()
                    continue
                if critic_reduction.startswith("checkpointed actor"):  # the actor's loss scaled for 'sum' in a
                    hidden = x.detach().requires_grad_()  # reentrant checkpoint, of the module or of a lambda
                    actor_out = torch.utils.checkpoint.checkpoint(
                        ddp if critic_reduction == "checkpointed actor" else lambda t: ddp(t), hidden,
                        use_reentrant=True)
                    normalize_loss(actor_out.pow(2).sum(), micro, gradient_reduction="sum").backward()
                    continue
                reduction = "sum" if plain else critic_reduction
                checkpointed = {"plain checkpointed": critic, "plain checkpointed lambda": lambda t: critic(t)}.get(
                    critic_reduction)  # probe19 P19-06: the critic run under a reentrant checkpoint
                critic_out = critic(x) if checkpointed is None else torch.utils.checkpoint.checkpoint(
                    checkpointed, x.detach().requires_grad_(), use_reentrant=True)
                (normalize_loss(ddp(x).pow(2).sum(), micro) + normalize_loss(
                    critic_out.pow(2).sum(), micro, gradient_reduction=reduction)).backward()
    except (ValueError, ModelCheckWarning) as error:
        return f"{type(error).__name__}: {error}"
    if plain:
        all_reduce_gradients(critic, op="sum")
    return [p.grad.detach() for p in actor.parameters()] + [getattr(p.grad, "full_tensor", lambda: p.grad)()
                                                              for p in critic_net.parameters()]


def test_regression_nested_blocks_reducing_two_ways_refused_a_loss_its_own_model_reduces_right():
    """Cause (probe18 P18-17): with a DDP actor (mean) and an FSDP2 critic told to sum in nested blocks, each loss
    normalised for its own model, every rank raised: the check held each loss against every open block's model.
    Where the blocks' models reduce two ways, a loss is held against the models its graph reaches: the right scales
    give one float64 pass's gradients, the critic's loss scaled for 'mean' is refused naming it."""
    assert_reference_gradients(nested_job, "sum", copies=2)
    assert_reference_gradients(nested_job, "plain", copies=2)  # probe18 P18-21: held against the DDP actor before
    for message in spawn(nested_job, 2, args=("checkpointed actor",), timeout_s=60):  # review13 R13-14: passed
        assert message.startswith(  # the checkpointed module seen through (probe19 P19-06)
            "ValueError: normalize_loss(loss, micro, gradient_reduction='sum') in `accumulate` of "
            "DistributedDataParallel of Sequential, which averages"), message
    for rank, message in enumerate(spawn(nested_job, 2, args=("checkpointed actor lambda",), timeout_s=60)):
        assert message == (  # a lambda hides what it runs: not refused (the scale may be right), said
            f"ModelCheckWarning: rank {rank}: normalize_loss(loss, micro, gradient_reduction='sum') in nested "
            f"`accumulate` blocks: a reentrant checkpoint of a function that is not a module (a lambda, a function) in "
            f"the loss's graph hides whether the loss reaches DistributedDataParallel of Sequential (which reduces by "
            f"mean), so its scale is not checked there; checkpoint with use_reentrant=False or checkpoint the module "
            f"itself (the check sees through both)"), message
    for message in spawn(nested_job, 2, args=("mean",), timeout_s=60):
        assert message.startswith("ValueError: normalize_loss(loss, micro, gradient_reduction='mean') in `accumulate` "
                                  "of FSDPSequential, which sums gradients across ranks"), message
    for message in spawn(nested_job, 2, args=("one loss",), timeout_s=60):  # review13 R13-13, probe18 P18-20
        assert message.startswith("ValueError: normalize_loss(loss, micro, ...) in nested `accumulate` blocks: the "
                                  "loss reaches DistributedDataParallel of Sequential, which reduces by mean and "
                                  "FSDPSequential, which reduces by sum, so no gradient_reduction is right"), message


@pytest.mark.parametrize("how", ["plain checkpointed", "plain checkpointed lambda"])
def test_regression_a_plain_critic_under_a_reentrant_checkpoint_was_held_against_the_ddp_actor_and_refused(how):
    """Cause (probe19 P19-06): a plain critic reduced by hand (its loss normalised 'sum') run under a reentrant
    checkpoint beside a DDP actor, in nested blocks: the walk of the critic's loss met the checkpoint's node, could
    not see which models it reaches, held it against the actor (mean) and refused it on every rank, advising 'mean'.
    A checkpointed module (or a module's method) is seen through; a function that hides what it runs is left
    unchecked (no false refusal): both give one float64 pass's gradients."""
    assert_reference_gradients(nested_job, how, copies=2)


def test_the_reduction_check_on_one_rank_says_the_scale_is_off_only_on_more():
    """review10 R10-01: on one rank (the debug run every trainer starts with) mean and sum give the same gradients,
    and the refusal said they 'would come out 1 times too small'; it still refuses (the same script is D times off
    on D ranks) and says so."""
    message, = spawn(reduction_job, 1, args=("ddp", "sum"), timeout_s=60)
    assert isinstance(message, str) and message.endswith(
        "the same gradients on this one rank, but D times too small on D ranks, so refused here too; pass "
        "gradient_reduction='mean'"), message


def test_regression_the_fingerprint_of_a_model_on_two_devices_failed_in_torch_stack():
    """Cause (probe15 P15-12): `contents` stacked every parameter's sum into one tensor, so a model whose trainable
    parameters sit on two devices (DDP of a multi-device module, an embedding kept on CPU) failed with torch's raw
    'not on the expected device' at its first held block.  The sums stay on their devices, one tensor per device
    (a meta layer stands for a second device on a CPU-only machine); a change is named by parameter."""
    from orchmllm.runtime.versions import _changed, contents

    two = nn.Module()
    two.first, two.second = nn.Linear(2, 2), nn.Linear(2, 2, device="meta")
    assert {device.type: tuple(sums.shape) for device, sums in contents(two).items()} == {"cpu": (2,), "meta": (2,)}
    plain = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    before = contents(plain)
    assert _changed(plain, before, contents(plain)) is None
    plain[1].weight.data.add_(1.0)
    assert _changed(plain, before, contents(plain)) == [False, False, True, False]



PEAK = """import resource, sys, torch
from torch import nn
from orchmllm.runtime.versions import contents
contents(nn.Linear(2, 2))
model = nn.Embedding(2048, 4096, dtype=getattr(torch, sys.argv[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
contents(model)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 / model.weight.nbytes)"""


PEAK_DTYPES = ("bfloat16", "float32")
EARLY = {dtype: ("-c", PEAK, dtype)  # conftest's `started_early`
         for dtype in PEAK_DTYPES}  # each a fresh process of its own


@pytest.mark.early("bfloat16")
@pytest.mark.early("float32")
def test_regression_the_fingerprint_made_an_int64_copy_of_each_parameter(started_early):
    """Cause (review10 R10-08): `contents` summed each parameter as `view(intN).sum(dtype=torch.int64)`, which casts
    a whole int64 copy first (4x a bf16 parameter's bytes: a 152k x 8192 bf16 embedding, a 10 GB transient on the
    GPU, at every step's first held block).  It reads int64 words in place now: the peak RSS of a fresh process
    grows by under a quarter of the parameter's bytes (before: 4x bf16's, 2x fp32's)."""
    for dtype in PEAK_DTYPES:
        child = started_early(dtype)
        assert child.returncode == 0, child.stderr
        grown = float(child.stdout)
        assert grown < 0.25, f"{dtype}: peak RSS grew by {grown:.2f}x the parameter's bytes"


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float32, torch.float64,
                                   torch.complex64])
def test_the_fingerprint_changes_with_any_one_entry_of_a_shard_at_any_offset(dtype):
    """An FSDP2 shard may start at any entry of its storage: the entries before and after its run aligned on 8
    bytes are summed one by one, the run as int64 words; flipping any bit of any one entry changes the fingerprint
    (and restoring it restores it)."""
    from orchmllm.runtime.versions import contents

    generator = torch.Generator().manual_seed(3)
    for offset in range(9):
        storage = torch.randn(offset + 13, generator=generator).to(dtype)
        model = nn.Module()
        model.shard = nn.Parameter(storage[offset:])
        assert model.shard.storage_offset() == offset
        before = contents(model)[torch.device("cpu")]
        for entry in range(13):
            for bit in range(8 * model.shard.element_size()):
                raw = model.shard.data[entry:entry + 1].view(torch.uint8)
                raw[bit // 8] ^= 1 << bit % 8
                assert not torch.equal(contents(model)[torch.device("cpu")], before), (offset, entry, bit)
                raw[bit // 8] ^= 1 << bit % 8
        assert torch.equal(contents(model)[torch.device("cpu")], before)

def cleared_job(rank, size, where):
    """Two DDP steps (M >= 2), `optimizer.zero_grad()` in every micro-batch (the classic bug: `where` 'inside' the
    block, before the forward, or 'between' blocks, at the top of the loop body) and `optimizer.step()` after each
    loop: what the ranks raised."""
    torch.manual_seed(0)
    net = nn.Linear(3, 1).double()
    model = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

    def body(micro):
        if where == "inside":
            optimizer.zero_grad()
        squared(model)(micro)

    def between(step, micro):
        if where == "between" and not micro.is_last:
            optimizer.zero_grad()

    return run_steps(model, body, between, after=lambda step: optimizer.step())


@pytest.mark.parametrize("where", ["inside", "between"])
def test_regression_zero_grad_inside_the_micro_batch_loop_trained_each_step_on_its_last_micro_batch(where):
    """Cause (probe15 P15-14): `zero_grad()` inside the loop (the classic accumulation bug) dropped under DDP the
    gradients `accumulate` held from the step's earlier micro-batches, and each step trained on its last micro-batch
    only, no error (off the float64 reference by 9e-3).  A held block notes a parameter its backward gave a
    gradient; a later block of the step refuses it cleared, at its start or as its loss is normalised, on every
    rank.  (zero_grad(set_to_none=False) leaves zeros, which an empty micro-batch gives too: not seen.)"""
    for message in spawn(cleared_job, 2, args=(where,), timeout_s=60):
        assert message is not None and message.startswith(
            "ValueError: the gradients of DistributedDataParallel of Linear that `accumulate` held from micro-batch 0 "
            "of a step were cleared before micro-batch 1's backward (`zero_grad()` inside the micro-batch loop?)"), \
            message


def skipping_job(rank, size):
    """A DDP step of 2 micro-batches (budget 4) whose loop body is guarded by `if micro.items.size == 0: continue`;
    rank 1 holds one item in micro-batch 0 and its last micro-batch is empty (a step due the check): what each rank
    raised."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(3, 1).double())
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=4)
    lengths = [4, 4, 4] if rank == 0 else []
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch({"x": torch.ones(sum(lengths), 3, dtype=torch.float64)}, plan)
    try:
        for micro in dispatcher.microbatches(plan, moved):
            if micro.items.size == 0:
                continue
            with accumulate(model, micro):
                squared(model)(micro)
    except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
        return f"{type(error).__name__}: {error}"
    return None


def test_regression_a_rank_skipping_its_empty_last_micro_batch_left_its_peers_in_the_model_check_until_the_timeout():
    """Cause (probe15 P15-16): a loop guarded by `if micro.items.size == 0: continue` ran no block on the rank whose
    last micro-batch of a step due the check was empty: its peers waited in the model check's all-reduce and it in
    the next plan's all-gather until the group's timeout (30 min by default), both blaming a dead peer (under FSDP2
    gloo's SIGABRT).  The generator, asked for the next micro-batch after a pass that ran blocks for the earlier
    ones, refuses it on that rank at once (its peers then fail as it stops)."""
    peer, skipping = spawn(skipping_job, 2, timeout_s=60, collective_timeout_s=30)
    assert skipping is not None and skipping.startswith(
        "ModelContractError: rank 1: micro-batch 1 of 2, the last of a step due the model check (0 items on this "
        "rank), ran no `with accumulate(model, micro):` block with grad here"), skipping
    assert peer is not None, peer  # failed as its peer stopped (gloo's error or ours), not at the timeout


class TiedLM(nn.Module):
    """An embedding and an output head sharing its weight (the usual weight tying)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(20, 4).double(), nn.Linear(4, 20, bias=False).double()
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)))


def tied_unresharded_job(rank, size):
    """Two FSDP2 steps (M >= 2, SGD after each) of a TiedLM sharded with reshard_after_forward=False after one no-grad
    forward: the full parameters, or what was raised."""
    from torch.distributed.fsdp import fully_shard

    net = TiedLM()
    fully_shard(net, reshard_after_forward=False)
    return unresharded_steps(net, rank, token_ids)


def test_regression_a_tied_weight_under_fsdp2_kept_unsharded_made_the_parameter_check_read_freed_storage():
    """Cause (probe15 P15-11b, a residual of 84c1be9): FSDP2 records a tied parameter under one of its modules, and
    the other module's entry fell back to what it held after a no-grad forward without resharding, the unsharded
    alias: every rank died of SIGSEGV reading its freed storage.  Under FSDP2 the check lists FSDP2's record alone.
    Parameters as two float64 SGD steps."""
    net = TiedLM()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(2):
        (net(torch.cat([token_ids(step, rank) for rank in STEPS[step]])).pow(2).sum()
         / sum(sum(lengths) for lengths in STEPS[step].values())).backward()
        optimizer.step()
        optimizer.zero_grad()
    for parameters in spawn(tied_unresharded_job, 2, timeout_s=60):
        assert not isinstance(parameters, str), parameters
        for got, want in zip(parameters, net.parameters(), strict=True):
            torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-12)

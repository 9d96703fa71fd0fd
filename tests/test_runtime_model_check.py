"""The model check of `accumulate` at reentrant checkpoints whose function runs no module (it uses parameters
directly): real gloo ranks under DDP, the walk and recording in one process."""

import warnings
import weakref
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint

from orchmllm.runtime import ModelCheckWarning, PostBalancingDispatcher, accumulate, normalize_loss
from orchmllm.runtime.encoders import reached_leaves, recording
from orchmllm.runtime.launch import spawn

LENGTHS = {0: [26, 36, 20, 24], 1: [29, 25, 22, 22], 2: [11, 32, 27, 1]}  # T 40, M 6: every rank's tail empty


class DirectCheckpointNet(nn.Module):
    """`head(lin2(checkpoint(tanh(F.linear(x, lin1.weight, lin1.bias)))))`: the checkpointed function uses lin1's
    parameters directly (no module runs inside it); `skip`: lin2, outside the checkpoint, skipped on empty input."""

    def __init__(self, skip: bool = False, checkpointed: bool = True):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.lin1, self.lin2, self.head = nn.Embedding(30, 4), nn.Linear(4, 4), nn.Linear(4, 4), \
            nn.Linear(4, 30)
        self.skip, self.checkpointed = skip, checkpointed

    def forward(self, tokens):
        function = lambda x: torch.tanh(F.linear(x, self.lin1.weight, self.lin1.bias))  # noqa: E731
        embedded = self.embed(tokens)
        hidden = checkpoint(function, embedded, use_reentrant=True) if self.checkpointed else function(embedded)
        return self.head(hidden if self.skip and tokens.numel() == 0 else torch.tanh(self.lin2(hidden)))


class Critic(nn.Module):
    """A value head that skips `lin2` on empty input (a wrong model)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.embed, self.lin1, self.lin2 = nn.Embedding(30, 4), nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, tokens):
        hidden = torch.tanh(self.lin1(self.embed(tokens)))
        return (hidden[:, :1] if tokens.numel() == 0 else self.lin2(hidden)).squeeze(-1)


def rank_tokens(rank):
    generator = torch.Generator().manual_seed(rank)
    lengths = LENGTHS[rank]
    return lengths, torch.randint(0, 30, (sum(lengths),), generator=generator), \
        torch.randint(0, 30, (sum(lengths),), generator=generator)


def direct_checkpoint_job(rank, size, steps, skip, with_critic):
    """`steps` DDP steps of DirectCheckpointNet (`skip`: lin2 skipped on empty input) in `accumulate` (6
    micro-batches: every step is due the check), with a nested critic or not: what each rank raised, and the
    ModelCheckWarnings."""
    model = nn.parallel.DistributedDataParallel(DirectCheckpointNet(skip).double())
    critic = nn.parallel.DistributedDataParallel(Critic().double())
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=40, num_microbatches=6)
    lengths, tokens, labels = rank_tokens(rank)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for _ in range(steps):
                plan = dispatcher.plan(lengths)
                moved = dispatcher.dispatch({"tokens": tokens, "labels": labels}, plan)
                for micro in dispatcher.microbatches(plan, moved):
                    with accumulate(model, micro), accumulate(critic, micro) if with_critic else nullcontext():
                        logits = model(micro.data["tokens"])
                        loss_sum = F.cross_entropy(logits, micro.data["labels"], reduction="sum") \
                            if micro.items.size else logits.sum() * 0
                        if with_critic:
                            loss_sum = loss_sum + critic(micro.data["tokens"]).square().sum()
                        normalize_loss(loss_sum, micro).backward()
            outcome = "trained"
        except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
            outcome = f"{type(error).__name__}: {error}"
    return outcome, [str(w.message) for w in caught if issubclass(w.category, ModelCheckWarning)]


def test_regression_a_checkpoint_running_no_module_turned_the_model_check_off_silently():
    """Cause (probe11 P11-09): the walk answered 'cannot tell' at a reentrant checkpoint whose function runs no
    module, and the check took that for 'nothing unused': lin2 skipped on empty micro-batches (outside the
    checkpoint) trained silently wrong (0.038-0.077 off) on every rank.  Every rank now warns, once, naming the
    parameters it cannot see (lin2 among them) and the way out."""
    for skip, steps, unseen in ((True, 1, "module.lin1.bias, module.lin1.weight, module.lin2.bias, module.lin2.weight"),
                                (False, 2, "module.lin1.bias, module.lin1.weight")):  # two due steps, one warning
        for rank, (outcome, caught) in enumerate(spawn(direct_checkpoint_job, 3, args=(steps, skip, False),
                                                       timeout_s=90)):
            assert outcome == "trained" and len(caught) == 1, (rank, outcome, caught)
            assert caught[0].startswith(f"rank {rank}: the model check of micro-batch 5 of 6 cannot tell whether the "
                                        f"loss depends on parameters {unseen} of the model given to `accumulate` "
                                        f"(DistributedDataParallel of DirectCheckpointNet"), caught
            assert "Checkpoint with use_reentrant=False or checkpoint a module" in caught[0], caught


def test_regression_another_models_checkpoint_running_no_module_switched_the_check_off():
    """Cause (probe11 P11-09, nested): the critic's walk reached the policy's checkpoint that runs no module and
    answered 'cannot tell' for the critic too, so its lin2 skipped on empty input was not named (rank 1 aborted,
    the others died in gloo).  A checkpoint made in another checked model's forward hides none of this model's
    parameters: the critic is refused on every rank."""
    outcomes = spawn(direct_checkpoint_job, 3, args=(1, False, True), timeout_s=90)
    for rank, (outcome, _) in enumerate(outcomes):
        assert outcome.startswith(f"ModelContractError: rank {rank}: the loss given to `normalize_loss` in "
                                  f"micro-batch 5 of 6"), outcome
        assert "does not depend on parameters module.lin2.bias, module.lin2.weight of the model given to " \
               "`accumulate` (DistributedDataParallel of Critic, block 2 of 2" in outcome, outcome


def test_a_checkpoint_running_no_module_is_charged_to_the_model_whose_forward_made_it():
    """The walk: a module-less checkpoint made in `policy`'s forward may hide the policy's parameters (cannot tell
    about those unreached) and none of `critic`'s (the sequence numbers of the nodes made in each one's forwards)."""
    policy, critic = DirectCheckpointNet(), Critic()
    empty = torch.zeros(0, dtype=torch.int64)
    hidden = {model: weakref.WeakKeyDictionary() for model in (policy, critic)}
    spans = {model: [] for model in (policy, critic)}
    with recording(policy, hidden[policy], None, spans[policy]) as names_policy, \
            recording(critic, hidden[critic], None, spans[critic]) as names_critic:
        loss = policy(empty).sum() + critic(empty).sum()
    number = next(node for node in _nodes(loss) if type(node).__name__ == "CheckpointFunctionBackward")._sequence_nr()
    assert any(first <= number < end for first, end in spans[policy])
    assert not any(first <= number < end for first, end in spans[critic])
    critic_wanted, policy_wanted = set(dict(critic.named_parameters())), set(dict(policy.named_parameters()))
    outside = {"lin2.weight", "lin2.bias"}
    assert reached_leaves([loss], names_critic, critic_wanted, hidden[critic], lambda node: False) == \
        (critic_wanted - outside, False)
    reached, opaque = reached_leaves([loss], names_policy, policy_wanted, hidden[policy], lambda node: True)
    assert opaque and policy_wanted - reached == {"lin1.weight", "lin1.bias"}


def _nodes(output):
    """Every node of the graph of `output`."""
    stack, seen = [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(function for function, _ in node.next_functions)
    return seen


class CompiledTokenNet(nn.Module):
    """An embedding and a head, per token."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(30, 4).double(), nn.Linear(4, 30).double()

    def forward(self, tokens):
        return self.head(torch.tanh(self.embed(tokens)))


def compiled_job(rank, size, order):
    """One step of LENGTHS[0] (M >= 2, due the model check) on DDP of a compiled model (`order`: 'ddp_of_compiled'
    or 'compiled_of_ddp'): the gradients, or what was raised."""
    torch.manual_seed(0)
    net = CompiledTokenNet()
    model = nn.parallel.DistributedDataParallel(torch.compile(net)) if order == "ddp_of_compiled" else \
        torch.compile(nn.parallel.DistributedDataParallel(net))
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=60)
    lengths = LENGTHS[0]
    tokens = torch.randint(0, 30, (sum(lengths),), generator=torch.Generator().manual_seed(1))
    plan = dispatcher.plan(lengths)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `torch.compile")  # torch's: global hooks fire twice
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"t": tokens}, plan)):
            with accumulate(model, micro):
                logits = model(micro.data["t"])
                normalize_loss(F.cross_entropy(logits, micro.data["t"], reduction="sum"), micro).backward()
    assert plan.num_microbatches >= 2 and micro.contract is not None
    return [parameter.grad.clone() for parameter in net.parameters()]


@pytest.mark.parametrize("order", ["ddp_of_compiled", "compiled_of_ddp"])
def test_regression_a_compiled_model_failed_in_dynamo_tracing_the_model_checks_hooks(order):
    """Cause (probe15 P15-08): the model check's global module hooks (closures) were traced into a `torch.compile`d
    model's forward and dynamo failed on every rank ('UnspecializedNNModuleVariable ... is already tracked for
    mutation'): a compiled model could not train with the check on.  The hooks run eagerly (`torch.compiler.disable`);
    the gradients are one float64 pass's."""
    (gradients,) = spawn(compiled_job, 1, args=(order,), timeout_s=300)
    torch.manual_seed(0)
    net = CompiledTokenNet()
    tokens = torch.randint(0, 30, (sum(LENGTHS[0]),), generator=torch.Generator().manual_seed(1))
    (F.cross_entropy(net(tokens), tokens, reduction="sum") / tokens.numel()).backward()
    for got, parameter in zip(gradients, net.parameters(), strict=True):
        torch.testing.assert_close(got, parameter.grad, rtol=0, atol=1e-12)


def two_rank_step(rank):
    """Every rank's features (float64, 2 columns) and this rank's step on M = 2 micro-batches: (homes, dispatcher,
    plan, moved)."""
    generator = torch.Generator().manual_seed(1)
    homes = [[torch.randn(length, 2, generator=generator, dtype=torch.float64) for length in home]
             for home in ([5, 3, 7], [2, 6])]
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=9)
    lengths = [len(x) for x in homes[rank]]
    plan = dispatcher.plan(lengths)
    return homes, dispatcher, plan, dispatcher.dispatch({"x": torch.cat(homes[rank])}, plan, lengths=lengths)


class TwoHeads(nn.Module):
    """A head registered before the trunk it reads, and a second head: a loss through `b` alone reaches no `a`."""

    def __init__(self):
        super().__init__()
        self.a, self.trunk, self.b = nn.Linear(3, 1), nn.Linear(2, 3), nn.Linear(3, 1)

    def forward(self, x):
        hidden = torch.tanh(self.trunk(x))
        return torch.cat([self.a(hidden), self.b(hidden)], dim=1)


def two_backwards_job(rank, size, wrapper, form):
    torch.manual_seed(0)
    base = (TwoHeads() if form == "two heads" else nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))).double()
    model = nn.parallel.DistributedDataParallel(base) if wrapper == "ddp" else fully_shard(base)
    homes, dispatcher, plan, moved = two_rank_step(rank)
    parts = (lambda out: (out[:, :1] ** 2).sum() + 0 * out[:, 1:].sum(), lambda out: out[:, 1:].sum()) \
        if form == "two heads" else (lambda out: (out ** 2).sum(), lambda out: out.sum())
    try:
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(model, micro):
                out = model(micro.data["x"])
                with model.no_sync() if form == "first under no_sync" else nullcontext():
                    normalize_loss(parts[0](out), micro).backward(retain_graph=True)
                (parts[1](out) / 100.0 if form == "auxiliary" else normalize_loss(parts[1](out), micro)).backward()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    torch.manual_seed(0)
    reference = (TwoHeads() if form == "two heads" else nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))
                 ).double()
    xs = [x for home in homes for x in home]
    (sum(parts[0](reference(x)) + parts[1](reference(x)) for x in xs) / sum(len(x) for x in xs)).backward()
    grads = [p.grad.full_tensor() if wrapper == "fsdp2" else p.grad for p in base.parameters()]
    return max(float((g - r.grad).abs().max()) for g, r in zip(grads, reference.parameters()))


@pytest.mark.parametrize("wrapper, form", [("ddp", "two parts"), ("ddp", "first under no_sync"), ("ddp", "two heads"),
                                           ("ddp", "auxiliary"), ("fsdp2", "two parts")])
def test_regression_a_loss_backwarded_in_two_parts_under_ddp_trained_on_unreduced_gradients(wrapper, form):
    """Cause (probe17 P17-08): under DDP the step's last block reduced at its first backward; a second backward of
    another `normalize_loss(..., micro)` part kept its gradients on each rank (4e-2 off the reference, no error).  Now
    every rank raises there, also where the first backward ran under one's own `no_sync()` (DDP decides at the
    forward: that was 4e-2 off too) and where the second reaches none of the first's parameters but the model's
    other ones (two heads: review12 R12-08, 4.9e-2 off where only the first parameter was watched), or is an
    auxiliary loss's, not normalised (R12-10: the ranks' gradients differed); FSDP2 reduces at the block's end and
    was exact."""
    outcomes = spawn(two_backwards_job, 2, args=(wrapper, form), timeout_s=120)
    if wrapper == "ddp":
        assert all(isinstance(outcome, str) and outcome.startswith(
            "ModelContractError: a second backward reaching the model in the block of micro-batch 1 of 2, the step's "
            "last, under DDP") for outcome in outcomes), outcomes
    else:
        assert all(isinstance(error, float) and error <= 1e-15 for error in outcomes), outcomes


def actor_critic_job(rank, size):
    """An actor and a critic, each DDP, in nested `accumulate` blocks, each loss normalised, then backwarded one after
    the other (one backward per model): the largest difference from the float64 reference, or what was raised."""
    torch.manual_seed(0)
    actor, critic = nn.Linear(2, 1).double(), nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1)).double()
    reference = [module for module in (nn.Linear(2, 1), nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1)))]
    for copy, module in zip(reference, (actor, critic)):
        copy.double().load_state_dict(module.state_dict())
    ddps = [nn.parallel.DistributedDataParallel(module) for module in (actor, critic)]
    homes, dispatcher, plan, moved = two_rank_step(rank)
    try:
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(ddps[0], micro), accumulate(ddps[1], micro):
                losses = [normalize_loss((ddp(micro.data["x"]) ** 2).sum(), micro) for ddp in ddps]
                for loss in losses:
                    loss.backward()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    xs = [x for home in homes for x in home]
    for copy in reference:
        (sum((copy(x) ** 2).sum() for x in xs) / sum(len(x) for x in xs)).backward()
    return max(float((p.grad - q.grad).abs().max()) for module, copy in zip((actor, critic), reference)
               for p, q in zip(module.parameters(), copy.parameters()))


def test_regression_an_actor_and_a_critic_each_backwarded_once_were_taken_for_two_backwards_of_one_model():
    """Cause (probe17 P17-17, a regression of f1f6024): the second-backward check hooked every `normalize_loss` result
    of the block for every DDP model of the nested blocks, so the critic's first backward counted as the actor's
    second.  A backward now counts where it reaches the model (its first trainable parameter's gradient)."""
    for error in spawn(actor_critic_job, 2, timeout_s=120):
        assert isinstance(error, float) and error <= 1e-15, error

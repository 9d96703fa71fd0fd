"""`dispatch(..., differentiable=True)` with micro-batches: every micro-batch's backward, exact gradients, one reverse
exchange per step (`runtime.carry`), on real gloo groups against a float64 reference."""

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from orchmllm.runtime import PostBalancingDispatcher, all_reduce_gradients, normalize_loss
from orchmllm.runtime.alltoall import FlatAllToAll
from orchmllm.runtime.launch import run_processes, spawn
from orchmllm.runtime.microbatch import accumulate

VOCAB, WIDTH, BUDGET = 11, 4, 8
LENGTHS = ([3, 5, 2, 6], [7, 1, 4], [2, 8, 3])  # rank r's items: M = 2 micro-batches of 8 tokens per rank
RANK_1_LAST_EMPTY = ([8, 8, 8], [])  # M = 2; rank 1 samples nothing and runs one item, in micro-batch 0


class CountingAllToAll(FlatAllToAll):
    """The flat transport, counting its payload all-to-alls (forward exchange and reverse exchange alike)."""

    calls = 0

    def __call__(self, buffer, flows):
        CountingAllToAll.calls += 1
        return super().__call__(buffer, flows)


def modules():
    torch.manual_seed(0)
    return nn.Embedding(VOCAB, WIDTH).double(), nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(),
                                                              nn.Linear(WIDTH, VOCAB)).double()


def rank_batch(rank, lengths=LENGTHS):
    generator = torch.Generator().manual_seed(rank)
    tokens = torch.randint(0, VOCAB, (sum(lengths[rank]),), generator=generator)
    return tokens, torch.randint(-1, VOCAB, (tokens.numel(),), generator=generator)


def reference_grads(lengths):
    """The float64 gradients of one pass over the whole step (every rank's tokens), loss over its loss tokens."""
    encoder, head = modules()
    tokens, labels = (torch.cat(parts) for parts in zip(*(rank_batch(rank, lengths) for rank in range(len(lengths)))))
    loss = F.cross_entropy(head(encoder(tokens)), labels, ignore_index=-1, reduction="sum")
    (loss / int(labels.ge(0).sum())).backward()
    return [parameter.grad for parameter in (*encoder.parameters(), *head.parameters())]


def encoder_before_dispatch_job(rank, size, lengths, ddp):
    """An encoder run on the rank's own tokens before a differentiable dispatch, then the micro-batch loop with one
    backward per micro-batch; the summed (plain modules) or DDP-averaged gradients, M, and the payload all-to-alls."""
    encoder, head = modules()
    if ddp:
        encoder, head = DistributedDataParallel(encoder), DistributedDataParallel(head)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET, transport=CountingAllToAll())
    tokens, labels = rank_batch(rank, lengths)
    loss_tokens = [int(part.ge(0).sum()) for part in labels.split(lengths[rank])]
    plan = dispatcher.plan(lengths[rank], loss_tokens=loss_tokens)
    CountingAllToAll.calls = 0
    moved = dispatcher.dispatch({"e": encoder(tokens), "y": labels}, plan, differentiable=True)
    for micro in dispatcher.microbatches(plan, moved):
        with accumulate(head, micro):
            loss = F.cross_entropy(head(micro.data["e"]), micro.data["y"], ignore_index=-1, reduction="sum")
            normalize_loss(loss, micro, gradient_reduction="mean" if ddp else "sum").backward()
    parameters = [*encoder.parameters(), *head.parameters()]
    if not ddp:
        all_reduce_gradients(parameters, op="sum")
    return [parameter.grad for parameter in parameters], plan.num_microbatches, CountingAllToAll.calls


@pytest.mark.parametrize("lengths, ddp", [(LENGTHS[:2], False), (LENGTHS, False), (LENGTHS[:2], True),
                                          (RANK_1_LAST_EMPTY, True)],
                         ids=["2 ranks", "3 ranks", "2 ranks DDP", "2 ranks DDP, rank 1's last micro-batch empty"])
def test_regression_micro_batches_of_a_differentiable_dispatch_backpropagate_each_exactly_with_one_reverse_exchange(
        lengths, ddp):
    """Cause (probe15 P15-05): every micro-batch's rows were slices of the one differentiable exchange, so the first
    micro-batch's backward ran the reverse exchange and the encoder's backward and freed them: the second died in
    torch's "Trying to backward through the graph a second time" (retain_graph=True: M reverse exchanges).  The
    micro-batches before the last are cut from a leaf; the last one's backward sends the step's whole gradient home,
    once: the gradients are one pass's over the step, with two payload all-to-alls (out and back) per step."""
    expected = reference_grads(lengths)
    for rank, (grads, count, exchanges) in enumerate(spawn(encoder_before_dispatch_job, len(lengths),
                                                           args=(lengths, ddp), timeout_s=120,
                                                           collective_timeout_s=30)):
        assert count >= 2 and exchanges == 2, (rank, count, exchanges)
        for grad, want in zip(grads, expected):
            torch.testing.assert_close(grad, want, rtol=0, atol=1e-12)


def test_a_backward_after_the_last_micro_batchs_is_refused_not_lost():
    """The last micro-batch's backward sends the step's gradient home: an earlier micro-batch's backward after it
    would add a gradient nobody sends; it raises instead (world size 1: the same path, no communication)."""
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET)
    source = torch.randn(sum(LENGTHS[0]), 2, dtype=torch.float64, requires_grad=True)
    plan = dispatcher.plan(LENGTHS[0])
    micros = list(dispatcher.microbatches(plan, dispatcher.dispatch({"x": source * 3}, plan, differentiable=True)))
    assert len(micros) == 2
    micros[-1].data["x"].sum().backward()
    with pytest.raises(RuntimeError, match=r"a micro-batch's backward reached rows of a differentiable dispatch .* "
                                           r"after the backward of the step's last micro-batch"):
        micros[0].data["x"].sum().backward()


def combined_home_job(rank, size):
    """Every micro-batch's outputs combined home, then one backward there: the gradient of the rank's weight and
    what it is without any exchange (the rank's own rows, home)."""
    torch.manual_seed(0)
    weight = torch.randn(2, 2, dtype=torch.float64, requires_grad=True)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET)
    rows = torch.randn(sum(LENGTHS[rank]), 2, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    plan = dispatcher.plan(LENGTHS[rank])
    moved = dispatcher.dispatch({"e": rows @ weight}, plan, differentiable=True)
    outputs = [(micro, {"o": torch.sin(micro.data["e"])}) for micro in dispatcher.microbatches(plan, moved)]
    (dispatcher.combine(outputs, plan)["o"] ** 2).sum().backward()
    local = torch.autograd.grad((torch.sin(rows @ weight) ** 2).sum(), weight)[0]
    return weight.grad, local, plan.num_microbatches


def test_one_backward_over_every_micro_batch_combined_home_is_exact():
    """A loop that runs no backward per micro-batch but one over all of them (here after `combine` sends the outputs
    home): the last micro-batch's rows still send the gradient home after the others' reached the leaf."""
    for grad, local, count in spawn(combined_home_job, 2, timeout_s=60, collective_timeout_s=30):
        assert count == 2
        torch.testing.assert_close(grad, local, rtol=0, atol=1e-12)


def loss_at_home_job(rank, size, check):
    """The head as DDP, run per micro-batch inside `accumulate(head, micro, check=check)`, its logits combined home,
    the loss at home over the step's loss tokens, one backward: what each rank raised, or the head's gradients."""
    encoder, head = modules()
    ddp = DistributedDataParallel(head)
    tokens, labels = rank_batch(rank)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET)
    plan = dispatcher.plan(LENGTHS[rank])
    moved = dispatcher.dispatch({"e": encoder(tokens).detach()}, plan)
    try:
        outputs = []
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(ddp, micro, check=check):
                outputs.append((micro, {"logits": ddp(micro.data["e"])}))
        logits = dispatcher.combine(outputs, plan)["logits"]
        loss = F.cross_entropy(logits, labels, ignore_index=-1, reduction="sum")
        total = sum(int(rank_batch(r)[1].ge(0).sum()) for r in range(size))
        (loss * size / total).backward()  # DDP averages: times the world size
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return [parameter.grad for parameter in head.parameters()]


def test_the_loss_at_home_after_combine_trains_exactly_with_check_false_and_the_refusal_says_so():
    """probe17 P17-09: forward on the balanced ranks, `combine` home, one loss and one backward there: refused under
    DDP by the model check (which cannot follow a loss made after the exchange) without saying how to run it; with
    `accumulate(model, micro, check=False)` around each forward it is exact, and the refusal now names that form."""
    for outcome in spawn(loss_at_home_job, 3, args=(True,), timeout_s=90, collective_timeout_s=30):
        assert isinstance(outcome, str) and "where the loss is made at home after `combine`" in outcome, outcome
        assert "`with accumulate(model, micro, check=False):`" in outcome, outcome
    expected = reference_grads(LENGTHS)[1:]  # the head's
    for grads in spawn(loss_at_home_job, 3, args=(False,), timeout_s=90, collective_timeout_s=30):
        for got, want in zip(grads, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


class Whole(nn.Module):
    """The encoder and the head in one module; its forward runs the head (the encoder runs before the dispatch)."""

    def __init__(self):
        super().__init__()
        self.encoder, self.head = modules()

    def forward(self, embedded):
        return self.head(embedded)


def static_graph_job(rank, size, together):
    """Two steps on a DDP built with static_graph=True, an encoder run before a differentiable dispatch with
    micro-batches: the encoder a module of that DDP (`together`, run as `ddp.module.encoder`), or a DDP of its own
    beside a static-graph DDP of the head.  What each rank raised, or the gradients of the second step and M."""
    lengths = LENGTHS[:2]
    if together:
        model = DistributedDataParallel(Whole(), static_graph=True)
        encoder = model.module.encoder
        parameters = [*encoder.parameters(), *model.module.head.parameters()]
    else:
        encoder, head = modules()
        encoder, model = DistributedDataParallel(encoder), DistributedDataParallel(head, static_graph=True)
        parameters = [*encoder.parameters(), *head.parameters()]
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET)
    tokens, labels = rank_batch(rank, lengths)
    loss_tokens = [int(part.ge(0).sum()) for part in labels.split(lengths[rank])]
    try:
        for _ in range(2):
            for parameter in parameters:
                parameter.grad = None
            plan = dispatcher.plan(lengths[rank], loss_tokens=loss_tokens)
            moved = dispatcher.dispatch({"e": encoder(tokens), "y": labels}, plan, differentiable=True)
            for micro in dispatcher.microbatches(plan, moved):
                with accumulate(model, micro):
                    loss = F.cross_entropy(model(micro.data["e"]), micro.data["y"], ignore_index=-1, reduction="sum")
                    normalize_loss(loss, micro).backward()
    except ValueError as error:
        return str(error)
    return [parameter.grad for parameter in parameters], plan.num_microbatches


def test_regression_a_static_graph_ddp_whose_module_ran_before_a_differentiable_dispatch_failed_in_torch():
    """Cause (probe16 P16-03): a DDP built with static_graph=True records its graph in its first backward, micro-batch
    0's, which a differentiable dispatch's carried rows cut from the graph before the dispatch (`runtime.carry`):
    where a module of that DDP ran before the dispatch, its parameters were left out of the recorded graph and the
    last micro-batch's backward died in torch's "Your training graph has changed in this iteration" on every rank.
    Now every rank raises before the first block's forward, naming static_graph and the parameters; an encoder
    outside the static-graph DDP (a DDP of its own) trains exactly, as one float64 pass."""
    for message in spawn(static_graph_job, 2, args=(True,), timeout_s=60, collective_timeout_s=30):
        assert isinstance(message, str) and message.startswith(
            "DistributedDataParallel of Whole is built with static_graph=True and records its graph in this step, "
            "whose micro-batches come from a differentiable dispatch whose graph reaches its parameters "
            "['module.encoder.weight']"), message
    expected = reference_grads(LENGTHS[:2])
    for grads, count in spawn(static_graph_job, 2, args=(False,), timeout_s=60, collective_timeout_s=30):
        assert count == 2
        for grad, want in zip(grads, expected, strict=True):
            torch.testing.assert_close(grad, want, rtol=0, atol=1e-12)


def dummy_loss_job(rank, size, lengths):
    """A differentiable dispatch whose rank 1 holds no row in the step's last micro-batch, where its body's loss is
    DDP's usual "dummy loss" (every parameter times 0), which reaches no row of the dispatch: what each rank raised,
    and after how long."""
    encoder, head = modules()
    encoder, head = DistributedDataParallel(encoder), DistributedDataParallel(head)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET)
    tokens, labels = rank_batch(rank, lengths)
    start = time.monotonic()
    try:
        plan = dispatcher.plan(lengths[rank])
        moved = dispatcher.dispatch({"e": encoder(tokens), "y": labels}, plan, differentiable=True)
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(head, micro):
                if micro.items.size:
                    loss = F.cross_entropy(head(micro.data["e"]), micro.data["y"], ignore_index=-1, reduction="sum")
                else:
                    loss = sum(parameter.sum() for parameter in head.parameters()) * 0
                normalize_loss(loss, micro).backward()
    except Exception as error:  # noqa: BLE001
        return f"{type(error).__name__}: {error}", time.monotonic() - start
    return "no error", time.monotonic() - start


@pytest.mark.parametrize("lengths", [RANK_1_LAST_EMPTY, ([8], [])], ids=["M = 2", "M = 1"])
def test_regression_a_last_backward_that_missed_the_dispatched_rows_left_the_peers_in_the_reverse_exchange(lengths):
    """Cause (probe16 P16-13, HG): where a rank's last micro-batch's loss reaches none of its rows of a differentiable
    dispatch (an empty micro-batch's dummy loss, every parameter times 0), that rank never runs the step's reverse
    exchange, which its peers' last backward waits in: both waited until the group's timeout, blaming a dead peer.
    That rank now raises as its last block ends, naming the rule, and stops: its peers' exchange fails at once."""
    outcomes = run_processes(dummy_loss_job, 2, args=(lengths,), timeout_s=60, collective_timeout_s=30)
    (first, first_seconds), (second, second_seconds) = (outcome.value for outcome in outcomes)
    assert second.startswith("ValueError: the backward of the step's last micro-batch on this rank did not reach its "
                             "rows of a differentiable dispatch"), second
    assert first.startswith("PeerFailureError: rank 0: the exchange payload all-to-all"), first
    assert max(first_seconds, second_seconds) < 20, (first_seconds, second_seconds)


def detached_rows_job(rank, size, differentiable):
    """Every rank's loss detaches the dispatched rows (an encoder frozen after a warm-up), the rows dispatched with
    `differentiable` (else detached before the dispatch): what each rank raised, or "trained"."""
    encoder, head = modules()
    head = DistributedDataParallel(head)
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET)
    tokens, labels = rank_batch(rank, LENGTHS[:2])
    plan = dispatcher.plan(LENGTHS[rank])
    embedded = encoder(tokens) if differentiable else encoder(tokens).detach()
    moved = dispatcher.dispatch({"e": embedded, "y": labels}, plan, differentiable=differentiable)
    try:
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(head, micro):
                loss = F.cross_entropy(head(micro.data["e"].detach()), micro.data["y"], ignore_index=-1,
                                       reduction="sum")
                normalize_loss(loss, micro).backward()
    except ValueError as error:
        return str(error)
    return "trained"


def test_regression_rows_detached_on_every_rank_were_refused_with_advice_to_fake_a_dependency():
    """Cause (probe16 P16-16, after d8f4e16): a differentiable dispatch whose rows every rank's loss detaches (an
    encoder frozen after a warm-up) is refused, as a rank cannot tell that its peers skipped the reverse exchange
    too, but the message only told the user to make the loss reach the rows.  It now names the way out: dispatch
    rows that take no gradient without `differentiable=True`, which trains."""
    for message in spawn(detached_rows_job, 2, args=(True,), timeout_s=60, collective_timeout_s=30):
        assert "where the rows take no gradient on purpose (an encoder frozen), dispatch them without " \
               "`differentiable=True` (`.detach()` them first)" in message, message
    assert spawn(detached_rows_job, 2, args=(False,), timeout_s=60, collective_timeout_s=30) == ["trained"] * 2

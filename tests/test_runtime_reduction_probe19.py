"""`all_reduce_gradients` and the reduction checks against probe19's inputs, in real gloo groups: what they passed
silently or refused wrongly, each named after its cause."""

import torch
from torch import nn

from orchmllm.runtime import all_reduce_gradients
from orchmllm.runtime.launch import spawn


def outcome(call) -> str:
    """What `call()` raised as 'ErrorType: message', else 'reduced'."""
    try:
        call()
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "reduced"


def consumed_generator_job(rank, size):
    """A model's `parameters()` generator iterated already (an optimizer built from it), then passed: every rank
    reduced 0 parameters before; rank 1 alone in the second call, its peer passing the list."""
    model = nn.Linear(3, 1)
    model(torch.full((2, 3), rank + 1.0)).sum().backward()
    parameters = model.parameters()
    torch.optim.SGD(parameters, lr=0.1)
    every = outcome(lambda: all_reduce_gradients(parameters, op="sum"))
    alone = outcome(lambda: all_reduce_gradients(model.parameters() if rank == 0 else parameters, op="sum"))
    return every, alone


def test_regression_a_consumed_parameters_generator_reduced_nothing_without_an_error():
    """Cause (probe19 P19-09): an exhausted `model.parameters()` gave 0 parameters on every rank: nothing reduced,
    no error.  Refused on every rank, naming `parameters` and the likely cause; a rank alone is named to its peer."""
    for rank, (every, alone) in enumerate(spawn(consumed_generator_job, 2, timeout_s=60, collective_timeout_s=20)):
        assert every == (f"ValueError: `parameters` passed to all_reduce_gradients on rank {rank} holds no tensor, "
                         f"so nothing would be reduced (a generator such as `model.parameters()` yields its "
                         f"parameters once: one iterated already, by an optimizer built from it or an earlier call, "
                         f"yields none; pass the module itself or `list(model.parameters())`)"), every
        assert alone == (every if rank == 1 else "PeerInputError: ranks [1] passed all_reduce_gradients a parameter "
                                                 "it cannot reduce (each raised why); rank 0 stops with them"), alone


def embedding_job(rank, size):
    """A DDP model that is mostly an embedding (1000 rows of 8; rows 3 and 7 touched on rank 0, 5 and 7 on rank 1),
    its parameters passed as a list with op 'sum' after DDP's backward; then controls that must reduce: the same
    plain model (local gradients), and one whose gradients are all zero on every rank."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(1000, 8), nn.Linear(8, 1))
    ddp = nn.parallel.DistributedDataParallel(net)
    tokens = torch.tensor([3, 7] if rank == 0 else [5, 7])
    ddp(tokens).sum().backward()
    twice = outcome(lambda: all_reduce_gradients(list(ddp.parameters()), op="sum"))
    plain = nn.Sequential(nn.Embedding(1000, 8), nn.Linear(8, 1))
    plain(tokens).sum().backward()
    local = outcome(lambda: all_reduce_gradients(list(plain.parameters()), op="sum"))
    plain.zero_grad(set_to_none=False)
    zero = outcome(lambda: all_reduce_gradients(list(plain.parameters()), op="sum"))
    return twice, local, zero


def test_regression_an_embeddings_ddp_gradients_summed_again_read_as_zero_by_the_sampled_digest():
    """Cause (probe19 P19-03): the rank-equal check read 64 values spread over the flat gradients; an embedding's
    few touched rows fell between them, every sampled value read 0 and a list of a DDP model's parameters summed
    again (gradients x world size) passed.  The digest also sums runs of the gradients, reading every value: refused
    on every rank; local gradients and all-zero ones still reduce."""
    for twice, local, zero in spawn(embedding_job, 2, timeout_s=60, collective_timeout_s=20):
        assert twice.startswith("ValueError: all_reduce_gradients(op='sum') of gradients that are the same on all 2 "
                                "ranks"), twice
        assert (local, zero) == ("reduced", "reduced")


def fsdp2_holder_job(rank, size):
    """A ModuleDict holding an FSDP2 encoder beside a plain LLM, both trained: passed whole, its parameters as a
    list, then the advice followed (the LLM's parameters, its gradient the mean of the ranks')."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    holder = nn.ModuleDict({"enc": fully_shard(nn.Linear(3, 3)), "llm": nn.Linear(3, 1)})
    holder["llm"](holder["enc"](torch.full((2, 3), rank + 1.0))).sum().backward()
    whole = outcome(lambda: all_reduce_gradients(holder, op="mean"))
    listed = outcome(lambda: all_reduce_gradients(list(holder.parameters()), op="mean"))
    local = holder["llm"].bias.grad.clone()
    advised = outcome(lambda: all_reduce_gradients(
        [p for name, p in holder.named_parameters() if not name.startswith(("enc.",))], op="mean"))
    return whole, listed, advised, local, holder["llm"].bias.grad


def test_regression_a_module_holding_an_fsdp2_encoder_was_told_to_drop_the_call_leaving_the_rest_unreduced():
    """Cause (probe19 P19-12): a ModuleDict holding a `fully_shard` encoder beside a plain LLM was told 'drop this
    call' (the DTensor refusal), which would leave the LLM's gradients each rank's own.  The module names the FSDP2
    part and says to pass the other parameters, with the expression that does; a list mixing both says the same.
    The advice followed reduces the LLM's gradients (their mean)."""
    outcomes = spawn(fsdp2_holder_job, 2, timeout_s=60, collective_timeout_s=20)
    for whole, listed, advised, _, reduced in outcomes:
        assert whole == (
            "TypeError: all_reduce_gradients was given a module holding FSDP2 (fully_shard) 'enc' (FSDPLinear), "
            "whose gradients FSDP2 reduces itself at the backward (sharded, as DTensors): pass the other parameters "
            "only, `[p for name, p in model.named_parameters() if not name.startswith(('enc.',))]`"), whole
        assert listed.startswith("TypeError: all_reduce_gradients reduces plain models' gradients; a parameter of "
                                 "shape (3, 3) is a DTensor of FSDP2 (fully_shard), which reduces its gradients "
                                 "itself: pass the other parameters only (those of plain modules; a second reduction "
                                 "of these would"), listed
        assert advised == "reduced"
        assert torch.equal(reduced, (outcomes[0][3] + outcomes[1][3]) / 2)

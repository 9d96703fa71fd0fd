"""probe55: a differentiable dispatch where some rank's tensors require no grad (a rank of no items passing fresh
zeros, `torch.zeros(0, d)`, beside peers whose rows come out of an encoder).

That rank's exchange recorded no autograd node, so its backward never ran the reverse exchange, and its peers, whose
rows it held, waited in theirs until the peer died or the group's timeout (PeerFailureError: gradients of the rows
it held never came home; a rank that went on to its next collective met them there).  Now the outputs require grad
on every rank where autograd records, and every rank's backward sends the gradients home: exact, as if every rank's
tensors required grad."""

import pytest
import torch

from orchmllm.runtime import PostBalancingDispatcher
from orchmllm.runtime.launch import run_processes

LENGTHS = {"one rank holds nothing": [[3, 1, 2], []], "one rank's rows need no gradient": [[3, 1, 2], [2, 2]]}


def _job(rank, size, lengths, budget):
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=budget)
    weight = torch.tensor([1.5, -2.0], dtype=torch.float64, requires_grad=True)  # a model's parameter
    mine = lengths[rank]
    x = torch.arange(2.0 * sum(mine), dtype=torch.float64).reshape(-1, 2) + 10 * rank
    if rank == 0:
        x.requires_grad_()  # rank 0's rows come out of an encoder; rank 1's are fresh
    plan = dispatcher.plan(mine)
    moved = dispatcher.dispatch({"x": x}, plan, differentiable=True)
    for micro in dispatcher.microbatches(plan, moved):
        ((micro.data["x"] * weight) ** 2).sum().backward()
    torch.distributed.all_reduce(weight.grad)
    return None if x.grad is None else x.grad.clone(), x.detach().clone(), weight.grad.clone()


@pytest.mark.parametrize("budget", [None, 4], ids=["one batch", "micro-batches"])
@pytest.mark.parametrize("case", sorted(LENGTHS))
def test_regression_a_rank_whose_rows_need_no_gradient_left_its_peers_waiting_in_the_backward(case, budget):
    outcomes = run_processes(_job, 2, args=(LENGTHS[case], budget), timeout_s=60, collective_timeout_s=15)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    (grad, x, weight_grad), (other_grad, other_x, _) = (o.value for o in outcomes)
    weight = torch.tensor([1.5, -2.0], dtype=torch.float64)
    assert other_grad is None
    torch.testing.assert_close(grad, 2 * x * weight ** 2, rtol=0, atol=1e-12)
    everything = torch.cat([x, other_x])
    torch.testing.assert_close(weight_grad, (2 * everything ** 2 * weight).sum(0), rtol=0, atol=1e-9)

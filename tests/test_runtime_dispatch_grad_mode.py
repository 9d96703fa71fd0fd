"""`dispatch(..., differentiable=True)` run under torch.no_grad on some ranks only, or with `differentiable=False` on
some: the ranks that recorded its backward waited in their backward's reverse exchange (until the collective timeout,
or until a peer left).  Whether each rank records rides in the dispatch exchange's header beside the step clock's
fact (one word, no extra collective), and every rank raises, naming the ranks of each mode."""

import torch

from orchmllm.runtime import PostBalancingDispatcher
from orchmllm.runtime.launch import run_processes


def _job(rank, size):
    dispatcher = PostBalancingDispatcher()
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    said = []
    modes = [(True, False), (False, True)] if rank else [(True, True)] * 2  # (differentiable, grad enabled)
    for differentiable, grad in (*modes, (True, True)):  # rank 0 records, rank 1 not; then every rank trains
        lengths = [(5, 3), (2, 6)][rank]
        x = torch.randn(sum(lengths), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
        plan = dispatcher.plan(lengths)
        try:
            with torch.set_grad_enabled(grad):
                moved = dispatcher.dispatch({"x": x * weight if differentiable else x}, plan,
                                            differentiable=differentiable)
            [micro] = dispatcher.microbatches(plan, moved)
            micro.data["x"].sum().backward()
            said.append(float(weight.grad.sum()))
        except RuntimeError as error:
            said.append(str(error))
    return said


def test_regression_dispatch_in_other_grad_modes_on_some_ranks_is_named_on_every_rank_not_a_hang():
    outcomes = run_processes(_job, 2, timeout_s=60, collective_timeout_s=8)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        *refused, trained = o.value
        assert refused == [f"dispatch (seen from rank {o.rank}): ranks [0] run it with grad enabled and ranks [1] "
                           f"{how}, so ranks [0] would wait in their backward's reverse exchange until the collective "
                           f"timeout; run it in the same grad mode on every rank, and with the same `differentiable` "
                           f"(in evaluation too: the exchange cannot know whether a backward follows)"
                           for how in ("under torch.no_grad (or inference_mode)", "with differentiable=False")], refused
        assert isinstance(trained, float), trained

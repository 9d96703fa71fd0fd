"""`combine` (differentiable, the default) run under torch.no_grad on some ranks only (fix60): the ranks with grad
enabled recorded its backward, the others did not, and the recording ranks waited in their backward's reverse
exchange (until the collective timeout, or until a peer left).  Whether each rank records now rides in the combine
exchange's header, and every rank raises, naming the ranks of each grad mode."""

import torch

from orchmllm.runtime import PostBalancingDispatcher
from orchmllm.runtime.launch import run_processes


def _job(rank, size):
    dispatcher = PostBalancingDispatcher()
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    said = []
    for grad_on_rank_1 in (False, True):  # rank 1 alone under no_grad; then every rank with grad (trains)
        lengths = [(5, 3), (2, 6)][rank]
        x = torch.randn(sum(lengths), 4, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
        plan = dispatcher.plan(lengths)
        [micro] = dispatcher.microbatches(plan, dispatcher.dispatch({"x": x}, plan))
        try:
            with torch.set_grad_enabled(rank == 0 or grad_on_rank_1):
                home = dispatcher.combine({"y": micro.data["x"] * weight}, plan)
            home["y"].sum().backward()
            said.append(float(weight.grad.sum()))
        except RuntimeError as error:
            said.append(str(error))
    return said


def test_regression_combine_under_no_grad_on_some_ranks_is_named_on_every_rank_not_a_hang():
    outcomes = run_processes(_job, 2, timeout_s=60, collective_timeout_s=8)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        refused, trained = o.value
        assert refused == (f"combine (seen from rank {o.rank}): ranks [0] run it with grad enabled and ranks [1] under "
                           f"torch.no_grad (or inference_mode), so ranks [0] would wait in their backward's reverse "
                           f"exchange until the collective timeout; run it in the same grad mode on every rank, and "
                           f"with the same `differentiable` (in evaluation too: the exchange cannot know whether a "
                           f"backward follows)"), refused
        assert isinstance(trained, float), trained

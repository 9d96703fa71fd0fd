"""`normalize_loss` with a count on ranks that disagree on `gradient_reduction`, in a real gloo group (probe27
P27-04: rank 0 'mean', the others 'sum' scaled their losses by D and 1, so the reduced gradient mixed the two, with
no error): the count's one all-reduce carries the reduction, and a mix raises on every rank, naming it."""

import torch

from orchmllm.runtime import global_count, normalize_loss
from orchmllm.runtime.launch import spawn


def outcome(call) -> str:
    """What `call()` raised as 'ErrorType: message', else 'normalised'."""
    try:
        call()
    except ValueError as error:
        return f"{type(error).__name__}: {error}"
    return "normalised"


def mixed_job(rank, size):
    """Rank 0 normalises for 'mean', rank 1 for 'sum'; then rank 0 for 'sum' while rank 1 sums the same count
    by `global_count`; then both for 'sum', which divides by the global count."""
    loss = torch.tensor(2.0 + rank, dtype=torch.float64)
    mixed = outcome(lambda: normalize_loss(loss, 1 + rank, gradient_reduction="mean" if rank == 0 else "sum"))
    counted = outcome(lambda: normalize_loss(loss, 1, gradient_reduction="sum") if rank == 0 else
                      global_count(1, name="num_loss_tokens"))
    agreed = float(normalize_loss(loss, 1 + rank, gradient_reduction="sum"))
    return mixed, counted, agreed


def test_regression_ranks_that_disagree_on_the_gradient_reduction_raise_on_every_rank():
    for rank, (mixed, counted, agreed) in enumerate(spawn(mixed_job, 2, timeout_s=60, collective_timeout_s=20)):
        assert mixed == (f"ValueError: rank {rank}: normalize_loss with gradient_reduction="
                         f"{'mean' if rank == 0 else 'sum'!r} here, but 1 of 2 ranks normalise for 'mean', 1 for "
                         f"'sum' and 0 call global_count: each rank scales its loss for its own reduction, so the "
                         f"reduced gradient mixes factors 1 and 2; pass the same `gradient_reduction` on every "
                         f"rank"), mixed
        # review R19-01: codes 1 and 2 summed a global_count beside 'mean' and 'sum' to 3 x 'mean' on 3 ranks
        kinds = "0 of 2 ranks normalise for 'mean', 1 for 'sum' and 1 call global_count"
        assert counted == (f"ValueError: rank 0: normalize_loss with gradient_reduction='sum' here, but {kinds}: each "
                           f"rank scales its loss for its own reduction, so the reduced gradient mixes factors 1 and "
                           f"2; pass the same `gradient_reduction` on every rank" if rank == 0 else
                           f"PeerInputError: rank 1: `global_count` of `num_loss_tokens` here was paired with "
                           f"normalize_loss's count on some rank ({kinds}): every rank must normalise the same "
                           f"way"), counted
        assert agreed == (2.0 + rank) / 3  # the group still works: counts 1 + 2

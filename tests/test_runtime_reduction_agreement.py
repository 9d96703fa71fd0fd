"""`normalize_loss` with a count on ranks that disagree on `gradient_reduction`, in a real gloo group (probe27
P27-04: rank 0 'mean', the others 'sum' scaled their losses by D and 1, so the reduced gradient mixed the two, with
no error): the count's one all-reduce carries the reduction, and a mix raises on every rank, naming it."""

import torch

from orchmllm.runtime import normalize_loss
from orchmllm.runtime.launch import spawn


def mixed_job(rank, size):
    """Rank 0 normalises for 'mean', rank 1 for 'sum'; then all for 'sum', which divides by the global count."""
    loss = torch.tensor(2.0 + rank, dtype=torch.float64)
    try:
        normalize_loss(loss, 1 + rank, gradient_reduction="mean" if rank == 0 else "sum")
        mixed = "normalised"
    except ValueError as error:
        mixed = f"ValueError: {error}"
    agreed = float(normalize_loss(loss, 1 + rank, gradient_reduction="sum"))
    return mixed, agreed


def test_regression_ranks_that_disagree_on_the_gradient_reduction_raise_on_every_rank():
    for rank, (mixed, agreed) in enumerate(spawn(mixed_job, 2, timeout_s=60, collective_timeout_s=20)):
        assert mixed == (f"ValueError: rank {rank}: normalize_loss with gradient_reduction="
                         f"{'mean' if rank == 0 else 'sum'!r} here, but 1 of 2 ranks pass 'mean' and 1 'sum': each "
                         f"rank scales its loss for its own reduction, so the reduced gradient mixes factors 1 and 2; "
                         f"pass the same `gradient_reduction` on every rank"), mixed
        assert agreed == (2.0 + rank) / 3  # the group still works: counts 1 + 2

"""A rank of a split item's group attending in another grad mode than its peer (fix62: its peer's backward sent
gradient rows that its next call received as keys: gloo's SIGABRT on sizes that differ, wrong keys where they match).
Each row's flag says whether its exchange records the backward, read at a layout's first call in that mode.  A rank
whose keys need no grad, with grad on (a frozen LLM's text shard beside its peer's image tokens; rev58), records all
the same and sends its peer the gradient of the keys it received: the peer's gradient is the one both need."""

import pytest
import torch

from orchmllm.runtime.context_parallel import (ContextParallelError, ContextParallelLayout, SplitItem,
                                               context_parallel_attention)
from orchmllm.runtime.launch import run_processes

STEPS = (("grad", "grad"), ("grad", "no_grad"), ("grad", "grad"), ("grad", "inputs_need_no_grad"), ("grad", "grad"))


def _step(rank: int, mode: str, dtype) -> tuple:
    """One step on a fresh layout: rank's attention over one split item of 16 tokens, then its backward."""
    split = SplitItem(item=0, length=16, group=(0, 1))
    layout = ContextParallelLayout.build([split], [split])
    weight = torch.nn.Parameter(torch.ones(2, dtype=dtype))
    scale = weight.detach() if mode == "inputs_need_no_grad" else weight
    generator = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(layout.num_tokens, 1, 2, generator=generator).to(dtype) * scale for _ in range(3))
    try:
        with torch.set_grad_enabled(mode != "no_grad"):
            out = context_parallel_attention(q, k, v, layout)
        if out.requires_grad:
            out.sum().backward()
    except ContextParallelError as error:
        return "raised", str(error)
    return "trained", out.detach().float(), None if weight.grad is None else weight.grad.float()


def _job(rank: int, world_size: int, dtype):
    return [_step(rank, modes[rank], dtype) for modes in STEPS]


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_regression_a_rank_attending_in_another_grad_mode_than_its_peer_raises_on_both(dtype):
    outcomes = run_processes(_job, 2, args=(dtype,), timeout_s=60, collective_timeout_s=8)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for rank, steps in enumerate(o.value for o in outcomes):
        assert [step[0] for step in steps] == ["trained", "raised", "trained", "trained", "trained"]
        peer = 1 - rank
        for said in (steps[1][1],):
            assert f"on rank {rank} " in said and f"ranks [{peer}]" in said and "one grad mode" in said
            assert "need grad alike" not in said  # probe59 M2: keys needing no grad beside a peer's are fine
        assert ("on rank 1 does not record" in steps[1][1]) == (rank == 1)
        for later in (steps[2], steps[4]):  # the same inputs as the first step: the same output and gradient
            assert torch.equal(later[1], steps[0][1]) and torch.equal(later[2], steps[0][2])
        frozen = steps[3]  # rank 1's keys need no grad: rank 0's gradient still holds rank 1's queries' part
        assert torch.equal(frozen[1], steps[0][1])
        assert torch.equal(frozen[2], steps[0][2]) if rank == 0 else frozen[2] is None

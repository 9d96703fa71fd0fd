"""rev55 N5 (fix56): `exchange_with_grad`'s public default, `record=False`, still left a direct caller's peers waiting
(probe55's layout: one rank's pieces need no gradient, its peers' do).  That rank recorded no autograd node, so its
backward never ran the reverse exchange, and the rank whose rows it held waited in its own until the group's timeout.
`record` is now the default; the multi-stage runtime, whose encoder outputs agree on `requires_grad` on every rank,
passes `record=False`, which still records no node where no input requires grad."""

import pytest
import torch

from orchmllm.runtime import ExchangeMeta, Piece, exchange_with_grad
from orchmllm.runtime.launch import run_processes


def _swap(rank, size):
    """Item 0 lives on rank 0 and item 1 on rank 1; each moves to the other rank.  Only rank 0's rows need grad."""
    route = ExchangeMeta([0, 1], [1, 0], rank, size)
    rows = torch.tensor([[1.0 + rank, -2.0]], dtype=torch.float64, requires_grad=rank == 0)
    weight = torch.tensor([3.0, 0.5], dtype=torch.float64, requires_grad=True)
    [moved] = exchange_with_grad([Piece(route, rows, 1)])
    ((moved * weight) ** 2).sum().backward()
    torch.distributed.all_reduce(weight.grad)
    return None if rows.grad is None else rows.grad.clone(), weight.grad.clone()


def test_regression_a_rank_whose_pieces_need_no_gradient_left_its_peer_waiting():
    outcomes = run_processes(_swap, 2, timeout_s=60, collective_timeout_s=8)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    (grad, weight_grad), (other_grad, _) = (o.value for o in outcomes)
    weight = torch.tensor([3.0, 0.5], dtype=torch.float64)
    assert other_grad is None
    torch.testing.assert_close(grad, 2 * torch.tensor([[1.0, -2.0]], dtype=torch.float64) * weight ** 2,
                               rtol=0, atol=0)  # rank 0's row, moved to rank 1: its gradient came home
    both = torch.tensor([[1.0, -2.0], [2.0, -2.0]], dtype=torch.float64)
    torch.testing.assert_close(weight_grad, (2 * both ** 2 * weight).sum(0), rtol=0, atol=0)


@pytest.mark.parametrize("record", [True, False])
def test_outputs_need_no_grad_where_nothing_records_or_record_is_false(record):
    route = ExchangeMeta([0, 0], [0, 0], 0, 1)
    piece = Piece(route, torch.arange(4.0).reshape(2, 2), 1)
    with torch.no_grad():
        [moved] = exchange_with_grad([piece], record=record)
    assert not moved.requires_grad
    [moved] = exchange_with_grad([piece], record=record)
    assert moved.requires_grad == record  # record=False: no node, no reverse exchange (frozen encoders)
    [moved] = exchange_with_grad([piece])
    assert moved.requires_grad  # the default records

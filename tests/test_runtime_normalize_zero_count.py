"""probe55 N5 (fix56): `normalize_loss(loss, 0)`.  The behaviour is kept and now documented (it passes on the parent,
by design): a global count of 0 divides by 1, so a loss summed over no token comes back 0 with zero gradients (never
0 / 0 = NaN), and a nonzero `loss_sum` (an auxiliary term) comes back as it is.  An error was not chosen: a step whose
targets are all masked would raise it in the middle of a run.  Counts that are not counts stay errors naming
`num_loss_tokens` / `total_loss_tokens`."""

import pytest
import torch

from orchmllm.runtime import normalize_loss


@pytest.mark.parametrize("count", [{"num_loss_tokens": 0}, {"total_loss_tokens": 0},
                                   {"num_loss_tokens": torch.tensor(0)}])
def test_a_step_of_no_loss_token_gives_zero_and_zero_gradients(count):
    weight = torch.tensor(2.0, requires_grad=True)
    loss = normalize_loss(weight * torch.zeros(0).sum(), **count, gradient_reduction="sum")
    loss.backward()
    assert loss.item() == 0.0 and weight.grad.item() == 0.0


def test_a_nonzero_sum_over_no_token_comes_back_as_it_is():
    assert normalize_loss(torch.tensor(3.0), 0).item() == 3.0


def test_the_choice_is_documented():
    assert "A global count of 0" in normalize_loss.__doc__ and "divides by 1" in normalize_loss.__doc__


@pytest.mark.parametrize("count, error", [(-5, ValueError), (2.5, TypeError),
                                          (torch.zeros(2, dtype=torch.int64), ValueError)])
def test_counts_that_are_not_counts_are_errors_naming_the_argument(count, error):
    with pytest.raises(error, match="`num_loss_tokens`"):
        normalize_loss(torch.tensor(3.0), count)

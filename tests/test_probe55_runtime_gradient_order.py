"""probe55: all_reduce_gradients given a Module whose parameters come in another order on another process, with the
same dtypes and shapes (encoders of one class in a ModuleDict filled from a set of modality names, whose order follows
each process's string hashes under torchrun): the digest compared counts, dtypes and shapes only, so the image
encoder's gradients were summed into the audio encoder's without a word.  A Module's parameter names ride in the digest
now: every rank raises naming the difference."""

import torch
from torch import nn

from orchmllm.runtime import all_reduce_gradients
from orchmllm.runtime.launch import run_processes


def _job(rank, size, orders):
    torch.manual_seed(0)
    model = nn.ModuleDict({name: nn.Linear(2, 2) for name in orders[rank]})
    for index, name in enumerate(sorted(model)):  # each encoder's gradient says whose it is
        for parameter in model[name].parameters():
            parameter.grad = torch.full_like(parameter, float((index + 1) * (rank + 1)))
    try:
        all_reduce_gradients(model, op="sum")
    except ValueError as error:
        return "refused", str(error)
    return "reduced", {name: model[name].weight.grad[0, 0].item() for name in model}


def test_regression_parameters_in_another_order_on_another_rank_were_summed_into_each_other():
    outcomes = run_processes(_job, 2, args=((("image", "audio"), ("audio", "image")),), timeout_s=40,
                             collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message = o.value
        assert kind == "refused", o.value
        assert "the parameter list passed to all_reduce_gradients differs" in message
        assert "a Module's names" in message


def test_the_same_order_reduces_as_before():
    outcomes = run_processes(_job, 2, args=((("image", "audio"), ("image", "audio")),), timeout_s=40,
                             collective_timeout_s=20)
    assert [o.value for o in outcomes] == [("reduced", {"image": 6.0, "audio": 3.0})] * 2

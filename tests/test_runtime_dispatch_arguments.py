"""`PostBalancingDispatcher` checks `group` and `transport` when it is built, as every other argument."""

import warnings

import pytest
import torch

from orchmllm.runtime import PostBalancingDispatcher, gather_metadata
from orchmllm.runtime.alltoall import FlatAllToAll
from orchmllm.runtime.sampler import BalancedDistributedSampler


@pytest.mark.parametrize("options, named", [({"group": (0, 1)}, "group"), ({"group": "world"}, "group"),
                                            ({"transport": "flat"}, "transport"),
                                            ({"transport": object()}, "transport")],
                         ids=["ranks_as_group", "name_as_group", "transport_name", "no_exchange"])
def test_regression_the_dispatcher_took_a_group_or_transport_of_the_wrong_kind(options, named):
    """Cause (probe15 P15-20, the dispatcher's half): `group=[0, 1]` or `transport="hierarchical"` was accepted, then
    failed inside `plan` or `dispatch` with raw Python errors (a weak reference to a list, a str's `size`) naming
    neither argument.  Both are checked when the dispatcher is built (`alltoall.runtime_transport`)."""
    with pytest.raises(TypeError, match=f"^`{named}` must be "):
        PostBalancingDispatcher(**options)


def test_a_transport_given_is_the_one_used():
    transport = FlatAllToAll()
    assert PostBalancingDispatcher(transport=transport).transport is transport
    assert isinstance(PostBalancingDispatcher().transport, FlatAllToAll)


TENSORS_WITHOUT_DENSE_INTEGERS = {  # how each is made, and what the refusal says of `{}` (the argument)
    "nested": (lambda: torch.nested.nested_tensor([torch.tensor([1, 2]), torch.tensor([3])]),
               r"`{}` is a nested tensor, not a dense one of integers \(one per item\); pass a dense tensor or a list "
               r"\(a nested batch's lengths: `\[item.shape\[0\] for item in batch.unbind\(\)\]`\)"),
    "jagged": (lambda: torch.nested.nested_tensor([torch.tensor([1, 2]), torch.tensor([3])], layout=torch.jagged),
               r"`{}` is a nested tensor, not a dense one of integers"),
    "float8": (lambda: torch.tensor([3.0, 1, 2]).to(torch.float8_e4m3fn),
               r"`{}` has dtype torch.float8_e4m3fn, which numpy cannot hold"),
    "quantized": (lambda: torch.quantize_per_tensor(torch.tensor([3.0, 1, 2]), 1.0, 0, torch.quint8),
                  r"`{}` has dtype torch.quint8, which numpy cannot hold"),
    "meta": (lambda: torch.empty(3, dtype=torch.int64, device="meta"),
             r"`{}` is a meta tensor, which has a shape but no values; pass a tensor with values"),
    "sparse_coo": (lambda: torch.tensor([3, 1, 2]).to_sparse(),
                   r"`{0}` is a tensor of layout torch.sparse_coo, not a dense one; pass `{0}.to_dense\(\)` or a list"),
    "sparse_csr": (lambda: torch.tensor([[3, 1], [0, 2]]).to_sparse_csr(),
                   r"`{0}` is a tensor of layout torch.sparse_csr, not a dense one; pass `{0}.to_dense\(\)`"),
}


@pytest.mark.parametrize("kind", list(TENSORS_WITHOUT_DENSE_INTEGERS))
def test_regression_lengths_without_dense_integer_values_raised_torchs_errors_in_the_runtime(kind):
    """Cause (probe19 P19-02, P19-11): lengths or loss tokens given as a nested, float8, quantized, meta or sparse
    tensor reached `.numpy()` in `as_table` (the dispatcher's plan and dispatch, gather_metadata, the multi-stage
    runtime's loss tokens) or `as_lengths` (the sampler: nested, float8): torch's "NestedTensorImpl doesn't support
    sizes", "Got unsupported ScalarType Float8_e4m3fn", "Cannot copy out of meta tensor", naming no argument.  Each
    entry point now refuses them naming the argument and what to pass."""
    make, message = TENSORS_WITHOUT_DENSE_INTEGERS[kind]
    dispatcher = PostBalancingDispatcher()
    plan = dispatcher.plan([3, 1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: nested and sparse CSR tensors are in beta
        tensor = make()
        for name, call in [("lengths", lambda: dispatcher.plan(tensor)),
                           ("loss_tokens", lambda: dispatcher.plan([3, 1, 2], loss_tokens=tensor)),
                           ("lengths", lambda: dispatcher.dispatch({"ids": torch.zeros(6)}, plan, lengths=tensor)),
                           ("lengths", lambda: gather_metadata(tensor)),
                           ("lengths", lambda: BalancedDistributedSampler(tensor, num_replicas=1, rank=0,
                                                                          global_batch_size=1))]:
            with pytest.raises(TypeError, match="^" + message.format(name)):
                call()

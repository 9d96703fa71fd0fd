"""A planning error about one item of the step names the rank that sampled it and its index there, not only its
index in the gathered batch, which the user never sees (probe15 P15-06); on real gloo ranks."""

import pytest

from orchmllm.balancers import InfeasibleError
from orchmllm.balancers.context_parallel import ContextParallel
from orchmllm.runtime import PostBalancingDispatcher
from orchmllm.runtime.launch import spawn

OPTIONS = {
    "budget": ({"max_tokens_per_microbatch": 8}, 9,
               "rank 1's item 0 (item 4 of the step) has 9 tokens > max_tokens_per_microbatch=8",
               "item 4 has 9 tokens"),
    "rank cap": ({"max_tokens_per_rank": 8}, 9,
                 "the largest item (9 tokens at rank 1's item 0 (index 4 of the step))", "(9 tokens at index 4)"),
    "budget under context parallelism": (
        {"max_tokens_per_microbatch": 8, "context_parallel": ContextParallel(degrees=(1, 2))}, 90,
        "rank 1's item 0 (item 4 of the step) (90 tokens) fits max_tokens_per_microbatch=8 at no allowed degree",
        "item 4 (90 tokens) fits"),
}


def refused_job(rank, size):
    """Each configuration's refusal of a step whose rank 1 sampled a giant first: (type, message, min_cap, the
    cause's message and min_cap)."""
    refusals = {}
    for name, (options, giant, *_) in OPTIONS.items():
        try:
            PostBalancingDispatcher(**options).plan([3, 4, 5, 2] if rank == 0 else [giant, 1])
        except InfeasibleError as error:
            refusals[name] = (type(error).__name__, str(error), error.min_cap, str(error.__cause__),
                              getattr(error.__cause__, "min_cap", None))
    return refusals


@pytest.fixture(scope="module")
def refusals():
    return spawn(refused_job, 2, timeout_s=90, collective_timeout_s=30)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_regression_an_item_over_the_budget_was_named_by_its_index_in_the_gathered_batch_only(refusals, name):
    """Cause (probe15 P15-06): the balancer names the item by its index in the all-gathered batch ("item 4"); on rank
    1 the culprit is its item 0, and rank 0 has no item 4.  The dispatcher re-raises the same error (type, `min_cap`)
    with the rank and its local index, the balancer's own as `__cause__`; every rank raises the same."""
    _, _, named, original = OPTIONS[name]
    for refused in refusals:
        kind, message, min_cap, cause, cause_min_cap = refused[name]
        assert kind == "InfeasibleError" and named in message and min_cap == cause_min_cap, refused[name]
        assert original in cause and "rank 1" not in cause, cause
    assert refusals[0][name] == refusals[1][name]

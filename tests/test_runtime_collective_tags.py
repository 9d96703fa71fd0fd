"""Two different orchmllm calls paired across ranks by rank-dependent code are named on every rank.

The all-gather that opens each call is one `call_header` (same size, a tag word per call), so any two of them
pair cleanly and every rank raises `ConfigMismatchError` naming both calls; the group stays usable after.
"""

import time

import numpy as np
import pytest
import torch

from orchmllm.runtime import ConfigMismatchError, HierarchicalAllToAll, PostBalancingDispatcher, all_reduce_gradients
from orchmllm.runtime.agreement import CALLS, HEADER_WORDS, call_header, call_tag, mispairing
from orchmllm.runtime.launch import run_processes
from orchmllm.runtime.sampler import BalancedDistributedSampler

COLLECTIVE_TIMEOUT_S = 20


def sampler_epoch(rank, size):
    sampler = BalancedDistributedSampler(list(range(1, 41)), num_replicas=size, rank=rank, global_batch_size=8)
    sampler.set_epoch(0)
    return len(list(sampler))


def plan(rank, size):
    return PostBalancingDispatcher().plan(np.array([3, 4 + rank])).lengths.tolist()


def reduce_gradients(rank, size):
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    all_reduce_gradients(list(model.parameters()), op="sum")
    return model.weight.grad.tolist()


CALLERS = {"sampler": sampler_epoch, "transport": lambda rank, size: HierarchicalAllToAll(2).num_nodes,
           "plan": plan, "gradients": reduce_gradients}
PAIRINGS = [  # (what ranks [0] or [0, 1] do, what the others do), as probe20 P20-13 found them (and one more)
    ("sampler", "transport", 1),  # rank 0 aborted by gloo (SIGABRT), the others a PeerFailureError
    ("plan", "sampler", 1),  # rank 1 aborted, the others a PeerFailureError
    ("gradients", "plan", 2),  # the 64-byte gradient digest beside the metadata header: gloo aborted
]
NAMED = {"sampler": "a BalancedDistributedSampler's epoch agreement (iterating the sampler)",
         "transport": "a HierarchicalAllToAll's construction (its layout all-gather)",
         "plan": "a plan's metadata all-gather (PostBalancingDispatcher.plan, MultiStageRuntime.plan)",
         "gradients": "all_reduce_gradients' digest all-gather (its `check`)"}


def mispaired_job(rank, size):
    """Every pairing in turn, then a plan every rank makes alike (the group is still usable)."""
    seen = []
    for first, others, count in PAIRINGS:
        try:
            CALLERS[first if rank < count else others](rank, size)
            seen.append("no error")
        except ConfigMismatchError as error:
            seen.append(str(error))
    return seen, plan(rank, size)


def test_regression_two_orchmllm_calls_paired_across_ranks_aborted_a_rank_in_gloo():
    """probe20 P20-13: rank-dependent code paired two orchmllm calls' first collectives (a sampler's epoch agreement
    and a HierarchicalAllToAll's layout gather, a plan's metadata header and the sampler's, the gradient digest and
    the metadata header): gathers of other sizes, so gloo aborted a rank (SIGABRT, a C++ trace) and the others got a
    PeerFailureError.  They are one call header now: every rank names both calls, and the group stays usable."""
    started = time.monotonic()
    outcomes = run_processes(mispaired_job, 4, timeout_s=90, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [(o.rank, o.error) for o in outcomes]
    for o in outcomes:
        seen, lengths = o.value
        assert lengths == [3, 4, 3, 5, 3, 6, 3, 7]  # the plan after the mispairings gathered every rank's lengths
        for message, (first, others, count) in zip(seen, PAIRINGS):
            firsts = "rank 0 is" if count == 1 else f"ranks {list(range(count))} are"
            assert message.startswith(f"orchmllm calls paired across ranks (seen from rank {o.rank}): {firsts} in "
                                      f"{NAMED[first]} while ranks {list(range(count, 4))} are in {NAMED[others]}: "
                                      f"every rank of the group must make the same orchmllm calls in the same "
                                      f"order"), (o.rank, message)
    assert time.monotonic() - started < COLLECTIVE_TIMEOUT_S


def test_call_tags_are_distinct_and_unknown_tags_are_shown():
    assert len({call_tag(call) for call in CALLS}) == len(CALLS)
    message = mispairing([call_tag("plan digest"), 7, 7], 2)
    assert message.startswith("orchmllm calls paired across ranks (seen from rank 2): rank 0 is in a plan agreement "
                              "check (check_agreement, a dispatcher's `check_plan`) while ranks [1, 2] are in a "
                              "collective orchmllm does not know (first word 0x7)"), message


def test_a_call_header_refuses_an_unknown_call_or_a_long_payload():
    with pytest.raises(ValueError, match="a call header is one of .* with at most 8 words; got 'sampler' with 9"):
        call_header("sampler", [0] * HEADER_WORDS, None, "test")
    with pytest.raises(ValueError, match="got 'nope' with 1"):
        call_header("nope", [0], None, "test")

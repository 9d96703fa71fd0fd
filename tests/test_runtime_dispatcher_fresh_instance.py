"""A dispatcher rebuilt on one rank (same options) meets its peers' warm ones (probe27 P27-08).

Warm dispatchers send their exchange headers in the payload all-to-all; a dispatcher built since had no schema agreed
and sent its first header in an all-reduce, so every rank waited until the group's timeout.  The metadata all-gather
of `plan` now carries a word of each rank's exchange sites: where they differ, every rank starts its sites afresh.

Real gloo groups of 3 ranks; each rank counts its own collectives (`runtime.counting`)."""

import numpy as np
import torch

from orchmllm.runtime import PostBalancingDispatcher
from orchmllm.runtime.counting import CollectiveCounter
from orchmllm.runtime.launch import spawn

REBUILT_RANK, REBUILT_STEP = 2, 1


def _lengths(rank, step):
    return [4, 4] if rank == 2 else [3 + step, 1 + (step * 2) % 5, 2]


def _rebuilt_job(rank, size):
    """Three steps of plan, dispatch, combine; rank 2 alone builds a new dispatcher at step 1.  Per step: the
    collectives its dispatch and combine ran; every step's moved ids are the plan's items, and home comes back."""
    dispatcher, counts = PostBalancingDispatcher(per_item_keys={"id"}), []
    for step in range(3):
        if rank == REBUILT_RANK and step == REBUILT_STEP:
            dispatcher = PostBalancingDispatcher(per_item_keys={"id"})
        lengths = _lengths(rank, step)
        plan = dispatcher.plan(lengths)
        batch = {"x": torch.arange(sum(lengths), dtype=torch.float32)[:, None] + 100 * rank + 1000 * step,
                 "id": torch.arange(len(lengths)) + 10 * rank}
        counter = CollectiveCounter()
        try:
            moved = dispatcher.dispatch(batch, plan)
            home = dispatcher.combine(dict(moved), plan, differentiable=False, order="local_items")
        finally:
            counter.close()
        firsts = np.cumsum(plan.metadata.counts) - plan.metadata.counts  # global index of each rank's item 0
        sources = plan.metadata.source_ranks[plan.local_items]
        assert moved["id"].tolist() == (plan.local_items - firsts[sources] + 10 * sources).tolist(), step
        assert torch.equal(home["x"], batch["x"]) and torch.equal(home["id"], batch["id"]), step
        counts.append(sum(counter.calls.values()))
    return counts


def test_regression_a_dispatcher_rebuilt_on_one_rank_waited_for_its_peers_until_the_timeout():
    """Cause: rank 2's new dispatcher sent its first header in an all-reduce while ranks 0-1 rode theirs in the
    payload all-to-all: every rank raised PeerFailureError after the collective timeout, naming nothing.  Now the
    step of the rebuild moves its rows on every rank with a header all-reduce at dispatch and at combine (four
    collectives, as the first step), and the next step's headers ride again (two)."""
    counts = spawn(_rebuilt_job, 3, timeout_s=60, collective_timeout_s=5)
    assert counts == [[4, 4, 2]] * 3, counts

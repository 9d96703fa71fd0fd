"""With M free, the fills' grouping (`grouping.group_microbatches`) opens micro-batches past the count it is given
while the items left are over D · T tokens, which no micro-batch holds; with M fixed it groups as before (the last
takes the rest)."""

import dataclasses

import numpy as np
import pytest

from orchmllm import ContextParallel, Topology, balance_microbatches
from orchmllm.balancers.context_parallel import grouping
from orchmllm.balancers.context_parallel.grouping import group_microbatches
from orchmllm.balancers.context_parallel.microbatch_bound import split_bound
from orchmllm.study.models import MODELS

COST = MODELS["84b"].stages()[-1].cost
SPEC = ContextParallel().on(Topology(num_nodes=4, gpus_per_node=8))


def _allgiant(num_ranks: int, per_rank: int, seed: int) -> np.ndarray:
    """The issue 24 probe's allgiant family: 20k-130k tokens, about an eighth of them within T = 32k."""
    return np.random.default_rng(seed).integers(20000, 130000, num_ranks * per_rank).astype(np.int64)


def _tokens(microbatch: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    return np.bincount(microbatch, weights=lengths)


def test_regression_last_micro_batch_took_every_item_within_t():
    """allgiant on 32 ranks x 8, T = 32k, the 95 % fill's 19 micro-batches: the giants' ranks bound the first 18, so
    the last took every item left, 133 % of D · T (no layout; the repair then failed: allgiant D = 512 seed 41 spent
    1.1 s of 1.7 s in two such fills).  M free: 22 micro-batches, none over the room."""
    num_ranks, budget = 32, 32768
    lengths = _allgiant(num_ranks, 8, 11)
    _, fewest, _, items = split_bound(lengths, num_ranks, SPEC, COST, budget, 0.0, None)
    room = int(0.95 * num_ranks * budget)
    count = max(fewest, -(-int(lengths.sum()) // room))
    microbatch = group_microbatches(items, num_ranks, count, room)
    assert count == 19 and int(microbatch.max()) + 1 == 22
    assert _tokens(microbatch, lengths).max() <= room
    fixed = group_microbatches(dataclasses.replace(items, free=False), num_ranks, count, room)
    assert int(fixed.max()) + 1 == count and _tokens(fixed, lengths)[-1] > num_ranks * budget


@pytest.mark.parametrize("seed", [3, 5, 41])
@pytest.mark.parametrize("fill", [0.95, 0.85, 0.5])
@pytest.mark.parametrize("per_rank", [2, 8])
def test_free_grouping_extends_only_past_the_tokens(seed, fill, per_rank, monkeypatch):
    """M free: the same micro-batches as M fixed where those leave the last within D · T tokens before its
    back-fill, else more micro-batches before it, none empty and none over D · T (with and without the back-fill)."""
    num_ranks, budget = 16, 32768
    lengths = _allgiant(num_ranks, per_rank, seed)
    _, fewest, _, items = split_bound(lengths, num_ranks, SPEC, COST, budget, 0.0, None)
    room = int(fill * num_ranks * budget)
    count = max(fewest, -(-int(lengths.sum()) // room))
    groupings = []
    for back_fill in (True, False):
        if not back_fill:
            monkeypatch.setattr(grouping, "_back_fill", lambda *args: None)
        free = group_microbatches(items, num_ranks, count, room)
        fixed = group_microbatches(dataclasses.replace(items, free=False), num_ranks, count, room)
        assert np.array_equal(np.unique(free), np.arange(int(free.max()) + 1))
        assert _tokens(free, lengths).max() <= num_ranks * budget
        groupings.append((free, fixed))
    extended = _tokens(groupings[1][1], lengths)[-1] > num_ranks * budget  # the rest before the back-fill
    assert (int(groupings[1][0].max()) + 1 > count) == extended  # (the back-fill may empty the last)
    assert extended or all(np.array_equal(free, fixed) for free, fixed in groupings)


def test_fixed_count_is_kept():
    """`num_microbatches` given: the plan has exactly that many micro-batches (the grouping opens none past it)."""
    lengths = _allgiant(16, 8, 11)
    plan = balance_microbatches(lengths, 16, max_tokens_per_microbatch=32768, cost=COST, context_parallel=SPEC,
                                num_microbatches=40)
    assert plan.num_microbatches == 40
    assert np.bincount(plan.microbatch, minlength=40).sum() == lengths.size

"""The split planner's repair of a micro-batch without a layout (`context_parallel.repair`): which items it
moves out, and how many plans it asks for."""

from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.context_parallel import repair


def spill(num_over: int, room: int, seed: int = 0):
    """Micro-batch 0 of `num_over` + 1 items over T = 100 (distinct times); it lays out once at most `room` of
    them besides the longest stay.  The items moved to micro-batch 1, and the plans the repair asked for."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(101, 1000, num_over + 1)
    times = rng.permutation(num_over + 1).astype(float)
    keep = int(np.argmax(times))
    calls = []

    def plan_pass(items):
        calls.append(items)
        over = np.count_nonzero((lengths[items] > 100) & (items != keep))
        return SimpleNamespace(loads=np.array([1.0])) if over <= room else None

    microbatch = np.zeros(num_over + 1, dtype=np.int64)
    plan = repair._spill(microbatch, 0, lengths, times, 100, plan_pass)
    return plan, np.flatnonzero(microbatch == 1), times, keep, calls


def test_regression_the_spill_planned_the_micro_batch_once_per_item_it_moved():
    """Regression: the spill moved items out one at a time and planned the micro-batch after each (the `long`
    workload at T = 16k: 3 spills, 395 split layouts, 20 of its 30 profiled seconds); moving more out frees
    blocks, so the fewest is found by doubling and bisection: the same items in O(log n) plans."""
    plan, moved, times, keep, calls = spill(200, 10)
    least = np.argsort(times, kind="stable")[:190]
    assert plan is not None and sorted(moved.tolist()) == sorted(least.tolist()) and keep not in moved
    assert len(calls) <= 20


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 40), st.integers(0, 45), st.integers(0, 10**6))
def test_property_the_spill_moves_the_fewest_items_that_let_it_lay_out(num_over, room, seed):
    """Against the one-at-a-time walk: the fewest least-time items over T (never the longest), or None when
    even all of them leave no layout (no item to move)."""
    plan, moved, times, keep, _ = spill(num_over, room, seed)
    if num_over == 0:
        assert plan is None and moved.size == 0
        return
    needed = max(num_over - room, 1)  # the spill runs where the micro-batch has no layout: one item at least
    least = [item for item in np.argsort(times, kind="stable").tolist() if item != keep][:needed]
    assert plan is not None and sorted(moved.tolist()) == sorted(least)

"""The split planner's repair of a micro-batch without a layout (`context_parallel.repair`): which items it
moves out, and how many plans it asks for; the certificate that no layout exists (`dual_feasible`), which
answers many of its probes without the planner."""

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import ContextParallel, CostModel
from orchmllm.balancers.context_parallel import microbatch, repair
from orchmllm.balancers.context_parallel.dual_feasible import cannot_lay_out
from orchmllm.testing.context_parallel import brute_force_split


def over_items(num_over: int, seed: int) -> tuple:
    """(lengths, times, the longest's index) of `num_over` + 1 items over T = 100, with distinct times."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(101, 1000, num_over + 1)
    times = rng.permutation(num_over + 1).astype(float)
    return lengths, times, int(np.argmax(times))


def spill(num_over: int, room: int, seed: int = 0):
    """Micro-batch 0 of `num_over` + 1 items over T = 100 (distinct times); it lays out once at most `room` of
    them besides the longest stay.  The items moved to micro-batch 1, and the plans the repair asked for."""
    lengths, times, keep = over_items(num_over, seed)
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


@st.composite
def crowded_ranks(draw):
    """(lengths, D, degrees, T): 1-4 items (1-3 on 8 ranks) up to the widest degree's T tokens a rank."""
    num_ranks = draw(st.sampled_from([2, 4, 8]))
    degrees = [1] + [c for c in (2, 4, 8) if c <= num_ranks and draw(st.booleans())]
    budget = draw(st.integers(4, 20))
    lengths = draw(st.lists(st.integers(1, degrees[-1] * budget), min_size=1, max_size=3 if num_ranks == 8 else 4))
    return np.array(lengths), num_ranks, np.array(degrees), budget


@settings(max_examples=300, deadline=None)
@given(case=crowded_ranks())
def test_property_no_layout_is_certified_only_where_brute_force_finds_none(case):
    lengths, num_ranks, degrees, budget = case
    if cannot_lay_out(lengths, num_ranks, degrees, budget):
        spec = ContextParallel(degrees=degrees.tolist(), gpus_per_node=8)
        assert brute_force_split(lengths, num_ranks, spec, max_tokens_per_rank=budget).makespan is None


@pytest.mark.parametrize("lengths, num_ranks, degrees, budget", [
    ([8, 7, 4], 2, [1], 10),  # 19 <= 20 tokens, but no two of them share a rank
    ([60, 40, 30], 8, [1, 4], 17),  # 130 <= 136 tokens: the shards of 60 and 40 at degree 4 (15, 10) share none
])
def test_no_layout_is_certified_where_the_tokens_fit_in_sum(lengths, num_ranks, degrees, budget):
    lengths = np.array(lengths)
    assert lengths.sum() <= num_ranks * budget and cannot_lay_out(lengths, num_ranks, np.array(degrees), budget)
    spec = ContextParallel(degrees=degrees, gpus_per_node=8)
    assert brute_force_split(lengths, num_ranks, spec, max_tokens_per_rank=budget).makespan is None


def test_a_pass_without_layout_is_not_planned_where_it_is_certified(monkeypatch):
    """The long workload at T = 16k spent a third of its passes on micro-batches without layout (spill probes
    above all: 320 items of 64-128k tokens at degree 8 hold every rank, the room beside them too little for
    the 16-32k ones); where the certificate proves it, the split planner is not run."""
    def planner(*args, **kwargs):
        raise AssertionError("the split planner ran on items the certificate rules out")

    lengths = np.array([6400, 6400, 1800])  # 14.6k <= 16 x 1000 tokens; shards of 800 leave 200 beside, 1800 needs 225
    assert microbatch._plan_pass(lengths, np.arange(3), 16, ContextParallel(), CostModel(), 1000) is None
    monkeypatch.setattr(microbatch, "balance_split", planner)
    assert microbatch._plan_pass(lengths, np.arange(3), 16, ContextParallel(), CostModel(), 1000) is None
    with pytest.raises(AssertionError, match="the split planner ran"):  # [6400, 6400] lays out: planned
        microbatch._plan_pass(lengths, np.arange(2), 16, ContextParallel(), CostModel(), 1000)

"""The reimplemented peers' micro-batching: the plan invariants and each peer's own rules."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmllm import CostModel, balance_microbatches
from orchmllm.study.microbatch_peers import MICROBATCH_PEERS, run_microbatch_peer
from orchmllm.study.peers import verl_workload
from orchmllm.testing import check_microbatch_plan

PEER_NAMES = sorted(MICROBATCH_PEERS)

instances = st.tuples(st.lists(st.integers(1, 3000), min_size=1, max_size=80), st.integers(1, 6),
                      st.integers(3000, 9000))


@pytest.mark.parametrize("name", PEER_NAMES)
@given(case=instances)
def test_peer_plans_are_valid_and_certified_on_the_common_bound(name, case):
    lengths, num_ranks, budget = case
    plan = MICROBATCH_PEERS[name](lengths, num_ranks, max_tokens_per_microbatch=budget, cost=CostModel(quadratic=1e-4))
    assert plan.algorithm == f"peer:{name}"
    check_microbatch_plan(plan, lengths, num_ranks, budget, cost=CostModel(quadratic=1e-4))
    assert plan.cell_tokens.sum() == sum(lengths)
    ours = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget, cost=CostModel(quadratic=1e-4))
    assert ours.lower_bound == pytest.approx(plan.lower_bound, rel=1e-12)  # one footing: the bound over every M


def test_naive_fill_keeps_every_sample_on_its_rank_in_sampling_order():
    lengths = [5, 4, 3, 6, 2, 7, 1, 1]
    sources = [0, 0, 0, 0, 1, 1, 1, 1]
    plan = run_microbatch_peer("none", lengths, 2, max_tokens_per_microbatch=8, sources=sources)
    assert plan.rank.tolist() == sources
    assert plan.microbatch.tolist() == [0, 1, 1, 2, 0, 1, 1, 2]  # next fit: 5 | 4+3 | 6 and 2 | 7+1 | 1
    assert plan.num_microbatches == 3


def test_verl_balances_equal_counts_then_orders_microbatches_small_at_both_ends():
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 4000, 64)
    plan = run_microbatch_peer("verl_dynamic_bsz", lengths, 4, max_tokens_per_microbatch=4096)
    assert np.bincount(plan.rank, minlength=4).tolist() == [16] * 4  # equal counts: 4 divides 64
    tokens = np.bincount(plan.rank, weights=lengths, minlength=4)
    assert plan.num_microbatches >= int(np.ceil(tokens.max() / 4096))
    workload = verl_workload(lengths)
    for rank in range(4):
        sums = np.array([workload[plan.items_of(rank, m)].sum() for m in range(plan.num_microbatches)])
        peak = int(np.argmax(sums))
        assert np.all(np.diff(sums[:peak + 1]) >= 0) and np.all(np.diff(sums[peak:]) <= 0)


def test_megatron_closes_a_group_once_within_five_percent():
    lengths = np.random.default_rng(1).integers(100, 2000, 120)
    plan = run_microbatch_peer("megatron_hybrid", lengths, 4, max_tokens_per_microbatch=10**6)
    squares = lengths.astype(float) ** 2
    for m in range(plan.num_microbatches - 1):  # the budget never binds: only the 5 % rule closes a group
        loads = np.array([squares[plan.items_of(r, m)].sum() for r in range(4)])
        assert loads.min() > 0 and loads.max() - loads.min() <= 0.05 * loads.max()


def test_sorted_grid_orders_rows_by_sum_of_squares():
    lengths = np.random.default_rng(2).integers(100, 3000, 50)
    plan = run_microbatch_peer("sorted_grid", lengths, 3, max_tokens_per_microbatch=6000)
    squares = np.array([[float((lengths[plan.items_of(r, m)].astype(float) ** 2).sum()) for r in range(3)]
                        for m in range(plan.num_microbatches)]).ravel()
    assert np.all(np.diff(squares) <= 0)


def test_unknown_peer_is_rejected():
    with pytest.raises(ValueError, match="unknown micro-batch peer 'nope'"):
        run_microbatch_peer("nope", [1], 1, max_tokens_per_microbatch=4)

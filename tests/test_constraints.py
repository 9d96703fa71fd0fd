"""balance()'s constraints, each checked exactly against brute force on tiny instances.

`costs=` (explicit per-item costs), `equal_counts=True` (floor / ceil(n / D) items per
rank) and `groups=` (keep-together groups).  Costs are integers, so every float sum is
exact and makespans compare with ==.
"""

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers import CostModel, InfeasibleError, Status, algorithms, balance, make_problem
from orchmllm.balancers.bounds import lower_bound
from orchmllm.testing import brute_force, check_plan

COSTS = [CostModel(), CostModel(per_item=3, linear=1, quadratic=1)]
EQUAL_COUNT_UNPADDED = [record.name for record in algorithms(padded=False) if record.equal_counts is not None]
EQUAL_COUNT_PADDED = [record.name for record in algorithms(padded=True) if record.equal_counts is not None]
UNPADDED = [record.name for record in algorithms(padded=False)]
EXACT = {record.name for record in algorithms() if record.exact}


def check_against_the_oracle(plan_or_error, optimum, exact: bool, retry, lengths, num_ranks, **options):
    """The shared verdict: infeasibility agreed, the plan certified by `check_plan` (constraints held,
    bound <= optimum <= makespan, claims proven), and an exact algorithm's plan optimal."""
    if not optimum.feasible:
        assert isinstance(plan_or_error, InfeasibleError)
        return
    if isinstance(plan_or_error, InfeasibleError):  # a heuristic may give up, naming a cap it meets
        assert not exact
        assert int(retry(plan_or_error.min_cap).tokens.max()) <= plan_or_error.min_cap
        return
    plan = plan_or_error
    check_plan(plan, lengths, num_ranks, optimum=optimum, **options)
    if exact:
        assert plan.makespan == optimum.makespan


def attempt(call):
    try:
        return call()
    except InfeasibleError as error:
        return error


tiny = dict(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=7), num_ranks=st.integers(1, 3))


@settings(max_examples=500)
@given(**tiny, cost=st.sampled_from(COSTS), padded=st.booleans(), cap_slack=st.sampled_from([None, 0, 2, 6]),
       data=st.data())
def test_equal_counts_agree_with_brute_force(lengths, num_ranks, cost, padded, cap_slack, data):
    algorithm = data.draw(st.sampled_from(EQUAL_COUNT_PADDED if padded else EQUAL_COUNT_UNPADDED))
    cap = None if cap_slack is None else max(1, max(lengths) + cap_slack)
    if cap is not None and algorithm == "identity":
        cap = None  # the baseline does not balance: only its counts are at stake

    def run(max_tokens_per_rank):
        return balance(lengths, num_ranks, cost=cost, padded=padded, equal_counts=True, algorithm=algorithm,
                       max_tokens_per_rank=max_tokens_per_rank)

    options = dict(cost=cost, padded=padded, max_tokens_per_rank=cap, equal_counts=True)
    optimum = brute_force(lengths, num_ranks, **options)
    outcome = attempt(lambda: run(cap))
    if optimum.feasible:
        problem = make_problem(lengths, num_ranks, cost=cost, padded=padded, equal_counts=True)
        assert lower_bound(problem) <= optimum.makespan
    check_against_the_oracle(outcome, optimum, padded and algorithm != "identity", run, lengths, num_ranks, **options)


@settings(max_examples=500)
@given(**tiny, data=st.data(), cap_slack=st.sampled_from([None, 0, 5]))
def test_explicit_costs_agree_with_brute_force(lengths, num_ranks, data, cap_slack):
    costs = data.draw(st.lists(st.integers(0, 30), min_size=len(lengths), max_size=len(lengths)))
    algorithm = data.draw(st.sampled_from(UNPADDED))
    cap = None if cap_slack is None or algorithm == "identity" else max(1, max(lengths) + cap_slack)

    def run(max_tokens_per_rank):
        return balance(lengths, num_ranks, costs=costs, algorithm=algorithm, max_tokens_per_rank=max_tokens_per_rank,
                       time_limit=20 if algorithm in EXACT else None)

    outcome = attempt(lambda: run(cap))
    if not isinstance(outcome, InfeasibleError):
        assert outcome.cost is None
    options = dict(costs=costs, max_tokens_per_rank=cap)
    optimum = brute_force(lengths, num_ranks, **options)
    check_against_the_oracle(outcome, optimum, algorithm in EXACT, run, lengths, num_ranks, **options)


@settings(max_examples=500)
@given(**tiny, cost=st.sampled_from(COSTS), data=st.data(), cap_slack=st.sampled_from([None, 0, 5]))
def test_groups_agree_with_brute_force(lengths, num_ranks, cost, data, cap_slack):
    groups = data.draw(st.lists(st.integers(0, 3), min_size=len(lengths), max_size=len(lengths)))
    algorithm = data.draw(st.sampled_from(UNPADDED))
    cap = None if cap_slack is None or algorithm == "identity" else max(1, max(lengths) + cap_slack)

    def run(max_tokens_per_rank):
        return balance(lengths, num_ranks, cost=cost, groups=groups, algorithm=algorithm,
                       max_tokens_per_rank=max_tokens_per_rank, time_limit=20 if algorithm in EXACT else None)

    options = dict(cost=cost, max_tokens_per_rank=cap, groups=groups)
    optimum = brute_force(lengths, num_ranks, **options)
    outcome = attempt(lambda: run(cap))
    check_against_the_oracle(outcome, optimum, algorithm in EXACT, run, lengths, num_ranks, **options)


def test_equal_counts_deal_floor_and_ceil_items_and_are_bit_deterministic():
    lengths = np.random.default_rng(3).integers(1, 4000, 1003)
    plans = [balance(lengths, 16, equal_counts=True) for _ in range(2)]
    assert plans[0].digest() == plans[1].digest()
    assert sorted(set(np.bincount(plans[0].assignment, minlength=16).tolist())) == [62, 63]
    assert plans[0].gap < 1e-3


def test_equal_counts_bound_sees_the_small_items_a_heavy_rank_must_take():
    # 4 items on 2 ranks, 2 each: the rank with 10 also takes at least the 1, so 11 > total / D = 6.5.
    plan = balance([10, 1, 1, 1], 2, equal_counts=True)
    assert plan.lower_bound == 11.0 and plan.makespan == 11.0 and plan.status is Status.OPTIMAL


def test_groups_keep_a_prompts_responses_together():
    plan = balance([5, 5, 5, 1, 1, 1, 4, 4], 2, groups=["a", "a", "a", "b", "b", "b", "c", "c"])
    assert plan.assignment.tolist() == [0, 0, 0, 1, 1, 1, 1, 1] and plan.makespan == 15.0


@pytest.mark.parametrize("options, error, match", [
    (dict(costs=[1, 2, 3], padded=True), ValueError, r"`costs` cannot be combined with `padded=True`"),
    (dict(costs=[1, 2, 3], cost=CostModel()), ValueError, r"pass `cost` .* or `costs` .*, not both"),
    (dict(costs=[1, 2]), ValueError, r"`costs` must hold one cost per item, shape \(3,\); got shape \(2,\)"),
    (dict(costs=[1, -2, 3]), ValueError, r"`costs` must be finite and non-negative; got -2.0 at index 1"),
    (dict(costs=[1, float("nan"), 3]), ValueError, r"`costs` must be finite and non-negative; got nan at index 1"),
    (dict(costs=[1, float("inf"), 3]), ValueError, r"`costs` gives item 1 \(length 2\) the cost inf"),
    (dict(costs=["a", "b", "c"]), TypeError, r"`costs` must hold real numbers"),
    (dict(groups=[0, 0, 1], padded=True), ValueError, r"`groups` cannot be combined with `padded=True`"),
    (dict(groups=[0, 0, 1], equal_counts=True), ValueError, r"`groups` cannot be combined with `equal_counts=True`"),
    (dict(groups=[0, 0, 1], sources=[0, 1, 0]), ValueError, r"`groups` cannot be combined with `sources`"),
    (dict(groups=[0, 1]), ValueError, r"`groups` must hold one group id per item, shape \(3,\); got shape \(2,\)"),
    (dict(groups=[0.5, 1, 1]), TypeError, r"`groups` must hold integer or str group ids; got dtype float64"),
    (dict(groups=["1", 1, "1"]), TypeError, r"`groups` must hold group ids of one kind, all ints or all strs; got "
                                            r"int, str \(an id printed alike in two kinds"),
    (dict(groups=[True, 1, 0]), TypeError, r"`groups` must hold group ids of one kind, .*; got bool, int"),
    (dict(groups=collections.deque(["1", 1, "1"])), TypeError, r"`groups` must hold group ids of one kind, all ints "
                                                               r"or all strs; got int, str"),
    (dict(equal_counts=True, sources=[0, 1, 0]), ValueError, r"`equal_counts=True` cannot be combined with `sources`"),
    (dict(equal_counts=True, algorithm="multifit"), ValueError,
     r"algorithm 'multifit' does not support `equal_counts=True`; choose one of \['identity', 'lpt', 'ilp', 'exact', "
     r"'karmarkar_karp', 'auto'\]"),
    (dict(equal_counts="yes"), TypeError, r"`equal_counts` must be a bool; got str"),
], ids=["costs-padded", "cost-and-costs", "costs-shape", "costs-negative", "costs-nan", "costs-inf", "costs-str",
        "groups-padded", "groups-equal-counts", "groups-sources", "groups-shape", "groups-float",
        "groups-str-and-int (probe18 P18-07: merged into one group before)", "groups-bool-and-int",
        "groups-deque-str-and-int (probe19 P19-01: merged into one group before)", "equal-sources",
        "equal-multifit", "equal-not-bool"])
def test_rejected_constraint_combinations_say_why(options, error, match):
    with pytest.raises(error, match=match):
        balance([1, 2, 3], 2, **options)


def test_group_over_the_cap_names_its_items():
    with pytest.raises(InfeasibleError, match=r"below the 9 tokens of the group of items \[0, 2\]") as info:
        balance([4, 3, 5], 2, groups=[7, 8, 7], max_tokens_per_rank=8)
    assert info.value.min_cap == 9

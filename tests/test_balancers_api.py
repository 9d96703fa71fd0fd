"""Every registered algorithm through `balance()`: certified permutations, caps, determinism, bad input.

Parametrized over the registry's records as they stand at collection (the peers' included,
and any installed plugin's), each case only where its record says it applies, so a newly
registered kernel is held to the same invariants without editing this file.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import orchmllm.study.peers  # noqa: F401  (registers the peers' records)
from orchmllm.balancers import (ALGORITHMS, CostModel, InfeasibleError, Kind, Status, algorithms, balance,
                                make_problem)
from orchmllm.balancers.bounds import lower_bound
from orchmllm.balancers.context_parallel import ContextParallel
from orchmllm.testing import brute_force_of, check_plan

RECORDS = algorithms()
NAMES = [record.name for record in RECORDS]
PADDINGS = [(record.name, padded) for record in RECORDS for padded in (False, True) if record.solves(padded)]
PADDING_IDS = [f"{name}-{'padded' if padded else 'unpadded'}" for name, padded in PADDINGS]
UNPADDED = [record.name for record in RECORDS if record.unpadded]
COSTS = {"linear": CostModel(), "quadratic": CostModel(per_item=3, linear=1, quadratic=0.5)}
TIME_LIMIT = 20.0  # generous: tiny instances are proven long before it, so no wall-clock cut


def solve(name, lengths, num_ranks, *, padded=False, cap=None, cost=None):
    return balance(lengths, num_ranks, algorithm=name, padded=padded, cost=cost,
                   max_tokens_per_rank=cap, time_limit=TIME_LIMIT)


small_lengths = st.lists(st.integers(0, 9), min_size=1, max_size=7)


@pytest.mark.parametrize("cost", list(COSTS.values()), ids=list(COSTS))
@pytest.mark.parametrize("name, padded", PADDINGS, ids=PADDING_IDS)
@settings(max_examples=15)
@given(lengths=small_lengths, num_ranks=st.integers(1, 3), cap_slack=st.none() | st.integers(0, 12))
def test_plan_is_a_certified_permutation_and_optimal_only_when_proven(name, padded, cost, lengths,
                                                                       num_ranks, cap_slack):
    cap = None if cap_slack is None else max(1, max(lengths)) + cap_slack
    try:
        problem = make_problem(lengths, num_ranks, cost=cost, padded=padded, max_tokens_per_rank=cap)
    except InfeasibleError:
        return  # the cap is below a necessary bound: rejected before any kernel runs
    optimum = brute_force_of(problem)
    try:
        plan = solve(name, lengths, num_ranks, padded=padded, cap=cap, cost=cost)
    except InfeasibleError as error:
        assert error.min_cap > cap and f"max_tokens_per_rank={cap}" in str(error)
        return
    assert optimum.feasible, "a plan was returned for a cap no plan can meet"
    # certified, makespan >= optimum >= bound, and equal when the plan claims optimality
    check_plan(plan, lengths, num_ranks, cost=cost, padded=padded, max_tokens_per_rank=cap, optimum=optimum)
    assert plan.lower_bound >= min(lower_bound(problem), plan.makespan)


@pytest.mark.parametrize("name, padded", PADDINGS, ids=PADDING_IDS)
def test_same_metadata_gives_a_bit_identical_plan(name, padded):
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 40, 14)
    first = solve(name, lengths, 3, padded=padded)
    second = solve(name, lengths.tolist(), 3, padded=padded)
    third = solve(name, lengths.astype(np.int32), 3, padded=padded)
    assert first.digest() == second.digest() == third.digest()
    np.testing.assert_array_equal(first.loads, second.loads)


@pytest.mark.parametrize("name", UNPADDED)
def test_permuting_the_input_keeps_a_proven_optimum(name):
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 30, 9)
    plan = solve(name, lengths, 3)
    shuffled = solve(name, lengths[rng.permutation(lengths.size)], 3)
    assert shuffled.makespan >= lower_bound(make_problem(lengths, 3))
    if plan.status is Status.OPTIMAL and shuffled.status is Status.OPTIMAL:
        assert plan.makespan == shuffled.makespan


@pytest.mark.parametrize("name", UNPADDED)
def test_scaling_lengths_scales_a_proven_optimum(name):
    lengths = np.array([7, 5, 5, 4, 3, 3, 2, 1])
    plan = solve(name, lengths, 3)
    scaled = solve(name, 10 * lengths, 3)
    assert scaled.lower_bound == pytest.approx(10 * plan.lower_bound)
    if plan.status is Status.OPTIMAL and scaled.status is Status.OPTIMAL:
        assert scaled.makespan == 10 * plan.makespan


@pytest.mark.parametrize("name, padded", PADDINGS, ids=PADDING_IDS)
def test_another_rank_never_raises_a_proven_optimum(name, padded):
    lengths = np.array([9, 7, 6, 5, 5, 3, 2, 2, 1])
    fewer = solve(name, lengths, 3, padded=padded)
    more = solve(name, lengths, 4, padded=padded)
    assert more.lower_bound <= fewer.lower_bound
    if fewer.status is Status.OPTIMAL and more.status is Status.OPTIMAL:
        assert more.makespan <= fewer.makespan


@pytest.mark.parametrize("record", [record for record in RECORDS if record.kind is not Kind.PEER], ids=lambda r: r.name)
def test_ranks_may_outnumber_items_and_stay_empty(record):
    """Ours and the baseline leave the surplus ranks empty at the optimum (peers pack by their own rules)."""
    plan = solve(record.name, [5, 0, 3], 6, padded=not record.unpadded)
    assert plan.num_items == 3 and plan.makespan == 5.0 and plan.status is Status.OPTIMAL
    assert (plan.loads == 0).sum() >= 4


BAD_INPUT = [
    (dict(lengths=[3, -1, 2]), ValueError, r"`lengths` must be non-negative integers; got -1 at index 1"),
    (dict(lengths=[3.0, float("nan")]), ValueError, r"`lengths` must be finite; got nan at index 1"),
    (dict(lengths=[float("inf"), 1.0]), ValueError, r"`lengths` must be finite; got inf at index 0"),
    (dict(lengths=[1.5, 2.0]), ValueError, r"`lengths` must be non-negative integers; got 1.5 at index 0"),
    (dict(lengths=[]), ValueError, r"`lengths` must not be empty"),
    (dict(lengths=[[1, 2], [3, 4]]), ValueError, r"`lengths` must be 1-D; got shape \(2, 2\)"),
    (dict(lengths="123"), TypeError, r"`lengths` must be a 1-D sequence of integers"),
    (dict(lengths=[True, False]), TypeError, r"`lengths` must hold integers, not booleans"),
    (dict(num_ranks=0), ValueError, r"`num_ranks` must be >= 1; got 0"),
    (dict(num_ranks=-2), ValueError, r"`num_ranks` must be >= 1; got -2"),
    (dict(num_ranks=2.0), TypeError, r"`num_ranks` must be an int; got float"),
    (dict(num_ranks=True), TypeError, r"`num_ranks` must be an int; got bool"),
    (dict(max_tokens_per_rank=4), InfeasibleError, r"below the largest item \(9 tokens at index 1\)"),
    (dict(max_tokens_per_rank=0), ValueError, r"`max_tokens_per_rank` must be >= 1; got 0"),
    (dict(max_tokens_per_rank=9.5), TypeError, r"`max_tokens_per_rank` must be an int or None; got float"),
    (dict(cost="linear"), TypeError, r"`cost` must be a CostModel or None; got str"),
    (dict(padded="yes"), TypeError, r"`padded` must be a bool; got str"),
    (dict(time_limit=-1), ValueError, r"`time_limit` must be a positive finite number of seconds; got -1"),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("override, error, message", BAD_INPUT,
                         ids=[f"{next(iter(o))}={next(iter(o.values()))!r}" for o, _, _ in BAD_INPUT])
def test_bad_input_is_rejected_with_a_message_naming_it(name, override, error, message):
    arguments = dict(lengths=[2, 9, 4], num_ranks=2, algorithm=name)
    arguments.update(override)
    with pytest.raises(error, match=message):
        balance(arguments.pop("lengths"), arguments.pop("num_ranks"), **arguments)


@pytest.mark.parametrize("algorithm, error, message", [
    ("best", ValueError, r"unknown `algorithm` 'best'; choose one of \["),
    ("LPT", ValueError, r"unknown `algorithm` 'LPT'"),
    (3, TypeError, r"`algorithm` must be a str; got int"),
])
def test_unknown_algorithm_is_rejected(algorithm, error, message):
    with pytest.raises(error, match=message):
        balance([1, 2, 3], 2, algorithm=algorithm)


def test_registry_holds_the_issue_algorithms():
    assert {"identity", "lpt", "karmarkar_karp", "padded", "ilp", "auto"} <= set(ALGORITHMS)


@pytest.mark.parametrize("record", [record for record in RECORDS if not (record.padded and record.unpadded)],
                         ids=lambda r: r.name)
def test_an_algorithm_asked_the_other_kind_of_problem_says_what_it_solves(record):
    with pytest.raises(ValueError,
                       match=rf"algorithm {record.name!r} solves the (un)?padded cost .* only; pass padded="):
        balance([3, 2, 1], 2, algorithm=record.name, padded=not record.padded)


def test_the_records_say_what_each_algorithm_is():
    by_name = {record.name: record for record in RECORDS}
    assert by_name["padded"].exact and not by_name["padded"].unpadded and by_name["ilp"].exact
    assert by_name["identity"].kind is Kind.BASELINE and not by_name["identity"].default
    assert {name for name, record in by_name.items() if record.kind is Kind.PEER} >= {"verl_kk", "omnibal_2d"}
    assert all(record.description for record in RECORDS)
    assert ALGORITHMS["lpt"] is by_name["lpt"] and set(NAMES) <= set(ALGORITHMS)


def test_algorithms_view_is_read_only_and_points_to_register_algorithm():
    with pytest.raises(TypeError, match="read-only; add a kernel with orchmllm.register_algorithm"):
        ALGORITHMS["mine"] = lambda problem: None
    assert "mine" not in ALGORITHMS and 3 not in ALGORITHMS


def test_karmarkar_karp_on_one_rank_checks_the_padded_cap():
    """Regression: the one-rank shortcut skipped the cap, and make_plan raised RuntimeError."""
    with pytest.raises(InfeasibleError, match="max_tokens_per_rank=1"):
        balance([0, 1], 1, padded=True, algorithm="karmarkar_karp", max_tokens_per_rank=1)


@pytest.mark.parametrize("rank, error, match", [(5, ValueError, r"`rank` must be in \[0, num_ranks=2\); got 5"),
                                                (-1, ValueError, r"`rank` must be in \[0, num_ranks=2\)"),
                                                (True, TypeError, "`rank` must be an int"),
                                                ("0", TypeError, "`rank` must be an int")])
def test_items_of_takes_a_rank_in_range_only(rank, error, match):
    """Out-of-range ranks gave an empty list and True gave rank 1's items."""
    plan = balance([5, 4, 3], 2)
    assert sorted(plan.items_of(0).tolist() + plan.items_of(np.int64(1)).tolist()) == [0, 1, 2]
    with pytest.raises(error, match=match):
        plan.items_of(rank)


@pytest.mark.parametrize("options", [{}, {"context_parallel": ContextParallel(degrees=(1, 2))}], ids=["plain", "split"])
@pytest.mark.parametrize("slack, error", [(float("nan"), ValueError), (-1.0, ValueError), ("small", TypeError)])
def test_regression_makespan_slack_went_unchecked_without_sources(options, slack, error):
    """Cause (fix24d F24-07): `makespan_slack` was checked only with `sources` (where locality reads it), so
    `balance(..., makespan_slack=nan)` or "small" planned without a word, while `item_bytes` or `topology` without
    `sources` are refused: a bad value of an argument is refused whether or not the plan reads it."""
    with pytest.raises(error, match=r"`makespan_slack` must be"):
        balance([5, 4, 3, 3, 2], 2, makespan_slack=slack, **options)


@pytest.mark.parametrize("rank_of_group", [[1.0, 0.0], [True, False], np.array([1, 0], dtype=object)],
                         ids=["floats", "bools", "objects"])
def test_regression_on_ranks_indexed_with_a_permutation_that_is_not_of_ints(rank_of_group):
    """Cause (fix24d F24-09): `BalancePlan.on_ranks` checked the values of `rank_of_group`, not their type, and then
    indexed with them: floats or objects gave numpy's "arrays used as indices must be of integer (or boolean) type",
    bools its "boolean array indexing assignment cannot assign 2 input values"."""
    with pytest.raises(ValueError, match=r"`rank_of_group` must be a permutation of the 2 ranks; got .* \(dtype "
                                         r"(float64|bool|object): ranks are ints\)"):
        balance([5, 4, 3, 3], 2).on_ranks(rank_of_group)


@pytest.mark.parametrize("argument", ["lengths", "costs"])
def test_regression_a_masked_array_s_masked_entries_were_planned_as_values(argument):
    """Cause (fix24d F24-10): `np.asarray` reads a masked array's data, masked entries too, so
    `balance(np.ma.masked_array([5, 4, 3], mask=[0, 1, 0]), 2)` planned the masked 4 (makespan 7) without a word.
    Whether a masked entry is an item to drop or a value to fill is the caller's to say."""
    masked = np.ma.masked_array([5, 4, 3], mask=[False, True, False])
    options = {"lengths": masked} if argument == "lengths" else {"lengths": [5, 4, 3], "costs": masked}
    with pytest.raises(TypeError, match=rf"`{argument}` is a masked array with 1 masked entry, which would be read as "
                                        rf"values; pass `{argument}.compressed\(\)` \(without them\) or "
                                        rf"`{argument}.filled\(value\)`"):
        balance(num_ranks=2, **options)
    assert balance(np.ma.masked_array([5, 4, 3]), 2).makespan == 7  # nothing masked: the values as they are

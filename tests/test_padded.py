"""The padded balancer is exact: checked against a DP over sorted runs and a brute force
over all assignments (which also checks the sorted-runs structure itself)."""

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers import CostModel, InfeasibleError, Status, balance, make_problem
from orchmllm.balancers.kernels import padded
from orchmllm.balancers.plan import make_plan
from orchmllm.testing import brute_force, check_plan, padded_optimum

COSTS = {
    "tokens": CostModel(),
    "affine": CostModel(per_item=3, linear=2),
    "quadratic": CostModel(linear=1, quadratic=0.37),  # non-integer costs: exact float arithmetic
    "per_item_only": CostModel(per_item=1, linear=0),
}

costs = st.sampled_from(sorted(COSTS)).map(COSTS.__getitem__)


def padded_problem(lengths, num_ranks, cost, cap=None):
    return make_problem(lengths, num_ranks, cost=cost, padded=True, max_tokens_per_rank=cap)


def certified_makespan(problem, result, optimum=None):
    """The kernel's makespan, once `check_plan` certifies its plan (against `optimum` when given) and
    the kernel proved it optimal."""
    plan = make_plan(problem, result.assignment, result.status, "padded", kernel_bound=result.lower_bound)
    check_plan(plan, problem.lengths, problem.num_ranks, cost=problem.cost, padded=True,
               max_tokens_per_rank=problem.max_tokens_per_rank, optimum=optimum)
    assert result.status is Status.OPTIMAL and result.lower_bound == plan.makespan
    return plan.makespan


ORACLES = {  # the oracle (lengths, num_ranks, cost=, max_tokens_per_rank=) -> Optimum, and the inputs it checks
    "brute force": (functools.partial(brute_force, padded=True),
                    st.tuples(st.lists(st.integers(0, 6), min_size=1, max_size=6), st.integers(1, 3), costs,
                              st.none() | st.integers(1, 16))),
    "dp over sorted runs": (padded_optimum,
                            st.tuples(st.lists(st.integers(1, 40), min_size=1, max_size=24), st.integers(1, 6), costs,
                                      st.none() | st.integers(40, 200))),
}


@pytest.mark.parametrize("oracle", list(ORACLES))
@settings(max_examples=80)
@given(data=st.data())
def test_matches_the_oracle_including_infeasibility(oracle, data):
    """The kernel refuses, naming the smallest cap that works, exactly where the oracle finds no plan,
    and otherwise certifies the oracle's optimum."""
    optimum_of, inputs = ORACLES[oracle]
    lengths, num_ranks, cost, cap = data.draw(inputs)
    try:
        problem = padded_problem(lengths, num_ranks, cost, cap)
    except InfeasibleError:  # the contract's necessary bounds must only reject hopeless caps
        assert not optimum_of(lengths, num_ranks, cost=cost, max_tokens_per_rank=cap).feasible
        return
    optimum = optimum_of(lengths, num_ranks, cost=cost, max_tokens_per_rank=cap)
    if not optimum.feasible:
        with pytest.raises(InfeasibleError, match="smallest cap that works"):
            padded.solve(problem)
    else:
        assert certified_makespan(problem, padded.solve(problem), optimum) == optimum.makespan


@settings(max_examples=40)
@given(lengths=st.lists(st.integers(0, 5), min_size=1, max_size=6), num_ranks=st.integers(1, 3))
def test_min_cap_matches_brute_force(lengths, num_ranks):
    needed = brute_force(lengths, num_ranks, padded=True).min_cap
    assert padded.min_cap(lengths, num_ranks) == needed


@settings(max_examples=40)
@given(lengths=st.lists(st.integers(2, 9), min_size=2, max_size=20), num_ranks=st.integers(1, 5))
def test_infeasible_error_names_the_smallest_cap(lengths, num_ranks):
    needed = padded.min_cap(lengths, num_ranks)
    problem = padded_problem(lengths, num_ranks, CostModel(), needed)
    certified_makespan(problem, padded.solve(problem))
    try:
        tight = padded_problem(lengths, num_ranks, CostModel(), needed - 1)
    except InfeasibleError as error:  # the contract's own necessary bounds caught it first
        assert error.min_cap <= needed
        return
    with pytest.raises(InfeasibleError, match=f"smallest cap that works is {needed}") as caught:
        padded.solve(tight)
    assert caught.value.min_cap == needed


@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=40), num_ranks=st.integers(1, 8),
       cost=costs, seed=st.integers(0, 2**32 - 1))
def test_permuting_the_input_keeps_the_optimum(lengths, num_ranks, cost, seed):
    permuted = np.random.default_rng(seed).permutation(lengths)
    first = balance(lengths, num_ranks, cost=cost, padded=True, algorithm="padded")
    second = balance(permuted, num_ranks, cost=cost, padded=True, algorithm="padded")
    assert first.makespan == second.makespan


@given(lengths=st.lists(st.integers(1, 50), min_size=1, max_size=40), num_ranks=st.integers(1, 8), cost=costs)
def test_more_ranks_never_worse(lengths, num_ranks, cost):
    fewer = balance(lengths, num_ranks, cost=cost, padded=True, algorithm="padded")
    more = balance(lengths, num_ranks + 1, cost=cost, padded=True, algorithm="padded")
    assert more.makespan <= fewer.makespan


@given(lengths=st.lists(st.integers(0, 50), min_size=1, max_size=40), num_ranks=st.integers(1, 8),
       scale=st.integers(2, 7))
def test_scaling_lengths_scales_the_optimum(lengths, num_ranks, scale):
    base = balance(lengths, num_ranks, padded=True, algorithm="padded")
    scaled = balance([scale * l for l in lengths], num_ranks, padded=True, algorithm="padded")
    assert scaled.makespan == scale * base.makespan


@pytest.mark.parametrize("num_ranks", [64, 1000], ids=["D64", "D1000"])
def test_large_instance_is_optimal_and_minimal(num_ranks):
    """At sizes no oracle reaches: the optimum is feasible and one ulp below it is not."""
    rng = np.random.default_rng(num_ranks)
    lengths = np.round(rng.lognormal(5, 1, size=16 * num_ranks)).astype(np.int64) + 1
    cost = CostModel(linear=1, quadratic=1 / 512)
    plan = balance(lengths, num_ranks, cost=cost, padded=True, algorithm="padded")
    assert plan.status is Status.OPTIMAL and plan.gap == 0
    assert np.bincount(plan.assignment, minlength=num_ranks).sum() == lengths.size
    problem = padded_problem(lengths, num_ranks, cost)
    order = np.argsort(-lengths, kind="stable")
    runs = padded._Runs(lengths[order], problem.item_costs[order], None)
    assert runs.probe(plan.makespan, num_ranks)[0]
    assert not runs.probe(math.nextafter(plan.makespan, 0), num_ranks)[0]


def test_ranks_hold_contiguous_runs_of_sorted_items():
    lengths = [5, 1, 9, 9, 3, 7, 2, 2, 8, 4]
    plan = balance(lengths, 3, padded=True, algorithm="padded")
    order = np.argsort(-np.asarray(lengths), kind="stable")
    ranks_along_order = plan.assignment[order]
    assert np.all(np.diff(ranks_along_order) >= 0)


def test_same_input_gives_bit_identical_plan():
    lengths = np.random.default_rng(7).integers(1, 6, size=500)  # many ties
    first = balance(lengths, 37, padded=True, algorithm="padded", cost=COSTS["quadratic"])
    second = balance(lengths.copy(), 37, padded=True, algorithm="padded", cost=COSTS["quadratic"])
    assert first.digest() == second.digest()


def test_zero_lengths_and_more_ranks_than_items():
    plan = balance([0, 0, 4, 0], 6, padded=True, algorithm="padded")
    assert plan.makespan == 4 and plan.status is Status.OPTIMAL


def test_unpadded_problem_is_rejected():
    with pytest.raises(ValueError, match="solves the padded cost.*pass padded=True"):
        balance([3, 1, 2], 2, algorithm="padded")


def test_min_cap_validates_input():
    with pytest.raises(ValueError, match="`num_ranks` must be >= 1"):
        padded.min_cap([1, 2], 0)
    with pytest.raises(ValueError, match="`lengths` must be non-negative"):
        padded.min_cap([1, -2], 2)


def test_a_cap_past_int64_binds_nothing():
    """A cap of 2**63 or more gives the uncapped optimum (it raised OverflowError inside the runs)."""
    uncapped = balance([5, 3, 3, 2], 2, padded=True, algorithm="padded")
    for cap in (2**63, 2**80):
        plan = balance([5, 3, 3, 2], 2, padded=True, algorithm="padded", max_tokens_per_rank=cap)
        assert plan.makespan == uncapped.makespan and np.array_equal(plan.assignment, uncapped.assignment)

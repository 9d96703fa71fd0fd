"""The exact P||Cmax solver: agreement with brute force and the `ilp` MILP (HiGHS), honest status, caps, floats,
determinism."""

import numpy as np
import pytest

from orchmllm.balancers import ALGORITHMS, CostModel, Status, balance, make_problem
from orchmllm.balancers.bounds import lower_bound
from orchmllm.balancers.exact import branch_and_bound as exact, dive as exact_dive, milp
from orchmllm.balancers.exact.bounds import PatternLP, l2_bins, simple_bound
from orchmllm.balancers.kernels import exact as exact_kernel, ilp
from orchmllm.balancers.problem import rank_loads
from orchmllm.balancers.validation import SizeLimitError
from orchmllm.benchmarks.pcmax_families import make_instance
from orchmllm.testing import brute_force, brute_force_of, check_plan


def certify(plan, problem):
    """`check_plan` (certified; at brute-force sizes also against the optimum) and the contract's bound."""
    check_plan(plan, problem.lengths, problem.num_ranks, cost=problem.cost,
               max_tokens_per_rank=problem.max_tokens_per_rank)
    assert plan.lower_bound >= lower_bound(problem) - 1e-9


def random_cases(seed, count, max_items=7):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n = int(rng.integers(1, max_items + 1))
        yield rng.integers(0, int(rng.choice([5, 100, 1000])) + 1, n), int(rng.integers(1, 4))


def test_exact_is_registered():
    record = ALGORITHMS["exact"]
    assert (record.kernel is exact_kernel.solve and record.exact and record.solves(padded=True)
            and record.solves(padded=False))


@pytest.mark.parametrize("cost", [CostModel(), CostModel(linear=1, quadratic=1 / 1024), CostModel(per_item=3)],
                         ids=["linear", "dyadic_quadratic", "per_item"])
def test_agrees_with_brute_force(cost):
    for lengths, ranks in random_cases(1, 60):
        problem = make_problem(lengths, ranks, cost=cost)
        plan = balance(lengths, ranks, cost=cost, algorithm="exact")
        certify(plan, problem)
        assert plan.status is Status.OPTIMAL and plan.makespan == brute_force_of(problem).makespan


@pytest.mark.parametrize("algorithm", ["exact", "ilp"])
def test_regression_non_dyadic_costs_stalled_cbc_on_six_items(algorithm, monkeypatch):
    """Cause: costs 0.1·l need a scale above 2**50, so the small instance went to CBC, which
    hit its 10 s limit in a clean-clone CI run.  Floats are dyadic rationals: branch and
    bound now decides them on exact integers, without CBC."""
    def no_milp(*args, **kwargs):
        raise AssertionError("the MILP solver was called")

    monkeypatch.setattr(milp, "solve_milp", no_milp)
    cost = CostModel(linear=0.1)
    assert exact.integer_costs(make_problem([7, 5, 4, 3, 3, 1], 2, cost=cost).item_costs) is None
    rng = np.random.default_rng(5)
    cases = [([7, 5, 4, 3, 3, 1], 2)] + [(rng.integers(1, 50, int(rng.integers(1, 8))).tolist(),
                                           int(rng.integers(1, 4)))
                                          for _ in range(60)]
    for lengths, ranks in cases:
        plan = balance(lengths, ranks, cost=cost, algorithm=algorithm)
        assert plan.status is Status.OPTIMAL
        assert plan.makespan == pytest.approx(brute_force(lengths, ranks, cost=cost).makespan, rel=1e-12)


def test_binding_cap_is_decided_and_respected():
    lengths, cost = [9, 8, 1, 1, 1, 1], CostModel(per_item=10, linear=0)  # cost counts items, cap counts tokens
    problem = make_problem(lengths, 3, cost=cost, max_tokens_per_rank=9)
    assert exact.cap_can_bind(problem, 30.0)
    plan = balance(lengths, 3, cost=cost, algorithm="exact", max_tokens_per_rank=9)
    certify(plan, problem)
    assert plan.status is Status.OPTIMAL and plan.makespan == brute_force_of(problem).makespan == 30.0
    assert balance(lengths, 3, cost=cost, algorithm="exact").makespan == 20.0


def test_agrees_with_the_milp_where_it_finishes():
    compared = 0
    for seed in range(6):
        lengths = np.random.default_rng(seed).integers(1, 101, 18)
        problem = make_problem(lengths, 6, time_limit=10)
        by_milp = ilp.solve(problem)
        plan = balance(lengths, 6, algorithm="exact", time_limit=10)
        assert plan.status is Status.OPTIMAL
        if by_milp.status is Status.OPTIMAL:
            compared += 1
            assert plan.makespan == float(rank_loads(problem, by_milp.assignment).max())
    assert compared >= 3


def test_proves_a_hard_family_instance_and_is_deterministic():
    instance = make_instance("uniform_100", 20, 3.0)
    first = balance(instance.times, 20, algorithm="exact", time_limit=60)
    again = balance(instance.times, 20, algorithm="exact", time_limit=60)
    assert first.status is Status.OPTIMAL and first.gap == 0
    assert first.makespan < balance(instance.times, 20, algorithm="lpt").makespan
    assert first.digest() == again.digest()


def test_time_limit_stop_is_honest():
    instance = make_instance("uniform_10000", 50, 3.0)
    problem = make_problem(instance.times, 50, time_limit=0.05)
    plan = balance(instance.times, 50, algorithm="exact", time_limit=0.05)
    certify(plan, problem)
    assert plan.makespan <= balance(instance.times, 50, algorithm="auto").makespan
    if plan.status is not Status.OPTIMAL:
        assert plan.status is Status.TIME_LIMIT and plan.lower_bound < plan.makespan


def test_padded_problems_use_the_exact_padded_kernel():
    plan = balance([5, 4, 3, 3, 3, 9], 2, padded=True, algorithm="exact")
    assert plan.status is Status.OPTIMAL
    assert plan.makespan == balance([5, 4, 3, 3, 3, 9], 2, padded=True, algorithm="padded").makespan


def test_bounds_never_exceed_the_optimum():
    for lengths, ranks in random_cases(2, 80, max_items=8):
        w = np.sort(lengths)[::-1]
        optimum = int(brute_force(lengths, ranks).makespan)
        assert simple_bound(w, ranks) <= optimum
        assert l2_bins(w, optimum) <= ranks
        if optimum > 0:
            assert PatternLP(w, optimum, {}).bins(ranks, 200, np.inf) <= ranks


def test_pattern_lp_refutes_what_l2_cannot():
    w = np.sort(make_instance("uniform_1000", 30, 2.0).times)[::-1]
    assert l2_bins(w, 1082) <= 30  # L2 lets 1082 through; the optimum is 1090
    assert PatternLP(w, 1082, {}).bins(30, 400, np.inf) > 30


def test_ilp_oracle_proves_the_stalling_instance_without_cbc(monkeypatch):
    """[495, 533, 44, 804, 927] on 2 ranks stalled CBC for its whole time limit 1 in 300 runs."""
    def no_milp(*args, **kwargs):
        raise AssertionError("the MILP solver was called")

    monkeypatch.setattr(milp, "solve_milp", no_milp)
    for _ in range(20):
        plan = balance([495, 533, 44, 804, 927], 2, algorithm="ilp")
        assert plan.status is Status.OPTIMAL and plan.makespan == 1422.0


def test_small_instances_skip_the_milp_only_when_proven():
    for lengths, ranks in random_cases(3, 200, max_items=12):
        problem = make_problem(lengths, ranks)
        result = exact.prove_small(problem, np.zeros(problem.num_items, dtype=np.int64))
        assert result is not None and result.status is Status.OPTIMAL
        assert result.lower_bound == float(rank_loads(problem, result.assignment).max())
    assert exact.prove_small(make_problem(np.arange(20), 3), np.zeros(20, dtype=np.int64)) is None


def check_bins(bins, w, capacity, num_bins):
    assert bins is not None and len(bins) <= num_bins
    assert sorted(cost for costs in bins for cost in costs) == sorted(w.tolist())
    assert max(sum(costs) for costs in bins) <= capacity


@pytest.mark.parametrize("rounding", [True, False], ids=["residual_rounding", "largest_column"])
def test_dive_packs_at_the_bound_where_bin_completion_gives_up(rounding):
    """uniform_1000 m40 r2.5: the LP allows exactly 40 bins at 1200 and bin completion finds no
    packing within its budget; the dive finds one, so 1200 (the lifted bound) is the optimum."""
    w = np.sort(make_instance("uniform_1000", 40, 2.5).times)[::-1]
    search = exact._Search(w, 40, np.inf)
    assert search.pack(1200, 20_000)[0] == "unknown"
    lp = search.lp_bound(1200)
    assert lp.bins(40, 400, np.inf, converge=True) <= 40
    bins = exact_dive.dive(w, 1200, 40, lp.columns, np.inf, search.finish(1200), rounding)
    check_bins(bins, w, 1200, 40)
    where = exact_dive.assign(bins, w)
    assert sorted(np.bincount(where, weights=w).tolist()) == sorted(sum(costs) for costs in bins)


def test_dive_never_claims_an_impossible_packing():
    for lengths, ranks in random_cases(4, 60, max_items=8):
        w = np.sort(lengths)[::-1]
        optimum = int(brute_force(lengths, ranks).makespan)
        if optimum == 0:
            continue
        assert exact_dive.dive(w, optimum - 1, ranks, [], np.inf) is None
        bins = exact_dive.dive(w, optimum, ranks, [], np.inf)
        if bins is not None:
            check_bins(bins, w, optimum, ranks)


def test_proves_the_instance_that_needed_the_dive():
    """uniform_1000 m50 r3: ceil(sum / 50) = 1493 is the optimum; before the dive the search
    stopped at 1496 with the bound 1493 (bin completion and the integer master found nothing)."""
    instance = make_instance("uniform_1000", 50, 3.0)
    plan = balance(instance.times, 50, algorithm="exact", time_limit=120)
    assert plan.status is Status.OPTIMAL and plan.makespan == 1493.0


def test_regression_exact_refused_inputs_its_start_proves_optimal_naming_ilp():
    """probe20 P20-16: long-tailed lengths under fractional costs, where one giant item sets the makespan and
    auto's start meets the bound, went to the MILP and were refused for its size ('ilp' needs 129056
    binaries), naming an algorithm the user did not choose.  A start at the bound is optimal at any size; a
    refusal that remains names 'exact'."""
    cost = CostModel(linear=1.0, quadratic=1e-4)
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 64 * 32) * 200).astype(np.int64) + 1, 65536)
    plan = balance(lengths, 64, cost=cost, algorithm="exact")
    assert plan.status is Status.OPTIMAL and plan.makespan == balance(lengths, 64, cost=cost).makespan
    with pytest.raises(SizeLimitError, match=r"^algorithm 'exact' proves these costs with the MILP, and algorithm "
                                             r"'ilp' needs \d+ binaries"):
        balance(np.random.default_rng(0).integers(100, 3000, 64 * 32), 64, cost=cost, algorithm="exact")

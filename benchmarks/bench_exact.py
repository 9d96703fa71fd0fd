"""Exact solvers: the padded balancer's time and optimality, and the ILP's solve time vs n.

Run: python3.11 -m pytest benchmarks/bench_exact.py --benchmark-only -q
     (add --heavy for D = 16384 × 16 and the larger ILP sizes)
"""

import math

import numpy as np
import pytest

from orchmllm.balancers import CostModel, Status, balance, make_problem
from orchmllm.balancers import ilp, padded
from orchmllm.balancers.problem import rank_loads

ENCODER_COST = CostModel(linear=1, quadratic=1 / 1024)  # attention term becomes visible past ~1k


def workload(name, size, seed):
    """Encoder-like lengths up to 8192: lognormal, uniform, or a few fixed tile sizes (ties)."""
    rng = np.random.default_rng(seed)
    if name == "lognormal":
        return np.minimum(np.round(rng.lognormal(6, 1, size)).astype(np.int64) + 1, 8192)
    if name == "uniform":
        return rng.integers(1, 8193, size)
    return rng.choice(np.array([256, 576, 1024, 2304]), size)  # e.g. image tiles of 4 sizes


def dp_over_sorted_runs(problem):
    """Reference O(n² D) DP over contiguous runs of the length-sorted items."""
    order = np.argsort(-problem.lengths, kind="stable")
    item_costs = problem.item_costs[order].tolist()
    n = problem.num_items
    best = [0.0] + [math.inf] * n
    for _ in range(problem.num_ranks):
        nxt = [0.0] + [math.inf] * n
        for end in range(1, n + 1):
            nxt[end] = min(max(best[first], (end - first) * item_costs[first]) for first in range(end))
        best = [min(a, b) for a, b in zip(best, nxt)]
    return best[n]


@pytest.mark.parametrize("workload_name", ["lognormal", "uniform", "tied"])
@pytest.mark.parametrize("num_ranks", [256, 2560, 16384], ids=["D256", "D2560", "D16384"])
def test_padded_exact(benchmark, best_of, request, num_ranks, workload_name):
    """Exact padded optimum at 16 items per rank; LPT's padded greedy timed alongside."""
    if num_ranks > 2560 and not request.config.getoption("--heavy", default=False):
        pytest.skip("D=16384 runs with --heavy")
    lengths = workload(workload_name, 16 * num_ranks, seed=num_ranks)
    plan = benchmark(balance, lengths, num_ranks, cost=ENCODER_COST, padded=True, algorithm="padded")
    assert plan.status is Status.OPTIMAL and plan.gap == 0
    assert np.bincount(plan.assignment, minlength=num_ranks).sum() == lengths.size
    lpt_seconds = best_of(lambda: balance(lengths, num_ranks, cost=ENCODER_COST, padded=True,
                                          algorithm="lpt"), repeats=3)
    lpt_plan = balance(lengths, num_ranks, cost=ENCODER_COST, padded=True, algorithm="lpt")
    assert lpt_plan.makespan >= plan.makespan
    benchmark.extra_info.update(
        items=int(lengths.size), makespan=plan.makespan,
        makespan_over_mean_load=plan.imbalance,
        lpt_makespan_over_optimum=lpt_plan.makespan / plan.makespan,
        lpt_seconds=lpt_seconds, lpt_time_over_padded_time=lpt_seconds / benchmark.stats.stats.min)


@pytest.mark.parametrize("num_items", [48, 96], ids=["n48", "n96"])
def test_padded_vs_dp(benchmark, best_of, num_items):
    """Against the O(n² D) DP over sorted runs: same optimum, time ratio in the same run."""
    num_ranks = num_items // 6
    lengths = workload("lognormal", num_items, seed=num_items)
    problem = make_problem(lengths, num_ranks, cost=ENCODER_COST, padded=True)
    result = benchmark(padded.solve, problem)
    dp_seconds = best_of(lambda: dp_over_sorted_runs(problem), repeats=1)
    assert result.lower_bound == dp_over_sorted_runs(problem)
    benchmark.extra_info.update(dp_seconds=dp_seconds, dp_time_over_padded_time=dp_seconds / benchmark.stats.stats.min)


def test_padded_equals_optimum_count(benchmark):
    """Random small instances (ties, caps, float costs): padded == DP optimum on every one."""
    rng = np.random.default_rng(0)
    cases = []
    for _ in range(300):
        num_items = int(rng.integers(1, 30))
        lengths = rng.integers(1, int(rng.choice([4, 40, 400])), num_items)
        cost = [CostModel(), ENCODER_COST, CostModel(per_item=50, linear=1)][int(rng.integers(3))]
        cases.append(make_problem(lengths, int(rng.integers(1, 8)), cost=cost, padded=True))
    optima = [dp_over_sorted_runs(problem) for problem in cases]

    def solve_all():
        return [padded.solve(problem).lower_bound for problem in cases]

    found = benchmark(solve_all)
    equal = sum(a == b for a, b in zip(found, optima))
    assert equal == len(cases)
    benchmark.extra_info.update(equal_to_optimum=f"{equal}/{len(cases)}")


@pytest.mark.parametrize("is_padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("num_items", [8, 12, 16, 20, 24, 32, 48], ids=lambda n: f"n{n}")
def test_ilp_time_vs_n(benchmark, request, num_items, is_padded):
    """CBC to proven optimality (10 s limit) on hard instances: n/D = 3, lengths uniform in [1, 100]."""
    if num_items > 24 and not request.config.getoption("--heavy", default=False):
        pytest.skip("n > 24 runs with --heavy")
    num_ranks = max(2, num_items // 3)
    lengths = np.random.default_rng(num_items).integers(1, 101, num_items)
    problem = make_problem(lengths, num_ranks, padded=is_padded, time_limit=10)
    result = benchmark.pedantic(ilp.solve, args=(problem,), rounds=1, iterations=1)
    lpt_plan = balance(lengths, num_ranks, padded=is_padded, algorithm="lpt")
    exact = padded.solve(problem).lower_bound if is_padded else None
    makespan = float(rank_loads(problem, result.assignment).max())
    if result.status is Status.OPTIMAL and exact is not None:
        assert makespan == exact
    benchmark.extra_info.update(status=str(result.status), makespan=makespan,
                                lpt_over_ilp=lpt_plan.makespan / makespan,
                                proven_bound=result.lower_bound)

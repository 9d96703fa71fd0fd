"""Exact solvers: the padded balancer's time and optimality, the ILP's solve time vs n, the exact
P||Cmax solver on the classical families (the `ilp` MILP as the same-run baseline), CBC against HiGHS
on the MILP models, and the oracle's stall count.

Run: python3.11 -m pytest benchmarks/bench_exact.py --benchmark-only -q
     (add --heavy for D = 16384 × 16, the larger ILP sizes and the whole family grid, n <= 150)
Figures go to the "Exact solver" section of BENCHMARKS.md.
"""

import math
import os
import resource
import statistics
import time
from pathlib import Path

import numpy as np
import pulp
import pytest

from orchmllm.balancers import CostModel, InfeasibleError, Status, balance, make_problem
from orchmllm.balancers.bounds import lower_bound
from orchmllm.balancers.exact import ilp, milp
from orchmllm.balancers.kernels import exact, ilp as ilp_kernel, lpt, padded
from orchmllm.balancers.problem import rank_loads
from orchmllm.benchmarks import pcmax_families

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
    """`ilp` (HiGHS) to proven optimality (10 s limit) on hard instances: n/D = 3, lengths uniform in [1, 100]."""
    if num_items > 24 and not request.config.getoption("--heavy", default=False):
        pytest.skip("n > 24 runs with --heavy")
    num_ranks = max(2, num_items // 3)
    lengths = np.random.default_rng(num_items).integers(1, 101, num_items)
    problem = make_problem(lengths, num_ranks, padded=is_padded, time_limit=10)
    result = benchmark.pedantic(ilp_kernel.solve, args=(problem,), rounds=1, iterations=1)
    lpt_plan = balance(lengths, num_ranks, padded=is_padded, algorithm="lpt")
    exact = padded.solve(problem).lower_bound if is_padded else None
    makespan = float(rank_loads(problem, result.assignment).max())
    if result.status is Status.OPTIMAL and exact is not None:
        assert makespan == exact
    benchmark.extra_info.update(status=str(result.status), makespan=makespan,
                                lpt_over_ilp=lpt_plan.makespan / makespan,
                                proven_bound=result.lower_bound)


# ------------------------------------------------ the exact P||Cmax solver on the classical families

def family_grid(request):
    """n <= 60 by default (m <= 20); the whole grid (n <= 150) with --heavy."""
    grid = pcmax_families.instances()
    if request.config.getoption("--heavy", default=False):
        return grid
    return [instance for instance in grid if instance.num_machines <= 20]


def timed(solver, problem):
    """(result, wall s, CPU s of this process and of the solver processes it waited for)."""
    wall, cpu = time.perf_counter(), time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = solver(problem)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    return result, time.perf_counter() - wall, time.process_time() - cpu + child_cpu


def milp_from_lpt(problem):
    """HiGHS on `ilp`'s model from LPT's plan (the `ilp` kernel itself decides n <= 16 by branch and bound)."""
    return ilp.improve(problem, lpt.solve(problem).assignment)


@pytest.mark.timeout(7200)  # --heavy: 144 instances, up to 10 s for each solver
def test_exact_on_the_families(benchmark, request):
    """Proven fraction, wall and CPU time of `exact` and of HiGHS on `ilp`'s model (10 s each), solver by
    solver on each instance in the same run; proofs cross-checked (each one's bound <= the
    other's plan, equal optima where both prove)."""
    grid = family_grid(request)
    problems = [make_problem(instance.times, instance.num_machines, time_limit=10) for instance in grid]

    def run():
        return [(timed(exact.solve, problem), timed(milp_from_lpt, problem)) for problem in problems]

    rows = benchmark.pedantic(run, rounds=1, iterations=1)
    by_family: dict[str, list] = {}
    for instance, problem, pair in zip(grid, problems, rows):
        (ours, ours_wall, ours_cpu), (by_ilp, ilp_wall, ilp_cpu) = pair
        ours_makespan = float(rank_loads(problem, ours.assignment).max())
        milp_makespan = float(rank_loads(problem, by_ilp.assignment).max())
        assert lower_bound(problem) - 1e-9 <= ours.lower_bound <= min(ours_makespan, milp_makespan)
        if by_ilp.lower_bound is not None:
            assert by_ilp.lower_bound <= ours_makespan * (1 + 1e-9)
        if by_ilp.status is Status.OPTIMAL and ours.status is Status.OPTIMAL:
            assert ours_makespan == milp_makespan
        by_family.setdefault(instance.family, []).append(dict(
            name=instance.name, exact_proven=ours.status is Status.OPTIMAL, exact_wall_s=ours_wall,
            exact_cpu_s=ours_cpu, exact_bound=ours.lower_bound, exact_makespan=ours_makespan,
            milp_proven=by_ilp.status is Status.OPTIMAL, milp_wall_s=ilp_wall, milp_cpu_s=ilp_cpu,
            milp_bound=by_ilp.lower_bound, milp_makespan=milp_makespan))
    summary = {}
    for family, cells in [*by_family.items(), ("all", [c for cells in by_family.values() for c in cells])]:
        summary[family] = {"instances": len(cells)}
        for solver in ("exact", "milp"):
            walls = [c[f"{solver}_wall_s"] for c in cells]
            summary[family].update({
                f"{solver}_proven": sum(c[f"{solver}_proven"] for c in cells),
                f"{solver}_wall_median_s": statistics.median(walls), f"{solver}_wall_max_s": max(walls),
                f"{solver}_cpu_max_s": max(c[f"{solver}_cpu_s"] for c in cells)})
    benchmark.extra_info.update(summary=summary, instances=[c for cells in by_family.values() for c in cells],
                                load_average=os.getloadavg())
    for family, row in summary.items():
        print(f"{family:14} exact {row['exact_proven']:3}/{row['instances']} "
              f"(wall median {row['exact_wall_median_s']:.2f} s,"
              f" max {row['exact_wall_max_s']:.2f} s, CPU max {row['exact_cpu_max_s']:.2f} s)   "
              f"ilp {row['milp_proven']:3}/"
              f"{row['instances']} (wall median {row['milp_wall_median_s']:.2f} s, max {row['milp_wall_max_s']:.2f} s)")


# ------------------------------------------------ the MILP path: CBC against HiGHS (issue 11)

def milp_cases(heavy):
    """(kind, problem, start) for the instances that still reach a MILP solver: unpadded n in
    17..60 without and with a binding token cap, padded big-M models, caps proven infeasible."""
    sizes, seeds = ((17, 20, 24, 30, 40, 60), range(3)) if heavy else ((17, 20, 24), range(2))
    cases = []
    for n in sizes:
        for seed in seeds:
            rng = np.random.default_rng([n, seed])
            lengths = rng.integers(1, 101, n)
            problem = make_problem(lengths, max(2, n // 3), time_limit=10)
            cases.append(("unpadded", problem, lpt.solve(problem).assignment))
            # costs grow with the square, the cap counts tokens: 5 % above the token balance
            cap = max(int(lengths.max()), math.ceil(1.05 * lengths.sum() / problem.num_ranks))
            capped = make_problem(lengths, problem.num_ranks, cost=CostModel(linear=1, quadratic=1 / 64),
                                  max_tokens_per_rank=cap, time_limit=10)
            try:
                start = lpt.solve(capped).assignment
            except InfeasibleError:
                start = None
            cases.append(("tight_cap", capped, start))
            units = rng.integers(1, 31, n)
            units[-1] += (1 - int(units.sum())) % 3  # sum(units) = 1 mod 3: every rank sum is a multiple of 3
            tokens = 3 * units
            cases.append(("infeasible_cap", make_problem(tokens, 3, max_tokens_per_rank=int(tokens.sum()) // 3,
                                                         time_limit=10), None))
    for n in sizes[:3]:
        for seed in seeds:
            lengths = np.random.default_rng([n, seed, 1]).integers(1, 101, n - 5)
            problem = make_problem(lengths, max(2, (n - 5) // 4), padded=True, time_limit=10)
            cases.append(("padded", problem, padded.solve(problem).assignment))
    return cases


def cbc_on_the_model(problem, start, time_limit):
    """PuLP's CBC (`milp.run_cbc`: one thread, fixed seeds) on `ilp`'s very model and cutoff, rebuilt
    row by row from its arrays: the same-run baseline HiGHS replaced.  A KernelResult, as `ilp.search`."""
    model = ilp._Model(problem)
    strictly_better = model.cut_off(start)
    lp = pulp.LpProblem("ilp_model", pulp.LpMinimize)
    variables = [lp.add_variable(f"v{j}", lowBound=None if not math.isfinite(lo) else float(lo),
                                 upBound=None if not math.isfinite(hi) else float(hi),
                                 cat=pulp.LpInteger if integral else pulp.LpContinuous)
                 for j, (lo, hi, integral) in enumerate(zip(model.lower, model.upper, model.integrality))]
    lp += variables[0]
    matrix = model.matrix.tocsr()
    for row in range(matrix.shape[0]):
        cells = slice(matrix.indptr[row], matrix.indptr[row + 1])
        expression = pulp.LpAffineExpression(
            [(variables[j], float(v)) for j, v in zip(matrix.indices[cells].tolist(), matrix.data[cells].tolist())])
        lower, upper = float(model.row_lower[row]), float(model.row_upper[row])
        if lower == upper:
            lp += expression == lower
            continue
        if math.isfinite(upper):
            lp += expression <= upper
        if math.isfinite(lower):
            lp += expression >= lower
    begin = time.perf_counter()
    milp.run_cbc(lp, time_limit, warm_start=False)
    finished = time.perf_counter() - begin < time_limit  # CBC's "infeasible" is no proof when its limit cut it
    values = np.array([var.value() or 0.0 for var in variables])
    found = model._read_assignment(values) if lp.sol_status in (pulp.LpSolutionOptimal,
                                                                pulp.LpSolutionIntegerFeasible) else None
    if finished and lp.status == pulp.LpStatusInfeasible:
        outcome = "infeasible"
    elif finished and lp.sol_status == pulp.LpSolutionOptimal and found is not None:
        outcome = "optimal"
    else:
        outcome = "stopped"
    bound = float(values[0]) * model.scale if outcome == "optimal" else None
    return ilp._verdict(problem, start, time_limit, outcome, found, bound, strictly_better)


def run_milp(problem, start, solver):
    """(verdict, makespan or None, seconds): one MILP search by `solver` ("highs": `ilp`'s own)."""
    begin = time.perf_counter()
    try:
        result = ilp.search(problem, start, 10.0) if solver == "highs" else cbc_on_the_model(problem, start, 10.0)
    except InfeasibleError:
        return "infeasible", None, time.perf_counter() - begin
    except TimeoutError:  # no plan found, infeasibility not proven
        return "stalled", None, time.perf_counter() - begin
    verdict = "proven" if result.status is Status.OPTIMAL else "stalled"
    return verdict, float(rank_loads(problem, result.assignment).max()), time.perf_counter() - begin


@pytest.mark.timeout(7200)
def test_milp_backends_same_run(benchmark, request):
    """CBC (PuLP's bundled binary) and HiGHS (scipy.optimize.milp, `ilp`'s solver) on the same `ilp` models, 10 s
    each, alternated instance by instance: proven / stalled / infeasible counts, time, agreement."""
    cases = milp_cases(request.config.getoption("--heavy", default=False))

    def run():
        return [(run_milp(problem, start, "cbc"), run_milp(problem, start, "highs")) for _, problem, start in cases]

    rows = benchmark.pedantic(run, rounds=1, iterations=1)
    summary: dict[str, dict] = {}
    for (kind, _, _), (cbc, highs) in zip(cases, rows):
        if cbc[0] != "stalled" and highs[0] != "stalled":
            assert cbc[0] == highs[0] and cbc[1] == highs[1], (kind, cbc, highs)
        if "infeasible" in (cbc[0], highs[0]):
            assert {cbc[0], highs[0]} <= {"infeasible", "stalled"} or cbc[0] == highs[0]
        cell = summary.setdefault(kind, {"instances": 0})
        cell["instances"] += 1
        for name, (verdict, _, seconds) in (("cbc", cbc), ("highs", highs)):
            cell[f"{name}_{verdict}"] = cell.get(f"{name}_{verdict}", 0) + 1
            cell.setdefault(f"{name}_seconds", []).append(seconds)
    for kind, cell in summary.items():
        for name in ("cbc", "highs"):
            seconds = cell.pop(f"{name}_seconds")
            cell[f"{name}_median_s"], cell[f"{name}_max_s"] = statistics.median(seconds), max(seconds)
        print(kind, cell)
    benchmark.extra_info.update(summary=summary, load_average=os.getloadavg())


# ------------------------------------------------ the oracle must not stall (issue 11)

STALL_COST = CostModel(linear=1, quadratic=1 / 64)
"""Cost of the capped stall-count cases: plans then trade cost against tokens."""


def stall_cases():
    """10 000 random instances with n <= 12, D <= 6: a third without a cap, a third with the
    smallest cap that works (tight), a third with one token less (infeasible)."""
    rng = np.random.default_rng(11)
    cases = []
    for index in range(10_000):
        num_items = int(rng.integers(1, 13))
        lengths = rng.integers(0, int(rng.choice([10, 1000, 10**6])) + 1, num_items).tolist()
        num_ranks = int(rng.integers(1, 7))
        kind = ("none", "tight", "infeasible")[index % 3]
        if kind == "none" or max(lengths) == 0:
            cases.append(("none", lengths, num_ranks, None))
            continue
        smallest = int(balance(lengths, num_ranks, algorithm="ilp").makespan)  # the tokens' own optimum
        if smallest == 1:
            kind = "tight"  # no cap below 1
        cases.append((kind, lengths, num_ranks, smallest if kind == "tight" else smallest - 1))
    return cases


def test_oracle_stall_count(benchmark, monkeypatch):
    """10 000 random instances with n <= 12 through `ilp` (no cap, tight caps, infeasible caps):
    stalls (calls over 1 s of CPU: wall time on a shared machine measures the load), wrong
    verdicts (asserted), and calls that reach the MILP solver (none may: branch and bound decides n <= 16)."""
    cases = stall_cases()
    milp_calls = []
    real_milp = milp.solve_milp
    monkeypatch.setattr(milp, "solve_milp", lambda *args, **kwargs: milp_calls.append(1) or real_milp(*args, **kwargs))

    def run():
        slowest, slowest_cpu, stalls = 0.0, 0.0, 0
        for kind, lengths, num_ranks, cap in cases:
            cost = CostModel() if cap is None else STALL_COST
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                plan = balance(lengths, num_ranks, cost=cost, algorithm="ilp", max_tokens_per_rank=cap)
                assert kind != "infeasible" and plan.status is Status.OPTIMAL
            except InfeasibleError as error:
                assert kind == "infeasible" and error.min_cap == cap + 1
            cpu = time.process_time() - cpu
            slowest, slowest_cpu = max(slowest, time.perf_counter() - wall), max(slowest_cpu, cpu)
            stalls += cpu > 1.0
        return slowest, slowest_cpu, stalls

    calls_before = len(milp_calls)
    slowest, slowest_cpu, stalls = benchmark.pedantic(run, rounds=1, iterations=1)
    assert stalls == 0 and len(milp_calls) == calls_before
    benchmark.extra_info.update(instances=len(cases), stalls_over_1s_cpu=stalls, slowest_wall_s=slowest,
                                slowest_cpu_s=slowest_cpu, milp_calls=len(milp_calls) - calls_before,
                                load_average=os.getloadavg(),
                                by_kind={kind: sum(c[0] == kind for c in cases)
                                         for kind in ("none", "tight", "infeasible")})


def test_milp_alone_stall_count(benchmark):
    """The MILP path itself (`ilp.improve`, HiGHS from LPT's start) on 1 000 of those instances, 2 s limit:
    how often HiGHS stalls when nothing spares it."""
    rng = np.random.default_rng(12)
    problems = []
    while len(problems) < 1000:
        lengths = rng.integers(0, 1001, int(rng.integers(2, 13)))
        problems.append(make_problem(lengths, int(rng.integers(2, 5)), time_limit=2))

    def run():
        outcomes = []
        for problem in problems:
            start = time.perf_counter()
            result = ilp.improve(problem, lpt.solve(problem).assignment)
            outcomes.append((result.status, time.perf_counter() - start))
        return outcomes

    outcomes = benchmark.pedantic(run, rounds=1, iterations=1)
    assert all(status in (Status.OPTIMAL, Status.TIME_LIMIT) for status, _ in outcomes)
    benchmark.extra_info.update(instances=len(problems),
                                stalls=sum(status is Status.TIME_LIMIT for status, _ in outcomes),
                                slowest_s=max(seconds for _, seconds in outcomes))


README_SNIPPET_RUNS = 200


def test_readme_property_snippet(benchmark):
    """The README's Hypothesis snippet (section "Property-test"), run 200 times in a row."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("### 2. Property-test"):]
    snippet = section[section.index("```python") + len("```python"):
                      section.index("```", section.index("```python") + 9)]

    def run():
        for _ in range(README_SNIPPET_RUNS):
            exec(compile(snippet, "README.md", "exec"), {})
        return README_SNIPPET_RUNS

    assert benchmark.pedantic(run, rounds=1, iterations=1) == README_SNIPPET_RUNS
    benchmark.extra_info.update(runs_passed=README_SNIPPET_RUNS)

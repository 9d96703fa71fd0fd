"""`exact` and `ilp` under a tight cap (probe22 P22-18): the uncapped optimum that meets the cap is the capped one,
and a search that finds no plan within the default time limit is a TimeoutError, not "a bug of the kernel"."""

import re

import numpy as np
import pytest

from orchmllm import balance
from orchmllm.balancers.exact import ilp as milp
from orchmllm.balancers.kernels import exact as exact_kernel
from orchmllm.balancers.problem import InfeasibleError

LENGTHS = [4144, 3839, 3540, 630, 1271, 4135, 1670, 4245, 883, 1749, 4876, 2557, 4180, 3012, 330, 1694, 2503, 3109,
           4931, 3662, 1679, 4305, 2109]  # exact's uncapped optimum: tokens [16264, 16262, 16263, 16264]


@pytest.mark.parametrize("time_limit", [None, 30.0])  # 2.0 ran out at load 8 (HiGHS's share is wall time)
def test_regression_exact_returns_the_uncapped_optimum_that_meets_the_cap(time_limit):
    plan = balance(LENGTHS, 4, algorithm="exact", max_tokens_per_rank=16264, time_limit=time_limit)
    assert str(plan.status) == "optimal" and plan.tokens.max() == 16264 == plan.makespan


def test_regression_a_default_time_limit_running_out_is_a_timeout_not_a_kernel_bug(monkeypatch):
    monkeypatch.setattr(milp, "DEFAULT_TIME_LIMIT", 0.001)  # no machine finds a plan in 1 ms
    with pytest.raises(TimeoutError, match=r"^HiGHS found no plan within time_limit=0.001 s"):
        balance(LENGTHS, 4, algorithm="ilp", max_tokens_per_rank=16264)


def test_regression_exact_keeps_autos_proof_that_no_plan_fits():
    """rev15 R15-08: 'exact' dropped auto's proven refusal (the pigeonhole bound) and built the MILP, refused by
    size at 3065 items x 64 ranks, where 'auto' says no plan fits."""
    lengths = np.concatenate((np.full(65, 10000), np.random.default_rng(3).integers(1, 50, 3000)))
    with pytest.raises(InfeasibleError, match=r"^no plan fits max_tokens_per_rank=19999 on 64 ranks: .* a cap of at "
                                              r"least 20000 is needed$"):
        balance(lengths, 64, costs=lengths ** 1.3, algorithm="exact", max_tokens_per_rank=19999)


def test_regression_exact_under_a_tight_cap_spends_its_time_limit_once(monkeypatch):
    """rev15 R15-07: where auto refuses the cap, the uncapped exact solve ran, then the MILP got the whole limit
    again (time_limit=1.0 took 2.0-2.2 s)."""
    limits = []
    solve = exact_kernel.ilp.solve
    monkeypatch.setattr(exact_kernel.ilp, "solve", lambda problem: limits.append(problem.time_limit) or solve(problem))
    rng = np.random.default_rng(1)
    lengths = rng.integers(1000, 100000, int(rng.integers(30, 60)))  # rev15's case: auto refuses cap = half the sum
    cap = int(-(-lengths.sum() // 2))
    try:  # the MILP may find a plan in its share on a fast machine; here it does not
        plan = balance(lengths, 2, costs=lengths.astype(float) ** 1.5, algorithm="exact", max_tokens_per_rank=cap,
                       time_limit=0.5)
    except TimeoutError as error:
        assert re.search(r"within time_limit=0\.[0-9]+ s .*\(the MILP's share of exact's time_limit=0\.5 s, after the "
                         r"optimum without the cap did not fit it\)$", str(error)), error
    else:
        assert plan.tokens.max() <= cap
    assert limits and all(limit < 0.5 for limit in limits)


def test_regression_exact_over_the_models_size_names_itself_not_ilp():
    """probe23 P23-06: where auto's plans overflow the cap and the MILP is over its size, 'exact' raised SizeLimitError
    "algorithm 'ilp' needs ... use 'auto'", while auto's refusal pointed at 'ilp': a circle.  'exact' gave up, and
    says so as a heuristic does (InfeasibleError naming itself, with the cap auto meets)."""
    lengths = np.random.default_rng(4).integers(300, 5001, 8192)
    cap = -(-int(lengths.sum()) // 512)  # the token bound itself: not proven infeasible, and lpt overflows it
    with pytest.raises(InfeasibleError, match=r"^algorithm 'exact' found no plan under max_tokens_per_rank=.* over "
                                              r"its size limit at 8192 items × 512 ranks") as caught:
        balance(lengths, 512, algorithm="exact", max_tokens_per_rank=cap, time_limit=1.0)
    assert caught.value.heuristic == "exact" and caught.value.min_cap > cap
    with pytest.raises(InfeasibleError, match=r"try algorithm='exact'$"):  # auto pointed at 'ilp', refused by size
        balance(lengths, 512, max_tokens_per_rank=cap)

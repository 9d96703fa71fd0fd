"""`exact` and `ilp` under a tight cap (probe22 P22-18): the uncapped optimum that meets the cap is the capped one,
and a search that finds no plan within the default time limit is a TimeoutError, not "a bug of the kernel"."""

import pytest

from orchmllm import balance
from orchmllm.balancers.exact import ilp as milp

LENGTHS = [4144, 3839, 3540, 630, 1271, 4135, 1670, 4245, 883, 1749, 4876, 2557, 4180, 3012, 330, 1694, 2503, 3109,
           4931, 3662, 1679, 4305, 2109]  # exact's uncapped optimum: tokens [16264, 16262, 16263, 16264]


@pytest.mark.parametrize("time_limit", [None, 2.0])
def test_regression_exact_returns_the_uncapped_optimum_that_meets_the_cap(time_limit):
    plan = balance(LENGTHS, 4, algorithm="exact", max_tokens_per_rank=16264, time_limit=time_limit)
    assert str(plan.status) == "optimal" and plan.tokens.max() == 16264 == plan.makespan


def test_regression_a_default_time_limit_running_out_is_a_timeout_not_a_kernel_bug(monkeypatch):
    monkeypatch.setattr(milp, "DEFAULT_TIME_LIMIT", 0.05)
    with pytest.raises(TimeoutError, match=r"^HiGHS found no plan within time_limit=0.05 s"):
        balance(LENGTHS, 4, algorithm="ilp", max_tokens_per_rank=16264)

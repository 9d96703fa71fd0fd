"""`check_conformance(..., time_limit=)` on an exact kernel: the limit is each call's, so the kernel may stop at it
(status 'time_limit') and its plan is still certified against the optimum.  Causes: probe57 C1, the suite imposed
the limit and then failed the kernel, declared exact, for the 'time_limit' status of an optimal plan; probe58 C2,
any 'time_limit' status then passed, so a kernel that "stopped" after 1 ms of a 30 s limit, on a case the exact
solver proves at once, conformed with a plan above the optimum."""

import time

import pytest

from orchmllm.balancers import Status
from orchmllm.balancers.microbatch.auto import solve_exact
from orchmllm.balancers.microbatch.greedy import solve as greedy
from orchmllm.balancers.registry import get_algorithm
from orchmllm.testing import ConformanceError, check_conformance, harness
from orchmllm.testing.microbatch_conformance import check_microbatch_conformance

EXACT = get_algorithm("exact")
LPT = get_algorithm("lpt")


def stopped_at_the_limit(problem):
    """orchmllm's exact kernel, reporting that it stopped at the time limit wherever one is set, after running for it
    (its certificate dropped: the plan's status then stays 'time_limit' where the plain bound is below the optimum)."""
    started = time.perf_counter()
    result = EXACT(problem)
    if problem.time_limit is None:
        return result
    while time.perf_counter() < started + problem.time_limit:  # a busy wait: a sleep under load oversleeps
        pass
    return result._replace(status="time_limit", lower_bound=None)


def test_an_exact_kernel_stopped_at_the_suites_time_limit_conforms():
    report = check_conformance(stopped_at_the_limit, exact=True, time_limit=0.0005, examples=5, processes=False,
                               constraints=())
    assert report.kinds


def test_without_a_time_limit_an_exact_kernel_must_prove_its_plans():
    def always_stopped(problem):
        return EXACT(problem)._replace(status="time_limit", lower_bound=None)

    with pytest.raises(ConformanceError, match="is declared exact but returned status time_limit"):
        check_conformance(always_stopped, exact=True, examples=5, processes=False, constraints=())


def lpt_stopped_at_once(problem):
    """LPT's plan, 'time_limit' at once (probe58 C2: 7 on [3, 3, 2, 2, 2] / 2 ranks, where the optimum is 6)."""
    return LPT(problem)._replace(status="time_limit", lower_bound=None)


def test_an_exact_kernel_that_stops_long_before_the_suites_time_limit_is_refused():
    with pytest.raises(ConformanceError, match=r"returned status time_limit after [0-9.e-]+ s of its "
                                               r"time_limit=30.0 s .* within the limit\) at makespan"):
        check_conformance(lpt_stopped_at_once, exact=True, time_limit=30.0, examples=5, processes=False,
                          constraints=())


def greedy_stopped_at_once(problem, num_microbatches):
    result = greedy(problem, num_microbatches)
    return None if result is None else result._replace(status=Status.TIME_LIMIT, lower_bound=None)


def test_an_exact_microbatch_kernel_that_stops_long_before_the_suites_time_limit_is_refused():
    with pytest.raises(ConformanceError, match=r"returned status time_limit after [0-9.e-]+ s of its "
                                               r"time_limit=30.0 s .* at step cost"):
        check_microbatch_conformance(greedy_stopped_at_once, exact=True, time_limit=30.0, examples=5,
                                     processes=False)


def test_an_early_stop_the_exact_solver_cannot_beat_within_the_limit_conforms(monkeypatch):
    stops = []

    def exact_stopped_by_its_budget(problem, num_microbatches):
        """The exact micro-batch kernel, its work budget's stop reported as 'time_limit' (the budget is work, not
        seconds: it may stop long before the limit on a fast machine)."""
        result = solve_exact(problem, num_microbatches)
        if result is None or result.status is Status.OPTIMAL:
            return result
        stops.append(num_microbatches)
        return result._replace(status=Status.TIME_LIMIT, lower_bound=None)

    monkeypatch.setattr(harness, "STOPPED_SHARE", 1e9)  # no call runs that long: the exact solver's reach decides
    check_microbatch_conformance(exact_stopped_by_its_budget, exact=True, time_limit=0.001, examples=10,
                                 processes=False)
    assert stops

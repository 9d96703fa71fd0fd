"""`check_conformance(..., time_limit=)` on an exact kernel: the limit is each call's, so the kernel may stop at it
(status 'time_limit') and its plan is still certified against the optimum.  Cause (probe57 C1): the suite imposed
the limit and then failed the kernel, declared exact, for the 'time_limit' status of an optimal plan."""

import pytest

from orchmllm.balancers.registry import get_algorithm
from orchmllm.testing import ConformanceError, check_conformance

EXACT = get_algorithm("exact")


def stopped_at_the_limit(problem):
    """orchmllm's exact kernel, reporting that it stopped at the time limit wherever one is set (its certificate
    dropped: the plan's status then stays 'time_limit' where the plain bound is below the optimum)."""
    result = EXACT(problem)
    return result if problem.time_limit is None else result._replace(status="time_limit", lower_bound=None)


def test_an_exact_kernel_stopped_at_the_suites_time_limit_conforms():
    report = check_conformance(stopped_at_the_limit, exact=True, time_limit=30.0, examples=5, processes=False,
                               constraints=())
    assert report.kinds


def test_without_a_time_limit_an_exact_kernel_must_prove_its_plans():
    def always_stopped(problem):
        return EXACT(problem)._replace(status="time_limit", lower_bound=None)

    with pytest.raises(ConformanceError, match="is declared exact but returned status time_limit"):
        check_conformance(always_stopped, exact=True, examples=5, processes=False, constraints=())

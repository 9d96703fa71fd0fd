"""A plugin kernel's result is checked alike on every path (probe56 F1, F2, N3): a `lower_bound` beyond float64 (a
Python int of 10**400) raised a raw OverflowError with no kernel named; under `sources=` a balancing kernel's status
went unread, and a micro-batch kernel's cells over the budget were re-dealt into a plan instead of refused.  A status
'time_limit' on a problem without a time limit is a plugin's own deadline: a plan of that status (probe57 P1)."""

import numpy as np
import pytest

from orchmllm import (ContextParallel, Pipeline, balance, balance_microbatches, register_algorithm,
                      register_microbatch_algorithm)
from orchmllm.balancers import registry
from orchmllm.balancers.microbatch.plan import MicroBatchResult
from orchmllm.balancers.problem import KernelResult

LENGTHS = [5, 4, 3, 3, 2, 1]
SOURCES = [0, 1, 0, 1, 0, 1]


def _round_robin(problem) -> np.ndarray:
    return np.arange(problem.num_items, dtype=np.int64) % problem.num_ranks


def _cells(problem, num_microbatches):
    """One item per cell in turn (rank fastest)."""
    cell = np.arange(problem.num_items, dtype=np.int64) % (num_microbatches * problem.num_ranks)
    return cell % problem.num_ranks, cell // problem.num_ranks



@pytest.fixture(scope="module", autouse=True)
def registered():
    """The kernels registered for this module's tests only (registered at import, they reached
    test_testing's conformance run of every registered algorithm)."""
    kernels = {
        "probe56_huge_bound": lambda problem: KernelResult(_round_robin(problem), lower_bound=10**400),
        "probe56_huge_negative_bound": lambda problem: KernelResult(_round_robin(problem), lower_bound=-10**400),
        "probe56_status_5": lambda problem: KernelResult(_round_robin(problem), status=5),
        "probe56_timed_out": lambda problem: KernelResult(_round_robin(problem), status="time_limit")}
    for name, kernel in kernels.items():
        register_algorithm(name, kernel)
    register_algorithm("probe56_huge_bound_exact",  # cross-examined by orchmllm's own plan before its plan is made
                       lambda problem: KernelResult(_round_robin(problem), lower_bound=10**400), exact=True)
    microbatch = {
        "probe56_mb_huge_bound": lambda problem, m: MicroBatchResult(*_cells(problem, m), lower_bound=10**400),
        "probe56_mb_timed_out": lambda problem, m: MicroBatchResult(*_cells(problem, m), status="time_limit"),
        "probe56_mb_over_budget": lambda problem, m: MicroBatchResult(  # every item on rank 0, micro-batches in turn
            np.zeros(problem.num_items, dtype=np.int64), np.arange(problem.num_items) % m)}
    for name, kernel in microbatch.items():
        register_microbatch_algorithm(name, kernel)
    yield
    with registry._lock:
        for name in (*kernels, "probe56_huge_bound_exact"):
            del registry._records[name]
        for name in microbatch:
            del registry._microbatch_records[name]


BEYOND = r"algorithm '{}' returned a lower_bound of magnitude about 2\*\*1329 \(int\), beyond float64"


SPLIT = ContextParallel(degrees=(1, 2), seconds_per_cost=1e-12)  # a unit of cost in FLOPs: the split pays


@pytest.mark.parametrize("name", ["probe56_huge_bound", "probe56_huge_negative_bound", "probe56_huge_bound_exact"])
@pytest.mark.parametrize("options", [{}, dict(sources=SOURCES), dict(groups=[0, 0, 1, 2, 3, 4]),
                                     dict(max_tokens_per_rank=12), dict(context_parallel=SPLIT)],
                         ids=["plain", "sources", "groups", "cap", "context-parallel"])
def test_a_balancing_bound_beyond_float64_names_the_kernel(name, options):
    with pytest.raises(RuntimeError, match=BEYOND.format(name)):
        balance(LENGTHS, 2, algorithm=name, **options)


@pytest.mark.parametrize("options", [dict(num_microbatches=3), {}, dict(sources=SOURCES, num_microbatches=3),
                                     dict(microbatch_overhead=2.5, num_microbatches=3),
                                     dict(pipeline=Pipeline(stages=2, schedule="1f1b"), num_microbatches=4)],
                         ids=["fixed-m", "free-m", "sources", "overhead", "pipeline"])
def test_a_microbatch_bound_beyond_float64_names_the_kernel(options):
    with pytest.raises(RuntimeError, match=BEYOND.format("probe56_mb_huge_bound")):
        balance_microbatches(LENGTHS, 2, max_tokens_per_microbatch=8, algorithm="probe56_mb_huge_bound", **options)


def test_a_balancing_status_is_checked_under_sources():
    for options in ({}, dict(sources=SOURCES)):
        with pytest.raises(RuntimeError, match=r"algorithm 'probe56_status_5' returned status 5; expected one of"):
            balance(LENGTHS, 2, algorithm="probe56_status_5", **options)


@pytest.mark.parametrize("options", [{}, dict(sources=SOURCES)], ids=["plain", "sources"])
def test_microbatch_cells_over_the_budget_are_refused_under_sources(options):
    with pytest.raises(RuntimeError, match=r"algorithm 'probe56_mb_over_budget' put \d+ tokens in cell \(rank 0, "
                                           r"micro-batch 0\), over max_tokens_per_microbatch=7"):
        balance_microbatches(LENGTHS, 2, max_tokens_per_microbatch=7, num_microbatches=3,
                             algorithm="probe56_mb_over_budget", **options)


def test_a_plugins_own_deadline_gives_a_plan_of_status_time_limit():
    """Regression (probe57 P1): a978616 refused a plugin's status 'time_limit' on a problem without `time_limit`,
    a false refusal of a valid plan where the plugin keeps a deadline of its own (training would stop on the hard
    steps only)."""
    for options in ({}, dict(sources=SOURCES), dict(time_limit=5.0)):
        plan = balance(LENGTHS, 2, algorithm="probe56_timed_out", **options)  # sources=: the locality pass's plan
        assert str(plan.status) == ("feasible" if "sources" in options else "time_limit")
        assert balance_microbatches(LENGTHS, 2, max_tokens_per_microbatch=8, num_microbatches=3,
                                    algorithm="probe56_mb_timed_out", **options).num_microbatches == 3

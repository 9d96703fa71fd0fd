"""A kernel's assignment is checked where `run_kernel` returns it, before any path reads it (probe53 F1), and
`balance(..., context_parallel=)` refuses the baseline it would not run (probe53 F2)."""

import numpy as np
import pytest

from orchmllm import CostModel, ContextParallel, Orchestrator, balance, register_algorithm
from orchmllm.balancers import KernelResult, registry
from orchmllm.orchestrator import Batch, Sample, Segment, Stage

MALFORMED = {
    "long": (lambda p: KernelResult(np.zeros(p.num_items + 1, np.int64)), r"shape \(7,\) and dtype int64"),
    "float": (lambda p: KernelResult(np.zeros(p.num_items) + 0.5), r"shape \(6,\) and dtype float64"),
    "far": (lambda p: KernelResult(np.full(p.num_items, 10**7, np.int64)), r"outside ranks \[0, 4\)"),
    "negative": (lambda p: KernelResult(np.full(p.num_items, -1, np.int64)), r"outside ranks \[0, 4\)"),
}


@pytest.fixture(scope="module", autouse=True)
def registered():
    """The kernels registered for this module's tests only: tests elsewhere run every registered algorithm."""
    kernels = {f"checked_{name}": kernel for name, (kernel, _) in MALFORMED.items()}
    kernels["checked_list"] = lambda p: KernelResult([i % p.num_ranks for i in range(p.num_items)])
    for name, kernel in kernels.items():
        register_algorithm(name, kernel)
    yield
    with registry._lock:
        for name in kernels:
            del registry._records[name]


@pytest.mark.parametrize("name", sorted(MALFORMED))
@pytest.mark.parametrize("sources", [None, [0, 1, 2, 3, 0, 1]], ids=["plain", "sources"])
def test_regression_a_malformed_assignment_under_sources_reached_numpy(name, sources):
    """Cause (probe53 F1): `balance(..., sources=)` handed the kernel's raw assignment to the communication-aware
    pass, which failed in numpy's bincount or reshape naming no algorithm (a rank of 10**7 first allocated memory
    in proportion to it); only `make_plan`, after that pass, checked it.  Now the same error with or without."""
    with pytest.raises(RuntimeError, match=rf"algorithm 'checked_{name}' .*{MALFORMED[name][1]}"):
        balance([5, 4, 3, 3, 2, 1], 4, algorithm=f"checked_{name}", sources=sources)


def test_a_kernel_returning_a_list_plans_with_sources_as_without():
    plain = balance([5, 4, 3, 3, 2, 1], 4, algorithm="checked_list")
    placed = balance([5, 4, 3, 3, 2, 1], 4, algorithm="checked_list", sources=[0, 1, 2, 3, 0, 1])
    assert placed.makespan == plain.makespan == 7.0


@pytest.mark.parametrize("stage", ["vision", "llm"])
def test_regression_the_orchestrators_locality_placement_read_a_malformed_assignment(stage):
    """The Orchestrator's default placement ("locality") is `balance(..., sources=)`: the same raw numpy errors."""
    samples = [Sample(100 + 10 * i, (Segment("image", 16, 5 + i),) if i % 2 else (), source=i % 4) for i in range(8)]
    stages = (Stage("vision", "image", CostModel(), input_bytes_per_unit=3.0, output_bytes_per_token=2.0,
                    algorithm="checked_far" if stage == "vision" else "auto"),
              Stage("llm", "llm", CostModel(linear=1.0, quadratic=0.01), input_bytes_per_unit=1.0,
                    algorithm="checked_far" if stage == "llm" else "auto"))
    with pytest.raises(RuntimeError, match=r"algorithm 'checked_far' assigned an item outside ranks \[0, 4\)"):
        Orchestrator(stages, 4).plan(Batch.from_samples(samples, 4))


def test_regression_the_baseline_under_context_parallel_returned_a_balanced_split_plan():
    """Cause (probe53 F2): with a giant, `algorithm="identity"` (the unbalanced baseline) returned the split
    planner's balanced plan, named "context_parallel", with no word.  Refused now; `balance` documents what
    `algorithm` means with `context_parallel`."""
    spec = ContextParallel(degrees=(1, 2, 4), seconds_per_cost=1.0)
    refusal = r"algorithm 'identity' is the unbalanced baseline.*without `context_parallel` \(or with degrees=\(1,\)\)"
    with pytest.raises(ValueError, match=refusal):
        balance([4000, 5, 4, 3, 3, 2, 1, 9], 4, cost=CostModel(linear=1.0, quadratic=0.01), algorithm="identity",
                context_parallel=spec)
    assert "context_parallel: an `orchmllm.ContextParallel`" in balance.__doc__

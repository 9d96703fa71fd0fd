"""Import time of the package against `import numpy, scipy.sparse`, which it cannot do without.

Issue 25's target: `import orchmllm` at most 2x the baseline.  `import orchmllm` loads its
names on first use, so what a user pays shows in `import orchmllm.balancers` (every solver)
and `from orchmllm import Orchestrator` (the planner: topology and orchestrator too).  Each sample is a fresh
interpreter timing one import statement in process (perf_counter around the `import`: interpreter start-up does not
count); the package's samples and the baseline's alternate, so the load of a shared machine
falls on both alike.  The figure is the ratio of the medians.  Each sample of the package
also checks that it loaded neither scipy.optimize nor PuLP (the exact solvers' stacks load
when an exact solver runs).

Run: python3.11 -m pytest benchmarks/bench_import.py --benchmark-only -q -s
"""

import statistics
import subprocess
import sys

import pytest

BASELINE = "import numpy, scipy.sparse"
PAIRS = 15
CODE = ("import sys, time\n"
        "start = time.perf_counter()\n"
        "{statement}\n"
        "seconds = time.perf_counter() - start\n"
        "print(seconds, any(m == 'pulp' or m.startswith('scipy.optimize') for m in sys.modules))\n")


def import_seconds(statement: str) -> tuple[float, bool]:
    """Seconds `statement` takes in a fresh interpreter, and whether it loaded an exact solver's stack."""
    seconds, loaded = subprocess.run([sys.executable, "-c", CODE.format(statement=statement)], capture_output=True,
                                     text=True, check=True).stdout.split()
    return float(seconds), loaded == "True"


@pytest.mark.parametrize("statement", ["import orchmllm", "import orchmllm.balancers",
                                       "from orchmllm import Orchestrator"])
def test_import_time_over_numpy_scipy_sparse(benchmark, statement):
    ours, baseline = [], []

    def pair():
        seconds, loaded = import_seconds(statement)
        assert not loaded, f"`{statement}` loaded scipy.optimize or PuLP"
        ours.append(seconds)
        baseline.append(import_seconds(BASELINE)[0])

    benchmark.pedantic(pair, rounds=PAIRS, iterations=1)
    ratio = statistics.median(ours) / statistics.median(baseline)
    benchmark.extra_info.update(package_seconds=statistics.median(ours), baseline_seconds=statistics.median(baseline),
                                ratio=ratio, target=2.0)
    print(f"\n{statement}: {statistics.median(ours) * 1e3:.0f} ms, {BASELINE}: "
          f"{statistics.median(baseline) * 1e3:.0f} ms (medians of {PAIRS} alternating pairs): ratio {ratio:.2f} "
          f"(target <= 2)")

"""Benchmark options (heavy sizes run only with --heavy) and the shared timing helper."""

import math
import time

import pytest


def pytest_addoption(parser):
    parser.addoption("--heavy", action="store_true", default=False,
                     help="also run the large benchmark sizes (minutes)")


@pytest.fixture
def best_of():
    """best_of(fn, repeats, timer=time.perf_counter): the best of `repeats` timed calls.

    The minimum is the steadiest figure on a shared machine; pass time.process_time to
    time CPU seconds (same-run baselines of pure-Python code).
    """
    def run(fn, repeats, timer=time.perf_counter):
        best = math.inf
        for _ in range(repeats):
            start = timer()
            fn()
            best = min(best, timer() - start)
        return best

    return run

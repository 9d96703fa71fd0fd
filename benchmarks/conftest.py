"""Benchmark options (heavy sizes run only with --heavy) and the shared timing helpers."""

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


@pytest.fixture
def alternated_cpu():
    """alternated_cpu(run, baseline, rounds=5): the CPU seconds (time.process_time) of `run` and of
    `baseline`, one warm-up call each, then `rounds` calls of each alternated (the order swapped every
    round) in this process, so that a shared machine's load falls on both alike; two lists.
    """
    def run_both(run, baseline, rounds=5):
        own, base = [], []
        run(), baseline()
        for i in range(rounds):
            for call, out in ((run, own), (baseline, base)) if i % 2 == 0 else ((baseline, base), (run, own)):
                start = time.process_time()
                call()
                out.append(time.process_time() - start)
        return own, base

    return run_both

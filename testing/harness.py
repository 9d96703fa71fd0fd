"""What the conformance suites share: their error, Hypothesis settings, argument checks and the
determinism checks that run outside Hypothesis (call after call, and in other processes).

A suite's target has a `name`, `run(case)` (the certified plan, a refusal, or None) and
`describe(case)`; cases are picklable, and so is the target when its kernel is importable.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from hypothesis import HealthCheck, Phase, example, settings
from hypothesis.errors import FlakyFailure

from ..balancers import InfeasibleError, Status
from ..balancers.validation import as_bool, as_int, as_real

REPEAT_CALLS = 700
"""Kernel calls of the repeat check, spread over its seeded cases.  A kernel whose plan differs
from its usual one in a fraction p of calls, independently, passes with probability at most
(1 - p)**(REPEAT_CALLS - cases): 0.1 % at p = 1 % (detection 99.9 %), 1e-6 at p = 2 %."""

REPEAT_CASES = 10
"""Seeded inputs of the repeat check (2 to 2 · max_items items, 2 to max_ranks ranks)."""

PROCESS_CASES = 8
"""Seeded inputs whose plans are compared across processes."""

STOPPED_SHARE = 0.5
"""An exact kernel's `time_limit` status counts as a stop at the suite's limit where its call ran at least this share
of the limit (wall clock, as the exact kernels' deadlines are), or where the registry's exact solver does not prove
the case within the same limit either (a kernel whose budget is work, not seconds, may stop sooner on a fast
machine).  probe58 C2: any `time_limit` status passed, so a kernel declared exact that returned LPT's plan "stopped"
after 1 ms of a 30 s limit conformed."""


class ConformanceError(AssertionError):
    """A kernel broke a property; the message names it, the input and what was seen."""


@dataclass(frozen=True)
class SuiteReport:
    """What every conformance suite reports checking (all of it passed): the algorithm, the kinds of
    batch it ran on, the plans it certified and those it proved optimal; each suite adds its counts."""

    algorithm: str
    kinds: tuple[str, ...]
    plans_certified: int
    plans_optimal: int

    def to_json(self) -> dict:
        return asdict(self)


class SuiteTarget:
    """The kernel under test, its name, and what it declares (padded/unpadded kinds, exact); each
    suite's target adds how it runs a case.  `lookup` resolves a registered name; `signature` says
    what else `algorithm_or_kernel` may be."""

    def __init__(self, target, lookup, signature: str, padded, exact, time_limit):
        if isinstance(target, str):
            target = lookup(target, "algorithm_or_kernel")
        if not callable(target):
            raise TypeError(f"`algorithm_or_kernel` must be {signature}; got {type(target).__name__}")
        self.kernel = target
        self.name = getattr(target, "name", getattr(target, "__name__", type(target).__name__))
        declared = [kind for kind in (False, True) if getattr(target, "padded" if kind else "unpadded", True)]
        padded = None if padded is None else as_bool(padded, "padded")
        if padded is not None and padded not in declared:
            kind = "padded" if padded else "unpadded"
            raise ValueError(f"`padded`={padded}: algorithm {self.name!r} does not solve {kind} problems (its record "
                             f"says {kind}=False); pass padded={not padded}, or None for the kinds it declares")
        self.kinds = declared if padded is None else [padded]
        self.exact = getattr(target, "exact", False) if exact is None else as_bool(exact, "exact")
        self.time_limit = time_limit
        self.seconds = 0.0

    def timed(self, call, *args):
        """`call(*args)`, its wall time kept in `seconds`: certify a plan right after the call that made it."""
        started = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.seconds = time.perf_counter() - started

    def provable(self, case) -> bool:
        """Whether the registry's exact solver proves `case` within the suite's `time_limit` (each suite's own)."""
        raise NotImplementedError

    def unproved(self, status: Status, case) -> str | None:
        """None where an exact kernel's `status`, of its last call on `case`, is optimal, or `time_limit` from a real
        stop at the suite's own `time_limit` (`STOPPED_SHARE`; probe57 C1: the kernel was blamed for the suite's
        limit); else what it returned, for the ConformanceError."""
        if status is Status.OPTIMAL:
            return None
        if status is not Status.TIME_LIMIT or self.time_limit is None:
            return f"returned status {status}"
        if self.seconds >= STOPPED_SHARE * self.time_limit or not self.provable(case):
            return None
        return (f"returned status time_limit after {self.seconds:.3g} s of its time_limit={self.time_limit} s (a "
                f"stop at the limit runs for at least {STOPPED_SHARE:g} of it, and the exact solver proves this case "
                f"within the limit)")


def check_suite_arguments(max_items, max_ranks, examples, processes, time_limit) -> tuple:
    """(max_items, max_ranks, examples, processes, time_limit) checked: ValueError / TypeError
    naming the argument, before Hypothesis sees them."""
    return (as_int(max_items, "max_items", minimum=1), as_int(max_ranks, "max_ranks", minimum=1),
            as_int(examples, "examples", minimum=1), as_bool(processes, "processes"),
            None if time_limit is None else as_real(time_limit, "time_limit", allow_zero=False))


def suite_settings(examples: int) -> settings:
    """Derandomized, no deadline, no database: the same examples on every run."""
    return settings(max_examples=examples, derandomize=True, database=None, deadline=None, report_multiple_bugs=False,
                    phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))


def with_examples(cases):
    """Hypothesis's `example` decorators of `cases`: inputs a property runs first, every time."""
    def decorate(test):
        for case in cases:
            test = example(case)(test)
        return test
    return decorate


def _first(group: BaseExceptionGroup) -> ConformanceError:
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


def run_properties(properties) -> None:
    """Run each Hypothesis property; a failure Hypothesis cannot reproduce (a kernel that fails
    and passes on the same input) is reported by its ConformanceError, not as FlakyFailure."""
    for run_property in properties:
        try:
            run_property()
        except FlakyFailure as flaky:
            found = flaky.subgroup(ConformanceError)
            if found is None:
                raise
            raise _first(found) from None


def fingerprint(outcome) -> tuple:
    """What must be bit-identical for the same input: the refusal, no packing, or the plan and
    its loads.

    The certificate (status, bound) is left out: a MILP stopped by its wall-clock time limit
    (`ilp`) may return the same plan with another proven bound from run to run, and such a stop
    is marked (`STOPPED`): where it stops depends on the clock, so its plan may differ from another
    run's (`same`; the runtime has every rank follow rank 0's plan there)."""
    if isinstance(outcome, InfeasibleError):
        return ("infeasible", outcome.min_cap, str(outcome))
    if outcome is None:
        return ("no packing",)
    loads = outcome.loads if hasattr(outcome, "loads") else outcome.cell_loads
    return (STOPPED if outcome.status is Status.TIME_LIMIT else "plan", outcome.digest(), loads.tobytes().hex())


STOPPED = "plan stopped by its time limit"


def same(one: tuple, other: tuple) -> bool:
    """Whether two runs' fingerprints agree: equal, or either a plan stopped by the clock."""
    return one == other or STOPPED in (one[0], other[0])


def check_repeats(target, cases, calls: int = REPEAT_CALLS) -> int:
    """Run every case calls / len(cases) times and raise ConformanceError unless every run gives
    the first's plan; returns the calls made.

    Outside Hypothesis on purpose: it reseeds Python's and numpy's global generators for every
    example, so a kernel drawing from them repeats its draws there and looks deterministic."""
    runs = -(-calls // len(cases))
    for case in cases:
        first = fingerprint(target.run(case))
        for run in range(2, runs + 1):
            other = fingerprint(target.run(case))
            if not same(other, first):
                raise ConformanceError(f"{target.name} is not deterministic: call {run} of {runs} on the same input "
                                       f"gave {other[:2]}, the first call {first[:2]}; input {target.describe(case)}")
    return runs * len(cases)


def fingerprints(target, cases) -> list[tuple]:
    return [fingerprint(target.run(case)) for case in cases]


UNPICKLING_FAILED = 3  # the child's exit status when it cannot rebuild the target


def child_main() -> None:
    """Entry of the process that recomputes the fingerprints (input pickled on stdin)."""
    try:
        target, cases = pickle.load(sys.stdin.buffer)
    except Exception as error:  # the kernel's module (or __main__) has no such name here
        sys.stderr.write(f"{type(error).__name__}: {error}")
        sys.exit(UNPICKLING_FAILED)
    json.dump(fingerprints(target, cases), sys.stdout)


def _not_importable(name: str, why: str) -> TypeError:
    return TypeError(f"cannot check {name} across processes: {why}; define the kernel in a module another process "
                     f"can import (not __main__: a script or an interactive session), or pass processes=False")


def compare_processes(target, cases) -> int:
    """Raise ConformanceError unless two other processes, with fixed and different hash seeds,
    compute the same fingerprints of `cases`; returns the cases compared.

    Whatever this process's seed, a kernel that depends on it differs between the two children
    on the same cases every time (no lucky agreement).  The kernel travels pickled by reference:
    one another process cannot import is a TypeError saying so."""
    try:
        payload = pickle.dumps((target, cases))
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise _not_importable(target.name, f"its kernel cannot be pickled ({error})") from None
    # Both children start at once: each spends most of its time importing, which they then do side by side.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    children, results = {}, {}
    try:
        for seed in ("1", "2"):
            children[seed] = subprocess.Popen([sys.executable, "-c", "from orchmllm.testing.harness import "
                                               "child_main; child_main()"], stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              env={**env, "PYTHONHASHSEED": seed})
        for seed, child in children.items():
            out, err = child.communicate(payload, timeout=600)
            if child.returncode == UNPICKLING_FAILED:
                raise _not_importable(target.name, f"another process could not import its kernel "
                                                   f"({err.decode()[-500:]})")
            if child.returncode:
                raise ConformanceError(f"{target.name}: the process with PYTHONHASHSEED={seed} failed:\n"
                                       f"{err.decode()[-2000:]}")
            results[seed] = [tuple(item) for item in json.loads(out)]
    finally:  # a child left by an error (its sibling's failure, a timeout, a failed start) does not outlive the call
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.communicate()  # reaped, its pipes closed
    for case, mine, first, second in zip(cases, fingerprints(target, cases), results["1"], results["2"]):
        for seed, other in (("1", first), ("2", second)):
            if not same(mine, other):
                raise ConformanceError(f"{target.name} is not deterministic across processes: {mine[:2]} here, "
                                       f"{other[:2]} in a process with PYTHONHASHSEED={seed}; input "
                                       f"{target.describe(case)}")
    return len(cases)

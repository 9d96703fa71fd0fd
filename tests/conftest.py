"""Shared test configuration: the toolkit's deterministic Hypothesis profile by default; `side_by_side` and
`planned_passes` fixtures."""

import subprocess

import pytest

from orchmllm.testing import load_profile

load_profile()


@pytest.fixture
def side_by_side():
    """Run commands at once (each spends most of its time importing torch or orchmllm), each as `subprocess.run`
    with captured text would: their CompletedProcess, in order.  Any still running when the test ends (a failed
    assertion, a timeout) is killed and reaped."""
    started = []

    def run(commands: list, timeout: float = 120) -> list:
        first = len(started)
        for command in commands:
            started.append(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        done = []
        for command, child in zip(commands, started[first:]):
            out, err = child.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(command, child.returncode, out, err))
        return done

    yield run
    for child in started:
        if child.poll() is None:
            child.kill()
            child.communicate()


@pytest.fixture
def planned_passes(monkeypatch):
    """The item counts of the CP micro-batch planner's pass plans (`_plan_pass` calls), in order, as the test runs."""
    from orchmllm.balancers.context_parallel import microbatch

    calls, plan_pass = [], microbatch._plan_pass

    def counted(lengths, items, *args):
        calls.append(items.size)
        return plan_pass(lengths, items, *args)

    monkeypatch.setattr(microbatch, "_plan_pass", counted)
    return calls

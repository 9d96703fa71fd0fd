"""Shared test configuration: the toolkit's deterministic Hypothesis profile by default; the `started_early` and
`planned_passes` fixtures."""

import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from orchmllm.testing import load_profile

load_profile()


EARLY = pytest.StashKey[dict]()


def pytest_configure(config):
    config.addinivalue_line("markers", "early(name): the test reads the result of its module's `EARLY[name]` "
                                       "command, started in the background once collection ends (`started_early`)")


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only the selected tests' commands start
def pytest_collection_modifyitems(config, items):
    """Start the selected tests' `early` commands, one at a time in their tests' order, on a thread of this process:
    each is a process importing torch and running ranks, which then runs on the core this process leaves idle
    through the tests before it, instead of at its test with this process waiting."""
    marked = [(item.module, marker.args[0]) for item in items for marker in item.iter_markers("early")]
    if not marked or config.option.collectonly:
        return
    modules = {module.__name__: module for module, _ in marked}
    names = dict.fromkeys((module.__name__, name) for module, name in marked)
    pool, children = ThreadPoolExecutor(max_workers=1), []

    def run(command: dict) -> subprocess.CompletedProcess:
        options = {key: value for key, value in command.items() if key not in ("args", "timeout")}
        child = subprocess.Popen(command["args"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)
        children.append(child)
        try:
            out, err = child.communicate(timeout=command["timeout"])
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
        return subprocess.CompletedProcess(command["args"], child.returncode, out, err)

    config.stash[EARLY] = (pool, children, {(module, name): pool.submit(run, modules[module].EARLY[name])
                                            for module, name in names})


def pytest_unconfigure(config):
    """What still runs when the session ends (an interrupted run, a failed test's unread result) is killed."""
    pool, children, _ = config.stash.get(EARLY, (None, [], {}))
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
    for child in children:
        if child.poll() is None:
            child.kill()
            child.communicate()


@pytest.fixture
def started_early(request):
    """`started_early(name)`: the CompletedProcess of the test module's `EARLY[name]` command (a dict of
    `subprocess.Popen` options with `args` and `timeout`), which the test's `@pytest.mark.early(name)` started when
    collection ended."""
    def result(name: str) -> subprocess.CompletedProcess:
        return request.config.stash[EARLY][2][request.module.__name__, name].result()
    return result


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

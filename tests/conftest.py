"""Shared test configuration: the toolkit's deterministic Hypothesis profile by default; the `started_early`,
`background` and `planned_passes` fixtures."""

import importlib
import inspect
import json
import subprocess
import sys
import tempfile
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchmllm.testing import load_profile

load_profile()


EARLY = pytest.StashKey[dict]()
EARLY_TIMEOUT = 300
"""Seconds an `early` command may run unless its module says otherwise."""
BACKGROUND = "background checks"
"""The `early` command a module need not write: its `BACKGROUND` checks ({name: function}: the bodies of tests
bound by rank starts or by timeouts they wait out) one after another in one process (`run_background`), each test
reading its own check's outcome (`background`)."""
BACKGROUND_TIMEOUT = 2 * EARLY_TIMEOUT
"""Seconds a module's background checks may take together (each of them bounds its own ranks' waits)."""
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    config.addinivalue_line("markers", "early(name): the test reads the result of its module's `EARLY[name]` "
                                       "command, started in the background once collection ends (`started_early`)")


@pytest.hookimpl(tryfirst=True)  # after collection and every deselection (-k, -m, --lf, stepwise): the run's items
def pytest_runtestloop(session):
    """Start the `early` commands of the tests that will run, one at a time in their tests' order, on a thread of
    this process: each is a process importing torch and running ranks, which then runs on the core this process
    leaves idle through the tests before it, instead of at its test with this process waiting.  None starts for a
    test skipped by a marker, under --collect-only or --benchmark-only."""
    config = session.config
    if config.option.collectonly or config.getoption("benchmark_only", False):
        return
    marked = [(item.module, marker.args[0]) for item in session.items if not _skipped(item)
              for marker in item.iter_markers("early")]
    if not marked:
        return
    commands = {(module.__name__, name): module for module, name in marked}
    pool, children, lock, stopping = ThreadPoolExecutor(max_workers=1), [], threading.Lock(), threading.Event()

    def run(module, name: str) -> subprocess.CompletedProcess:
        command = getattr(module, "EARLY", {}).get(name)
        if command is None and name == BACKGROUND and hasattr(module, "BACKGROUND"):  # imported as `tests.<name>`
            command = {"args": ("-c", "import sys; from tests.conftest import run_background; run_background("
                                      "sys.argv[1])", f"tests.{Path(module.__file__).stem}"), "cwd": ROOT,
                       "timeout": BACKGROUND_TIMEOUT}
        if command is None:
            raise LookupError(f"@pytest.mark.early({name!r}): {module.__name__} has no EARLY[{name!r}] command")
        options = {"timeout": EARLY_TIMEOUT, **getattr(module, "EARLY_OPTIONS", {}),
                   **(command if isinstance(command, dict) else {"args": command})}
        args, timeout = [sys.executable, *options.pop("args")], options.pop("timeout")
        with lock:  # none starts once the session ends (pytest_unconfigure kills what started)
            if stopping.is_set():
                raise RuntimeError("the test session ended before this command started")
            child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     **options)
            children.append(child)
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
        return subprocess.CompletedProcess(args, child.returncode, out, err)

    config.stash[EARLY] = (pool, children, lock, stopping,
                           {key: pool.submit(run, module, key[1]) for key, module in commands.items()})


def _skipped(item) -> bool:
    """Whether a `skip` or `skipif` marker skips `item` (its command would start for nothing)."""
    return item.get_closest_marker("skip") is not None or any(
        marker.args and all(isinstance(arg, bool) for arg in marker.args) and any(marker.args)
        or marker.kwargs.get("condition") is True for marker in item.iter_markers("skipif"))


def pytest_unconfigure(config):
    """What still runs when the session ends (an interrupted run, a failed test's unread result) is killed; the
    pool's thread reads its own child's pipes (reading them here too races it)."""
    pool, children, lock, stopping, _ = config.stash.get(EARLY, (None,) * 5)
    if pool is None:
        return
    pool.shutdown(wait=False, cancel_futures=True)
    with lock:
        stopping.set()
        for child in children:
            if child.poll() is None:
                child.kill()
    pool.shutdown(wait=True)


@pytest.fixture
def started_early(request):
    """`started_early(name)`: the CompletedProcess of the test module's `EARLY[name]` command (a dict of
    `subprocess.Popen` options with `args` and `timeout`), which the test's `@pytest.mark.early(name)` started when
    collection ended."""
    def result(name: str) -> subprocess.CompletedProcess:
        return request.config.stash[EARLY][4][request.module.__name__, name].result()
    return result


def run_background(module_name: str) -> None:
    """The `BACKGROUND` command's body: every check of `module_name`'s `BACKGROUND`, its traceback (None where it
    passed), as JSON on the last line of stdout.  A check with a `tmp_path` parameter gets a fresh empty folder, as
    pytest's fixture."""
    outcomes = {}
    for name, check in importlib.import_module(module_name).BACKGROUND.items():
        try:
            with tempfile.TemporaryDirectory() as folder:
                check(**{"tmp_path": Path(folder)} if "tmp_path" in inspect.signature(check).parameters else {})
            outcomes[name] = None
        except KeyboardInterrupt:
            raise
        except pytest.skip.Exception as skip:
            outcomes[name] = ["skipped", str(skip)]
        except BaseException:  # each check's own failure, for its test: pytest.raises' "DID NOT RAISE" (a
            outcomes[name] = ["failed", traceback.format_exc()]  # BaseException) too, the checks after it still run
    print(f"\n{json.dumps(outcomes)}")  # a line of its own whatever a check's processes printed


@pytest.fixture
def background(started_early):
    """`background(name)`: fails with the traceback of the module's `BACKGROUND[name]` check where it failed (its
    test marked `@pytest.mark.early("background checks")`)."""
    def check(name: str) -> None:
        done = started_early(BACKGROUND)
        assert done.returncode == 0, done.stderr
        outcome = json.loads(done.stdout.splitlines()[-1])[name]
        if outcome is not None and outcome[0] == "skipped":
            pytest.skip(outcome[1])
        if outcome is not None:
            pytest.fail(f"the background check {name!r} failed:\n{outcome[1]}", pytrace=False)
    return check


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

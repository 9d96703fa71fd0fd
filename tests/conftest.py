"""Shared test configuration: the toolkit's deterministic Hypothesis profile by default; `early` commands and
`background` tests; the `started_early` and `planned_passes` fixtures."""

import ast
import contextlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from _pytest.assertion.rewrite import rewrite_asserts

from orchmllm.testing import load_profile

load_profile()


EARLY = pytest.StashKey[dict]()
EARLY_TIMEOUT = 300
"""Seconds an `early` command may run unless its module says otherwise."""
BACKGROUND = "background tests"
"""The `early` command a module need not write: its tests marked `background` (long ones: rank starts, timeouts
waited out, long in-process searches, which then run on the core this process leaves idle) that will run, one
after another in one process (`run_background`); each test, in this process, reads its own outcome instead of
running its body (`pytest_pyfunc_call`).  Such a test must not depend on what other tests leave behind."""
BACKGROUND_TIMEOUT = 2 * EARLY_TIMEOUT
"""Seconds a module's background tests may take together (each of them bounds its own ranks' waits); a test that
reads their outcome waits up to that long (its own timeout mark), and a command past it names the test it was
running (the `STARTING` line it wrote to stderr)."""
STARTING = "background test starting: "
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    config.addinivalue_line("markers", "early(name): the test reads the result of its module's `EARLY[name]` "
                                       "command, started in the background once collection ends (`started_early`)")
    config.addinivalue_line("markers", "background: the test's body runs in its module's background process, "
                                       "started once collection ends; the test reads its outcome (parameters: JSON "
                                       "values; fixtures: tmp_path only)")


@pytest.hookimpl(tryfirst=True)  # after collection and every deselection (-k, -m, --lf, stepwise): the run's items
def pytest_runtestloop(session):
    """Start the `early` commands of the tests that will run, one at a time in their tests' order, on a thread of
    this process: each is a process (ranks, a module's background tests), which then runs on the core this process
    leaves idle through the tests before it, instead of at its test with this process waiting.  None starts for a
    test skipped by a marker, under --collect-only or --benchmark-only."""
    config = session.config
    if config.option.collectonly or config.getoption("benchmark_only", False):
        return
    running = [item for item in session.items if not _skipped(item)]
    background = {}  # {module: [[test name, function name, parameters]]}: what each background process runs
    refused = [f"{item.nodeid}: {why}" for item in running if item.get_closest_marker("background") is not None
               and (why := _background_refusal(item))]
    if refused:
        raise pytest.UsageError("@pytest.mark.background runs a test's bare function in another process, which "
                                "would drop what pytest wraps around it:\n" + "\n".join(refused))
    for item in running:
        if item.get_closest_marker("background") is not None:
            parameters = getattr(item, "callspec", None)
            background.setdefault(item.module, []).append(
                [item.name, item.originalname, parameters.params if parameters is not None else {}])
            item.add_marker(pytest.mark.timeout(BACKGROUND_TIMEOUT + EARLY_TIMEOUT))  # it waits for its module's
    marked = [(item.module, marker.args[0] if marker.name == "early" else BACKGROUND) for item in running
              for marker in item.iter_markers() if marker.name in ("early", "background")]
    if not marked:
        return
    commands = {(module.__name__, name): module for module, name in marked}
    pool, children, lock, stopping = ThreadPoolExecutor(max_workers=1), [], threading.Lock(), threading.Event()
    filters = [*config.getini("filterwarnings"), *(config.known_args_namespace.pythonwarnings or [])]  # as pytest's

    def run(module, name: str) -> subprocess.CompletedProcess:
        command = getattr(module, "EARLY", {}).get(name)
        if command is None and name == BACKGROUND:  # imported as `tests.<name>`, as spawned ranks import it
            command = {"args": (*(f"-W{spec}" for spec in filters), "-c",
                                "import sys; from tests.conftest import run_background; run_background("
                                "sys.argv[1], sys.argv[2])", f"tests.{Path(module.__file__).stem}",
                                json.dumps(background[module])), "cwd": ROOT, "timeout": BACKGROUND_TIMEOUT}
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
            err = child.communicate()[1]
            started = [line for line in err.splitlines() if line.startswith(STARTING)]
            raise RuntimeError(f"{module.__name__}'s {name!r} command ran past {timeout} s" + (
                f"; the test running then: {started[-1][len(STARTING):]}" if started else "")) from None
        return subprocess.CompletedProcess(args, child.returncode, out, err)

    config.stash[EARLY] = (pool, children, lock, stopping,
                           {key: pool.submit(run, module, key[1]) for key, module in commands.items()})


BACKGROUND_MARKS = {"background", "parametrize", "skip", "skipif", "hypothesis"}
"""The marks a background test may carry: the others (filterwarnings, timeout, xfail, usefixtures) act in this
process only, and a background test would pass where it fails (rev55 F2)."""


def _background_refusal(item) -> str | None:
    """Why `item` cannot run in a background process as it would here, or None."""
    parameters = getattr(item, "callspec", None)
    parameters = parameters.params if parameters is not None else {}
    if not inspect.isfunction(item.obj) or inspect.iscoroutinefunction(item.obj) or inspect.isgeneratorfunction(
            item.obj) or item.cls is not None:
        return "only a plain module-level function (not a method, coroutine or generator) runs in the background"
    if fixtures := sorted(set(item.fixturenames) - {"tmp_path", "tmp_path_factory", "request", *parameters}):
        return f"fixtures {fixtures}: only tmp_path is given in the background"
    if marks := sorted({mark.name for mark in item.iter_markers()} - BACKGROUND_MARKS):
        return f"marks {marks} act in this process only (allowed: {sorted(BACKGROUND_MARKS)})"
    for name, value in parameters.items():
        try:
            back = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            back = None
        if back != value or type(back) is not type(value):
            return f"parameter {name}={value!r} does not survive JSON (str, int, float, bool, None, lists, dicts)"
    return None


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


def run_background(module_name: str, tests: str) -> None:
    """The `BACKGROUND` command's body: the tests of `module_name` named in `tests` (JSON: [[test name, function
    name, parameters]]); on the last two lines of stdout, as JSON, what each printed (its file descriptors 1 and 2,
    its ranks' too) and each outcome (None where it passed).  The module is imported with pytest's assertion
    rewriting (a failed assert shows its values); a test with a `tmp_path` parameter gets a fresh empty folder, as
    pytest's fixture."""
    module, outcomes, printed = _rewritten(module_name), {}, {}
    for name, function, parameters in json.loads(tests):
        print(f"{STARTING}{name}", file=sys.stderr, flush=True)  # named if the whole command times out
        test = getattr(module, function)
        with _captured() as output:
            try:
                with tempfile.TemporaryDirectory() as folder:
                    test(**parameters, **{"tmp_path": Path(folder)} if "tmp_path" in inspect.signature(
                        test).parameters else {})
                outcomes[name] = None
            except KeyboardInterrupt:
                raise
            except pytest.skip.Exception as skip:
                outcomes[name] = ["skipped", str(skip)]
            except BaseException:  # each test's own failure: pytest.raises' "DID NOT RAISE" (a BaseException) too,
                outcomes[name] = ["failed", traceback.format_exc()]  # the tests after it still run
        printed[name] = output[0]
    print(f"\n{json.dumps(printed)}\n{json.dumps(outcomes)}")


@contextlib.contextmanager
def _captured():
    """What the body prints to file descriptors 1 and 2 (child processes included), as `[text]` once it ends."""
    output = [""]
    with tempfile.TemporaryFile() as sink:
        sys.stdout.flush(), sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(sink.fileno(), 1), os.dup2(sink.fileno(), 2)
        try:
            yield output
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
            sink.seek(0)
            output[0] = sink.read().decode(errors="replace")


def _rewritten(module_name: str):
    """`module_name` imported from its file with its asserts rewritten as pytest rewrites a test module's."""
    spec = importlib.util.find_spec(module_name)
    source = Path(spec.origin).read_bytes()
    tree = ast.parse(source, spec.origin)
    rewrite_asserts(tree, source, spec.origin)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before its body runs: dataclasses and pickled functions look it up
    exec(compile(tree, spec.origin, "exec", dont_inherit=True), module.__dict__)
    return module


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A `background` test reads the outcome its module's background process recorded instead of running its
    body here: a failure shows that process's traceback, and what the body printed is this test's output
    (rev55 N0: it was lost)."""
    if pyfuncitem.get_closest_marker("background") is None:
        return None
    done = pyfuncitem.config.stash[EARLY][4][pyfuncitem.module.__name__, BACKGROUND].result()
    assert done.returncode == 0, done.stderr
    printed, outcomes = (json.loads(line) for line in done.stdout.splitlines()[-2:])
    sys.stdout.write(printed[pyfuncitem.name])  # pytest's "Captured stdout call" of this test
    outcome = outcomes[pyfuncitem.name]
    if outcome is not None and outcome[0] == "skipped":
        pytest.skip(outcome[1])
    if outcome is not None:
        pytest.fail(f"{pyfuncitem.name} failed in the background process:\n{outcome[1]}", pytrace=False)
    return True


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


@pytest.fixture
def fewer_start_off(monkeypatch):
    """A call keeps a pipeline test to the path it pins: on its instance the start on fewer micro-batches
    (`balancers/pipeline/fewer.py`, fd730f9) would meet the bound first and end the planning there.  Undone by
    `monkeypatch.undo()`: call it again after one."""
    return lambda: monkeypatch.setattr("orchmllm.balancers.pipeline.fewer.fewer_start", lambda *args: None)

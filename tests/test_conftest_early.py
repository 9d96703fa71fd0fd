"""conftest's `early` commands (review rev49 F1, F2, F4), in a pytest process of their own over a copy of it: a
command starts only for a test that will run, a mark naming no command fails its test alone, and a session ended
while a command runs kills it and exits with the tests' own status; `background` tests (rev53 F2, F4, F6) run only
where selected, each read by its own test, a failed assert showing its values and what the test printed."""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import run_background

CONFTEST = Path(__file__).with_name("conftest.py")

TESTS = '''
import pathlib, sys, time, pytest

@pytest.mark.background
@pytest.mark.parametrize("size", [3])
def test_background_passes(size, tmp_path):
    assert size == 3 and list(tmp_path.iterdir()) == []

@pytest.mark.background
def test_background_fails():
    print("the diagnosis it printed")
    assert [1, 2] == [1, 3]

@pytest.mark.background
def test_background_deselected():
    pathlib.Path("started_deselected").touch()

def touch(name):
    return ("-c", f"import pathlib; pathlib.Path({name!r}).touch()")

EARLY = {"skipped": touch("started_skipped"), "ran": touch("started_ran"),
         "long": ("-c", "import time; time.sleep(240)")}

@pytest.mark.skip(reason="never runs")
@pytest.mark.early("skipped")
def test_skipped(started_early):
    started_early("skipped")

@pytest.mark.early("ran")
def test_ran(started_early):
    assert started_early("ran").returncode == 0

@pytest.mark.early("no such command")
def test_typo(started_early):
    started_early("no such command")

@pytest.mark.early("long")
def test_long_then_fails(started_early):
    time.sleep(1)
    assert False
'''


@pytest.mark.background
def test_early_commands_start_for_running_tests_only_and_die_with_the_session(tmp_path):
    """A pytest process of its own (in conftest's background process: another process waits for it), over
    tests/conftest.py and tests/test_early.py: the background process imports `tests.test_early` from there."""
    (tmp_path / "tests").mkdir()
    shutil.copy(CONFTEST, tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_early.py").write_text(TESTS)
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_early.py",
                             "-k", "not deselected"], cwd=tmp_path, capture_output=True, text=True, timeout=200)
    assert time.monotonic() - began < 150, "the 240 s command outlived the session"
    assert result.returncode == 1, result.stdout + result.stderr
    assert "3 failed, 2 passed, 1 skipped, 1 deselected" in result.stdout, result.stdout
    assert "has no EARLY['no such command'] command" in result.stdout
    assert "test_background_fails failed in the background process" in result.stdout
    assert "assert [1, 2] == [1, 3]" in result.stdout, result.stdout
    assert "the diagnosis it printed" in result.stdout, result.stdout  # rev55 N0: a background test's output was lost
    assert "INTERNALERROR" not in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "started_ran").exists() and not (tmp_path / "started_skipped").exists()
    assert not (tmp_path / "started_deselected").exists()


PROBE = '''import pytest
def test_raises():
    with pytest.raises(ValueError):
        pass
def test_skips():
    pytest.skip("no such device")
def test_passes():
    pass
def test_fails():
    assert [1, 2] == [1, 3]
def test_unselected():
    raise SystemExit("ran unselected")
'''


def test_regression_a_check_whose_raises_saw_nothing_ended_the_other_checks(tmp_path, monkeypatch, capsys):
    """Cause (rev53 F2): `run_background` caught Exception only; pytest.raises' "DID NOT RAISE" (an outcome
    exception, a BaseException) ended the process, so the checks after it never ran and every test of the module
    failed with the same stderr.  Now each test has its own outcome; a skip is a skip.  Cause (rev53 F4): the
    module ran without pytest's assertion rewriting, so a failed assert said "AssertionError" and no values.
    Cause (rev53 F6): every check of a module's `BACKGROUND` ran, also one that no test read."""
    (tmp_path / "background_probe.py").write_text(PROBE)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_background("background_probe", json.dumps([[name, name, {}] for name in (
        "test_raises", "test_skips", "test_passes", "test_fails")]))
    outcomes = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert outcomes["test_raises"][0] == "failed" and "DID NOT RAISE" in outcomes["test_raises"][1]
    assert outcomes["test_skips"] == ["skipped", "no such device"] and outcomes["test_passes"] is None
    assert outcomes["test_fails"][0] == "failed" and "assert [1, 2] == [1, 3]" in outcomes["test_fails"][1]
    assert "test_unselected" not in outcomes


REFUSED = '''import pytest, warnings

@pytest.mark.background
@pytest.mark.filterwarnings("error")
def test_warns():
    warnings.warn("fails here, passed in the background", RuntimeWarning)

@pytest.mark.background
@pytest.mark.parametrize("shape", [(2, 3)])
def test_tuple(shape):
    assert isinstance(shape, tuple)

@pytest.mark.background
async def test_coroutine():
    assert False
'''


WARNS = '''import pytest, warnings

@pytest.mark.background
def test_warns():
    warnings.warn("fails here, passed in the background", RuntimeWarning)
'''


@pytest.mark.background
def test_regression_background_tests_whose_marks_act_here_only_are_refused(tmp_path):
    """Cause (rev55 F2): the background process called the bare function, so a `filterwarnings("error")` test passed
    where it fails, a coroutine test passed unawaited, a tuple parameter arrived as a list.  Such tests are refused,
    each named with the reason, before anything starts; the session's -W filters reach the background process."""
    (tmp_path / "tests").mkdir()
    shutil.copy(CONFTEST, tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_refused.py").write_text(REFUSED)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_refused.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == pytest.ExitCode.USAGE_ERROR, result.stdout + result.stderr
    for why in ("test_warns: marks ['filterwarnings']", "test_tuple[shape0]: parameter shape=(2, 3) does not survive",
                "test_coroutine: only a plain module-level function"):
        assert why in result.stderr, result.stderr
    (tmp_path / "tests" / "test_refused.py").write_text(WARNS)  # the session's -W filters reach the background
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
                             "error::RuntimeWarning", "tests/test_refused.py"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert "1 failed" in result.stdout and "RuntimeWarning: fails here" in result.stdout, result.stdout

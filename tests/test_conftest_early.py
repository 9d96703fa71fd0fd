"""conftest's `early` commands (review rev49 F1, F2, F4), in a pytest process of their own over a copy of it: a
command starts only for a test that will run, a mark naming no command fails its test alone, and a session ended
while a command runs kills it and exits with the tests' own status."""

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

def touch(name):
    return ("-c", f"import pathlib; pathlib.Path({name!r}).touch()")

EARLY = {"skipped": touch("started_skipped"), "ran": touch("started_ran"),
         "long": ("-c", "import time; time.sleep(60)")}

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


@pytest.mark.early("background checks")
def test_early_commands_start_for_running_tests_only_and_die_with_the_session(background):
    background("a session of its own")


def session_check(tmp_path):
    """A pytest process of its own: conftest's `background` check (another process waits for it)."""
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_early.py").write_text(TESTS)
    began = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_early.py"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - began < 40, "the 60 s command outlived the session"
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 failed, 1 passed, 1 skipped" in result.stdout, result.stdout
    assert "has no EARLY['no such command'] command" in result.stdout
    assert "INTERNALERROR" not in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert (tmp_path / "started_ran").exists() and not (tmp_path / "started_skipped").exists()


BACKGROUND = {"a session of its own": session_check}


CHECKS = '''import pytest
def raises():
    with pytest.raises(ValueError):
        pass
def skips():
    pytest.skip("no such device")
def passes():
    pass
def fails():
    assert [1, 2] == [1, 3]
BACKGROUND = {"raises": raises, "skips": skips, "passes": passes, "fails": fails}
'''


def test_regression_a_check_whose_raises_saw_nothing_ended_the_other_checks(tmp_path, monkeypatch, capsys):
    """Cause (rev53 F2): `run_background` caught Exception only; pytest.raises' "DID NOT RAISE" (an outcome
    exception, a BaseException) ended the process, so the checks after it never ran and every test of the module
    failed with the same stderr.  Now each check has its own outcome; a skip is a skip."""
    (tmp_path / "background_probe.py").write_text(CHECKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_background("background_probe")
    outcomes = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert outcomes["raises"][0] == "failed" and "DID NOT RAISE" in outcomes["raises"][1]
    assert outcomes["skips"] == ["skipped", "no such device"] and outcomes["passes"] is None
    assert outcomes["fails"][0] == "failed" and "AssertionError" in outcomes["fails"][1]

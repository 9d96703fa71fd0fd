"""`orchmllm demo` says what it is doing on stderr while it runs, `--json` included."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"orchmllm demo: +(\d+\.\d) s  (.+)")


def test_regression_demo_under_json_ran_for_minutes_without_a_word():
    """Cause: the only progress was a rich bar, shown on a terminal and never with --json."""
    result = subprocess.run([sys.executable, "-m", "orchmllm", "demo", "--ranks", "2", "--steps", "1",
                             "--samples-per-rank", "2", "--costs", "flops", "--repeats", "1",
                             "--replay-repeats", "1", "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    report = json.loads(result.stdout)  # stdout is the report alone
    assert report["ranks"] == 2 and report["gradient_terms"] > 0
    assert result.returncode in (0, 1), result.stderr
    lines = [LINE.fullmatch(line) for line in result.stderr.splitlines()]
    assert all(lines), result.stderr
    assert [match.group(2) for match in lines] == [
        "starting 2 gloo ranks", "warming up",
        "step 1 of 1: training unbalanced and balanced",
        "replaying every rank's work in isolation", "done"]
    seconds = [float(match.group(1)) for match in lines]
    assert seconds == sorted(seconds)

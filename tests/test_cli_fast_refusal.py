"""Issue 24: a refusal of the `orchmllm` command is quick.  What the options alone show wrong is refused before the
subcommand's module imports numpy, scipy and the balancers (and, for the demo, torch: `demo --ranks 100000` took
~5 s of CPU, most of it importing torch, before its one-line error); an unknown demo algorithm, which needs the
registry, still before torch."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import orchmllm
from orchmllm.cli.prechecks import MAX_SPAWNED_RANKS

REFUSED_FROM_OPTIONS = {  # argv -> the start of its one-line error
    "demo --ranks -1": "orchmllm demo: error: --ranks and --steps must be >= 1",
    "demo --ranks 100000": ("orchmllm demo: error: --ranks must be at most 64 spawned CPU processes on this machine; "
                            "got 100000 (start more ranks with torchrun)"),
    "demo --transport hierarchical --gpus-per-node 3": "orchmllm demo: error: --gpus-per-node 3: transport",
    "demo --seed -1": "orchmllm demo: error: --seed must be >= 0; got -1",
    "demo --samples-per-rank 0": "orchmllm demo: error: --samples-per-rank must be >= 1",
    "demo --context-parallel 1,2": "orchmllm demo: error: --context-parallel needs --workload giants",
    "demo --workload giants --ranks 65": ("orchmllm demo: error: --ranks must be at most 64 spawned CPU processes on "
                                          "this machine; got 65"),
    "demo --dtype int8": "orchmllm: error: argument --dtype: invalid choice: 'int8'",
    "simulate --gpus 0": "orchmllm simulate: error: --gpus must be >= 1; got 0",
    "simulate --seed -1": "orchmllm simulate: error: --seed must be >= 0; got -1",
    "simulate --virtual-stages 3": "orchmllm simulate: error: --virtual-stages 3 applies only with --schedule",
    "compare --ranks 0": "orchmllm compare: error: --ranks must be >= 1; got 0",
    "compare --items-per-rank 4,x": "orchmllm compare: error: --items-per-rank must be comma-separated integers",
    "plan /nonexistent/lengths.csv -D 4": "orchmllm plan: error: lengths file '/nonexistent/lengths.csv' not found",
    "plan /nonexistent/lengths.csv -D 0": "orchmllm plan: error: --ranks must be >= 1; got 0",
}

RUNNER = """
import contextlib, io, json, sys
from orchmllm.cli import main
results = {}
for line in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(line.split())
    results[line] = [code, err.getvalue().splitlines(), sorted(m for m in ('torch', 'scipy', 'numpy',
                     'orchmllm.balancers', 'orchmllm.runtime') if m in sys.modules)]
print(json.dumps(results))
"""


def _refusals(lines: list[str]) -> dict:
    """Each command line run in turn by `main` in one fresh interpreter: (exit code, stderr lines, the heavy
    modules loaded so far)."""
    done = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(lines)], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout)


def test_a_refusal_from_the_options_alone_imports_no_numpy_scipy_balancer_or_torch():
    results = _refusals(list(REFUSED_FROM_OPTIONS))
    for line, (code, stderr, loaded) in results.items():
        assert code == 2 and len(stderr) == 1 and stderr[0].startswith(REFUSED_FROM_OPTIONS[line]), (line, stderr)
        assert loaded == [], (line, loaded)


def test_regression_an_unknown_demo_algorithm_was_refused_after_importing_torch():
    """Its check needs the registry (the balancers), not the runtime."""
    (code, stderr, loaded), = _refusals(["demo --algorithm magic"]).values()
    assert code == 2 and stderr[0].startswith("orchmllm demo: error: --algorithm magic: unknown;")
    assert "torch" not in loaded and "orchmllm.runtime" not in loaded


def test_the_demo_s_spawned_ranks_limit_is_the_runtime_s():
    """prechecks keeps its own copy (the runtime's module imports torch): read the runtime's without importing it."""
    source = Path(orchmllm.__file__).parent / "runtime" / "demo" / "run.py"
    values = [node.value.value for node in ast.parse(source.read_text()).body if isinstance(node, ast.Assign)
              and [getattr(target, "id", None) for target in node.targets] == ["MAX_SPAWNED_RANKS"]]
    assert values == [MAX_SPAWNED_RANKS]

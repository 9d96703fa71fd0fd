"""The package's shape as the house rules state it: no import circle, short modules and
functions, and `import orchmllm` without the exact solvers' stacks."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE_PACKAGE_CODE = {"tests", "benchmarks", "examples", "build", "dist"}


def _sources() -> dict[str, Path]:
    """Module name -> file, for every module of the package (tests, benchmarks and examples excluded)."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if parts[0] in OUTSIDE_PACKAGE_CODE or any(part.startswith(".") for part in parts):
            continue
        names = ["orchmllm", *parts[:-1]] + ([] if parts[-1] == "__init__.py" else [parts[-1][:-3]])
        modules[".".join(names)] = path
    return modules


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Package modules `module` imports anywhere in its source (functions' lazy imports included)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(name for name in candidates if name in modules and name != module)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle():
    modules = _sources()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_lines_are_at_most_120_characters():
    """STYLE: lines of at most 120 characters, in every tracked Python file (tests, benchmarks, examples too)."""
    listed = subprocess.run(["git", "ls-files", "*.py"], capture_output=True, text=True, cwd=ROOT)
    names = (listed.stdout.split() if listed.returncode == 0 else  # a copy without git: every file but hidden ones
             [str(path.relative_to(ROOT)) for path in ROOT.rglob("*.py")
              if not any(part.startswith(".") for part in path.relative_to(ROOT).parts)])
    long = [f"{name}:{number} ({len(line)})" for name in names
            for number, line in enumerate((ROOT / name).read_text(encoding="utf-8").split("\n"), 1) if len(line) > 120]
    assert not long, f"lines over 120 characters: {long}"


@pytest.mark.parametrize("name", sorted(_sources()))
def test_module_and_functions_are_short(name):
    path = _sources()[name]
    lines = path.read_text().count("\n")
    assert lines <= 500, f"{path.relative_to(ROOT)} has {lines} lines (at most 500: it holds two concerns)"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            assert length <= 80, f"{path.relative_to(ROOT)}:{node.lineno} {node.name} has {length} lines (at most 80)"


@pytest.mark.parametrize("package", ["orchmllm", "orchmllm.balancers", "orchmllm.orchestrator"])
def test_import_loads_no_exact_solver_stack(package):
    """The registry points to kernels by name and the MILP entry imports its backends when it
    solves, so a user who never calls an exact solver never pays for scipy.optimize or PuLP."""
    code = (f"import sys, {package}; "
            "print(sorted(m for m in sys.modules if m == 'pulp' or "
            "m.startswith(('pulp.', 'scipy.optimize', 'torch'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"`import {package}` loaded {loaded}"


def test_registry_imports_no_kernel():
    """The registry's records name their kernels ("module:attr", imported on first use), so the
    registry sits below every kernel: a kernel may look an algorithm up without a circle."""
    modules = _sources()
    imported = _imported("orchmllm.balancers.registry", modules["orchmllm.balancers.registry"], modules)
    rooms = tuple(f"orchmllm.balancers.{room}." for room in ("kernels", "search", "exact", "locality", "constraints"))
    kernels = {"orchmllm.balancers.microbatch." + name for name in ("auto", "cells", "exact", "greedy", "search")}
    assert sorted(name for name in imported if name.startswith(rooms) or name in kernels) == []


def test_the_exact_room_runs_no_heuristic():
    """Proofs take their start plan from the caller and return verdicts; the kernels that run
    heuristics for a start (and raise for the user) import them, never the other way round."""
    modules = _sources()
    room = [name for name in modules if name.startswith("orchmllm.balancers.exact.")]
    above = ("orchmllm.balancers.kernels", "orchmllm.balancers.search", "orchmllm.balancers.locality",
             "orchmllm.balancers.microbatch", "orchmllm.balancers.constraints", "orchmllm.balancers.registry",
             "orchmllm.balancers.api")
    assert room and {name: sorted(imported) for name in room
                     if (imported := {m for m in _imported(name, modules[name], modules) if m.startswith(above)})} == {}


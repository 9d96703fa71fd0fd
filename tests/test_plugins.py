"""Algorithms from outside orchmllm: `register_algorithm` in process, and the README's plugin package
built, pip-installed into a temporary directory and found through its `orchmllm.algorithms` entry point."""

import atexit
import collections
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from orchmllm import balance_microbatches, register_algorithm, register_microbatch_algorithm
from orchmllm.balancers import Algorithm, InfeasibleError, KernelResult, balance, get_algorithm, registry
from orchmllm.balancers.microbatch.plan import MicroBatchResult

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_recipe() -> tuple[str, str]:
    """The plugin module and the entry-point table of the README's "Add a balancer" section."""
    section = README.read_text().split("## Add a balancer from your own package", 1)[1].split("\n## ", 1)[0]
    module = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    entry_points = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    return module, entry_points


def pip_install(source: Path, name: str, module: str, entry_points: str, target: Path) -> None:
    """Build the package `name` holding `module.py` and install it (entry points included) into `target`."""
    source.mkdir()
    (source / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=68"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "0.1"\n\n[tool.setuptools]\npy-modules = ["{module}"]\n\n'
        + entry_points)
    (source / f"{module}.py").write_text(PLUGIN_SOURCES[module])
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(source)], check=True, capture_output=True,
                   timeout=240)


PLUGIN_SOURCES = {"round_robin_balancer": readme_recipe()[0], "broken_balancer": "NOT_A_KERNEL = 42\n"}


def run_with(target: Path, *args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": path})


def printed_json(target: Path, *args: str):
    """What `run_with(target, *args)` printed as JSON, once it exited 0."""
    result = run_with(target, *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@functools.cache
def plugin_site() -> Path:
    """The README's plugin pip-installed once in this process (conftest's background process), into a
    folder removed at its exit."""
    root = Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    pip_install(root / "source", "round-robin-balancer", "round_robin_balancer", readme_recipe()[1], root / "site")
    return root / "site"


@pytest.mark.background
def test_the_readme_plugin_runs_in_balance_once_installed():
    script = ("import json; from orchmllm import balance, InfeasibleError; "
              "from orchmllm.balancers import get_algorithm, algorithms\n"
              "plan = balance([5, 4, 3, 2, 1], 2, algorithm='round_robin')\n"
              "try:\n    balance([5, 4, 3, 2, 1], 2, algorithm='round_robin', max_tokens_per_rank=8)\n"
              "except InfeasibleError as error:\n    needed = error.min_cap\n"
              "record = get_algorithm('round_robin')\n"
              "print(json.dumps({'assignment': plan.assignment.tolist(), 'algorithm': plan.algorithm,"
              " 'kind': str(record.kind), 'min_cap': needed,"
              " 'listed': 'round_robin' in [r.name for r in algorithms()]}))")
    assert printed_json(plugin_site(), "-c", script) == {"assignment": [0, 1, 0, 1, 0], "algorithm": "round_robin",
                                                         "kind": "plugin", "min_cap": 9, "listed": True}


@pytest.mark.background
def test_the_readme_plugin_is_an_orchmllm_plan_algorithm(tmp_path):
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("length\n" + "\n".join(map(str, [40, 7, 19, 3, 25, 11, 8, 30])) + "\n")
    plan = printed_json(plugin_site(), "-m", "orchmllm", "plan", str(lengths), "-D", "4", "--algorithm", "round_robin",
                        "--json")
    assert plan["algorithm"] == "round_robin" and plan["assignment"] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert plan["loads"] == [65.0, 18.0, 27.0, 33.0]


def test_without_the_package_the_name_is_unknown():
    with pytest.raises(ValueError, match="unknown `algorithm` 'round_robin'"):
        balance([1, 2], 2, algorithm="round_robin")


@pytest.mark.background
def test_a_broken_entry_point_is_named(tmp_path):
    pip_install(tmp_path / "source", "broken-balancer", "broken_balancer",
                '[project.entry-points."orchmllm.algorithms"]\nnot_a_kernel = "broken_balancer:NOT_A_KERNEL"\n',
                tmp_path / "site")
    result = run_with(tmp_path / "site", "-c", "from orchmllm import balance; balance([1, 2], 2, algorithm='x')")
    assert result.returncode == 1 and "ValueError: unknown `algorithm` 'x'; choose one of" in result.stderr
    assert ("RuntimeWarning: orchmllm skipped the entry point not_a_kernel = broken_balancer:NOT_A_KERNEL of "
            "distribution broken-balancer (group 'orchmllm.algorithms'): TypeError: it must be an orchmllm "
            "Algorithm, a MicroBatchAlgorithm or a kernel; got int") in result.stderr


def fake_distribution(path: Path, name: str, module: str, source: str, entry_points: str) -> Path:
    """A distribution on `path` (a module and a dist-info declaring its entry points), no pip needed."""
    (path / f"{module}.py").write_text(source)
    info = path / f"{name.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[orchmllm.algorithms]\n" + entry_points)
    return path


CLASHING = (
    "import numpy as np\nfrom orchmllm.balancers import KernelResult\n\n"
    "def first_rank(problem):\n    return KernelResult(np.zeros(problem.num_items, dtype=np.int64))\n")


@pytest.mark.background
def test_regression_entry_points_that_clash_or_fail_broke_every_listing(tmp_path):
    """Cause: the first entry point that failed to import, or whose name was taken, raised out of
    the loader, so every listing of the registry (compare, plan's choices, an unknown name)
    raised with it.  Each is now skipped with a warning naming it and its distribution."""
    fake_distribution(tmp_path, "clashing-plugins", "clashing_plugins", CLASHING,
                      "lpt = clashing_plugins:first_rank\nverl_kk = clashing_plugins:first_rank\n"
                      "gone = clashing_plugins_gone:kernel\nfirst_rank = clashing_plugins:first_rank\n")
    script = ("import json, warnings\nwarnings.simplefilter('always')\n"
              "from orchmllm.balancers import ALGORITHMS, balance, get_algorithm\n"
              "with warnings.catch_warnings(record=True) as caught:\n"
              "    names = list(ALGORITHMS)\n"
              "print(json.dumps({'lpt': balance([3, 2, 1], 2, algorithm='lpt').assignment.tolist(),\n"
              "                  'first_rank': balance([3, 2, 1], 2, algorithm='first_rank').assignment.tolist(),\n"
              "                  'verl_kk': str(get_algorithm('verl_kk').kind), 'listed': names,\n"
              "                  'warnings': sorted(str(w.message) for w in caught)}))\n")
    seen = printed_json(tmp_path, "-c", script)
    assert seen["lpt"] == [0, 1, 1] and seen["first_rank"] == [0, 0, 0] and seen["verl_kk"] == "peer"
    assert {"lpt", "verl_kk", "first_rank"} <= set(seen["listed"]) and "gone" not in seen["listed"]
    where = "of distribution clashing-plugins (group 'orchmllm.algorithms')"
    assert seen["warnings"] == [
        f"orchmllm skipped the entry point gone = clashing_plugins_gone:kernel {where}: ModuleNotFoundError: No "
        f"module named 'clashing_plugins_gone'",
        f"orchmllm skipped the entry point lpt = clashing_plugins:first_rank {where}: ValueError: algorithm 'lpt' "
        f"is already registered (ours: longest processing time first; <= (4/3 - 1/(3D)) x optimum unpadded); "
        f"choose another name",
        f"orchmllm skipped the entry point verl_kk = clashing_plugins:first_rank {where}: ValueError: algorithm "
        f"'verl_kk' is already registered (peer: verl (reimplemented): Karmarkar-Karp on 24576*l + l^2, equal "
        f"counts when D | n); choose another name"]
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("length\n" + "\n".join(map(str, [40, 7, 19, 3, 25, 11, 8, 30])) + "\n")
    done = run_with(tmp_path, "-m", "orchmllm", "compare", "--lengths", str(lengths), "-D", "2", "--json")
    assert done.returncode == 0 and "orchmllm skipped the entry point gone" in done.stderr, done.stderr
    assert {"lpt", "verl_kk"} <= {row["algorithm"] for row in json.loads(done.stdout)["rows"]}


@pytest.mark.background
def test_regression_an_entry_point_exiting_at_import_ended_the_command(tmp_path):
    """Cause: the loader caught Exception only, so a plugin module raising SystemExit at import
    (`raise SystemExit('needs CUDA')`) ended `orchmllm plan --algorithm lpt`, exit 1, no plugin named."""
    fake_distribution(tmp_path, "exiting-plugin", "exiting_plugin", "raise SystemExit('needs CUDA')\n",
                      "cuda_only = exiting_plugin:kernel\n")
    (tmp_path / "lengths.csv").write_text("length\n5\n3\n4\n")
    done = run_with(tmp_path, "-m", "orchmllm", "plan", str(tmp_path / "lengths.csv"), "-D", "2", "--algorithm", "lpt")
    assert done.returncode == 0 and "makespan 7" in done.stdout, done.stderr
    assert ("RuntimeWarning: orchmllm skipped the entry point cuda_only = exiting_plugin:kernel of distribution "
            "exiting-plugin (group 'orchmllm.algorithms'): SystemExit: needs CUDA") in done.stderr


@pytest.mark.background
def test_regression_a_skipped_entry_point_s_warning_showed_an_unrelated_source_line(tmp_path):
    """Cause: the command printed Python's two-line warning format, whose second line was the orchmllm line that
    listed the algorithms (`f"algorithms: {', '.join(ALGORITHMS)}")` of cli/compare.py), unrelated to the plugin
    (probe6 P6-11).  The command prints each warning as one line."""
    fake_distribution(tmp_path, "gone-plugin", "gone_plugin", "", "gone = gone_plugin_module:kernel\n")
    (tmp_path / "lengths.csv").write_text("length\n5\n3\n4\n")
    done = run_with(tmp_path, "-m", "orchmllm", "plan", str(tmp_path / "lengths.csv"), "-D", "2", "--algorithm", "lpt")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "orchmllm: RuntimeWarning: orchmllm skipped the entry point gone = gone_plugin_module:kernel of distribution "
        "gone-plugin (group 'orchmllm.algorithms'): ModuleNotFoundError: No module named 'gone_plugin_module'"]


@pytest.mark.background
def test_regression_a_skipped_entry_point_asked_for_by_name_was_called_unknown(tmp_path):
    """probe20 P20-04: a name whose entry point failed to load was "unknown `algorithm`" at use, the one warning
    filtered away (-W ignore) or shown on another rank: the user who installed it was told it did not exist.
    The lookup of a skipped entry point's name (plain or micro-batch) says it was skipped and why."""
    fake_distribution(tmp_path, "gone-plugin", "gone_plugin", "", "gone = gone_plugin_module:kernel\n")
    script = ("from orchmllm import balance, balance_microbatches\n"
              "for call in (lambda: balance([3, 2, 1], 2, algorithm='gone'),\n"
              "             lambda: balance_microbatches([3, 2, 1], 2, max_tokens_per_microbatch=4, "
              "algorithm='gone')):\n"
              "    try:\n        call()\n    except ValueError as error:\n        print(error)\n")
    done = run_with(tmp_path, "-W", "ignore", "-c", script)
    told = ("`algorithm` 'gone' is an installed plugin's, but orchmllm skipped the entry point gone = "
            "gone_plugin_module:kernel of distribution gone-plugin (group 'orchmllm.algorithms'): ModuleNotFoundError: "
            "No module named 'gone_plugin_module'")
    assert done.returncode == 0 and done.stdout.splitlines() == [told, told], (done.stdout, done.stderr)
    (tmp_path / "lengths.csv").write_text("length\n5\n3\n4\n")
    for command in (["plan", str(tmp_path / "lengths.csv"), "-D", "2", "--algorithm", "gone"],
                    ["compare", "--lengths", str(tmp_path / "lengths.csv"), "-D", "2",
                     "--algorithms", "gone+locality"]):
        done = run_with(tmp_path, "-W", "ignore", "-m", "orchmllm", *command)
        assert done.returncode == 2 and done.stderr.endswith(told + "\n"), done.stderr


RAISING = ("from orchmllm.balancers import Algorithm\n\n"
           "def kernel(problem):\n    return 1 // 0\n\n"
           "RAISER = Algorithm('raiser', kernel, default=True, description='raises')\n")


@pytest.mark.background
def test_regression_a_plugin_whose_kernel_raises_ended_compare_and_plan_in_a_traceback(tmp_path):
    """Cause: the RuntimeError naming a plugin's kernel that raised went up through `compare` (which runs every
    default record, the plugin's too) and `plan` as an orchmllm bug: a 41-line traceback, exit 1, no table for
    any algorithm (probe6 P6-20).  compare marks the plugin's rows failed, warns naming it, and runs the rest;
    plan says so in one line, exit 1."""
    fake_distribution(tmp_path, "raising-plugin", "raising_plugin", RAISING, "raiser = raising_plugin:RAISER\n")
    (tmp_path / "lengths.csv").write_text("length\n5\n3\n4\n2\n")
    failed = ("the entry point raiser = raising_plugin:RAISER of distribution raising-plugin (group "
              "'orchmllm.algorithms') failed: algorithm 'raiser' raised ZeroDivisionError: integer division or modulo "
              "by zero")
    done = run_with(tmp_path, "-m", "orchmllm", "compare", "--lengths", str(tmp_path / "lengths.csv"), "-D", "2",
                    "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [f"orchmllm: RuntimeWarning: {failed}; its rows say failed"]
    rows = {row["algorithm"]: row for row in json.loads(done.stdout)["rows"]}
    assert rows["raiser"]["status"] == "failed" and rows["raiser"]["note"] == failed
    assert rows["lpt"]["status"] in ("optimal", "feasible")
    done = run_with(tmp_path, "-m", "orchmllm", "plan", str(tmp_path / "lengths.csv"), "-D", "2", "--algorithm",
                    "raiser")
    assert done.returncode == 1 and done.stderr.splitlines() == [f"orchmllm plan: error: {failed}"], done.stderr


LAZY = ("from orchmllm.balancers import Algorithm\n\n"
        "LAZY = Algorithm('needs_cuda', 'needs_cuda_kernels:kernel', default=True, description='needs CUDA')\n")


@pytest.mark.background
def test_regression_a_plugin_whose_lazy_kernel_cannot_be_imported_ended_plan_and_compare_in_a_traceback(tmp_path):
    """Cause: a plugin record's "module:attr" kernel whose module is missing (an optional dependency) raised
    ModuleNotFoundError, not the RuntimeError naming a failing kernel, through `plan` and `compare`: a 40-line
    traceback, exit 1 (probe10 P10-02).  Now as a kernel that raises: plan says so in one line naming the entry
    point, exit 1; compare marks its rows failed and runs the rest."""
    fake_distribution(tmp_path, "lazy-plugin", "lazy_plugin", LAZY, "needs_cuda = lazy_plugin:LAZY\n")
    (tmp_path / "lengths.csv").write_text("length\n5\n3\n4\n2\n")
    failed = ("the entry point needs_cuda = lazy_plugin:LAZY of distribution lazy-plugin (group "
              "'orchmllm.algorithms') failed: algorithm 'needs_cuda' could not import its `kernel` "
              "'needs_cuda_kernels:kernel': ModuleNotFoundError: No module named 'needs_cuda_kernels'")
    done = run_with(tmp_path, "-m", "orchmllm", "plan", str(tmp_path / "lengths.csv"), "-D", "2", "--algorithm",
                    "needs_cuda")
    assert done.returncode == 1 and done.stderr.splitlines() == [f"orchmllm plan: error: {failed}"], done.stderr
    done = run_with(tmp_path, "-m", "orchmllm", "compare", "--lengths", str(tmp_path / "lengths.csv"), "-D", "2",
                    "--algorithms", "needs_cuda,lpt", "--json")
    assert done.returncode == 0 and done.stderr.splitlines() == [f"orchmllm: RuntimeWarning: {failed}; its rows say "
                                                                 f"failed"], done.stderr
    rows = {row["algorithm"]: row for row in json.loads(done.stdout)["rows"]}
    assert rows["needs_cuda"]["status"] == "failed" and rows["lpt"]["status"] in ("optimal", "feasible")


@pytest.mark.background
def test_regression_a_peer_name_could_be_taken_before_the_entry_points_loaded():
    """Cause: names were only checked against what was registered, and the peers register on
    first listing: `register_algorithm('verl_kk', k)` succeeded, and every listing then raised."""
    script = ("from orchmllm.balancers import ALGORITHMS, register_algorithm\n"
              "from orchmllm.balancers.kernels import lpt\n"
              "try:\n    register_algorithm('verl_kk', lpt.solve)\nexcept ValueError as error:\n    print(error)\n"
              "print(ALGORITHMS['verl_kk'].kind, len(ALGORITHMS) > 10)\n")
    result = run_with(Path(__file__).parent, "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "algorithm name 'verl_kk' is reserved by the entry point verl_kk = orchmllm.study.peers:VERL_KK of "
        "distribution orchmllm (group 'orchmllm.algorithms'); choose another name", "peer True"]


def test_a_reserved_name_is_refused_in_process_too():
    with pytest.raises(ValueError, match="algorithm 'verl_kk' is already registered|algorithm name 'verl_kk' is "
                                         "reserved by the entry point verl_kk"):
        register_algorithm("verl_kk", halves)
    with pytest.raises(ValueError, match="algorithm name 'omnibal_2d' is reserved by the entry point omnibal_2d = "
                                         "orchmllm.study.peers:OMNIBAL_2D of distribution orchmllm"):
        register_microbatch_algorithm("omnibal_2d", lambda problem, num_microbatches: None)


def halves(problem):
    """Items of the first half to rank 0, the rest to the last rank (a kernel for the tests below)."""
    assignment = np.where(np.arange(problem.num_items) < problem.num_items // 2, 0, problem.num_ranks - 1)
    return KernelResult(assignment.astype(np.int64))


def test_register_algorithm_in_process_returns_the_record_and_is_idempotent():
    record = register_algorithm("test_halves", halves, unpadded=True, padded=False, description="two halves")
    assert record == Algorithm("test_halves", halves, padded=False, description="two halves")
    assert register_algorithm("test_halves", halves, padded=False, description="two halves") is record
    assert get_algorithm("test_halves") is record
    assert balance([3, 1, 2, 2], 3, algorithm="test_halves").assignment.tolist() == [0, 0, 2, 2]
    with pytest.raises(ValueError,
                       match=r"algorithm 'test_halves' solves the unpadded cost sum f\(l\) only; pass padded=False"):
        balance([3, 1, 2, 2], 3, algorithm="test_halves", padded=True)
    with pytest.raises(ValueError, match="algorithm 'test_halves' is already registered"):
        register_algorithm("test_halves", halves, description="another")
    with pytest.raises(ValueError, match="algorithm 'lpt' is already registered"):
        register_algorithm("lpt", halves)


@pytest.mark.parametrize("register, name, twin", [(register_algorithm, "LPT", "lpt"),
                                                  (register_microbatch_algorithm, "Greedy", "greedy")])
def test_regression_a_case_variant_of_a_registered_name_is_refused(register, name, twin):
    """probe32 E2: `register_algorithm("LPT", ...)` was accepted beside the built-in "lpt", two algorithms told
    apart by case alone on the command line and in reports."""
    with pytest.raises(ValueError, match=rf"^algorithm name '{name}' differs from the registered '{twin}' only in "
                                         r"case; choose another name$"):
        register(name, halves)
    listed = registry.algorithms() if register is register_algorithm else registry.microbatch_algorithms()
    assert name not in [record.name for record in listed]


@pytest.mark.background
def test_regression_a_case_variant_of_a_plugins_name_is_refused_before_the_plugins_load():
    """rev50 F5: registered before the entry points loaded, "VERL_KK" was accepted, and orchmllm.study.peers'
    "verl_kk" was then refused as its case twin: the peers' module failed to import and all five built-in peers
    were skipped.  Also "NONE" beside `compare`'s baseline label "none"."""
    script = ("import warnings; warnings.simplefilter('error')\n"
              "import numpy as np\n"
              "from orchmllm.balancers import KernelResult, registry\n"
              "kernel = lambda problem: KernelResult(np.zeros(problem.num_items, dtype=np.int64))\n"
              "for name in ('VERL_KK', 'NONE'):\n"
              "    try:\n"
              "        registry.register_algorithm(name, kernel)\n"
              "    except ValueError as error:\n"
              "        print(error)\n"
              "print(registry.get_algorithm('verl_kk').kind.value)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    refused_twin, refused_label, kind = result.stdout.splitlines()
    assert re.fullmatch(r"algorithm name 'VERL_KK' differs from 'verl_kk', reserved by the entry point verl_kk = "
                        r"orchmllm\.study\.peers:VERL_KK of .*, only in case; choose another name", refused_twin)
    assert refused_label.startswith("algorithm name 'NONE' is reserved: it is `orchmllm compare`'s label")
    assert kind == "peer"


def test_a_kernel_that_ignores_the_cap_is_caught_by_make_plan():
    register_algorithm("test_halves_uncapped", halves, description="two halves, caps ignored")
    with pytest.raises(RuntimeError, match="'test_halves_uncapped' put 4 tokens on rank 0"):
        balance([3, 1, 2, 2], 3, algorithm="test_halves_uncapped", max_tokens_per_rank=3)


@pytest.mark.parametrize("arguments, error, message", [
    (dict(name="has space"), ValueError, r"`name` must be a non-empty str of ASCII letters, digits"),
    (dict(name=""), ValueError, r"`name` must be a non-empty str"),
    (dict(kernel=3), TypeError, r"`kernel` of algorithm 'ok' must be callable"),
    (dict(kernel="orchmllm.balancers.kernels.lpt.solve"), TypeError,
     r"`kernel` of algorithm 'ok' must be callable \(Problem -> KernelResult\) or a 'module:attr' str; "
     r"got 'orchmllm.balancers.kernels.lpt.solve'"),
    (dict(equal_counts="lpt:"), TypeError, r"`equal_counts` of algorithm 'ok' must be callable .* got 'lpt:'"),
    (dict(padded=False, unpadded=False), ValueError, r"must solve padded or unpadded problems"),
    (dict(exact=1), TypeError, r"`exact` must be a bool; got int"),
    (dict(kind="theirs"), ValueError, r"`kind` must be one of \['ours', 'peer', 'baseline', 'plugin'\]"),
    (dict(description="two\nlines"), TypeError, r"`description` of algorithm 'ok' must be a one-line str"),
])
def test_register_algorithm_rejects_a_bad_record(arguments, error, message):
    arguments = {"name": "ok", "kernel": halves, **arguments}
    with pytest.raises(error, match=message):
        register_algorithm(arguments.pop("name"), arguments.pop("kernel"), **arguments)


def test_a_kernel_named_as_module_attr_is_imported_on_first_use():
    """How the built-in records point to their kernels: the registry imports no kernel module."""
    from orchmllm.balancers.kernels import lpt

    record = register_algorithm("test_lpt_by_name", "orchmllm.balancers.kernels.lpt:solve",
                                description="LPT, named")
    assert vars(record)["_kernel"] == "orchmllm.balancers.kernels.lpt:solve"
    assert balance([3, 1, 2, 2], 3, algorithm="test_lpt_by_name").assignment.tolist() == \
        balance([3, 1, 2, 2], 3, algorithm="lpt").assignment.tolist()
    assert record.kernel is lpt.solve and vars(record)["_kernel"] is lpt.solve
    assert get_algorithm("exact").kernel.__module__ == "orchmllm.balancers.kernels.exact"


def test_a_kernel_named_wrongly_fails_on_first_use_naming_it():
    record = register_algorithm("test_missing_by_name", "orchmllm.balancers.kernels.lpt:no_such_kernel")
    with pytest.raises(RuntimeError, match="algorithm 'test_missing_by_name' could not import its `kernel` "
                                           "'orchmllm.balancers.kernels.lpt:no_such_kernel': AttributeError: "):
        balance([3, 1, 2], 2, algorithm=record.name)


@pytest.mark.parametrize("field", ["kernel", "equal_counts", "microbatch"])
def test_regression_a_lazy_kernel_whose_module_cannot_be_imported_raised_a_bare_module_not_found_error(field):
    """Cause: a "module:attr" kernel was imported where it was first read, outside the kernel call that names a
    failing kernel, so a plugin's kernel module needing a dependency not installed gave a bare ModuleNotFoundError
    naming neither the algorithm nor the field (probe10 P10-02); now a RuntimeError naming both, as a kernel
    that raises."""
    name, missing = f"test_lazy_missing_{field}", f"orchmllm_p10_missing_{field}:kernel"
    if field == "microbatch":
        register_microbatch_algorithm(name, missing)
        call = lambda: balance_microbatches([3, 1, 2], 2, max_tokens_per_microbatch=4, algorithm=name)
    else:
        register_algorithm(name, halves if field == "equal_counts" else missing,
                           equal_counts=missing if field == "equal_counts" else None)
        call = lambda: balance([3, 1, 2, 2], 2, algorithm=name, equal_counts=field == "equal_counts")
    field = "equal_counts" if field == "equal_counts" else "kernel"
    with pytest.raises(RuntimeError, match=f"^algorithm '{name}' could not import its `{field}` '{missing}': "
                                           f"ModuleNotFoundError: No module named 'orchmllm_p10_missing_"):
        call()



def _zero_lengths(problem):
    problem.lengths[:] = 0
    return KernelResult(np.zeros(problem.num_items, np.int64))


def _sort_costs(problem):
    problem.item_costs.sort()
    return KernelResult(np.arange(problem.num_items) % problem.num_ranks)


def _zero_costs_microbatch(problem, num_microbatches):
    problem.item_costs[:] = 0
    cells = np.arange(problem.num_items)
    return MicroBatchResult(cells % problem.num_ranks, cells // problem.num_ranks)


@pytest.mark.parametrize("kernel", [_zero_lengths, _sort_costs], ids=["lengths", "item_costs"])
def test_a_kernel_writing_the_problems_arrays_is_refused_naming_it_and_never_reaches_the_callers(kernel):
    """The problem's arrays were the caller's own and writeable: a kernel sorting `item_costs` in place
    certified loads it never reached and sorted the user's `costs`; one zeroing `lengths` broke the cap
    unseen and zeroed the user's lengths (probe3 SW1)."""
    name = f"test_writes_{kernel.__name__}"
    register_algorithm(name, kernel)
    lengths, costs = np.array([9, 1, 1, 1, 8, 1, 1, 1]), np.array([9.0, 1, 1, 1, 8, 1, 1, 1])
    with pytest.raises(RuntimeError, match=rf"algorithm '{name}' raised ValueError: .*read-only \(a kernel gets the "
                                           r"problem's arrays read-only: copy one before writing it\)"):
        balance(lengths, 2, costs=costs, algorithm=name, max_tokens_per_rank=12)
    assert lengths.tolist() == [9, 1, 1, 1, 8, 1, 1, 1] and costs.tolist() == [9.0, 1, 1, 1, 8, 1, 1, 1]


def _refuses_without_min_cap(problem):
    raise InfeasibleError("my kernel finds no room")


def test_regression_a_refusal_without_min_cap_says_what_min_cap_is():
    """probe21 note: a plugin raising InfeasibleError("msg") got Python's bare "missing 1 required positional
    argument: 'min_cap'" (wrapped naming the kernel), with no word of what min_cap is."""
    register_algorithm("test_refuses_without_min_cap", _refuses_without_min_cap)
    with pytest.raises(RuntimeError, match=r"^algorithm 'test_refuses_without_min_cap' raised TypeError: .*'min_cap' "
                                           r"\(a kernel refuses with InfeasibleError\(message, min_cap\): min_cap is "
                                           r"the cap to try next"):
        balance([9, 1, 1, 8], 2, algorithm="test_refuses_without_min_cap", max_tokens_per_rank=12)


@pytest.mark.parametrize("register", [register_algorithm, register_microbatch_algorithm])
def test_regression_the_baselines_label_none_is_reserved(register):
    """probe22 P22-08: a plugin named "none" was accepted, but `orchmllm compare --algorithms none` ran the
    unbalanced baseline (its label "none") in the plugin's place, with no word."""
    with pytest.raises(ValueError, match=r"^algorithm name 'none' is reserved: it is `orchmllm compare`'s "
                                         r"label for the unbalanced baseline"):
        register("none", _refuses_without_min_cap)
    listed = registry.algorithms() if register is register_algorithm else registry.microbatch_algorithms()
    names = [record.name for record in listed]
    assert "none" not in names and "auto" in names


def test_a_microbatch_kernel_writing_the_problems_arrays_is_refused_naming_it():
    """The micro-batch problem's arrays were read-only, but the write surfaced as numpy's bare
    "assignment destination is read-only", naming no kernel (probe3 SW1)."""
    register_microbatch_algorithm("test_mb_writes_costs", _zero_costs_microbatch)
    with pytest.raises(RuntimeError, match=r"algorithm 'test_mb_writes_costs' raised ValueError: assignment "
                                           r"destination is read-only \(a kernel gets the problem's arrays read-only"):
        balance_microbatches([9, 1, 1, 1, 8, 1, 1, 1], 2, max_tokens_per_microbatch=9, algorithm="test_mb_writes_costs")


def test_the_problem_holds_a_private_copy_so_the_callers_arrays_stay_writeable():
    """The micro-batch path made the caller's own int64 `lengths` (and float64 `costs`) read-only in
    place; the plain path handed them to kernels as the problem's arrays (probe3 SW1)."""
    seen = []
    register_algorithm("test_peeks_arrays", lambda problem: seen.append(problem) or KernelResult(
        np.zeros(problem.num_items, np.int64)))
    lengths, costs = np.array([3, 4, 5, 6]), np.array([3.0, 4.0, 5.0, 6.0])
    balance(lengths, 2, costs=costs, algorithm="test_peeks_arrays")
    problem = seen[0]
    assert not np.shares_memory(problem.lengths, lengths) and not np.shares_memory(problem.item_costs, costs)
    assert not problem.lengths.flags.writeable and not problem.item_costs.flags.writeable
    balance_microbatches(lengths, 2, costs=costs, max_tokens_per_microbatch=10)
    assert lengths.flags.writeable and costs.flags.writeable


def _raises_key_error(problem):
    raise KeyError("bucket")


def test_a_kernel_that_raises_is_named_with_its_error_as_the_cause():
    """A plugin's own bug surfaced as its bare exception, naming no algorithm (issue 24)."""
    register_algorithm("test_raises", _raises_key_error)
    register_microbatch_algorithm("test_mb_raises", lambda problem, num_microbatches: _raises_key_error(problem))
    with pytest.raises(RuntimeError, match=r"algorithm 'test_raises' raised KeyError: 'bucket'") as plain:
        balance([3, 1, 2], 2, algorithm="test_raises")
    with pytest.raises(RuntimeError, match=r"algorithm 'test_mb_raises' raised KeyError: 'bucket'") as micro:
        balance_microbatches([3, 1, 2], 2, max_tokens_per_microbatch=4, algorithm="test_mb_raises")
    assert isinstance(plain.value.__cause__, KeyError) and isinstance(micro.value.__cause__, KeyError)


def _refusing(error):
    def kernel(problem, *rest):
        raise error
    return kernel


@pytest.mark.parametrize("error, options, contradiction", [
    (InfeasibleError("no room", min_cap=100), {}, r"on a problem with no token cap"),
    (InfeasibleError("no room", min_cap=5), {"max_tokens_per_rank": 1000},
     r"with min_cap=5, not above the max_tokens_per_rank=1000 it was given"),
    (InfeasibleError("no room", min_cap=-1), {"max_tokens_per_rank": 1000}, r"with min_cap=-1, a negative cap"),
    (TimeoutError("slow"), {}, r"on a problem with no time limit"),
], ids=["no-cap", "min-cap-below-the-cap", "negative-min-cap", "timeout-without-a-limit"])
def test_regression_a_kernels_refusal_that_contradicts_its_input_was_passed_on_as_the_inputs_fault(
        error, options, contradiction):
    """A plugin's InfeasibleError on a problem with no cap (or a min_cap no larger than the cap, or negative) and its
    TimeoutError with no time limit reached the caller as they were, naming no kernel: the CLI then printed "the
    smallest cap known to be needed" of an uncapped problem (probe17 P17-02).  Consistent refusals still pass on."""
    name = f"test_refusal_{error.__class__.__name__}_{getattr(error, 'min_cap', 0)}_{len(options)}"
    register_algorithm(name, _refusing(error))
    with pytest.raises(RuntimeError, match=rf"algorithm '{name}' raised \w+Error {contradiction}.*a bug of the kernel"):
        balance([9, 7, 6, 5], 2, algorithm=name, **options)


def test_a_microbatch_kernels_negative_min_cap_is_its_bug_and_a_consistent_refusal_passes_on():
    register_microbatch_algorithm("test_mb_negative_min_cap", _refusing(InfeasibleError("no room", min_cap=-1)))
    with pytest.raises(RuntimeError,
                       match=r"algorithm 'test_mb_negative_min_cap' raised InfeasibleError with min_cap=-1"):
        balance_microbatches([9, 7, 6, 5], 2, max_tokens_per_microbatch=12, algorithm="test_mb_negative_min_cap")
    # a positive min_cap of a micro-batch kernel counts micro-batches: a refusal passed on, not held against the
    # cap of a plain problem that a micro-batch problem lacks (probe18 P18-06: "not above max_tokens_per_rank=inf")
    register_microbatch_algorithm("test_mb_min_cap_3", _refusing(InfeasibleError("needs 3", min_cap=3)))
    with pytest.raises(InfeasibleError, match="needs 3"):
        balance_microbatches([5, 4, 3, 3, 1], 2, max_tokens_per_microbatch=8, algorithm="test_mb_min_cap_3")
    register_algorithm("test_refusal_consistent", _refusing(InfeasibleError("no room", min_cap=30)))
    with pytest.raises(InfeasibleError, match="no room"):
        balance([9, 7, 6, 5], 2, algorithm="test_refusal_consistent", max_tokens_per_rank=20)


Named = collections.namedtuple("Named", "assignment status lower_bound")
NamedCells = collections.namedtuple("NamedCells", "rank microbatch status lower_bound")


def test_a_kernel_returning_a_namedtuple_or_tuple_of_its_own_is_refused_naming_it():
    """A tuple with the right fields is still not the result type whose fields are checked (issue 24)."""
    zeros = np.zeros(3, np.int64)
    register_algorithm("test_named", lambda problem: Named(zeros, "feasible", None))
    register_algorithm("test_tuple", lambda problem: (zeros,))
    register_microbatch_algorithm("test_mb_named", lambda problem, m: NamedCells(zeros, zeros, "feasible", None))
    for name, got in (("test_named", "Named"), ("test_tuple", "tuple")):
        with pytest.raises(RuntimeError, match=rf"algorithm '{name}' returned a {got}; expected a KernelResult"):
            balance([3, 1, 2], 2, algorithm=name)
    with pytest.raises(RuntimeError, match=r"algorithm 'test_mb_named' returned a NamedCells for num_microbatches=1; "
                                           r"expected a MicroBatchResult"):
        balance_microbatches([3, 1, 2], 2, max_tokens_per_microbatch=6, algorithm="test_mb_named")


def _all_on_rank_zero(problem):
    return KernelResult(np.zeros(problem.num_items, np.int64))


@pytest.mark.parametrize("lengths, allowed", [([4, 3, 2, 1], "exactly 2 (4 items on 2 ranks)"),
                                              ([4, 3, 2, 1, 1], "2 or 3 (5 items on 2 ranks)")],
                         ids=["ranks-divide-items", "remainder"])
def test_regression_a_kernel_breaking_equal_counts_was_told_q_or_q_plus_1_where_only_q_is_allowed(lengths, allowed,
                                                                                               monkeypatch):
    """Cause: the message printed `q or q + 1` also where D divides n, so 3 items on a rank read as allowed
    for 4 items on 2 ranks (probe8 P8-08)."""
    monkeypatch.setitem(registry._records, "test_all_on_zero",  # for this test only: it breaks equal_counts
                        Algorithm("test_all_on_zero", _all_on_rank_zero, equal_counts=_all_on_rank_zero))
    with pytest.raises(RuntimeError, match=rf"algorithm 'test_all_on_zero' put 0 items on rank 1; `equal_counts` "
                                           rf"allows {re.escape(allowed)}$"):
        balance(lengths, 2, algorithm="test_all_on_zero", equal_counts=True)


def test_regression_compare_reported_a_plugin_as_orchmllm_and_took_its_plan_as_orchmllm_s_best(capsys):
    """probe18 P18-12: compare's rows of a plugin read kind "orchmllm", timed "orchmllm", and its plan could become
    the summary's "best" (orchmllm's "after"); a plugin claiming kind "peer" crashed (peer_mode: unknown peer).
    Both are kind "plugin" now, named with their origin, and "best" stays among orchmllm's own."""
    from orchmllm.balancers import CostModel
    from orchmllm.study.compare import PLUGIN_TIMING, CompareConfig, algorithm_names, file_stages, run_comparison

    def exact_again(problem):  # beats lpt on [3, 3, 2, 2, 2] over 2 ranks: 6 against lpt's 7
        return get_algorithm("exact")(problem)

    register_algorithm("test_exact_again", exact_again, kind="ours", description="exact, relabelled")
    register_algorithm("test_peer_claim", halves, kind="peer", description="two halves")
    stage = file_stages(np.array([3, 3, 2, 2, 2]), 2, CostModel(), False, 1.0)[0]
    names = algorithm_names("lpt,test_exact_again,test_peer_claim,test_peer_claim+locality")  # review13 R13-12
    comparison = run_comparison([CompareConfig(2, None, (stage,))], names, gpus_per_node=8)
    rows = {row.algorithm: row for row in comparison.rows}
    assert (rows["lpt"].kind, rows["lpt"].timed, rows["lpt"].makespan) == ("orchmllm", "orchmllm", 7.0)
    assert rows["test_peer_claim+locality"].kind == "plugin"
    for name, description in (("test_exact_again", "exact, relabelled"), ("test_peer_claim", "two halves")):
        assert (rows[name].kind, rows[name].timed, rows[name].mode) == ("plugin", PLUGIN_TIMING, "")
        assert rows[name].label == f"algorithm {name!r} (registered by a register_* call): {description}"
    summary = comparison.summaries[0]
    assert dict(summary.best.algorithms) == {stage.name: "lpt"} and summary.best.work == 7.0
    assert (summary.best_plugin.algorithm, summary.best_plugin.work, summary.best_peer) == ("test_exact_again", 6.0,
                                                                                            None)
    assert summary.to_json()["best_plugin"]["algorithm"] == "test_exact_again"
    from orchmllm.cli.render import print_compare

    print_compare(comparison, "test lengths")  # the text marks them too: rows and a line of their own
    text = capsys.readouterr().out
    assert "test_exact_again (plugin)" in text and "test_peer_claim (plugin)" in text
    assert re.search(r"best plugin.*test_exact_again", text) and re.search(r"after.*lpt", text), text


def test_regression_a_plugin_claiming_kind_baseline_had_no_locality_variant():
    """Cause (probe19 P19-08): compare offered NAME+locality for every record but those of kind "baseline", so a
    plugin claiming that kind was refused as an unknown algorithm, unlike one claiming "ours" or "peer" (R13-12),
    though `balance` runs its locality pass like theirs.  A plugin has its +locality variant whatever kind it
    claims; orchmllm's baseline and peers, which have none, are refused with the reason, not as unknown."""
    from orchmllm.balancers import CostModel
    from orchmllm.study.compare import CompareConfig, algorithm_names, file_stages, peer_names, run_comparison

    register_algorithm("test_baseline_claim", halves, kind="baseline", description="two halves")
    names = algorithm_names("test_baseline_claim,test_baseline_claim+locality")
    stage = file_stages(np.array([3, 3, 2, 2, 2, 1, 1, 4]), 4, CostModel(), False, 1.0)[0]
    rows = {row.algorithm: row for row in run_comparison([CompareConfig(4, None, (stage,))], names,
                                                         gpus_per_node=2).rows}
    assert rows["test_baseline_claim+locality"].kind == rows["test_baseline_claim"].kind == "plugin"
    assert rows["test_baseline_claim+locality"].bytes_moved < rows["test_baseline_claim"].bytes_moved, rows  # 0 < 7
    peer = peer_names()[0]
    for name, reason in (("identity", "it is the baseline, which keeps every item on the rank that sampled it"),
                         (peer, "it is a peer's heuristic, compared as its system runs it, without a locality pass")):
        with pytest.raises(ValueError, match=rf"^algorithm '{name}' has no \+locality variant: {reason}.*; name "
                                             rf"'{name}'$"):
            algorithm_names(f"{name}+locality")

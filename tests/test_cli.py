"""The `orchmllm` command end to end: output, JSON schemas, files, exit codes.  By subprocess where the process
itself is under test (exit codes, a clean stderr, the console script, closed or full stdout, no torch imported);
elsewhere `main` runs in this process, as the subprocess would (the CLI's imports, about a second each, paid once)."""

import csv
import dataclasses
import io
import json
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from orchmllm.balancers import ALGORITHMS
from orchmllm.study.peers import PEER_NAMES as PEERS
from orchmllm.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def orchmllm(*args):
    return subprocess.run([sys.executable, "-m", "orchmllm", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def in_process(*args) -> subprocess.CompletedProcess:
    """`orchmllm(*args)` run by `main` in this process: its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(map(str, args)))
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def assert_png(path: Path):
    image = pytest.importorskip("matplotlib.image")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, path
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


@pytest.fixture(scope="module")
def lengths_csv(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "trace.csv"
    rng = np.random.default_rng(7)
    rows = [(i, int(a), int(b)) for i, (a, b) in enumerate(zip(rng.integers(1, 4000, 96), rng.integers(1, 500, 96)))]
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        writer.writerows(rows)
    return path


@pytest.mark.early("compare")
def test_compare_prints_tables_and_a_before_after_summary(started_early):
    result = started_early("compare")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for text in ("D=8, 4 items/rank", "D=16, 4 items/rank", "image encoder", "audio encoder", "llm", "Before / after",
                 "faster", "lpt", *(f"{name} (peer)" for name in PEERS)):
        assert text in out, text
    assert result.stderr == ""  # no progress bar when stderr is not a terminal


def test_compare_json_schema():
    result = in_process("compare", "--ranks", "16", "--items-per-rank", "8", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert set(payload) == {"command", "source", "rows", "summary", "files"}
    rows = payload["rows"]
    stages = {row["stage"] for row in rows}
    assert stages == {"image encoder", "audio encoder", "llm"}
    algorithms = {row["algorithm"] for row in rows}
    assert {"none", "lpt", "auto", "auto+locality"} | set(PEERS) <= algorithms
    for row in rows:
        assert row["ranks"] == 16 and row["items_per_rank"] == 8
        assert row["kind"] == ("peer" if row["algorithm"] in PEERS else "orchmllm")
        if row["algorithm"] == "verl_kk":  # equal-size KK only when D divides the stage's item count
            assert row["mode"] == ("equal_size" if row["num_items"] % 16 == 0 else
                                   "equal_size=False (D does not divide n)")
        assert row["makespan"] >= row["lower_bound"] > 0
        assert row["makespan_over_bound"] == pytest.approx(row["makespan"] / row["lower_bound"])
        assert 0 <= row["bytes_inter_node"] <= row["bytes_moved"]
        assert row["solve_seconds"] >= 0 and row["status"] in ("optimal", "feasible", "time_limit")
        if row["algorithm"] == "none":
            assert row["bytes_moved"] == 0 and row["speedup_vs_none"] == 1.0
    llm = [row for row in rows if row["stage"] == "llm"]
    assert sum(row["num_items"] for row in llm) == len(llm) * 16 * 8
    (summary,) = payload["summary"]
    assert summary["stages"] == ["image encoder", "audio encoder", "llm"]
    chosen = summary["best"]["algorithms"]
    assert list(chosen) == summary["stages"] and set(chosen.values()) <= set(ALGORITHMS)
    for stage, name in chosen.items():  # the best registered algorithm of each stage
        makespans = {row["algorithm"]: row["makespan"] for row in rows
                     if row["stage"] == stage and row["kind"] == "orchmllm" and row["algorithm"] != "none"}
        assert makespans[name] == min(makespans.values())
    assert summary["best"]["work"] == pytest.approx(sum(
        row["makespan"] for row in rows if (row["stage"], row["algorithm"]) in chosen.items()))
    assert summary["best_peer"]["algorithm"] in PEERS
    (locality,) = summary["locality"]
    assert locality["algorithm"] == "auto"
    assert locality["bytes_inter_node_locality"] <= locality["bytes_inter_node"]
    for stage in summary["stages"]:  # communication-aware plans stay within 0.2 % of the plain makespan
        plain, aware = ({row["algorithm"]: row for row in rows if row["stage"] == stage}[name]
                        for name in ("auto", "auto+locality"))
        assert aware["makespan"] <= plain["makespan"] * 1.002 * (1 + 1e-12)
    assert summary["work_before"] >= summary["best"]["work"] >= summary["work_ideal"] > 0


def test_regression_the_summary_divides_by_the_best_bound_its_rows_proved(tmp_path):
    """probe22 P22-05: the before/after summary divided by the baseline row's bound (padded: the generic count · f
    bound), so a plan proven optimal read "1.17x the lower bound" (and the asr workload's 1.0007x step 1.05x)."""
    lengths = tmp_path / "five.csv"
    lengths.write_text("5\n6\n7\n8\n9\n")
    result = in_process("compare", "--lengths", lengths, "--ranks", "2", "--padded", "--algorithms", "auto,lpt",
                      "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (summary,) = report["summary"]
    (auto,) = [row for row in report["rows"] if row["algorithm"] == "auto"]
    assert auto["status"] == "optimal" and summary["work_ideal"] == auto["lower_bound"] == auto["makespan"]
    assert summary["work_ideal"] == max(row["lower_bound"] for row in report["rows"])


def test_compare_lengths_file_writes_csv_and_plots(lengths_csv, tmp_path):
    out = tmp_path / "out"
    result = in_process("compare", "--lengths", lengths_csv, "--column", "ContextTokens", "--ranks", "8,16",
                      "--algorithms", "lpt,verl_kk,identity,lpt+locality", "--csv", out / "rows.csv", "--plot", out)
    assert result.returncode == 0, result.stderr
    assert "96 items" in result.stdout and "wrote" in result.stdout
    with (out / "rows.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(row["ranks"], row["algorithm"]) for row in rows] == [
        (d, a) for d in ("8", "16") for a in ("none", "lpt", "verl_kk", "identity", "lpt+locality")]
    # a file's items arrive rank by rank, so identity keeps every item where it was sampled
    assert all(float(row["bytes_moved"]) == 0 for row in rows if row["algorithm"] == "identity")
    for name in ("loads.png", "traffic.png", "traffic_locality.png"):
        assert_png(out / name)


def test_compare_workload_file_of_multimodal_samples(tmp_path):
    rng = np.random.default_rng(5)
    lines = []
    for index in range(64):
        modality, length, tokens = (("image", int(rng.choice([256, 1024, 4096])), 64) if index % 2
                                    else ("audio", int(rng.integers(100, 3000)), 50))
        lines.append(json.dumps({"text": int(rng.integers(10, 3000)),
                                 "segments": [{"modality": modality, "length": length, "tokens": tokens}]}))
    (tmp_path / "samples.jsonl").write_text("\n".join(lines) + "\n")
    result = in_process("compare", "--workload-file", tmp_path / "samples.jsonl", "-D", "8", "--items-per-rank", "8",
                      "--algorithms", "lpt,llava_length_grouped", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    items = {row["stage"]: row["num_items"] for row in rows if row["algorithm"] == "none"}
    assert items == {"image encoder": 32, "audio encoder": 32, "llm": 64}


def test_compare_explicit_algorithm_that_does_not_apply_is_reported():
    result = in_process("compare", "--ranks", "8", "--items-per-rank", "4", "--algorithms", "padded", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["stage"]: row for row in json.loads(result.stdout)["rows"] if row["algorithm"] == "padded"}
    assert rows["audio encoder"]["makespan"] > 0  # the 84b model's audio encoder is padded
    for stage in ("image encoder", "llm"):
        assert rows[stage]["status"] == "n/a" and rows[stage]["makespan"] is None and "padded" in rows[stage]["note"]


SIMULATION_KEYS = {"step_seconds", "speedup_vs_none", "mfu", "overhead_fraction", "exchanges_per_step", "oom",
                   "planning_seconds", "exchange_seconds", "idle_fraction", "per_stage"}


def test_simulate_json_schema_and_plots(tmp_path):
    result = in_process("simulate", "--model", "10b", "--gpus", "8,16", "--samples-per-rank", "4",
                      "--strategies", "llm_only,ours", "--json", "--plot", tmp_path)
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["command"] == "simulate" and [run["gpus"] for run in payload["runs"]] == [8, 16]
    for run in payload["runs"]:
        assert run["model"] == "10b" and set(run["strategies"]) == {"llm_only", "ours"}
        assert run["samples_per_rank"] == 4 and run["samples_per_rank_choice"] == {"rule": "explicit"}
        for figures in run["strategies"].values():
            assert SIMULATION_KEYS <= set(figures)
            assert figures["step_seconds"] > 0 and 0 < figures["mfu"] < 1 and 0 <= figures["idle_fraction"] < 1
            assert set(figures["per_stage"]) == {"image encoder", "audio encoder", "llm"}
    assert sorted(Path(path).name for path in payload["files"]) == ["scaling.png", "timeline_ours.png"]
    for path in payload["files"]:
        assert_png(Path(path))


def test_simulate_table_names_the_fastest_strategy():
    result = in_process("simulate", "--model", "10b", "--gpus", "16", "--samples-per-rank", "4")
    assert result.returncode == 0, result.stderr
    for name in ("none", "megatron", "length_grouped", "llm_only", "single_algorithm", "allgather", "two_exchange",
                 "ours", "Fastest without running out of memory"):
        assert name in result.stdout, name


def test_simulate_notes_a_step_of_so_little_compute_that_planning_noise_is_its_speed_up(tmp_path):
    """probe16 P16-06's residue: 39 empty samples and one of 1 token read "Fastest: megatron, 1.70x" (another run,
    another winner): the summary says that planning is over half of the step there."""
    path = tmp_path / "tiny.jsonl"
    path.write_text('{"text": 0, "segments": []}\n' * 31 + '{"text": 1}\n')
    result = in_process("simulate", "--model", "10b", "--gpus", "16", "--samples-per-rank", "2", "--workload-file",
                      str(path))
    assert result.returncode == 0, result.stderr
    assert "Note: planning, measured on this machine and noisy run to run, is over half of the step" in result.stdout
    normal = in_process("simulate", "--model", "10b", "--gpus", "16", "--samples-per-rank", "4", "--strategies", "ours")
    assert normal.returncode == 0 and "Note: planning" not in normal.stdout, normal.stderr


def test_regression_simulate_named_a_fastest_strategy_that_fits_when_none_fits(tmp_path):
    """probe20 P20-26: where every strategy ran out of memory the summary still read "Fastest without running out
    of memory: single_algorithm"; it says none fits and what to change."""
    path = tmp_path / "long.jsonl"
    path.write_text('{"text": 60000, "segments": [{"modality": "image", "length": 4096, "tokens": 600}]}\n' * 16)
    result = in_process("simulate", "--model", "84b", "--gpus", "16", "--strategies", "none,ours", "--workload-file",
                      str(path))
    assert result.returncode == 0, result.stderr
    assert "Fastest without" not in result.stdout and "Every strategy runs out of memory at 1 samples per rank: no " \
        "fastest among those that fit; try more GPUs or shorter samples" in " ".join(result.stdout.split())


def test_simulate_sizes_the_batch_by_memory_by_default():
    result = in_process("simulate", "--model", "10b", "--gpus", "8", "--strategies", "ours", "--json")
    assert result.returncode == 0, result.stderr
    (run,) = json.loads(result.stdout)["runs"]
    choice = run["samples_per_rank_choice"]
    assert choice["rule"] == "memory" and run["samples_per_rank"] in choice["grid"]
    assert run["strategies"]["ours"]["memory_peak_gib"] <= choice["limit_gib"]
    table = in_process("simulate", "--model", "10b", "--gpus", "8", "--strategies", "ours")
    assert table.returncode == 0, table.stderr
    title = " ".join(table.stdout.split())
    assert f"{run['samples_per_rank']} samples per rank (" in title and "ours fits in 90% of GPU memory" in title


def test_timeline_seconds_agree_with_the_simulator():
    from orchmllm.study.simulator import run_simulation

    result = run_simulation(model="10b", gpus=16, samples_per_rank=4, strategies=["none", "ours"], seed=3)
    for name in ("none", "ours"):
        seconds = result.strategies[name].rank_seconds  # what the timelines draw: no batch re-sampled or re-planned
        per_stage = result.to_json()["strategies"][name]["per_stage"]
        assert list(seconds) == list(per_stage)
        for stage, values in seconds.items():
            assert values.shape == (16,)
            assert values.max() == pytest.approx(per_stage[stage]["seconds"], rel=1e-12)
            assert values.mean() == pytest.approx(per_stage[stage]["mean_seconds"], rel=1e-12)


@pytest.mark.early("demo")
def test_demo_trains_on_gloo_ranks_and_reports_json(capsys, started_early):
    result = started_early("demo")
    report = json.loads(result.stdout)
    from orchmllm.runtime.demo.report import DemoReport

    typed = DemoReport(**report)
    assert result.returncode == (1 if typed.failed_checks() else 0), result.stderr  # the report's own verdict
    assert report["ranks"] == 2 and report["steps"] == 1 and report["dtype"] == "float32"
    # a regression: under --json the demo ran for minutes without a word (its rich bar showed only
    # on a terminal without --json); now each stage with the seconds elapsed, on stderr
    progress = [re.fullmatch(r"orchmllm demo: +(\d+\.\d) s  (.+)", line) for line in result.stderr.splitlines()]
    assert all(progress), result.stderr
    assert [match.group(2) for match in progress] == [
        "starting 2 gloo ranks", "warming up", "step 1 of 1: training unbalanced and balanced",
        "replaying every rank's work in isolation", "done"]
    assert [float(match.group(1)) for match in progress] == sorted(float(match.group(1)) for match in progress)
    assert report["samples_lost"] == 0 and report["samples_duplicated"] == 0
    assert 0 <= report["grad_max_rel_diff"] <= typed.gradient_tolerance / 10  # sums commute: only rounding differs
    assert len(report["busy_seconds_per_rank_balanced"]) == len(report["busy_seconds_per_rank_unbalanced"]) == 2
    assert report["busy_max_over_mean_balanced"] >= 1 and report["busy_max_over_mean_unbalanced"] >= 1
    assert report["busy_max_over_mean_balanced_isolated"] >= 1 and report["replay_seconds"] > 0
    assert report["exchange_seconds"] > 0 and 0 <= report["planning_hidden_fraction"] <= 1
    # the same report as text, and the checks that decide the exit code
    from orchmllm.cli.demo import print_demo

    assert print_demo(typed) == typed.failed_checks()
    out = capsys.readouterr().out
    assert "balanced, isolated" in out and "within float32 rounding tolerance" in out and "samples lost 0" in out
    assert ("isolated (every rank's recorded work replayed by one process, one piece of one work at a time, the "
            "ranks' pieces side by side, thread CPU time, trimmed mean share of 2 rounds; the check uses these)"
            ) in " ".join(out.split())  # unwrapped
    broken = dataclasses.replace(typed, samples_duplicated=1, grad_max_rel_diff=0.5)
    assert print_demo(broken)[:2] == [f"gradients differ by 0.5 (relative) > {typed.gradient_tolerance:.2g}, float32 "
                                      f"rounding of sums of {typed.gradient_terms} terms",
                                      "0 samples lost, 1 duplicated"]
    assert "check failed" in capsys.readouterr().out


def test_demo_with_gradient_accumulation_matches_the_unbalanced_one_pass_gradient(capsys):
    """Issue 12: the balanced step as M >= 2 micro-batches on 2 gloo ranks gives the gradient of
    the unbalanced, un-micro-batched step (float64 within 1e-12), no sample lost or duplicated, and
    per-micro-batch busy figures (float32's tolerance: `test_demo_trains_on_gloo_ranks_and_reports_json`)."""
    dtype = "float64"
    result = in_process("demo", "--ranks", "2", "--steps", "1", "--samples-per-rank", "8", "--json", "--dtype", dtype,
                      "--costs", "flops", "--repeats", "1", "--replay-repeats", "1",
                      "--max-tokens-per-microbatch", "800")
    report = json.loads(result.stdout)
    from orchmllm.runtime.demo.report import DemoReport

    typed = DemoReport(**report)
    assert result.returncode == (1 if typed.failed_checks() else 0), result.stderr
    assert report["max_tokens_per_microbatch"] == 800 and report["num_microbatches"][0] >= 2
    assert report["grad_max_abs_diff"] <= 1e-12 and report["grad_max_rel_diff"] <= 1e-12
    assert report["samples_lost"] == 0 and report["samples_duplicated"] == 0
    for suffix in ("", "_isolated", "_planned"):
        cells = report[f"microbatch_busy_max_over_mean{suffix}_per_cell"]
        assert len(cells) == 1 and len(cells[0]) == report["num_microbatches"][0]
        assert all(value >= 1 for value in cells[0])
        # Σ_m max_r / Σ_m mean_r lies between the best and the worst micro-batch's max / mean
        assert min(cells[0]) - 1e-12 <= report[f"microbatch_busy_max_over_mean{suffix}"] <= max(cells[0]) + 1e-12
    from orchmllm.cli.demo import print_demo

    assert print_demo(typed) == typed.failed_checks()
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "micro-batched balanced step (<= 800 tokens per rank and micro-batch" in out
    assert "per micro-batch, slowest rank / mean, isolated: step 0:" in out
    assert "noise floor (identical cells)" in out


def test_plan_prints_saves_and_round_trips(lengths_csv, tmp_path, capsys):
    result = in_process("plan", lengths_csv, "--column", "ContextTokens", "-D", "8", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assignment = np.asarray(payload["assignment"])
    assert assignment.shape == (96,) and assignment.min() >= 0 and assignment.max() < 8
    assert payload["makespan"] == max(payload["loads"]) >= payload["lower_bound"]
    assert payload["algorithm"] == "auto" and len(payload["digest"]) == 64
    for suffix in ("npy", "csv", "json"):
        target = tmp_path / f"plan.{suffix}"
        code = main(["plan", str(lengths_csv), "--column", "ContextTokens", "-D", "8", "-o", str(target), "-q"])
        out = capsys.readouterr().out
        assert code == 0 and "makespan" in out and "rank" not in out.split("makespan")[0]
        if suffix == "npy":
            loaded = np.load(target, allow_pickle=False)
        elif suffix == "csv":
            loaded = np.loadtxt(target, delimiter=",", skiprows=1, dtype=np.int64)[:, 1]
        else:
            loaded = np.asarray(json.loads(target.read_text())["assignment"])
        assert np.array_equal(loaded, assignment), suffix
    table = in_process("plan", lengths_csv, "--column", "ContextTokens", "-D", "4", "--algorithm", "omnibal_2d")
    assert (table.returncode == 0 and "omnibal_2d" in table.stdout and "(peer)" in table.stdout
            and "load / mean" in table.stdout)
    code = main(["plan", str(lengths_csv), "--column", "ContextTokens", "-D", "16", "--algorithm", "lpt+locality",
                 "--json"])
    aware = json.loads(capsys.readouterr().out)
    assert code == 0 and aware["algorithm"] == "lpt+locality" and len(aware["assignment"]) == 96


def test_plan_reads_json_lines_and_npy(tmp_path):
    lengths = [5, 300, 7, 42, 1000, 3, 3, 64]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"length": n}) for n in lengths) + "\n")
    np.save(tmp_path / "a.npy", np.asarray(lengths))
    plans = [json.loads(in_process("plan", tmp_path / name, "-D", "3", "--json").stdout)
             for name in ("a.jsonl", "a.npy")]
    assert plans[0]["assignment"] == plans[1]["assignment"] and plans[0]["num_items"] == 8


def test_compare_handles_a_step_without_work(tmp_path, capsys):
    (tmp_path / "zeros.csv").write_text("0\n0\n0\n")
    assert main(["compare", "--lengths", str(tmp_path / "zeros.csv"), "--ranks", "2", "--json"]) == 0
    (summary,) = json.loads(capsys.readouterr().out)["summary"]
    assert summary["work_before"] == 0 and summary["best"]["speedup_vs_none"] == 1.0


def test_csv_without_header_keeps_its_first_value(tmp_path, capsys):
    (tmp_path / "exp.csv").write_text("1e3\n20\n7\n")
    assert main(["plan", str(tmp_path / "exp.csv"), "-D", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_items"] == 3


def test_plan_and_compare_never_import_torch(lengths_csv):
    code = ("import sys; from orchmllm.cli import main; "
            f"main(['plan', {str(lengths_csv)!r}, '--column', 'ContextTokens', '-D', '2', '-q']); "
            "main(['compare', '--ranks', '8', '--items-per-rank', '2', '--json']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


BAD_INPUTS = {
    "missing file": (["plan", "{tmp}/nope.csv", "-D", "2"], "not found"),
    "malformed csv": (["plan", "{tmp}/bad.csv", "-D", "2"], "bad.csv:3: expected an integer length, got 'x7'"),
    "ragged csv": (["plan", "{tmp}/ragged.csv", "-D", "2"], "ragged.csv:2: expected 1 comma-separated fields"),
    "negative length": (["compare", "--lengths", "{tmp}/negative.csv"], "negative.csv:2: lengths must be non-negative"),
    "negative npy": (["plan", "{tmp}/negative.npy", "-D", "2"], "index 1: lengths must be non-negative"),
    "pickled npy": (["plan", "{tmp}/objects.npy", "-D", "2"], "not a plain numeric .npy"),
    "garbage npy": (["plan", "{tmp}/garbage.npy", "-D", "2"], "not a plain numeric .npy"),
    "huge json length": (["plan", "{tmp}/huge.jsonl", "-D", "2"], "huge.jsonl:1: lengths must be below 2**53"),
    "bad json line": (["plan", "{tmp}/bad.jsonl", "-D", "2"], "bad.jsonl:2: not valid JSON"),
    "unknown workload": (["compare", "--workload", "video-only"], "unknown workload 'video-only'"),
    "unknown model": (["compare", "--model", "1t"], "--model 1t: unknown model '1t'; choose one of 10b, 18b, 84b"),
    "unknown strategy": (["simulate", "--gpus", "8", "--strategies", "ours,magic"],
                         "unknown strategy 'magic'; choose from none, megatron,"),
    "simulate D = 0": (["simulate", "--gpus", "0"], "--gpus must be >= 1; got 0"),
    "simulate unknown model": (["simulate", "--model", "7b"], "unknown model '7b'"),
    "simulate no samples": (["simulate", "--gpus", "8", "--samples-per-rank", "0"],
                            "--samples-per-rank must be >= 1; got 0"),  # probe51: it said "... or None"
    "simulate unknown workload": (["simulate", "--workload", "nosuch"],  # probe51: the names as a Python list
                                  "unknown workload 'nosuch'; choose one of asr, audio_qa, chat,"),
    "demo no ranks": (["demo", "--ranks", "0"], "--ranks and --steps must be >= 1"),
    "demo bad dtype": (["demo", "--dtype", "int8"], "invalid choice: 'int8'"),
    "demo nodes not dividing ranks": (["demo", "--transport", "hierarchical", "--gpus-per-node", "3"],
                                      "needs `gpus_per_node` dividing ranks=4"),
    "demo unknown algorithm": (["demo", "--algorithm", "magic"], "--algorithm magic: unknown; the demo's stages "
                                                                 "balance unpadded costs sum f(l): choose one of "
                                                                 "identity, lpt,"),  # probe51: named a stage
    "demo padded-only algorithm": (["demo", "--algorithm", "padded"],  # probe51: said "pass padded=True"
                                   "--algorithm padded: solves the padded cost only; the demo's stages"),
    "demo negative seed": (["demo", "--seed", "-1"], "--seed must be >= 0; got -1"),
    "demo more ranks than it spawns": (["demo", "--ranks", "100000"], "--ranks must be at most 64 spawned"),
    # probe10 P10-20: the LLM stage's balancer never ran under a micro-batch budget, no word said
    "demo balancer the micro-batch planner replaces": (
        ["demo", "--algorithm", "identity", "--max-tokens-per-microbatch", "4096"],
        "--algorithm 'identity' plans a step of one pass per rank, which --max-tokens-per-microbatch replaces: its "
        "cells come from the micro-batch planner (`microbatch_algorithm` in Python); leave --algorithm at 'lpt' or "
        "'auto'"),
    "demo micro-batch budget 0": (["demo", "--max-tokens-per-microbatch", "0"],
                                  "--max-tokens-per-microbatch must be >= 1; got 0"),
    "demo micro-batch budget below the longest sample": (
        ["demo", "--max-tokens-per-microbatch", "100"],
        "must hold the longest sample: 509 LLM tokens (step 2, rank 3) is the smallest budget"),
    "bad workload line": (["compare", "--workload-file", "{tmp}/samples.jsonl", "-D", "1", "--items-per-rank", "2"],
                          "line 2"),
    "unknown algorithm": (["compare", "--algorithms", "lpt,greedy"], "unknown algorithm 'greedy'"),
    "unknown plan algorithm": (["plan", "{tmp}/good.csv", "-D", "2", "--algorithm", "magic"], "unknown algorithm"),
    "D = 0 compare": (["compare", "--ranks", "0"], "--ranks must be >= 1; got 0"),
    "D = 0 plan": (["plan", "{tmp}/good.csv", "-D", "0"], "--ranks must be >= 1; got 0"),
    "D not an integer": (["compare", "--ranks", "8,x"], "--ranks must be comma-separated integers"),
    "partial node": (["compare", "--ranks", "12"], "12 = 1 × 8 + 4"),
    "infeasible cap": (["plan", "{tmp}/good.csv", "-D", "2", "--max-tokens", "3"], "--max-tokens"),
    "unknown option": (["compare", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    "negative time limit": (["compare", "--time-limit", "-1"],
                            "--time-limit: `time_limit` must be a positive finite number of seconds; got -1.0"),
    "plan negative time limit": (["plan", "{tmp}/good.csv", "-D", "2", "--time-limit", "0"],
                                 "--time-limit: `time_limit` must be a positive finite number of seconds; got 0.0"),
    "negative cost": (["compare", "--lengths", "{tmp}/good.csv", "--cost=-1,1,0"],
                      "`per_item` must be finite and >= 0"),
    "cost of two numbers": (["plan", "{tmp}/good.csv", "-D", "2", "--cost", "1,2"], "--cost must be three numbers"),
    "no command": ([], "choose a command"),
    "bad output type": (["plan", "{tmp}/good.csv", "-D", "2", "-o", "{tmp}/plan.txt"], "unknown file type '.txt'"),
    "column without header": (["plan", "{tmp}/good.csv", "-D", "2", "--column", "x"], "has no header line"),
}


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "bad.csv").write_text("3\n4\nx7\n")
    (tmp / "ragged.csv").write_text("3\n4,5\n")
    (tmp / "negative.csv").write_text("length\n-3\n4\n")
    (tmp / "good.csv").write_text("3\n4\n5\n")
    (tmp / "bad.jsonl").write_text('{"length": 3}\n{"length": \n')
    (tmp / "samples.jsonl").write_text('{"text": 20, "segments": [{"modality": "image", "length": 1024, '
                                       '"tokens": 256}]}\n{"text": -4}\n')
    np.save(tmp / "negative.npy", np.array([3, -1, 2]))
    (tmp / "garbage.npy").write_bytes(b"this is not numpy")
    (tmp / "huge.jsonl").write_text("1e20\n")
    np.save(tmp / "objects.npy", np.array([3, "a", None], dtype=object), allow_pickle=True)
    return tmp


def check_one_line_error(code, stderr, message):
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchmllm") and "error: " in lines[0], stderr
    assert message in lines[0]


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(case, bad_files, capsys):
    args, message = BAD_INPUTS[case]
    code = main([arg.format(tmp=bad_files) for arg in args])
    check_one_line_error(code, capsys.readouterr().err, message)


@pytest.mark.parametrize("case", ["missing file", "malformed csv", "unknown workload", "D = 0 compare",
                                  "unknown option", "no command"])
def test_bad_input_exit_code_of_the_real_process(case, bad_files):
    args, message = BAD_INPUTS[case]
    result = orchmllm(*(arg.format(tmp=bad_files) for arg in args))
    check_one_line_error(result.returncode, result.stderr, message)


@pytest.mark.early("help")
def test_help_shows_examples_and_commands(capsys, started_early):
    top = started_early("help")
    assert top.returncode == 0 and all(name in top.stdout for name in ("compare", "simulate", "demo", "plan"))
    for command in ("compare", "simulate", "demo", "plan"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        out = capsys.readouterr().out
        assert exit_info.value.code == 0 and "examples:" in out and f"orchmllm {command}" in out


def run_with_terminal_stderr(*args):
    """Run the command with stderr on a pseudo-terminal (stdout stays a pipe); (rc, stdout, stderr)."""
    import os
    import pty
    import threading

    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "orchmllm", *args], stdout=subprocess.PIPE,
                               stderr=slave, env={**os.environ, "TERM": "xterm", "COLUMNS": "100"})
    os.close(slave)
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    stdout = process.communicate(timeout=120)[0].decode()
    reader.join(timeout=10)
    os.close(master)
    return process.returncode, stdout, b"".join(chunks).decode(errors="replace")


def test_progress_bar_only_on_a_terminal_and_never_with_json():
    code, stdout, stderr = run_with_terminal_stderr("compare", "--ranks", "8", "--items-per-rank", "4")
    assert code == 0 and "balancing" in stderr and "━" in stderr  # the bar, on stderr
    assert "Before / after" in stdout and "━━━" not in stdout.split("┏")[0]
    code, stdout, stderr = run_with_terminal_stderr("compare", "--ranks", "8", "--items-per-rank", "4", "--json")
    assert code == 0 and "balancing" not in stderr and json.loads(stdout)["rows"]


def test_console_script_is_installed():
    script = shutil.which("orchmllm", path=str(Path(sys.executable).parent)) or shutil.which("orchmllm")
    assert script, "the `orchmllm` console script is not on PATH: pip install -e ."
    result = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("orchmllm ")


# ---------------------------------------------------------------- regressions (issue 11), named after their cause


def test_csv_starting_with_a_utf8_byte_order_mark_keeps_its_first_value(tmp_path, capsys):
    (tmp_path / "excel.csv").write_bytes("\ufeff1000\n20\n7\n".encode())
    assert main(["plan", str(tmp_path / "excel.csv"), "-D", "1", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["num_items"] == 3 and payload["makespan"] == 1027
    (tmp_path / "header.csv").write_bytes("\ufefflength,other\n5,1\n6,1\n".encode())
    assert main(["plan", str(tmp_path / "header.csv"), "-D", "1", "--column", "length", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == 11


def write_samples(path, lines):
    path.write_text("\n".join(json.dumps(line) if isinstance(line, dict) else line for line in lines) + "\n")
    return path


def test_compare_workload_file_segment_of_a_modality_no_stage_encodes_is_rejected(tmp_path, capsys):
    path = write_samples(tmp_path / "video.jsonl", [
        {"text": 20}, {"text": 30, "segments": [{"modality": "video", "length": 64, "tokens": 16}]}])
    code = main(["compare", "--workload-file", str(path), "-D", "1", "--items-per-rank", "2"])
    check_one_line_error(code, capsys.readouterr().err, "line 2: segment 0 has modality 'video', which no stage "
                                                         "encodes; stages encode ['audio', 'image']")


def test_simulate_workload_file_segment_of_a_modality_no_stage_encodes_names_its_line(tmp_path, capsys):
    path = write_samples(tmp_path / "video.jsonl", [{"text": 20}] * 7 + [
        {"text": 30, "segments": [{"modality": "video", "length": 64, "tokens": 16}]}])
    code = main(["simulate", "--workload-file", str(path), "--gpus", "8", "--samples-per-rank", "1"])
    check_one_line_error(code, capsys.readouterr().err, "line 8: segment 0 has modality 'video'")


@pytest.mark.parametrize("command", [["compare", "-D", "1", "--items-per-rank", "2"],
                                     ["simulate", "--gpus", "1", "--samples-per-rank", "2"]],
                         ids=["compare", "simulate"])
def test_workload_file_lines_beyond_the_samples_a_run_uses_are_validated(tmp_path, capsys, command):
    path = write_samples(tmp_path / "w.jsonl", [{"text": 20}, {"text": 30}, {"text": 40}, {"text": -1}])
    code = main([*command, "--workload-file", str(path)])
    check_one_line_error(code, capsys.readouterr().err, "line 4: the sample 'text' must be a non-negative integer")


@pytest.mark.parametrize("option", ["-o", "--csv", "--plot"])
def test_output_to_an_unwritable_path_is_one_line_and_exit_2(lengths_csv, tmp_path, capsys, option):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    target = blocker / ("out" if option == "--plot" else "plan.json")
    if option == "-o":
        args = ["plan", str(lengths_csv), "--column", "ContextTokens", "-D", "2", "-o", str(target)]
    else:
        if option == "--plot":
            pytest.importorskip("matplotlib")
        args = ["compare", "--lengths", str(lengths_csv), "--column", "ContextTokens", "-D", "2",
                "--algorithms", "lpt", option, str(target)]
    code = main(args)
    named = {"-o": "--output"}.get(option, option)
    check_one_line_error(code, capsys.readouterr().err, f"{named} {str(target)!r}: cannot write (")


def test_stdout_closed_by_its_reader_ends_quietly_with_exit_141(lengths_csv):
    """`orchmllm compare --json | head` once ended in a BrokenPipeError traceback."""
    code = ("import os, sys\n"
            "read_end, write_end = os.pipe()\n"
            "os.close(read_end)  # the reader is gone, as `head` is once it has its lines\n"
            "os.dup2(write_end, sys.stdout.fileno())\n"
            "from orchmllm.cli import main\n"
            f"sys.exit(main(['compare', '--lengths', {str(lengths_csv)!r}, '--column', 'ContextTokens', '-D', '2', "
            "'--json']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 141 and result.stderr == "", result.stderr


def test_demo_with_zero_samples_per_rank_is_one_line_and_exit_2(capsys):
    check_one_line_error(main(["demo", "--samples-per-rank", "0"]), capsys.readouterr().err,
                         "--samples-per-rank must be >= 1; got 0")


@pytest.mark.early("demo without torch")
def test_demo_without_torch_installed_says_how_to_install_it(started_early):
    result = started_early("demo without torch")
    check_one_line_error(result.returncode, result.stderr, "the demo needs torch: python3.11 -m pip install "
                                                           "'torch>=2.4,<3'")


@pytest.mark.early("a bug inside")
def test_a_value_error_inside_orchmllm_is_a_bug_with_its_traceback_not_a_usage_error(started_early):
    """`main` once caught every ValueError/TypeError as bad input (exit 2), hiding bugs' tracebacks."""
    result = started_early("a bug inside")
    assert result.returncode == 1
    assert "Traceback" in result.stderr and result.stderr.strip().endswith("ValueError: a bug deep inside")


A_BUG_INSIDE = ("import sys\n"
                "import orchmllm.cli.compare as compare\n"
                "def broken(*args, **kwargs):\n"
                "    raise ValueError('a bug deep inside')\n"
                "compare.run_comparison = broken\n"
                "from orchmllm.cli import main\n"
                "sys.exit(main(['compare', '--ranks', '8', '--items-per-rank', '2']))\n")
NO_TORCH = ("import sys; sys.modules['torch'] = None\n"
            "from orchmllm.cli import main\n"
            "sys.exit(main(['demo', '--ranks', '1', '--steps', '1']))\n")
EARLY = {"compare": ("-m", "orchmllm", "compare", "--ranks", "8,16", "--items-per-rank", "4"),  # conftest's
         "demo": ("-m", "orchmllm", "demo", "--ranks", "2", "--steps", "1", "--samples-per-rank", "8", "--json",
                  "--costs", "flops", "--repeats", "1", "--replay-repeats", "2"),  # `started_early`
         "help": ("-m", "orchmllm", "--help"), "demo without torch": ("-c", NO_TORCH),
         "a bug inside": ("-c", A_BUG_INSIDE)}

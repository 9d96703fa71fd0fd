"""`orchmllm simulate --context-parallel` and `orchmllm compare --context-parallel` end to end: JSON,
tables, the split-work figure, and bad input as one line with exit 2."""

import json

import pytest

from orchmllm.cli import main

SIMULATE = ["simulate", "--model", "10b", "--gpus", "16", "--workload", "long", "--samples-per-rank", "4",
            "--context-parallel", "1,2,4,8"]
COMPARE = ["compare", "--workload", "long", "--ranks", "16", "--items-per-rank", "4", "--algorithms", "lpt",
           "--context-parallel", "1,2,4,8"]


def check_png(path):
    image = pytest.importorskip("matplotlib.image")
    pixels = image.imread(path)
    assert path.read_bytes().startswith(b"\x89PNG") and min(pixels.shape[:2]) > 100 and pixels[..., :3].std() > 0.05


def test_simulate_json_has_every_strategy_and_the_split_work_figure(tmp_path, capsys):
    assert main([*SIMULATE, "--json", "--plot", str(tmp_path)]) == 0
    payload = json.loads(capsys.readouterr().out)
    strategies = payload["runs"][0]["strategies"]
    assert list(strategies) == ["none", "no_split", "static_cp", "megatron_dynamic_cp", "ours"]
    for figures in strategies.values():
        assert {"step_seconds", "speedup_vs_none", "items_split", "cp_exposed_seconds",
                "cp_bytes_inter_node"} <= set(figures)
    assert strategies["ours"]["items_split"] > 0 and strategies["no_split"]["items_split"] == 0
    assert payload["runs"][0]["degrees"] == [1, 2, 4, 8]
    assert payload["files"] == [str(tmp_path / "cp_work.png")]
    check_png(tmp_path / "cp_work.png")


def test_simulate_table_explains_its_columns(capsys):
    assert main([*SIMULATE, "--strategies", "no_split,ours"]) == 0
    out = capsys.readouterr().out
    assert "megatron_dynamic_cp" not in out and "ours" in out and "no_split" in out and "none" in out
    assert "LLM/LB" in out and "certified lower bound" in out


def test_compare_adds_the_split_algorithms_with_step_over_bound(tmp_path, capsys):
    assert main([*COMPARE, "--json", "--plot", str(tmp_path)]) == 0
    payload = json.loads(capsys.readouterr().out)
    rows = payload["context_parallel"]
    assert [row["algorithm"] for row in rows] == ["no_split", "static_cp", "megatron_dynamic_cp", "ours"]
    assert all(row["step_cost_over_bound"] >= 1 - 1e-9 and row["ranks"] == 16 for row in rows)
    assert str(tmp_path / "cp_work.png") in payload["files"]
    check_png(tmp_path / "cp_work.png")
    assert main(COMPARE) == 0
    assert "step / LB" in capsys.readouterr().out


def test_regression_a_ratio_over_a_zero_bound_was_inf_which_strict_json_refused_with_a_traceback(tmp_path, capsys):
    """Cause: on a file of zero lengths the canonical-allotment bound is 0, the peer's split step is not, so its
    `step / LB` was inf, and `--json` (strict: no inf) ended in json's traceback, exit 1 (probe6 P6-10).  A number
    JSON cannot hold is null there; the table still says inf."""
    (tmp_path / "zeros.csv").write_text("0\n0\n0\n0\n")
    command = ["compare", "--lengths", str(tmp_path / "zeros.csv"), "-D", "2", "--cost", "0,6e9,0",
               "--context-parallel", "1,2"]
    assert main([*command, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} in the JSON"))
    ratios = {row["algorithm"]: row["step_cost_over_bound"] for row in rows["context_parallel"]}
    assert ratios == {"no_split": 1.0, "static_cp": None, "megatron_dynamic_cp": 1.0, "ours": 1.0}
    assert main(command) == 0 and "inf" in capsys.readouterr().out


BAD = {
    "not a power of two": (["simulate", "--gpus", "16", "--context-parallel", "1,3"],
                           "--context-parallel 1,3: `degrees` must be powers of two (1, 2, 4, ...); got 3"),
    "wider than the ranks": (["simulate", "--gpus", "64,8", "--context-parallel", "1,16"],
                             "--context-parallel 1,16: degree 16 > 8 ranks"),
    "zero": (["simulate", "--gpus", "16", "--context-parallel", "0"], "--context-parallel must be >= 1; got 0"),
    "not integers": (["simulate", "--gpus", "16", "--context-parallel", "1,x"],
                     "--context-parallel must be comma-separated integers"),
    "empty": (["simulate", "--gpus", "16", "--context-parallel", ","], "--context-parallel must list at least one"),
    "repeated": (["simulate", "--gpus", "16", "--context-parallel", "2,2"], "`degrees` must be distinct"),
    "with micro-batches": (["simulate", "--gpus", "16", "--context-parallel", "1,2", "--max-tokens-per-microbatch",
                            "8192"], "--context-parallel is not available with --max-tokens-per-microbatch"),
    "unknown strategy": (["simulate", "--gpus", "16", "--context-parallel", "1,2", "--strategies", "ours,magic"],
                         "--strategies: unknown context-parallel strategy 'magic'"),
    "unknown workload": (["simulate", "--gpus", "16", "--context-parallel", "1,2", "--workload", "huge"],
                         "unknown workload 'huge'"),
    "compare wider than the ranks": (["compare", "--ranks", "8", "--context-parallel", "1,16"],
                                     "--context-parallel 1,16: degree 16 > 8 ranks"),
    # probe16 P16-02: the library's refusal named `allow_inter_node=True`, a keyword no option sets
    "compare straddling nodes": (["compare", "--ranks", "6", "--gpus-per-node", "3", "--context-parallel", "1,2"],
                                 "--context-parallel 1,2: degree 2 does not divide the 3 GPUs of a node at -D 6 "
                                 "(--gpus-per-node 3), so the peers' aligned groups would straddle nodes "
                                 "(orchmllm's planner alone would keep them inside); use degrees that divide 3"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_context_parallel_input_is_one_line_and_exit_2(case, capsys):
    args, message = BAD[case]
    assert main(args) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0] and message in lines[0], lines


def test_regression_a_lengths_file_split_without_a_flop_cost_priced_tokens_as_flops(tmp_path, capsys):
    """Cause (probe13 P13-13): `compare --lengths F --context-parallel` without --cost took a cost of 1 per
    token for FLOPs on an H100, so split times were all communication: every split peer read ~1e9 x the bound,
    ours never split, exit 0 and no word.  Split times need the stage's cost in FLOPs: --cost is required."""
    (tmp_path / "giants.csv").write_text("90000\n" + "500\n" * 30)
    command = ["compare", "--lengths", str(tmp_path / "giants.csv"), "-D", "8", "--algorithms", "lpt",
               "--context-parallel", "1,2,4"]
    assert main(command) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--context-parallel with --lengths needs --cost in FLOPs" in lines[0], lines
    assert main([*command, "--cost", "0,6e9,0", "--json"]) == 0
    rows = {row["algorithm"]: row for row in json.loads(capsys.readouterr().out)["context_parallel"]}
    assert rows["ours"]["items_split"] == 1 and rows["static_cp"]["step_cost_over_bound"] < 2


def test_regression_the_micro_batch_table_refused_an_item_only_splitting_fits_without_saying_why(tmp_path, capsys):
    """Cause (probe13 P13-14): with --max-tokens-per-microbatch and --context-parallel, an item over the budget
    refused the whole run as if no plan could hold it: the micro-batch table keeps items whole, the split table
    alone splits them, and the message said neither."""
    (tmp_path / "giants.csv").write_text("90000\n" + "500\n" * 30)
    assert main(["compare", "--lengths", str(tmp_path / "giants.csv"), "-D", "8", "--algorithms", "lpt",
                 "--cost", "0,6e9,0", "--context-parallel", "1,2", "--max-tokens-per-microbatch", "50000"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "a budget of at least 90000 is needed" in lines[0], lines
    assert "the micro-batch table keeps every item whole; --context-parallel splits items in its own table" in lines[0]

"""The micro-batched simulator and locality that pays for itself."""

import json

import numpy as np
import pytest

from orchmllm import Orchestrator, Topology
from orchmllm.study.microbatch_sim import (STRATEGIES, microbatch_plan, run_microbatch_simulation,
                                           simulate_microbatched_step)
from orchmllm.study.models import GPUS, MODELS
from orchmllm.study.simulator import run_simulation
from orchmllm.study.workloads import sample_workload


@pytest.mark.parametrize("model, gpus", [("10b", 64), ("84b", 16), ("18b", 8)])
def test_ours_is_never_slower_than_no_placement(model, gpus):
    strategies = run_simulation(model, gpus, samples_per_rank=8, strategies=["no_placement", "ours"]).strategies
    ours, plain = strategies["ours"], strategies["no_placement"]
    assert ours.step_seconds <= plain.step_seconds
    if gpus > 8:  # and it still keeps bytes on their node where nodes exist
        assert ours.bytes_inter_node < 0.5 * plain.bytes_inter_node


def test_locality_slack_follows_what_the_bytes_are_worth():
    stages = MODELS["10b"].stages()
    batch = sample_workload("default", 16, 8, seed=0)
    topology = Topology.for_world_size(16)
    cheap_compute = Orchestrator(stages, topology, seconds_per_cost=1e-30)  # bytes dear: the full slack
    dear_compute = Orchestrator(stages, topology, seconds_per_cost=1.0)  # compute dwarfs the exchange: ~none
    llm = stages[-1]
    lengths = batch.sample_llm_length
    assert cheap_compute._slack(batch, llm, np.full(lengths.size, 1e6)) == pytest.approx(0.002)
    assert dear_compute._slack(batch, llm, np.full(lengths.size, 1e6)) < 1e-6
    assert Orchestrator(stages, topology)._slack(batch, llm, np.ones(lengths.size)) == 0.002
    with pytest.raises(ValueError, match="seconds_per_cost"):
        Orchestrator(stages, topology, seconds_per_cost=0.0)


def test_micro_batched_simulation_reports_every_strategy():
    run = run_microbatch_simulation("10b", 16, max_tokens_per_microbatch=16384, samples_per_rank=16)
    assert json.loads(json.dumps(run.to_json()))["strategies"].keys() == set(STRATEGIES)
    results = run.strategies
    assert list(results) == list(STRATEGIES)
    for name, result in results.items():
        record = json.loads(json.dumps(result.to_json()))
        assert record["strategy"] == name and record["num_microbatches"] >= 1
        assert result.step_seconds >= result.compute_seconds > 0
        assert result.step_cost_over_bound >= 1.0 - 1e-12 and 0 < result.mfu < 1
    assert results["none"].speedup_vs_none == 1.0
    assert results["ours"].step_cost_over_bound <= min(r.step_cost_over_bound for r in results.values()) + 1e-12
    assert results["ours"].num_microbatches <= results["verl_dynamic_bsz"].num_microbatches


def test_more_micro_batches_cost_more_parameter_gathers():
    stages = MODELS["84b"].stages()
    batch = sample_workload("default", 64, 16, seed=0)
    topology = Topology.for_world_size(64)
    few = microbatch_plan("ours", stages, topology, batch, 65536)
    many = microbatch_plan("ours", stages, topology, batch, 8192)
    assert many.num_microbatches > few.num_microbatches
    cheap = simulate_microbatched_step(few, "ours", MODELS["84b"], GPUS["h100"], topology, planning_seconds=0.0)
    dear = simulate_microbatched_step(many, "ours", MODELS["84b"], GPUS["h100"], topology, planning_seconds=0.0)
    assert dear.param_gather_exposed_seconds > cheap.param_gather_exposed_seconds


def test_unknown_micro_batch_strategy_is_rejected():
    with pytest.raises(ValueError, match="unknown micro-batch strategy 'fastest'"):
        run_microbatch_simulation("10b", 8, strategies=["fastest"])


def test_simulate_command_runs_the_micro_batched_strategies(capsys):
    from orchmllm.cli import main

    assert main(["simulate", "--model", "10b", "--gpus", "16", "--samples-per-rank", "8",
                 "--max-tokens-per-microbatch", "16384", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert run["max_tokens_per_microbatch"] == 16384 and set(run["strategies"]) == set(STRATEGIES)
    for figures in run["strategies"].values():
        assert {"step_seconds", "speedup_vs_none", "num_microbatches", "mfu"} <= set(figures)
    assert main(["simulate", "--model", "10b", "--gpus", "16", "--max-tokens-per-microbatch", "16384",
                 "--strategies", "ours,fastest"]) == 2
    assert "unknown micro-batch strategy 'fastest'" in capsys.readouterr().err


def test_compare_command_adds_the_micro_batched_algorithms(capsys, tmp_path):
    from orchmllm.cli import main

    assert main(["compare", "--ranks", "16", "--items-per-rank", "8", "--algorithms", "lpt",
                 "--max-tokens-per-microbatch", "16384", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["microbatches"]
    by_name = {row["algorithm"]: row for row in rows}
    assert set(by_name) == {"none", "verl_dynamic_bsz", "megatron_hybrid", "sorted_grid", "ours"}
    assert all(row["step_cost_over_bound"] >= 1.0 - 1e-12 for row in rows)
    assert by_name["ours"]["step_cost_over_bound"] <= min(row["step_cost_over_bound"] for row in rows) + 1e-12
    assert by_name["verl_dynamic_bsz"]["timed"] == "our reimplementation"
    pytest.importorskip("matplotlib")
    assert main(["compare", "--ranks", "16", "--items-per-rank", "8", "--algorithms", "lpt",
                 "--max-tokens-per-microbatch", "16384", "--plot", str(tmp_path)]) == 0
    assert (tmp_path / "cells.png").stat().st_size > 0


def test_compare_says_why_a_padded_stage_has_no_peer_rows(capsys, tmp_path):
    """The reimplemented peers do not model padded stages: `compare --padded` runs ours alone and
    says so instead of dropping the peers' rows silently."""
    from orchmllm.cli import main

    lengths = tmp_path / "lengths.csv"
    lengths.write_text("tokens\n" + "\n".join(str(100 + 37 * k % 900) for k in range(64)) + "\n")
    assert main(["compare", "--lengths", str(lengths), "--column", "tokens", "--ranks", "4", "--padded",
                 "--algorithms", "padded", "--max-tokens-per-microbatch", "4000"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "No peer rows: the reimplemented micro-batch peers do not model padded stages" in out
    assert main(["compare", "--lengths", str(lengths), "--column", "tokens", "--ranks", "4", "--padded",
                 "--algorithms", "padded", "--max-tokens-per-microbatch", "4000", "--json"]) == 0
    assert {row["algorithm"] for row in json.loads(capsys.readouterr().out)["microbatches"]} == {"ours"}

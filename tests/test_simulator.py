"""Cluster simulator: output schema, the ordering of the ablations, memory and micro-batches."""

import dataclasses
import json
import pathlib

import numpy as np
import pytest

from orchmllm.study.models import GPUS, MODELS, list_models
from orchmllm.study.simulator import (SAMPLES_PER_RANK_GRID, choose_samples_per_rank, cluster, run_simulation,
                                             simulate_step, stage_rank_seconds)
from orchmllm.study.strategies import STRATEGIES, get_strategy, length_grouped_batch, micro_batched
from orchmllm.study.workloads import list_workloads, sample_workload

KEYS = {"step_seconds", "speedup_vs_none", "mfu", "overhead_fraction", "exchanges_per_step", "oom",
        "planning_seconds", "exchange_seconds", "idle_fraction", "per_stage"}


@pytest.fixture(scope="module", params=["default", "speech"])
def small(request):
    return run_simulation(model="10b", gpus=64, workload=request.param, samples_per_rank=8, seed=0).to_json()


def test_output_schema_is_json_serialisable(small):
    assert json.loads(json.dumps(small)) == small
    assert {"model", "gpus", "workload", "samples_per_rank", "samples_per_rank_choice", "strategies"} <= set(small)
    assert small["samples_per_rank"] == 8 and small["samples_per_rank_choice"] == {"rule": "explicit"}
    assert set(small["strategies"]) == set(STRATEGIES)
    for name, result in small["strategies"].items():
        assert KEYS <= set(result), name
        assert set(result["per_stage"]) == {"image encoder", "audio encoder", "llm"}
        assert isinstance(result["oom"], bool)
        assert 0 <= result["idle_fraction"] < 1 and 0 < result["mfu"] < 1
        assert 0 <= result["overhead_fraction"] < 1
        stages = sum(stage["seconds"] for stage in result["per_stage"].values())
        assert result["compute_seconds"] == pytest.approx(stages)
        assert result["step_seconds"] == pytest.approx(
            result["compute_seconds"] + result["exchange_seconds"] + result["planning_unhidden_seconds"])


def test_ablations_keep_the_papers_ordering(small):
    results = small["strategies"]
    ours = results["ours"]
    assert ours["speedup_vs_none"] > 1.5
    for name in ("none", "megatron", "length_grouped", "llm_only", "single_algorithm"):
        assert results[name]["step_seconds"] > ours["step_seconds"], name
    for name in ("allgather", "two_exchange"):
        assert results[name]["exchange_seconds"] > ours["exchange_seconds"], name
        assert results[name]["compute_seconds"] == pytest.approx(ours["compute_seconds"])
    assert results["allgather"]["memory_peak_gib"] > ours["memory_peak_gib"]
    assert results["no_placement"]["bytes_inter_node"] > ours["bytes_inter_node"]
    assert results["llm_only"]["memory_peak_gib"] > ours["memory_peak_gib"]
    assert [results[n]["exchanges_per_step"] for n in ("none", "length_grouped", "ours", "two_exchange")] == \
        [0, 0, 2, 3]


def test_single_algorithm_loses_on_the_padded_audio_stage():
    results = run_simulation(model="10b", gpus=64, workload="speech", samples_per_rank=8,
                             strategies=["single_algorithm", "ours"]).to_json()["strategies"]
    single = results["single_algorithm"]["per_stage"]["audio encoder"]
    ours = results["ours"]["per_stage"]["audio encoder"]
    assert single["seconds"] > 1.2 * ours["seconds"]
    assert results["ours"]["per_stage"]["llm"]["seconds"] == pytest.approx(
        results["single_algorithm"]["per_stage"]["llm"]["seconds"])


def test_memory_overflow_is_flagged():
    results = run_simulation(model="84b", gpus=64, samples_per_rank=24, strategies=["ours", "allgather"]).to_json()
    for result in results["strategies"].values():
        assert result["oom"] == (result["memory_peak_gib"] > result["memory_limit_gib"])
    assert results["strategies"]["allgather"]["oom"]


def test_megatron_takes_the_largest_micro_batch_that_fits():
    topology = cluster(16)
    batch = sample_workload("default", 16, 16, seed=2)
    megatron = get_strategy("megatron")
    plan = megatron.plan(MODELS["18b"].stages(), topology, batch)
    chosen = simulate_step(plan, megatron, MODELS["18b"], GPUS["h100"], topology).to_json()
    assert not chosen["oom"] and 1 < chosen["micro_batch_size"] < max(megatron.micro_batch_sizes)
    for size in megatron.micro_batch_sizes:
        forced = simulate_step(plan, dataclasses.replace(megatron, micro_batch_sizes=(size,)), MODELS["18b"],
                               GPUS["h100"], topology).to_json()
        assert forced["oom"] == (size > chosen["micro_batch_size"]), size


def test_micro_batches_of_one_cost_the_unpadded_sum():
    topology = cluster(8)
    batch = sample_workload("default", 8, 4, seed=1)
    plan = get_strategy("none").plan(MODELS["10b"].stages(), topology, batch)
    loads, _ = micro_batched(plan, plan.microbatches[0].llm, 1)
    np.testing.assert_allclose(loads, plan.microbatches[0].llm.loads)
    whole, _ = micro_batched(plan, plan.microbatches[0].llm, 4)
    assert np.all(whole >= loads - 1e-6 * loads)


def test_workload_file_drives_the_simulation(tmp_path):
    path = tmp_path / "w.jsonl"
    lines = [json.dumps({"text": 100 + 37 * i, "segments": [{"modality": "image", "length": 64 * (i % 5 + 1),
                                                              "tokens": 16 * (i % 5 + 1)}]}) for i in range(16)]
    path.write_text("\n".join(lines))
    result = run_simulation(model="10b", gpus=4, workload_file=str(path), samples_per_rank=4,
                            strategies=["ours"]).to_json()
    assert result["workload"] == str(path)
    assert result["strategies"]["ours"]["per_stage"]["image encoder"]["items"] == 16
    assert result["strategies"]["ours"]["per_stage"]["audio encoder"]["items"] == 0


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="unknown model 'huge'"):
        run_simulation(model="huge", gpus=8)
    with pytest.raises(ValueError, match="unknown strategy 'fast'"):
        run_simulation(model="10b", gpus=8, strategies=["fast"])
    with pytest.raises(ValueError, match="not a whole number of nodes"):
        run_simulation(model="10b", gpus=12)
    with pytest.raises(ValueError, match="`gpus` must be a positive int"):
        run_simulation(model="10b", gpus=0)


def test_models_and_workloads_are_listed():
    assert set(list_models()) == {"10b", "18b", "84b"}
    for name, model in MODELS.items():
        assert model.params / 1e9 == pytest.approx(float(name[:-1]), rel=0.15)
    assert "default" in list_workloads()


@pytest.mark.parametrize("name", ["ours", "megatron"])
def test_stage_rank_seconds_are_what_the_step_uses(name):
    topology = cluster(16)
    batch = sample_workload("default", 16, 8, seed=3)
    strategy = get_strategy(name)
    plan = strategy.plan(MODELS["10b"].stages(), topology, batch)
    result = simulate_step(plan, strategy, MODELS["10b"], GPUS["h100"], topology).to_json()
    seconds = stage_rank_seconds(plan, GPUS["h100"], result["micro_batch_size"])
    for stage, per_rank in seconds.items():
        assert per_rank.shape == (16,)
        assert result["per_stage"][stage]["seconds"] == pytest.approx(float(per_rank.max()))


def test_length_grouped_sampling_deals_equal_counts_and_evens_out_tokens():
    batch = sample_workload("default", 16, 8, seed=5)
    grouped = length_grouped_batch(batch)
    np.testing.assert_array_equal(np.bincount(grouped.sample_source, minlength=16), np.full(16, 8))
    np.testing.assert_array_equal(grouped.sample_llm_length, batch.sample_llm_length)
    tokens_before = np.bincount(batch.sample_source, weights=batch.sample_llm_length, minlength=16)
    tokens_after = np.bincount(grouped.sample_source, weights=grouped.sample_llm_length, minlength=16)
    assert tokens_after.max() < tokens_before.max()


def _ours_peak_gib(model: str, gpus: int, samples_per_rank: int, **kwargs) -> float:
    result = run_simulation(model=model, gpus=gpus, samples_per_rank=samples_per_rank, strategies=["ours"],
                            **kwargs).to_json()
    return result["strategies"]["ours"]["memory_peak_gib"]


def test_batch_chooser_takes_the_largest_grid_value_where_ours_fits():
    chosen, choice = choose_samples_per_rank(model="84b", gpus=64)
    choice = choice.to_json()
    assert choice["rule"] == "memory" and choice["limited_by"] == "memory" and choice["reference_strategy"] == "ours"
    assert choice["limit_gib"] == pytest.approx(0.9 * GPUS["h100"].memory_bytes / 2**30)
    following = SAMPLES_PER_RANK_GRID[SAMPLES_PER_RANK_GRID.index(chosen) + 1]
    assert _ours_peak_gib("84b", 64, chosen) <= choice["limit_gib"] < _ours_peak_gib("84b", 64, following)
    for value, peak in choice["probed_memory_gib"].items():
        assert peak == pytest.approx(_ours_peak_gib("84b", 64, int(value)))
        assert (peak <= choice["limit_gib"]) == (int(value) <= chosen), value


def test_batch_chooser_reports_the_grid_end_and_nothing_fitting():
    chosen, choice = choose_samples_per_rank(model="10b", gpus=8, grid=(2, 4))
    choice = choice.to_json()
    assert chosen == 4 and choice["limited_by"] == "grid end" and choice["grid"] == [2, 4]
    assert choice["probed_memory_gib"]["4"] <= choice["limit_gib"]
    chosen, choice = choose_samples_per_rank(model="84b", gpus=8, grid=(1, 2))
    choice = choice.to_json()
    assert chosen == 1 and choice["limited_by"] == "over memory at the smallest"
    assert choice["probed_memory_gib"]["1"] > choice["limit_gib"]


def test_default_batch_is_the_chosen_one_for_every_strategy():
    names = ["llm_only", "ours"]
    default = run_simulation(model="84b", gpus=64, strategies=names).to_json()
    chosen, choice = choose_samples_per_rank(model="84b", gpus=64)
    choice = choice.to_json()
    assert default["samples_per_rank"] == chosen
    assert {k: v for k, v in default["samples_per_rank_choice"].items() if k != "probed_memory_gib"} == \
        {k: v for k, v in choice.items() if k != "probed_memory_gib"}
    explicit = run_simulation(model="84b", gpus=64, samples_per_rank=chosen, strategies=names).to_json()
    for name in names:
        for key in ("compute_seconds", "exchange_seconds", "memory_peak_gib", "oom"):
            assert default["strategies"][name][key] == explicit["strategies"][name][key], (name, key)
        assert default["strategies"][name]["per_stage"]["llm"]["items"] == 64 * chosen


def test_explicit_samples_per_rank_is_respected():
    result = run_simulation(model="84b", gpus=64, samples_per_rank=4, strategies=["ours"]).to_json()
    assert result["samples_per_rank"] == 4 and result["samples_per_rank_choice"] == {"rule": "explicit"}
    assert result["strategies"]["ours"]["per_stage"]["llm"]["items"] == 64 * 4


def test_memory_sized_batch_on_a_workload_file_stays_within_the_file(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(json.dumps({"text": 50 + 11 * i}) for i in range(20)))
    result = run_simulation(model="10b", gpus=4, workload_file=str(path), strategies=["ours"]).to_json()
    assert result["samples_per_rank"] == 4 and result["samples_per_rank_choice"]["grid"] == [1, 2, 4]
    with pytest.raises(ValueError, match="fewer samples than one per rank"):
        run_simulation(model="10b", gpus=32, workload_file=str(path))


@pytest.mark.parametrize("kwargs, match", [
    ({"samples_per_rank": 0}, "`samples_per_rank` must be a positive int or None"),
    ({"samples_per_rank": 2.5}, "`samples_per_rank` must be a positive int or None"),
], ids=["zero", "float"])
def test_bad_samples_per_rank_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        run_simulation(model="10b", gpus=8, **kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"grid": ()}, "`grid` must be strictly increasing positive ints"),
    ({"grid": (4, 2)}, "`grid` must be strictly increasing positive ints"),
    ({"grid": (0, 4)}, "`grid` must be strictly increasing positive ints"),
    ({"headroom": 0.0}, r"`headroom` must be a fraction in \(0, 1\]"),
    ({"headroom": 1.5}, r"`headroom` must be a fraction in \(0, 1\]"),
], ids=["empty", "decreasing", "zero", "no-room", "over-one"])
def test_bad_chooser_arguments_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        choose_samples_per_rank(model="10b", gpus=8, **kwargs)


def test_84b_on_2560_gpus_at_the_memory_sized_batch_shows_the_papers_ordering():
    """The issue's targets, on the default batch (sized so that ours fits, as a training run sizes it)."""
    result = run_simulation(model="84b", gpus=2560).to_json()
    assert result["samples_per_rank_choice"]["limited_by"] == "memory"
    runs = result["strategies"]
    ours = runs["ours"]
    assert not ours["oom"] and ours["memory_peak_gib"] <= result["samples_per_rank_choice"]["limit_gib"]
    assert ours["speedup_vs_none"] >= 1.8 and ours["overhead_fraction"] <= 0.01
    assert runs["llm_only"]["oom"] and runs["llm_only"]["step_seconds"] > ours["step_seconds"]
    assert runs["allgather"]["oom"] or runs["allgather"]["step_seconds"] > ours["step_seconds"]
    assert runs["single_algorithm"]["step_seconds"] > ours["step_seconds"]
    assert runs["none"]["memory_peak_gib"] > ours["memory_peak_gib"]


def test_results_are_frozen_and_keep_every_ranks_seconds(small):
    result = run_simulation(model="10b", gpus=16, samples_per_rank=4, strategies=["ours"], seed=1)
    ours = result.strategies["ours"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        ours.step_seconds = 0.0
    assert set(ours.rank_seconds) == set(ours.per_stage) and not ours.rank_seconds["llm"].flags.writeable
    payload = result.to_json()
    assert "rank_seconds" not in payload["strategies"]["ours"] and json.loads(json.dumps(payload)) == payload
    assert payload["strategies"]["ours"]["compute_seconds"] == pytest.approx(
        sum(float(seconds.max()) for seconds in ours.rank_seconds.values()))


def test_regression_the_readme_and_the_help_state_the_batch_size_grid(capsys):
    """probe22 P22-06: both read "1, 2, 4, 8, ..., 64" (doubling), from which the README's own 28 samples per rank
    cannot arise; the grid is 1, 2, then multiples of 4."""
    stated = "1, 2, then multiples of 4 up to 64"
    assert SAMPLES_PER_RANK_GRID == (1, 2, *range(4, 65, 4))
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert stated in " ".join(readme.split())
    from orchmllm.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--help"])
    assert exit_info.value.code == 0 and stated in " ".join(capsys.readouterr().out.split())

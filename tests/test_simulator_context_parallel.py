"""The context-parallel simulator: the long-content workload, every strategy's figures, bit-identical
steps without giants, ring bytes between nodes only where groups cross them."""

import json

import numpy as np
import pytest

from orchmllm.balancers import ContextParallel
from orchmllm.balancers.context_parallel import certify_split
from orchmllm.study.context_parallel_compare import compare_context_parallel
from orchmllm.study.compare import CompareConfig, workload_stages
from orchmllm.study.context_parallel_sim import (STRATEGIES, ours_pass, run_context_parallel_simulation,
                                                 split_exchanges, split_spec, _ring_figures)
from orchmllm.study.models import GPUS, MODELS
from orchmllm.study.simulator import cluster, seconds_per_cost
from orchmllm.study.strategies import STRATEGIES as PLAIN_STRATEGIES, single_pass
from orchmllm.study.workloads import LONG_DOCUMENT_TOKENS, LONG_VIDEO_FRAMES, WORKLOADS, sample_workload

FIELDS = {"step_seconds", "speedup_vs_none", "items_split", "cp_exposed_seconds", "cp_bytes", "cp_bytes_inter_node",
          "llm_seconds_over_bound", "oom", "memory_peak_gib", "waves", "widest_degree"}


@pytest.fixture(scope="module")
def long_run():
    return run_context_parallel_simulation("10b", 32, workload="long", samples_per_rank=4, seed=3)


def test_long_workload_holds_documents_and_videos_in_their_documented_ranges():
    batch = sample_workload("long_document", 8, 16, seed=1)
    assert batch.segment_sample.size == 0
    assert LONG_DOCUMENT_TOKENS[0] <= batch.sample_text.min() and batch.sample_text.max() < LONG_DOCUMENT_TOKENS[1]
    videos = sample_workload("long_video", 8, 16, seed=1)
    frames = np.bincount(videos.segment_sample, minlength=128)
    assert LONG_VIDEO_FRAMES[0] <= frames.min() and frames.max() <= LONG_VIDEO_FRAMES[1]
    mix = WORKLOADS["long"][1]
    assert sum(mix.values()) == pytest.approx(1.0) and mix["long_video"] == mix["long_document"] == 0.05
    assert sample_workload("long", 64, 8, seed=0).sample_llm_length.max() > 8 * 8192  # giants do occur


def test_every_strategy_reports_its_step_and_context_parallel_figures(long_run):
    record = json.loads(json.dumps(long_run.to_json()))
    assert list(record["strategies"]) == list(STRATEGIES)
    assert all(FIELDS <= set(figures) for figures in record["strategies"].values())
    results = long_run.strategies
    items = results["none"].llm_plan.num_items
    assert results["none"].speedup_vs_none == 1.0
    for name, result in results.items():
        assert result.step_seconds >= result.compute_seconds >= result.llm_seconds > 0, name
        assert result.llm_seconds_over_bound >= 1.0 - 1e-9, name
        assert 0.0 <= result.cp_bytes_inter_node <= result.cp_bytes, name
        assert (result.cp_bytes > 0) == (result.items_split > 0), name
    assert results["none"].items_split == results["no_split"].items_split == 0
    assert results["static_cp"].items_split == items and results["static_cp"].widest_degree == long_run.static_degree
    assert results["megatron_dynamic_cp"].waves >= 1 and long_run.megatron_capacity >= 1
    assert results["ours"].items_split > 0
    assert results["ours"].llm_seconds < results["no_split"].llm_seconds


@pytest.mark.parametrize("workload, degrees", [("default", (1, 2, 4, 8)), ("long", (1,))])
def test_without_giants_or_splitting_ours_is_todays_step_bit_for_bit(workload, degrees):
    run = run_context_parallel_simulation("10b", 16, workload=workload, samples_per_rank=8, degrees=degrees,
                                          strategies=["no_split", "ours"], seed=0)
    ours, today = run.strategies["ours"], run.strategies["no_split"]
    assert ours.items_split == 0
    assert ours.llm_plan.digest() == today.llm_plan.digest()
    assert (ours.compute_seconds, ours.exchange_seconds, ours.memory_peak_gib) == (
        today.compute_seconds, today.exchange_seconds, today.memory_peak_gib)


@pytest.mark.parametrize("degree, crossing", [(4, 2), (2, 0)], ids=["over two nodes", "inside a node"])
def test_ring_bytes_cross_nodes_only_on_the_hops_between_them(degree, crossing):
    spec = ContextParallel(degrees=(1, 2, 4), gpus_per_node=2, allow_inter_node=True)
    lengths = np.array([6000])
    plan = certify_split(lengths, 4, spec, [0], [degree])
    total, inter, exposed = _ring_figures(plan, lengths, spec)
    assert total == (degree - 1) * 6000 * spec.kv_bytes_per_token * spec.num_layers * spec.kv_passes
    assert inter == total * crossing / degree  # a ring over k > 1 nodes crosses k of its c hops
    assert exposed >= spec.latency_s * spec.num_layers * spec.kv_passes * (degree - 1) * (1 - 1e-9)


def test_split_items_share_their_bytes_over_their_group():
    config, gpu = MODELS["10b"], GPUS["h100"]
    topology = cluster(16)
    batch = sample_workload("long", 16, 4, seed=5)
    plan = single_pass(PLAIN_STRATEGIES["ours"].plan(config.stages(), topology, batch,
                                                      seconds_per_cost=seconds_per_cost(gpu)))
    start = np.arange(plan.llm.num_items) % 4 * 4
    degree = np.full(plan.llm.num_items, 4)
    inputs, embedding = split_exchanges(plan, start, degree)
    assert inputs.item_bytes.sum() == pytest.approx(plan.input_exchange().item_bytes.sum())
    assert embedding.item_bytes.sum() == pytest.approx(plan.embedding_exchange().item_bytes.sum())
    llm_part = inputs.destination[-4 * plan.llm.num_items:]
    assert np.array_equal(llm_part, np.repeat(start, 4) + np.tile(np.arange(4), plan.llm.num_items))
    assert split_spec((1, 2, 4, 8), config, gpu, topology).seconds_per_cost == seconds_per_cost(gpu)


@pytest.mark.parametrize("degrees, message", [((1, 3), "powers of two"), ((1, 32), "32 > 16 gpus")])
def test_bad_degrees_are_named(degrees, message):
    with pytest.raises(ValueError, match=message):
        run_context_parallel_simulation("10b", 16, workload="long", samples_per_rank=2, degrees=degrees)


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match="unknown context-parallel strategy 'magic'"):
        run_context_parallel_simulation("10b", 16, strategies=["ours", "magic"])


def test_compare_rows_are_certified_against_one_bound():
    batch = sample_workload("long", 16, 4, seed=2)
    config = CompareConfig(16, 4, workload_stages(batch, MODELS["10b"].stages()))
    rows, plans = compare_context_parallel([config], (1, 2, 4, 8), gpus_per_node=8)
    assert [row.algorithm for row in rows] == ["no_split", "static_cp", "megatron_dynamic_cp", "ours"]
    assert len({row.lower_bound for row in rows}) == 1
    assert all(row.step_cost_over_bound >= 1.0 - 1e-9 for row in rows)
    by_name = {row.algorithm: row for row in rows}
    assert by_name["ours"].step_cost <= by_name["no_split"].step_cost
    assert by_name["static_cp"].setting.startswith("degree ") and by_name["megatron_dynamic_cp"].setting
    assert plans[(16, 4, "ours")].makespan == by_name["ours"].step_cost


def test_ours_holds_the_memory_token_budget_and_plans_without_it_only_when_none_fits():
    config, gpu, topology = MODELS["10b"], GPUS["h100"], cluster(16)
    batch = sample_workload("long", 16, 4, seed=4)
    spec = split_spec((1, 2, 4, 8), config, gpu, topology)
    free = ours_pass(config.stages(), topology, batch, spec, gpu, 2**40)
    lengths = batch.sample_llm_length
    budget = int(0.9 * free.llm.tokens.max())
    assert free.splits and budget > max(-(-int(lengths.max()) // 8), -(-int(lengths.sum()) // 16))
    assert ours_pass(config.stages(), topology, batch, spec, gpu, budget).llm.tokens.max() <= budget
    assert ours_pass(config.stages(), topology, batch, spec, gpu, 1).digest() == free.digest()  # nothing fits 1


@pytest.mark.parametrize("degrees", [(1, 16), (1, 2, 8)])
def test_regression_megatron_split_at_powers_of_two_the_spec_does_not_hold(degrees):
    """Megatron's peer took the next power of two of an item's need (8 for a 60k item at capacity 8192), which
    `--context-parallel 1,16` does not hold: `certify_split` raised and `orchmllm simulate` exited 1."""
    from orchmllm.study.context_parallel_peers import megatron_dynamic_cp
    spec = ContextParallel(degrees=degrees, gpus_per_node=8, allow_inter_node=True)
    lengths = np.array([60000, 30000, 20000, 9000, 5000] + [1000] * 20)
    waves = megatron_dynamic_cp(lengths, 16, spec, 8192)
    used = {int(d) for wave in waves.waves for d in wave.degree}
    assert used <= set(degrees) and max(used) > 1
    assert sorted(np.concatenate(waves.items).tolist()) == list(range(lengths.size))

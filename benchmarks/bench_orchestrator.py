"""Orchestrator and simulator: whole-step planning time (plain and micro-batched), the simulated 84B
run (plain and micro-batched), composition.

Run: python3.11 -m pytest benchmarks/bench_orchestrator.py --benchmark-only -q
     (add --heavy for 16 384 ranks)
"""

import time

import numpy as np
import pytest

from orchmllm import Orchestrator
from orchmllm.balancers import balance, balance_microbatches
from orchmllm.orchestrator.samples import Batch
from orchmllm.study.microbatch_sim import run_microbatch_simulation
from orchmllm.study.models import MODELS
from orchmllm.study.simulator import cluster, composition_comparison, run_simulation
from orchmllm.study.strategies import get_strategy
from orchmllm.study.workloads import sample_workload
from orchmllm.topology import traffic


@pytest.mark.parametrize("strategy", ["ours", "no_placement"])
@pytest.mark.parametrize("num_ranks", [256, 2560, 16384], ids=["D256", "D2560", "D16384"])
def test_plan_whole_step(benchmark, best_of, request, num_ranks, strategy):
    """Three stages (vision, audio, LLM) + placement + composition for D ranks × 16 samples.

    Timed from the step's flat metadata (what every rank holds after the length
    all-gather) to the StepPlan: the Batch is built and validated in every round, so
    what it derives once per batch is paid as a real step pays it.  `ours` places with
    communication-aware balancing; `no_placement` is the same plan without it (groups
    land as the balancer numbers them).
    """
    if num_ranks > 2560 and not request.config.getoption("--heavy", default=False):
        pytest.skip("D=16384 runs with --heavy")
    topology = cluster(num_ranks)
    batch = sample_workload("default", num_ranks, 16, seed=num_ranks)
    metadata = dict(num_ranks=num_ranks, modalities=batch.modalities, sample_text=batch.sample_text,
                    sample_source=batch.sample_source, sample_id=batch.sample_id, segment_sample=batch.segment_sample,
                    segment_modality=batch.segment_modality, segment_length=batch.segment_length,
                    segment_tokens=batch.segment_tokens, segment_position=batch.segment_position)
    stages = MODELS["84b"].stages()
    strategy = get_strategy(strategy)
    plan = benchmark.pedantic(lambda: strategy.plan(stages, topology, Batch.from_arrays(**metadata)).built(),
                              rounds=5, iterations=1, warmup_rounds=1).microbatches[0]  # one pass, routes built
    assert plan.llm.num_items == batch.num_samples
    assert sorted(np.concatenate([p.item_segment for p in plan.stage_plans[:-1]]).tolist()) == \
        list(range(batch.num_segments))
    lpt_llm = best_of(lambda: balance(batch.sample_llm_length, num_ranks, cost=stages[-1].cost, algorithm="lpt"), 3)
    embeddings = plan.embedding_exchange()
    moved = traffic(embeddings.source, embeddings.destination, embeddings.item_bytes, topology)
    inputs = plan.input_exchange()
    moved_inputs = traffic(inputs.source, inputs.destination, inputs.item_bytes, topology)
    benchmark.extra_info.update(
        samples=batch.num_samples, segments=batch.num_segments,
        **{f"gap_{p.stage.name.split()[0]}": p.gap for p in plan.stage_plans},
        **{f"solve_ms_{p.stage.name.split()[0]}": 1e3 * p.solve_seconds for p in plan.stage_plans},
        embedding_bytes_kept=moved.bytes_kept / moved.bytes_total,
        embedding_bytes_inter_node=moved.inter_node_fraction,
        input_bytes_kept=moved_inputs.bytes_kept / moved_inputs.bytes_total,
        input_bytes_inter_node=moved_inputs.inter_node_fraction,
        lpt_llm_only_ms=1e3 * lpt_llm, step_over_lpt_llm_only=benchmark.stats.stats.min / lpt_llm)


@pytest.mark.parametrize("model,workload", [("10b", "default"), ("18b", "default"), ("84b", "default"),
                                            ("84b", "speech")])
def test_simulate_2560_gpus(benchmark, model, workload):
    """Every strategy on 2560 simulated H100s, 16 samples per rank."""
    result = benchmark.pedantic(run_simulation, kwargs=dict(model=model, gpus=2560, workload=workload), rounds=1,
                                iterations=1).to_json()
    strategies = result["strategies"]
    ours = strategies["ours"]
    assert ours["step_seconds"] < strategies["none"]["step_seconds"]
    benchmark.extra_info.update(
        {f"{name}_{key}": value[key] for name, value in strategies.items()
         for key in ("speedup_vs_none", "mfu", "overhead_fraction", "oom", "memory_peak_gib", "exchanges_per_step")})
    benchmark.extra_info.update(ours_planning_ms=1e3 * ours["planning_seconds"],
                                megatron_micro_batch=strategies["megatron"]["micro_batch_size"],
                                **{f"composition_{k}": v for k, v in result["composition"].items()})


@pytest.mark.parametrize("samples_per_rank", [16, 20, 24])
def test_memory_headroom_84b(benchmark, samples_per_rank):
    """How memory grows with the batch: which strategies overflow 80 GiB first (84B, 2560 GPUs)."""
    result = benchmark.pedantic(run_simulation, kwargs=dict(model="84b", gpus=2560, samples_per_rank=samples_per_rank,
                                                            strategies=["llm_only", "length_grouped", "ours"]),
                                rounds=1, iterations=1).to_json()
    strategies = result["strategies"]
    assert strategies["ours"]["memory_peak_gib"] < strategies["llm_only"]["memory_peak_gib"]
    benchmark.extra_info.update({f"{name}_{key}": value[key] for name, value in strategies.items()
                                 for key in ("memory_peak_gib", "oom", "speedup_vs_none")})


def test_one_vs_two_embedding_exchanges(benchmark):
    """Composed route (one exchange) vs embeddings home and on (two), bytes and modelled time."""
    topology = cluster(2560)
    batch = sample_workload("default", 2560, 16, seed=1)
    plan = get_strategy("ours").plan(MODELS["84b"].stages(), topology, batch)
    figures = benchmark.pedantic(composition_comparison, args=(plan, topology), rounds=3, iterations=1).to_json()
    assert figures["one_exchange_bytes_moved"] <= figures["two_exchange_bytes_moved"]
    benchmark.extra_info.update(figures, bytes_ratio=figures["two_exchange_bytes_moved"]
                                / max(figures["one_exchange_bytes_moved"], 1.0),
                                seconds_ratio=figures["two_exchange_seconds"] / max(figures["one_exchange_seconds"],
                                                                                    1e-12))


@pytest.mark.parametrize("gpus", [256, 2560, 16384], ids=["G256", "G2560", "G16384"])
def test_overhead_scaling_84b(benchmark, request, gpus):
    """How exchange time and planning grow with the cluster (84B, default mix, ours vs none)."""
    if gpus > 2560 and not request.config.getoption("--heavy", default=False):
        pytest.skip("16384 GPUs run with --heavy")
    result = benchmark.pedantic(run_simulation, kwargs=dict(model="84b", gpus=gpus, strategies=["ours"]),
                                rounds=1, iterations=1).to_json()
    ours = result["strategies"]["ours"]
    assert ours["overhead_fraction"] < 0.01
    benchmark.extra_info.update(speedup_vs_none=ours["speedup_vs_none"], mfu=ours["mfu"],
                                overhead_fraction=ours["overhead_fraction"],
                                exchange_ms=1e3 * ours["exchange_seconds"], planning_ms=1e3 * ours["planning_seconds"],
                                step_seconds=ours["step_seconds"], oom=ours["oom"])


def interleaved_cpu(first, second, rounds: int) -> tuple[float, float]:
    """The least CPU seconds of `first` and of `second` over `rounds` rounds that run them in turn."""
    times = ([], [])
    for _ in range(rounds):
        for fn, spent in zip((first, second), times):
            start = time.process_time()
            fn()
            spent.append(time.process_time() - start)
    return min(times[0]), min(times[1])


@pytest.mark.parametrize("workload", ["default", "chat", "code", "long_tail"])
@pytest.mark.parametrize("budget", [8192, 16384, 65536], ids=["T8k", "T16k", "T64k"])
def test_plan_micro_batched_step(benchmark, best_of, budget, workload):
    """A micro-batched step at D = 2560 × 32 samples of `workload` (the default mix, or real request
    lengths: the conversation and coding traces, a long-tailed mix): cells for whole samples
    (balance_microbatches), then every micro-batch's stages balanced, placed and composed; the cells
    alone, the step without placement (`placement=None`) and the default mix's step (the issue's bound:
    within 10×) timed too, and the inter-node bytes of both plans' exchanges reported."""
    num_ranks = 2560
    topology = cluster(num_ranks)
    batch = sample_workload(workload, num_ranks, 32, seed=num_ranks)
    stages = MODELS["84b"].stages()
    orchestrator = Orchestrator(stages, topology, max_tokens_per_microbatch=budget)
    plan = benchmark.pedantic(lambda: orchestrator.plan(batch).built(), rounds=3, iterations=1, warmup_rounds=1)
    assert sorted(np.concatenate(plan.microbatch_samples).tolist()) == list(range(batch.num_samples))
    cells_only = best_of(lambda: balance_microbatches(batch.sample_llm_length, num_ranks, cost=stages[-1].cost,
                                                      max_tokens_per_microbatch=budget), 3)
    unplaced = Orchestrator(stages, topology, max_tokens_per_microbatch=budget, placement=None)
    unplaced_seconds = best_of(lambda: unplaced.plan(batch).built(), 3)
    unplaced_plan = unplaced.plan(batch)
    default_batch = sample_workload("default", num_ranks, 32, seed=num_ranks)
    # the ratio in CPU seconds, the two steps alternated: a load spike on a shared machine
    # neither lands on one of them only nor counts (wall time once read 12x for a 6x step)
    step_cpu, default_cpu = interleaved_cpu(lambda: orchestrator.plan(batch).built(),
                                            lambda: orchestrator.plan(default_batch).built(), rounds=3)
    seconds = benchmark.stats.stats.min

    def inter_node_gb(exchanges):
        return sum(traffic(e.source, e.destination, e.item_bytes, topology).bytes_inter_node for e in exchanges) / 1e9

    benchmark.extra_info.update(num_microbatches=plan.num_microbatches, step_cost_over_bound=plan.step_cost
                                / plan.lower_bound, cells_gap=plan.cells.gap, cells_ms=1e3 * cells_only,
                                step_over_cells=seconds / cells_only, unplaced_ms=1e3 * unplaced_seconds,
                                step_over_unplaced=seconds / unplaced_seconds, step_cpu_ms=1e3 * step_cpu,
                                default_cpu_ms=1e3 * default_cpu, step_over_default=step_cpu / default_cpu,
                                input_inter_node_gb=inter_node_gb([plan.input_exchange()]),
                                embedding_inter_node_gb=inter_node_gb(plan.embedding_exchanges()),
                                unplaced_input_inter_node_gb=inter_node_gb([unplaced_plan.input_exchange()]),
                                unplaced_embedding_inter_node_gb=inter_node_gb(unplaced_plan.embedding_exchanges()))
    print(f"\n{workload} T={budget}: step {seconds * 1e3:.0f} ms (M={plan.num_microbatches}); "
          f"CPU {step_cpu * 1e3:.0f} ms, "
          f"default mix {default_cpu * 1e3:.0f} ms, ratio {step_cpu / default_cpu:.1f}; "
          f"cells {cells_only * 1e3:.0f} ms")
    # issue 24's bound (before 2026-12-05: long_tail T = 8k 11-12x, the cluster deal sorting every roomy
    # cell; code T = 16k 9-11x, every cells and micro-batch deal ending in a repair that could not succeed)
    assert step_cpu <= 10 * default_cpu


@pytest.mark.timeout(1800)  # the reimplemented megatron_hybrid peer (pure Python) passed the 300 s default at load 3
@pytest.mark.parametrize("budget", [8192, 16384], ids=["T8k", "T16k"])
def test_simulate_micro_batched_84b_2560(benchmark, budget):
    """84B on 2560 simulated H100s, 32 samples per rank, as M micro-batches under T: ours vs the peers."""
    results = benchmark.pedantic(run_microbatch_simulation, kwargs=dict(model="84b", gpus=2560,
                                                                        max_tokens_per_microbatch=budget),
                                 rounds=1, iterations=1).strategies
    ours, verl = results["ours"], results["verl_dynamic_bsz"]
    assert ours.step_seconds < verl.step_seconds
    benchmark.extra_info.update({f"{name}_{key}": getattr(result, key) for name, result in results.items()
                                 for key in ("step_seconds", "speedup_vs_none", "num_microbatches", "mfu",
                                             "step_cost_over_bound", "param_gather_exposed_seconds")},
                                ours_faster_than_verl=verl.step_seconds / ours.step_seconds - 1.0)

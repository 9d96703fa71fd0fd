"""The communication-aware micro-batch cells (`balancers.microbatch.locality.keep_cells_local`)
against the plain micro-batch solve they start from (`microbatch._solve`), in the same run.

Run: python3.11 -m pytest benchmarks/bench_cells_deal.py --benchmark-only -q
Figures go to the "Micro-batch cells deal" section of BENCHMARKS.md.

Instance: the 84B step's LLM stage at D = 2560 × 32 samples (`sample_workload("default",
2560, 32, seed=2560)` on `study.simulator.cluster(2560)`), each sample anchored on the rank
that sampled it with its input bytes, as the orchestrator gives them.  Both are timed in
process time on fresh problems, interleaved, and their medians compared: the machine's
speed moves between minutes, a same-run ratio does not.
"""

import time

import numpy as np
import pytest

from orchmllm.balancers.microbatch.api import _solve, make_microbatch_problem
from orchmllm.balancers.microbatch.locality import keep_cells_local
from orchmllm.balancers.microbatch.plan import cell_accounts
from orchmllm.balancers.origins import Origins
from orchmllm.balancers.registry import get_microbatch_algorithm
from orchmllm.orchestrator.planner import input_bytes
from orchmllm.study.models import MODELS
from orchmllm.study.simulator import cluster
from orchmllm.study.workloads import sample_workload

NUM_RANKS = 2560
REPEATS = 7


@pytest.mark.parametrize("budget", [8192, 16384, 65536], ids=["T8k", "T16k", "T64k"])
def test_cells_deal_against_the_plain_solve(benchmark, budget):
    batch = sample_workload("default", NUM_RANKS, 32, seed=NUM_RANKS)
    stages = MODELS["84b"].stages()
    gpus_per_node = cluster(NUM_RANKS).gpus_per_node
    sources, item_bytes = batch.sample_source, input_bytes(batch, stages, stages[-1])
    kernel = get_microbatch_algorithm("auto").kernel

    def solved():
        problem = make_microbatch_problem(batch.sample_llm_length, NUM_RANKS, max_tokens_per_microbatch=budget,
                                          cost=stages[-1].cost)
        start = time.process_time()
        result, m, _, _ = _solve(problem, kernel, None)
        return (problem, result, m, Origins(sources, item_bytes, gpus_per_node)), time.process_time() - start

    solve_seconds, deal_seconds = [], []
    for _ in range(REPEATS):
        args, seconds = solved()
        solve_seconds.append(seconds)
        start = time.process_time()
        keep_cells_local(*args)
        deal_seconds.append(time.process_time() - start)
    local = benchmark.pedantic(keep_cells_local, setup=lambda: (solved()[0], {}), rounds=3, iterations=1)
    problem, result, m = args[:3]
    assert local is not None, "the cells deal missed: the per-micro-batch fallback would run"
    plain_loads, _ = cell_accounts(problem, result.rank, result.microbatch, m)
    loads, tokens = cell_accounts(problem, local.rank, local.microbatch, m)
    assert np.all(loads.max(axis=1) <= plain_loads.max(axis=1)) and tokens.max() <= budget
    inter_node = local.rank // gpus_per_node != sources // gpus_per_node
    plain_inter_node = result.rank // gpus_per_node != sources // gpus_per_node
    deal_ms, solve_ms = 1e3 * float(np.median(deal_seconds)), 1e3 * float(np.median(solve_seconds))
    benchmark.extra_info.update(num_microbatches=m, cells_deal_ms=deal_ms, plain_solve_ms=solve_ms,
                                deal_over_solve=deal_ms / solve_ms,
                                inter_node_gb=float(item_bytes[inter_node].sum()) / 1e9,
                                plain_inter_node_gb=float(item_bytes[plain_inter_node].sum()) / 1e9,
                                off_rank_gb=float(item_bytes[local.rank != sources].sum()) / 1e9)

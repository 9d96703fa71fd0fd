"""Runtime: exchange cost (flat vs node-wise), routing cost per rank at scale, and the
dispatcher's overhead as a share of a real multi-process training step.

Run: python3.11 -m pytest benchmarks/bench_runtime.py --benchmark-only -q
     (add --heavy for the 4-rank demo at 24 samples per rank and 8 steps)
Multi-process figures are timed inside the spawned ranks (barrier, then the median of
repeated exchanges) and reported in `extra_info`; the benchmark's own time is then the
whole spawned job.  Figures go to the "Runtime" section of BENCHMARKS.md.
"""

import statistics
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from orchmllm.balancers import CostModel, balance
from orchmllm.runtime import (ExchangeMeta, FlatAllToAll, HierarchicalAllToAll, Piece, PostBalancingDispatcher,
                              exchange, gather_metadata)
from orchmllm.runtime.demo import run_demo
from orchmllm.runtime.launch import spawn

ROWS_PER_ITEM, ITEMS_PER_RANK, WIDTH = 256, 16, 256  # 256 KiB of float32 per item, 4 MiB per rank


def heavy_option(request):
    return request.config.getoption("--heavy", default=False)


def exchange_timing_job(rank, size, repeats):
    """Median seconds of a balanced-plan exchange (flat, 2 nodes × 2 node-wise) and a check
    that both deliver the same bytes."""
    rng = np.random.default_rng(0)
    counts = [ITEMS_PER_RANK] * size
    lengths = rng.integers(ROWS_PER_ITEM // 2, 2 * ROWS_PER_ITEM, sum(counts))
    plan = balance(lengths, size, algorithm="lpt")
    meta = ExchangeMeta.from_assignment(plan.assignment, counts, rank)
    payload = torch.randn(int(lengths[meta.source_items].sum()), WIDTH)
    transports = {"flat": FlatAllToAll(), "hierarchical": HierarchicalAllToAll(2)}
    seconds, outputs = {}, {}
    for name, transport in transports.items():
        times = []
        for _ in range(repeats + 1):
            dist.barrier()
            start = time.perf_counter()
            (outputs[name],) = exchange([Piece(meta, payload, lengths)], transport)
            times.append(time.perf_counter() - start)
        seconds[name] = statistics.median(times[1:])
    assert torch.equal(outputs["flat"], outputs["hierarchical"])
    moved = int(sum(lengths[i] for i in meta.send_items if plan.assignment[i] != rank)) * WIDTH * 4
    return seconds, moved


def test_exchange_flat_vs_nodewise_4_ranks(benchmark):
    results = benchmark.pedantic(spawn, args=(exchange_timing_job, 4), kwargs={"args": (7,), "timeout_s": 300},
                                 rounds=1, iterations=1)
    flat = max(r[0]["flat"] for r in results)
    nodewise = max(r[0]["hierarchical"] for r in results)
    moved = sum(r[1] for r in results)
    benchmark.extra_info.update({
        "flat_seconds": flat, "nodewise_seconds": nodewise, "nodewise_over_flat": nodewise / flat,
        "bytes_moved_between_ranks": moved, "flat_bytes_per_second": moved / flat})


def agreement_overhead_job(rank, size, steps):
    """Median seconds of one dispatcher step (lengths all-gather, plan, one all-to-all of a
    per-token and a per-item tensor) today's way (no fingerprint, no schema guard), the
    same again (the noise floor), and with the cross-rank checks, interleaved step by step
    in rotating order so all three see the same load."""
    rng = np.random.default_rng(rank)
    lengths = rng.integers(64, 512, 16)
    batch = {"x": torch.randn(int(lengths.sum()), 64), "id": torch.arange(16) + 100 * rank}
    cost = CostModel(linear=1)
    checked = PostBalancingDispatcher(algorithm="lpt", cost=cost, per_item_keys={"id"})
    transport = FlatAllToAll()

    def unchecked_step():
        metadata = gather_metadata(lengths, num_columns=1)
        plan = balance(metadata.column(0), size, algorithm="lpt", cost=cost)
        route = ExchangeMeta.from_assignment(plan.assignment, metadata.counts, rank)
        ids, x = exchange([Piece(route, batch["id"], 1), Piece(route, batch["x"], metadata.column(0))], transport)
        return {"id": ids, "x": x}

    def checked_step():
        return checked.dispatch(batch, checked.plan(lengths))

    arms = [("unchecked", unchecked_step), ("unchecked_again", unchecked_step), ("checked", checked_step)]
    times = {name: [] for name, _ in arms}
    for round_number in range(steps + 1):  # round 0 warms up (and is the guard's cold call)
        moved = {}
        for name, step in arms[round_number % 3:] + arms[: round_number % 3]:
            dist.barrier()
            start = time.perf_counter()
            moved[name] = step()
            times[name].append(time.perf_counter() - start)
        assert all(torch.equal(moved["unchecked"][key], moved["checked"][key]) for key in batch)
    return {name: statistics.median(values[1:]) for name, values in times.items()}


def test_cross_rank_checks_cost_against_todays_dispatch_4_ranks(benchmark):
    results = benchmark.pedantic(spawn, args=(agreement_overhead_job, 4), kwargs={"args": (60,), "timeout_s": 300},
                                 rounds=1, iterations=1)
    unchecked, again, checked = (max(r[name] for r in results) for name in ("unchecked", "unchecked_again", "checked"))
    benchmark.extra_info.update({"unchecked_step_seconds": unchecked, "checked_step_seconds": checked,
                                 "checked_over_unchecked": checked / unchecked,
                                 "noise_floor_unchecked_again_over_unchecked": again / unchecked})


def test_route_building_per_rank_at_2560_ranks(benchmark):
    """Every rank builds its routes from the global plan: numpy work that must stay small
    next to planning itself (baseline: the LPT plan of the same lengths, same run)."""
    size = 2560
    rng = np.random.default_rng(1)
    lengths = np.rint(rng.lognormal(6.0, 1.0, size * 16)).astype(np.int64) + 1
    counts = np.full(size, 16)
    start = time.perf_counter()
    plan = balance(lengths, size, algorithm="lpt")
    plan_seconds = time.perf_counter() - start

    def build():
        meta = ExchangeMeta.from_assignment(plan.assignment, counts, 17)
        return (meta, meta.send_row_index(lengths), meta.arrival_row_index(lengths), meta.send_counts(lengths),
                meta.receive_counts(lengths))

    meta, send, arrive, sending, receiving = benchmark(build)
    assert send.size == lengths[meta.source_items].sum() == sending.sum()
    assert arrive.size == lengths[meta.dest_items].sum() == receiving.sum()
    benchmark.extra_info.update({"ranks": size, "items": int(lengths.size), "lpt_plan_seconds": plan_seconds,
                                 "route_over_plan": benchmark.stats.stats.median / plan_seconds})


def test_local_pack_unpack_vs_copy(benchmark):
    """Packing, byte views and reordering on one rank (no network) against one plain copy."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(100, 400, 64)
    meta = ExchangeMeta(np.zeros(64, dtype=np.int64), np.zeros(64, dtype=np.int64), 0, 1)
    payload = torch.randn(int(lengths.sum()), 512)
    copy_seconds = min(_timed(lambda: payload.clone()) for _ in range(5))
    (out,) = benchmark(exchange, [Piece(meta, payload, lengths)])
    assert torch.equal(out, payload)
    benchmark.extra_info.update({"bytes": payload.numel() * 4, "copy_seconds": copy_seconds,
                                 "over_copy": benchmark.stats.stats.median / copy_seconds})


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@pytest.mark.parametrize("heavy", [False, True], ids=["16-per-rank-3-steps", "24-per-rank-8-steps"])
def test_demo_overhead_share(benchmark, request, heavy):
    if heavy and not heavy_option(request):
        pytest.skip("needs --heavy")
    kwargs = dict(ranks=4, steps=8, samples_per_rank=24) if heavy else dict(ranks=4, steps=3)
    report = benchmark.pedantic(run_demo, kwargs=kwargs, rounds=1, iterations=1)
    assert report.samples_lost == 0 and report.samples_duplicated == 0
    assert report.grad_max_rel_diff <= 1e-5
    figures = report.to_json()
    benchmark.extra_info.update({key: figures[key] for key in (
        "busy_max_over_mean_unbalanced", "busy_max_over_mean_balanced", "busy_max_over_mean_identical_work",
        "busy_max_over_mean_unbalanced_isolated", "busy_max_over_mean_balanced_isolated",
        "busy_max_over_mean_identical_work_isolated", "busy_max_over_mean_balanced_planned", "grad_max_rel_diff",
        "exchange_seconds", "planning_seconds", "planning_hidden_fraction", "step_seconds", "overhead_fraction",
        "exchange_bytes_sent", "concurrent_seconds", "replay_seconds", "wall_seconds")})

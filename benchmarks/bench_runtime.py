"""Runtime: exchange cost (flat vs node-wise), routing cost per rank at scale, the
dispatcher's overhead as a share of a real multi-process training step, and the hot-path cost
of the runtime's own checks (the model check of a micro-batched step, the two-thread check of
every collective) as same-run ratios.

Run: python3.11 -m pytest benchmarks/bench_runtime.py --benchmark-only -q
     (add --heavy for the 4-rank demo at 24 samples per rank and 8 steps)
Multi-process figures are timed inside the spawned ranks (barrier, then the median of
repeated exchanges) and reported in `extra_info`; the benchmark's own time is then the
whole spawned job.  Figures go to the "Runtime" section of BENCHMARKS.md.
"""

import contextlib
import statistics
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from orchmllm.balancers import CostModel, balance, get_algorithm, register_algorithm
from orchmllm.runtime import (ExchangeMeta, FlatAllToAll, HierarchicalAllToAll, Piece, PostBalancingDispatcher,
                              accumulate, comm, exchange, gather_metadata, normalize_loss)
from orchmllm.runtime.demo import run_demo
from orchmllm.runtime.encoders import reached_leaves, recording
from orchmllm.runtime.launch import spawn
from orchmllm.runtime.steps import StepClock

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


def lpt_as_plugin(problem):
    """'lpt' registered as a plugin (`header_riding_job`): the same plans, which no planner word vouches for."""
    return get_algorithm("lpt")(problem)


def header_riding_job(rank, size, steps, tokens):
    """Per dispatch, the slowest-rank wall and this process's CPU (`time.process_time`: gloo's threads too) of a
    default dispatcher, whose plan agreement rides in the payload all-to-all (every rank's planner word, carried by
    the metadata all-gather, vouches that the plans are equal), against the same plans made by a plugin (no word
    vouches for them: the header all-reduce of its own), and the default one again (the noise floor); arms
    rotated step by step."""
    register_algorithm("lpt_as_plugin", lpt_as_plugin)
    rng = np.random.default_rng(rank)
    arms = {name: PostBalancingDispatcher(algorithm="lpt_as_plugin" if name == "header_round" else "lpt",
                                          cost=CostModel(linear=1), per_item_keys={"id"})
            for name in ("riding", "riding_again", "header_round")}
    times = {name: [] for name in arms}
    for step in range(steps + 1):  # step 0: every site's first exchange, which checks in a header of its own
        lengths = rng.integers(tokens // 2, tokens * 3 // 2, 16)
        batch = {"x": torch.randn(int(lengths.sum()), 64), "id": torch.arange(16) + 100 * rank}
        names, moved = list(arms), {}
        for name in names[step % 3:] + names[:step % 3]:
            plan = arms[name].plan(lengths)
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            moved[name] = arms[name].dispatch(batch, plan)
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
        assert all(torch.equal(moved[name]["x"], moved["riding"]["x"]) for name in names)  # the same plans
    return {name: values[1:] for name, values in times.items()}


@pytest.mark.parametrize("tokens", [64, 4096])
def test_plan_agreement_riding_the_payload_against_a_header_round_4_ranks(benchmark, tokens):
    """Issue 24: the agreement check of a default dispatch costs no collective of its own (header_round over
    riding)."""
    results = benchmark.pedantic(spawn, args=(header_riding_job, 4), kwargs={"args": (100 if tokens < 1024 else 20,
                                                                                       tokens), "timeout_s": 300},
                                 rounds=1, iterations=1)
    figures = {}
    for name in results[0]:
        steps = list(zip(*[result[name] for result in results]))  # per step, every rank's (wall, cpu)
        figures[name] = ([max(wall for wall, _ in step) for step in steps], [sum(cpu for _, cpu in step)
                                                                           for step in steps])
    for k, what in enumerate(("wall_slowest_rank", "cpu_all_ranks")):
        for arm in ("header_round", "riding_again"):
            benchmark.extra_info[f"{arm}_over_riding_{what}_median"] = statistics.median(figures[arm][k]) / \
                statistics.median(figures["riding"][k])
            benchmark.extra_info[f"{arm}_over_riding_{what}_min"] = min(figures[arm][k]) / min(figures["riding"][k])


class CheckedModel(nn.Module):
    """A small transformer (24 encoder layers, width 128, 5.0 M parameters, about 1300 autograd nodes in a
    micro-batch's loss graph): the graph the model check walks is that of a real model, at a size a CPU runs."""

    def __init__(self, layers: int = 24, width: int = 128, vocabulary: int = 1000):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.blocks = nn.ModuleList(nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
                                    for _ in range(layers))
        self.head = nn.Linear(width, vocabulary)

    def forward(self, tokens):
        hidden = self.embed(tokens)[None]  # the micro-batch packed into one sequence
        for block in self.blocks:
            hidden = block(hidden)
        return self.head(hidden[0])


def _alternated(arms, rounds: int) -> dict:
    """Per arm, the (wall, thread CPU) seconds of each round after the first (a warm-up), the arms run in
    rotating order after a barrier, so that every arm sees the same minutes of a shared machine."""
    times = {name: [] for name, _ in arms}
    for round_number in range(rounds + 1):
        for name, step in arms[round_number % len(arms):] + arms[: round_number % len(arms)]:
            dist.barrier()
            wall, cpu = time.perf_counter(), time.thread_time()
            step()
            times[name].append((time.perf_counter() - wall, time.thread_time() - cpu))
    return {name: values[1:] for name, values in times.items()}


def _median_ratios(times: dict, arm: str, base: str) -> tuple[float, float]:
    """Median over rounds of arm / base, of wall and of thread CPU seconds."""
    return tuple(statistics.median(new[k] / old[k] for old, new in zip(times[base], times[arm])) for k in (0, 1))


def model_check_job(rank, size, rounds):
    """A DDP micro-batched step (plan, dispatch, forward and backward of every micro-batch, the gradient
    all-reduce) due the model check (the dispatcher's step counter reset: its first step, whose micro-batches are
    all watched and whose last one checks, as a step where a rank's last micro-batch is empty) against the same
    step not due with `accumulate(..., check=False)`, twice (the noise floor); then the check's graph walk alone
    on the last micro-batch's loss."""
    torch.manual_seed(0)
    model = CheckedModel()
    ddp = nn.parallel.DistributedDataParallel(model)
    rng = np.random.default_rng(rank)
    lengths = rng.integers(8, 24, 8)  # about 128 tokens per rank, 2-3 micro-batches
    tokens = torch.from_numpy(rng.integers(0, 1000, int(lengths.sum())))
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=48)

    def step(check):
        if check:
            dispatcher._clock = StepClock()  # the next dispatch is the dispatcher's first step: due the check
        plan = dispatcher.plan(lengths)
        moved = dispatcher.dispatch({"tokens": tokens}, plan)
        for micro in dispatcher.microbatches(plan, moved):
            assert micro.contract is not None or not check
            with accumulate(ddp, micro, check=check):
                logits = ddp(micro.data["tokens"])
                loss_sum = nn.functional.cross_entropy(logits, micro.data["tokens"], reduction="sum")
                normalize_loss(loss_sum, micro).backward()
        ddp.zero_grad(set_to_none=True)
        return plan.num_microbatches

    times = _alternated([("unchecked", lambda: step(False)), ("unchecked_again", lambda: step(False)),
                         ("checked", lambda: step(True))], rounds)
    wanted = {name for name, parameter in model.named_parameters() if parameter.requires_grad}
    forwards, walks = {True: [], False: []}, []
    for round_number in range(2 * rounds):  # a forward with and without the check's recording, alternated
        recorded = bool(round_number % 2)
        start = time.thread_time()
        with recording(model, {}) if recorded else contextlib.nullcontext({}) as names:  # as a due check does
            loss_sum = nn.functional.cross_entropy(model(tokens[:48]), tokens[:48], reduction="sum")
        forwards[recorded].append(time.thread_time() - start)
        if recorded:
            start = time.thread_time()
            assert reached_leaves([loss_sum], names, wanted, {}) == (wanted, False)
            walks.append(time.thread_time() - start)
    return {"checked_over_unchecked": _median_ratios(times, "checked", "unchecked"),
            "noise_floor": _median_ratios(times, "unchecked_again", "unchecked"),
            "unchecked_step_seconds": statistics.median(wall for wall, _ in times["unchecked"]),
            "unchecked_step_cpu_seconds": statistics.median(cpu for _, cpu in times["unchecked"]),
            "walk_seconds": statistics.median(walks), "num_microbatches": step(False),
            "recording_seconds": statistics.median(forwards[True]) - statistics.median(forwards[False]),
            "parameters": sum(parameter.numel() for parameter in model.parameters())}


def test_model_check_cost_of_a_micro_batched_ddp_step_2_ranks(benchmark):
    """On a due step the model check costs the recording of the checked forward's parameters (a global forward
    hook), one graph walk and one all-reduce of a word per rank; other steps run no check."""
    results = benchmark.pedantic(spawn, args=(model_check_job, 2), kwargs={"args": (6,), "timeout_s": 300},
                                 rounds=1, iterations=1)
    worst = {key: max(r[key] for r in results) for key in ("walk_seconds", "recording_seconds",
                                                           "unchecked_step_seconds", "unchecked_step_cpu_seconds")}
    wall, cpu = (max(r["checked_over_unchecked"][k] for r in results) for k in (0, 1))
    floor_wall, floor_cpu = (max(r["noise_floor"][k] for r in results) for k in (0, 1))
    fixed = worst["walk_seconds"] + worst["recording_seconds"]  # CPU seconds, each measured alone
    assert fixed <= 0.10 * worst["unchecked_step_cpu_seconds"]
    benchmark.extra_info.update({
        **worst, "checked_over_unchecked_wall": wall, "checked_over_unchecked_thread_cpu": cpu,
        "noise_floor_wall": floor_wall, "noise_floor_thread_cpu": floor_cpu,
        "walk_and_recording_over_step_cpu": fixed / worst["unchecked_step_cpu_seconds"],
        "num_microbatches": results[0]["num_microbatches"], "parameters": results[0]["parameters"]})


@contextlib.contextmanager
def _no_thread_check():
    """The runtime's collectives without the two-thread check (`comm._one_thread` a no-op): the baseline arm."""
    kept = comm._one_thread
    comm._one_thread = lambda phase, group: contextlib.nullcontext()
    try:
        yield
    finally:
        comm._one_thread = kept


def thread_check_job(rank, size, rounds):
    """A dispatch step (plan, dispatch, combine: every collective through `comm.collective`) with the
    two-thread check against the same step without it, and twice without (the noise floor); also the
    number of collectives a step posts."""
    rng = np.random.default_rng(rank)
    lengths = rng.integers(64, 512, 16)
    batch = {"x": torch.randn(int(lengths.sum()), 64), "id": torch.arange(16) + 100 * rank}
    dispatcher = PostBalancingDispatcher(algorithm="lpt", per_item_keys={"id"})

    def step():
        plan = dispatcher.plan(lengths)
        moved = dispatcher.dispatch(batch, plan)
        home = dispatcher.combine(moved, plan)
        assert torch.equal(home["id"], batch["id"])

    def unchecked():
        with _no_thread_check():
            step()

    times = _alternated([("unchecked", unchecked), ("unchecked_again", unchecked), ("checked", step)], rounds)
    kept, posted = comm._one_thread, []
    comm._one_thread = lambda phase, group: posted.append(phase) or kept(phase, group)
    try:
        step()
    finally:
        comm._one_thread = kept
    return {"checked_over_unchecked": _median_ratios(times, "checked", "unchecked"),
            "noise_floor": _median_ratios(times, "unchecked_again", "unchecked"),
            "unchecked_step_cpu_seconds": statistics.median(cpu for _, cpu in times["unchecked"]),
            "collectives_per_step": len(posted)}


def test_thread_check_cost_per_dispatch_step_2_ranks(benchmark):
    results = benchmark.pedantic(spawn, args=(thread_check_job, 2), kwargs={"args": (200,), "timeout_s": 300},
                                 rounds=1, iterations=1)
    wall, cpu = (max(r["checked_over_unchecked"][k] for r in results) for k in (0, 1))
    floor_wall, floor_cpu = (max(r["noise_floor"][k] for r in results) for k in (0, 1))
    assert cpu <= 1.10
    benchmark.extra_info.update({
        "checked_over_unchecked_wall": wall, "checked_over_unchecked_thread_cpu": cpu,
        "noise_floor_wall": floor_wall, "noise_floor_thread_cpu": floor_cpu,
        "unchecked_step_cpu_seconds": max(r["unchecked_step_cpu_seconds"] for r in results),
        "collectives_per_step": results[0]["collectives_per_step"]})


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

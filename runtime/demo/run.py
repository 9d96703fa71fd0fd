"""The real multi-process demo: train the tiny vision + audio + text model with and without
post-balancing on the same data, and measure what balancing changes and what it costs.

`run_demo(ranks=4, steps=3)` spawns `ranks` CPU processes in a gloo group (free port,
always torn down, hard timeout).  Every step, on the same parameters and the same global
batch, each rank runs the step twice: unbalanced (every item stays where it was
sampled; the same runtime path with an identity plan) and balanced (every encoder stage
and the LLM balanced by the orchestrator; plan prefetched in a background thread on its
own process group).  It compares the all-reduced gradients, measures each rank's busy
time (CPU time of the compute, `time.thread_time`, one intra-op thread per process, so
ranks sharing cores do not distort it), and checks that every sample id sent is received
exactly once.  Then the optimizer steps with the balanced gradients.

Stage cost models come from timing packed batches of each stage, rank-sized, drawn by
every rank and timed by rank 0 in isolation as the replay times recorded work, fitted on
rank 0 (`calibration.py`) and broadcast so every rank plans with the same numbers.

After the run, every rank's recorded per-stage work is replayed in isolation, one rank
at a time (`replay.py`): those busy figures are what the pass/fail check
(`DemoReport.failed_checks`, `report.py`) uses, since on a shared machine
contention between the ranks can exceed the imbalance being measured.

On a cluster: `torchrun --nproc-per-node 8 -m orchmllm demo --json` (NCCL when CUDA is
available; busy time is then GPU wall time between synchronisations).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from ...balancers import CostModel
from ...balancers.validation import is_int
from ...orchestrator.stages import Stage
from ..comm import comm_device, group_size, init_distributed
from ..hierarchical import make_transport
from ..launch import spawn
from ..multistage import MultiStageRuntime
from ..prefetch import Prefetcher
from ..reduction import all_reduce_gradients, normalize_loss
from .costs import busy_clock, calibrate_in_isolation, flops_costs, warm_up
from .data import IGNORE, SyntheticMultimodal
from .model import ModelConfig, TinyMultimodalModel
from .replay import WorkRecorder, keep_freed_memory, replay_in_isolation
from .report import DemoReport, summarize

DTYPES = {"float32": torch.float32, "float64": torch.float64}
MAX_SPAWNED_RANKS = 64
"""Ranks `run_demo` spawns at most: each is a CPU process importing torch on this machine."""


def demo_stages(costs: dict, config: ModelConfig, algorithm: str = "auto", element_bytes: int = 4) -> tuple:
    """Vision, audio and LLM stages of the tiny model with the given cost models."""
    return (Stage("vision", "image", costs["image"], algorithm=algorithm,
                  input_bytes_per_unit=config.patch_dim * element_bytes,
                  output_bytes_per_token=config.llm_hidden * element_bytes),
            Stage("audio", "audio", costs["audio"], algorithm=algorithm,
                  input_bytes_per_unit=config.frame_dim * element_bytes,
                  output_bytes_per_token=config.llm_hidden * element_bytes),
            Stage("llm", "llm", costs["llm"], algorithm=algorithm, input_bytes_per_unit=8))


def _sample_ids(ids: torch.Tensor, group=None) -> list[int]:
    """Every rank's sample ids, gathered and sorted (the per-step checksum)."""
    local = ids.cpu().tolist()
    if group_size(group) == 1:
        return sorted(local)
    gathered = [None] * group_size(group)
    dist.all_gather_object(gathered, local, group=group)
    return sorted(i for part in gathered for i in part)


def _train_step(runtime, routes, batch, model, clock, stats, recorders: Callable | None = None):
    """One forward/backward through `runtime`, micro-batch by micro-batch (gradients accumulate;
    every micro-batch's loss is divided by the loss tokens of the whole step, planned with
    `_loss_tokens`); returns (busy seconds of every micro-batch, one for a plain step; sample ids
    received).  `recorders(index)` gives the WorkRecorder keeping the tensors micro-batch `index`
    ran on, for the isolated replay."""
    moved = runtime.dispatch(routes, text=batch.text, per_sample=batch.per_sample, inputs=batch.inputs, stats=stats)
    busy, ids = [], []
    for micro in runtime.microbatches(routes, moved):
        recorder = None if recorders is None else recorders(micro.index)
        encoders = model.encoders() if recorder is None else recorder.encoders(model)
        busy_start = clock()
        packed = runtime.forward(micro.routes, micro.data, encoders=encoders, text_embedding=model.llm.embed,
                                 stats=stats)
        logits = model.llm(packed.embeddings, packed.sample_lengths)
        packed_labels = packed.scatter_text("labels", IGNORE)
        loss_sum = model.loss_sum(logits, packed_labels)
        normalize_loss(loss_sum, micro, runtime.group, gradient_reduction="sum").backward()
        busy.append(clock() - busy_start)
        if recorder is not None:
            recorder.llm(packed.embeddings, packed.sample_lengths, packed_labels)
        ids.append(micro.data.per_sample["sample_id"])
    return busy, torch.cat(ids)


def _loss_tokens(batch) -> list[int]:
    """Loss tokens of every local sample (labels other than IGNORE), for the step's loss denominator."""
    return [int(part.ne(IGNORE).sum()) for part in batch.text["labels"].split([s.text for s in batch.samples])]


def _planned_loads(routes) -> list[list[float]]:
    """Per micro-batch (one for a plain step), per rank, the planned cost: the stage plans' loads
    summed over stages."""
    return [np.sum([plan.loads for plan in step.stage_plans], axis=0).tolist() for step in routes.step.microbatches]


def _stage_imbalance(routes) -> dict:
    """Per stage, Σ_m makespan / Σ_m mean load over the step's micro-batches (one for a plain step)."""
    plans = routes.step.microbatches
    return {stage.stage.name: float(sum(p.stage_plans[i].makespan for p in plans)
                                    / max(sum(p.stage_plans[i].loads.mean() for p in plans), 1e-300))
            for i, stage in enumerate(plans[0].stage_plans)}


@dataclass(frozen=True)
class DemoOptions:
    """How the demo runs: samples per rank and step, balancing algorithm, transport, and
    where the stage cost models come from ("calibrated": timed by rank 0 in isolation,
    `calibrate_in_isolation`; "flops": `CostModel.from_transformer` of each stage, no
    timing), and how many identical passes
    each busy time is the minimum of (CPU time only grows when co-scheduled processes
    evict caches or share a core, so the minimum filters that noise), and in how many
    rounds the isolated replay times every rank's work (`replay.py`).  `max_tokens_per_microbatch`:
    the balanced step runs as gradient-accumulation micro-batches of at most this many LLM
    tokens per rank (the unbalanced reference stays one pass per rank); None: one pass."""

    samples_per_rank: int = 16
    algorithm: str = "auto"
    transport: str = "flat"
    gpus_per_node: int | None = None
    costs: str = "calibrated"
    repeats: int = 3
    replay_repeats: int = 5
    max_tokens_per_microbatch: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens_per_microbatch is not None and (not is_int(self.max_tokens_per_microbatch)
                                                           or self.max_tokens_per_microbatch < 1):
            raise ValueError(f"`max_tokens_per_microbatch` must be an int >= 1 or None; "
                             f"got {self.max_tokens_per_microbatch!r}")
        for name in ("repeats", "replay_repeats"):
            if not is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be an int >= 1; got {getattr(self, name)!r}")
        if self.gpus_per_node is not None and (not is_int(self.gpus_per_node) or self.gpus_per_node < 1):
            raise ValueError(f"`gpus_per_node` must be an int >= 1 or None; got {self.gpus_per_node!r}")
        if not is_int(self.samples_per_rank) or self.samples_per_rank < 0:
            raise ValueError(f"`samples_per_rank` must be an int >= 0; got {self.samples_per_rank!r}")
        if self.costs not in ("calibrated", "flops"):
            raise ValueError(f"`costs` must be 'calibrated' or 'flops'; got {self.costs!r}")
        if self.transport not in ("flat", "hierarchical"):
            raise ValueError(f"`transport` must be 'flat' or 'hierarchical'; got {self.transport!r}")
        demo_stages({modality: CostModel() for modality in ("image", "audio", "llm")}, ModelConfig(), self.algorithm)


def _extra_passes(runtime, routes, batch, model, clock, passes: int) -> list[float]:
    """Run `passes` more identical steps (gradients discarded); per micro-batch, their least busy time."""
    best = None
    for _ in range(passes):
        busy = _train_step(runtime, routes, batch, model, clock, None)[0]
        best = busy if best is None else np.minimum(best, busy).tolist()
        model.zero_grad(set_to_none=True)
    return best


def _least(busy: list, extra: list | None) -> list[float]:
    """Per micro-batch, the least of a pass's busy times and those of the extra passes."""
    return busy if extra is None else np.minimum(busy, extra).tolist()


def gradient_terms(batch) -> int:
    """The most rows one weight gradient of the tiny model sums over in a step of this global
    `Batch`: its LLM tokens, image patches or audio frames (`report.rounding_tolerance`)."""
    encoder_rows = [int(batch.segment_length[batch.segments_of(modality)].sum()) for modality in batch.modalities]
    return max([int(batch.sample_llm_length.sum()), *encoder_rows])


@dataclass
class _Trainer:
    """What every step of a rank's demo run uses: the model, its data, the three runtimes
    (balanced, unbalanced, and `alone`: a group of one, for the busy-time noise floor)."""

    rank: int
    model: TinyMultimodalModel
    data: SyntheticMultimodal
    dtype: torch.dtype
    device: torch.device
    clock: Callable[[], float]
    balanced: MultiStageRuntime
    unbalanced: MultiStageRuntime
    alone: MultiStageRuntime
    prefetcher: Prefetcher
    optimizer: torch.optim.Optimizer
    repeats: int


def _trainer(rank: int, world_size: int, seed: int, dtype: str, options: DemoOptions, say) -> tuple:
    """Build the model and its runtimes, timing the stage cost models first; returns the
    `_Trainer`, the cost models, their fit errors and the seconds the costs took."""
    device = comm_device()
    torch_dtype = DTYPES[dtype]
    torch.manual_seed(seed)
    config = ModelConfig()
    model = TinyMultimodalModel(config).to(device=device, dtype=torch_dtype)
    data = SyntheticMultimodal(config, options.samples_per_rank, seed)
    clock = busy_clock(device)
    keep_freed_memory()  # on every rank: rank 0's replays keep freed memory, so the ranks' allocators agree
    say("warming up")
    warm_up(model, data, torch_dtype, device)
    calibration_start = time.perf_counter()
    if options.costs == "flops":
        costs, fit_errors = flops_costs(config), {}
    else:
        say("timing the stage cost models (rank 0, in isolation)")
        costs, fit_errors = calibrate_in_isolation(model, data, torch_dtype, device, rank, world_size, seed)
    calibration_seconds = time.perf_counter() - calibration_start
    stages = demo_stages(costs, config, options.algorithm, torch.finfo(torch_dtype).bits // 8)
    mover = make_transport(options.transport, gpus_per_node=options.gpus_per_node)
    microbatching = {} if options.max_tokens_per_microbatch is None else {
        "max_tokens_per_microbatch": options.max_tokens_per_microbatch}
    balanced = MultiStageRuntime(stages, transport=mover, check_plan=True, **microbatching)
    unbalanced = MultiStageRuntime(stages, transport=mover, balance_encoders=False, balance_llm=False)
    prefetcher = Prefetcher(lambda samples, loss_tokens, group: balanced.plan(samples, loss_tokens=loss_tokens,
                                                                             metadata_group=group))
    # A group of one per rank: the same batch computed alone on every rank measures the
    # busy-time noise floor (identical work, so any max/mean above 1 is measurement noise).
    alone = None
    for member in range(world_size):
        group = dist.new_group([member]) if world_size > 1 else None
        if member == rank:
            alone = MultiStageRuntime(stages, group=group, transport=make_transport("flat", group))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    trainer = _Trainer(rank, model, data, torch_dtype, device, clock, balanced, unbalanced, alone, prefetcher,
                       optimizer, options.repeats)
    return trainer, costs, fit_errors, calibration_seconds


def _reference_step(trainer: _Trainer, step: int, batch, record: dict, recorded: dict) -> list:
    """The noise floor (rank 0's batch alone on every rank) and the unbalanced step of `batch`;
    returns the unbalanced step's all-reduced gradients, the reference of the balanced one."""
    model, clock, extra_passes = trainer.model, trainer.clock, trainer.repeats - 1
    same = trainer.data.local_batch(step, 0, trainer.dtype).to(trainer.device)
    same_routes = trainer.alone.plan(same.samples, loss_tokens=_loss_tokens(same))
    extra = _extra_passes(trainer.alone, same_routes, same, model, clock, extra_passes)
    busy, _ = _train_step(trainer.alone, same_routes, same, model, clock, None)
    record["busy_identical"].append(_least(busy, extra)[0])
    model.zero_grad(set_to_none=True)

    routes = trainer.unbalanced.plan(batch.samples, loss_tokens=_loss_tokens(batch))
    record["planned_unbalanced"].append(_planned_loads(routes))
    record["gradient_terms"].append(gradient_terms(routes.batch))
    extra = _extra_passes(trainer.unbalanced, routes, batch, model, clock, extra_passes)
    recorded["unbalanced", step] = WorkRecorder()
    busy, ids = _train_step(trainer.unbalanced, routes, batch, model, clock, None,
                            lambda _: recorded["unbalanced", step])
    record["busy_unbalanced"].append(_least(busy, extra)[0])
    record["ids_unbalanced"].append(_sample_ids(ids))
    parameters = list(model.parameters())
    all_reduce_gradients(parameters, op="sum")
    reference = [p.grad.clone() for p in parameters]
    trainer.optimizer.zero_grad(set_to_none=True)
    return reference


def _balanced_step(trainer: _Trainer, step: int, steps: int, batch, planned, record: dict, recorded: dict,
                   reference: list):
    """The balanced step of `batch` (its routes `planned` by the prefetcher as (routes, wait,
    planning seconds), or None: planned here), the next step's plan prefetched meanwhile;
    records it, steps the optimizer and returns the next step's `planned`."""
    model, prefetcher, stats = trainer.model, trainer.prefetcher, {}
    if planned is None:  # the first step has nothing to overlap with
        plan_start = time.perf_counter()
        routes = trainer.balanced.plan(batch.samples, loss_tokens=_loss_tokens(batch))
        wait, planning = time.perf_counter() - plan_start, routes.planning_seconds
    else:
        routes, wait, planning = planned
    extra = _extra_passes(trainer.balanced, routes, batch, model, trainer.clock, trainer.repeats - 1)
    following_batch = trainer.data.local_batch(step + 1, trainer.rank, trainer.dtype) if step + 1 < steps else None
    step_start = time.perf_counter() - wait
    if step + 1 < steps:
        planning_before, wait_before = prefetcher.planning_seconds, prefetcher.wait_seconds
        prefetcher.submit(following_batch.samples, _loss_tokens(following_batch))
    cells = {}  # micro-batch index -> its WorkRecorder
    busy, ids = _train_step(trainer.balanced, routes, batch, model, trainer.clock, stats,
                            lambda index: cells.setdefault(index, WorkRecorder()))
    for index, recorder in cells.items():
        recorded["balanced", step, index] = recorder
    parameters = list(model.parameters())
    all_reduce_gradients(parameters, op="sum")
    following = None
    if step + 1 < steps:
        following = (prefetcher.result(), prefetcher.wait_seconds - wait_before,
                     prefetcher.planning_seconds - planning_before)
    record["step_seconds"].append(time.perf_counter() - step_start)
    record["busy_balanced"].append(_least(busy, extra))
    record["num_microbatches"].append(len(busy))
    record["ids_balanced"].append(_sample_ids(ids))
    record["exchange_seconds"].append(stats.get("exchange_seconds", 0.0))
    record["bytes_sent"].append(stats.get("exchange_bytes_sent", 0))
    record["plan_wait_seconds"].append(wait)
    record["planning_seconds"].append(planning)
    record["stage_imbalance"].append(_stage_imbalance(routes))
    record["planned_balanced"].append(_planned_loads(routes))
    record["grad_diff"].append(compare_gradients(reference, [p.grad for p in parameters]))
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return following


def _replay(trainer: _Trainer, world_size: int, steps: int, options: DemoOptions, record: dict,
            recorded: dict) -> None:
    """Replay every rank's recorded work in isolation into `record` (the busy figures the check uses)."""
    replay_start = time.perf_counter()
    # The identical work is rank 0's batch on every rank: its unbalanced pass (the same tensors);
    # per micro-batch cell, rank 0's cell of the balanced step.
    copies = {("identical", step): ("unbalanced", step) for step in range(steps)}
    if options.max_tokens_per_microbatch is not None:
        copies.update({("identical", step, index): ("balanced", step, index)
                       for step, count in enumerate(record["num_microbatches"]) for index in range(count)})
    isolated = replay_in_isolation(trainer.model, {key: r.work for key, r in recorded.items()}, trainer.clock,
                                   trainer.rank, world_size, options.replay_repeats, copies)
    record["replay_seconds"] = time.perf_counter() - replay_start
    record["replay_repeats"] = options.replay_repeats
    for mode in ("unbalanced", "identical"):
        record[f"isolated_{mode}"] = [isolated[mode, step] for step in range(steps)]
    record["isolated_balanced"] = [[isolated["balanced", step, index] for index in range(count)]
                                   for step, count in enumerate(record["num_microbatches"])]
    if options.max_tokens_per_microbatch is not None:
        record["isolated_identical_cells"] = [[isolated["identical", step, index] for index in range(count)]
                                              for step, count in enumerate(record["num_microbatches"])]


def train(rank: int, world_size: int, steps: int = 3, seed: int = 0, dtype: str = "float32",
          options: DemoOptions = DemoOptions(), progress: Callable[[str], None] | None = None) -> dict:
    """The per-rank body of the demo (inside an initialised process group); rank 0 tells
    `progress` each stage of the run as it starts."""
    say = progress if progress is not None and rank == 0 else (lambda message: None)
    trainer, costs, fit_errors, calibration_seconds = _trainer(rank, world_size, seed, dtype, options, say)
    record = {"busy_unbalanced": [], "busy_balanced": [], "grad_diff": [], "ids_sent": [],
              "ids_unbalanced": [], "ids_balanced": [], "step_seconds": [], "exchange_seconds": [],
              "plan_wait_seconds": [], "planning_seconds": [], "bytes_sent": [], "stage_imbalance": [],
              "busy_identical": [], "planned_balanced": [], "planned_unbalanced": [], "num_microbatches": [],
              "gradient_terms": []}
    recorded = {}  # (mode, step) -> the StageWork of that pass, replayed in isolation afterwards
    concurrent_start = time.perf_counter()
    planned = None
    for step in range(steps):
        say(f"step {step + 1} of {steps}: training unbalanced and balanced")
        batch = trainer.data.local_batch(step, rank, trainer.dtype).to(trainer.device)
        record["ids_sent"].append(_sample_ids(batch.per_sample["sample_id"]))
        reference = _reference_step(trainer, step, batch, record, recorded)
        planned = _balanced_step(trainer, step, steps, batch, planned, record, recorded, reference)
    trainer.prefetcher.close()
    record["concurrent_seconds"] = time.perf_counter() - concurrent_start
    say("replaying every rank's work in isolation")
    _replay(trainer, world_size, steps, options, record, recorded)
    record["calibration_seconds"] = calibration_seconds
    record["fit_errors"] = fit_errors
    record["costs"] = {name: [c.per_item, c.linear, c.quadratic] for name, c in costs.items()}
    return record


def compare_gradients(reference, other) -> dict:
    """How far two gradients (lists of tensors, same shapes) are apart.

    grad_max_abs_diff: max |Δ|; grad_max_rel_diff: max |Δ| / max |g| over the whole
    gradient; grad_rel_l2: ||Δ||₂ / ||g||₂; grad_max_rel_diff_per_tensor: the worst
    tensor's max |Δ| / max |g| (small-gradient tensors such as LayerNorm parameters show
    float32 summation-order noise here first).
    """
    diffs = [(a - b).abs() for a, b in zip(reference, other)]
    flat_ref = torch.cat([a.reshape(-1) for a in reference]).double()
    flat_diff = torch.cat([d.reshape(-1) for d in diffs]).double()
    scale = flat_ref.abs().max().item() if flat_ref.numel() else 0.0
    per_tensor = [d.max().item() / a.abs().max().item() for d, a in zip(diffs, reference)
                  if a.numel() and a.abs().max().item() > 0]
    return {"grad_max_abs_diff": flat_diff.max().item() if flat_diff.numel() else 0.0,
            "grad_max_rel_diff": flat_diff.max().item() / scale if scale > 0 else 0.0,
            "grad_rel_l2": (flat_diff.norm() / flat_ref.norm()).item() if scale > 0 else 0.0,
            "grad_max_rel_diff_per_tensor": max(per_tensor, default=0.0)}


def check_run(ranks: int, steps: int, dtype: str, options: DemoOptions, seed: int = 0, *,
              spawned: bool = True) -> None:
    """Raise ValueError for a demo run that cannot start (before any process is spawned),
    e.g. a micro-batch budget below the longest sample of the run (from the metadata alone),
    or more `spawned` ranks than `MAX_SPAWNED_RANKS`."""
    for name, value, low in (("ranks", ranks, 1), ("steps", steps, 1), ("seed", seed, 0)):
        if not is_int(value) or value < low:
            raise ValueError(f"`{name}` must be an int >= {low}; got {value!r}")
    if spawned and ranks > MAX_SPAWNED_RANKS:
        raise ValueError(f"`ranks` must be at most {MAX_SPAWNED_RANKS} spawned CPU processes on this machine; got "
                         f"{ranks} (start more ranks with torchrun)")
    if dtype not in DTYPES:
        raise ValueError(f"`dtype` must be one of {sorted(DTYPES)}; got {dtype!r}")
    if options.transport == "hierarchical" and (options.gpus_per_node is None or ranks % options.gpus_per_node):
        raise ValueError(f"transport 'hierarchical' needs `gpus_per_node` dividing ranks={ranks}; "
                         f"got {options.gpus_per_node}")
    budget = options.max_tokens_per_microbatch
    if budget is not None:
        data = SyntheticMultimodal(ModelConfig(), options.samples_per_rank, seed)
        longest = max(((sample.llm_length, step, rank) for step in range(steps) for rank in range(ranks)
                       for sample in data.samples(step, rank)), default=(0, 0, 0))
        if longest[0] > budget:
            raise ValueError(f"`max_tokens_per_microbatch` must hold the longest sample: {longest[0]} LLM tokens "
                             f"(step {longest[1]}, rank {longest[2]}) is the smallest budget that works; "
                             f"got {budget}")


def run_demo(ranks: int = 4, steps: int = 3, seed: int = 0, dtype: str = "float32", *,
             samples_per_rank: int = 16, algorithm: str = "auto", transport: str = "flat",
             gpus_per_node: int | None = None, costs: str = "calibrated", repeats: int = 3,
             replay_repeats: int = 5, max_tokens_per_microbatch: int | None = None,
             options: DemoOptions | None = None, timeout_s: float = 600.0,
             progress: Callable[[str], None] | None = None) -> DemoReport:
    """Spawn `ranks` CPU gloo processes, train `steps` steps with and without
    post-balancing on the same data, replay every rank's work in isolation, and return
    the report (`DemoReport`; `report.failed_checks()` is the pass/fail verdict).

    Each concurrent busy time is the minimum over `repeats` identical passes of the
    step, each isolated stage time an average over `replay_repeats` rounds; with
    `max_tokens_per_microbatch` the balanced step is micro-batched (gradient accumulation).
    `options`, if given, replaces those keyword arguments; `progress(message)` hears each
    stage of the run as it starts (from rank 0's process).
    """
    if options is None:
        options = DemoOptions(samples_per_rank, algorithm, transport, gpus_per_node, costs, repeats, replay_repeats,
                              max_tokens_per_microbatch)
    check_run(ranks, steps, dtype, options, seed)
    start = time.perf_counter()
    if progress is not None:
        progress(f"starting {ranks} gloo ranks")
    records = spawn(train, ranks, args=(steps, seed, dtype, options, progress),
                    timeout_s=timeout_s, collective_timeout_s=min(timeout_s, 120.0))
    return summarize(records, ranks, steps, dtype, time.perf_counter() - start, options.max_tokens_per_microbatch)


def run_demo_in_process_group(steps: int = 3, seed: int = 0, dtype: str = "float32", *,
                              options: DemoOptions = DemoOptions(),
                              progress: Callable[[str], None] | None = None) -> DemoReport | None:
    """The demo on the ranks torchrun started (`torchrun --nproc-per-node N -m orchmllm
    demo`): NCCL when CUDA is available, else gloo.  The report on rank 0, None elsewhere."""
    start = time.perf_counter()
    rank, world_size = init_distributed()
    check_run(world_size, steps, dtype, options, seed, spawned=False)
    if not torch.cuda.is_available():
        torch.set_num_threads(1)
    try:
        record = train(rank, world_size, steps, seed, dtype, options, progress)
        records = [None] * world_size
        dist.all_gather_object(records, record)
    finally:
        dist.destroy_process_group()
    return (summarize(records, world_size, steps, dtype, time.perf_counter() - start,
                      options.max_tokens_per_microbatch) if rank == 0 else None)



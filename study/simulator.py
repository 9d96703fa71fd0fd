"""Cluster simulator: one training step of a multimodal model under each strategy.

For a model (`models.MODELS`), a workload (`workloads.WORKLOADS` or a JSON-lines file)
and a cluster of `gpus` H100s (`Topology.for_world_size`, 8 per node), every strategy
(`strategies.STRATEGIES`) plans the same sampled batch, and the step is modelled as:

    busy[s, r]     = hardware FLOPs of stage s on rank r / (peak · kernel efficiency)
                     (stage cost model in FLOPs, padding included, × 4/3 for recomputation)
    compute        = Σ_s max_r busy[s, r]      ZeRO-3 gathers every layer's parameters
                                               collectively, so each stage waits for its
                                               slowest rank
    exchange       = Σ over exchanges of the topology comm model's seconds (forward
                     exchanges + the embedding-gradient exchanges of the backward pass)
    planning       = measured wall-clock of the real planner on this machine; hidden by
                     prefetching behind the previous step's compute, only the excess counts
    step           = compute + exchange + max(0, planning - compute)
    MFU            = model FLOPs of the real (unpadded) tokens / (step · D · peak)
    idle fraction  = 1 - Σ busy / (D · compute)
    overhead       = (exchange + unhidden planning) / step
    bytes_moved    = payload of the items that leave their rank, summed over the forward exchanges (what the
                     plan moves: the same for every exchange strategy)
    bytes_inter_node = the bytes the strategy's forward exchanges put on inter-node links (what the wire
                     carries: an all-gather sends every payload to every node, so it can exceed bytes_moved)
    memory[r]      = static + Σ_s stored activations + max_s one-layer working set
                     + exchange buffers (peak over the forward exchanges); OOM when the
                     busiest rank exceeds the GPU memory

Batch size.  To stay clear of out-of-memory errors a training run sets its batch size by
memory (the OrchMLLM paper's motivation: to avoid OOM a system must set its batch size by
its largest token count, so the batch is sized for the system being run).  Unless
`samples_per_rank` is given, `run_simulation` does the same for full orchestration: it
takes the largest samples per rank on `SAMPLES_PER_RANK_GRID` (1, 2, then multiples of 4
up to 64) at which `ours` needs at most `MEMORY_HEADROOM` = 90 % of GPU memory on its
busiest rank, found by bisection on the grid (peak memory grows with the batch), and runs
every strategy on that same sampled batch, so strategies that balance less go over
memory exactly where the paper says they do.  The 10 % left free is for the caching
allocator's fragmentation, which grows with the variable-length activations churned
every step (the fixed 4 GiB reserve in `models` covers the CUDA context and NCCL), and for
the step-to-step spread of the busiest rank while the batch size stays fixed for a run
(under 1 GiB for `ours`: 71.1–71.9 GiB over seeds 0–5 for 84b, 2560 GPUs, 28 per rank).

Assumptions on the models and GPUs are in `models`; on workloads in `workloads`; on
links in `topology.comm_model`.  Parameter all-gathers, gradient reduce-scatters and
the optimizer step are the same for every strategy and are not modelled.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..balancers.problem import as_num_ranks
from ..balancers.validation import is_int, is_real
from ..orchestrator.frames import stage_costs
from ..orchestrator.plan import Exchange, PassPlan
from ..orchestrator.step import StepPlan
from ..topology import Topology, estimate_exchange
from .compare import MAX_STEP_SAMPLES, check_batch_size
from .models import GIB, GPU, GPUS, MODELS, ModelConfig, check_model, list_models
from .records import FieldsAsJson
from .strategies import STRATEGIES, Strategy, get_strategy, micro_batched, single_pass
from .workloads import check_workload, check_workload_file, list_workloads, load_workload_file, sample_workload

RECOMPUTE_FACTOR = 4.0 / 3.0  # full activation recomputation: 4 forward-equivalents for 3 counted
SAMPLES_PER_RANK_GRID = (1, 2, *range(4, 65, 4))
MEMORY_HEADROOM = 0.9  # fraction of GPU memory the batch chooser lets `ours` use (module docstring)
BATCH_REFERENCE = "ours"  # the strategy the default batch is sized for

__all__ = ["BatchChoice", "CompositionFigures", "SimulationRun", "StageFigures", "StepFigures", "check_simulation",
           "choose_samples_per_rank", "list_models", "list_workloads", "run_simulation", "simulate_step",
           "stage_rank_seconds"]


@dataclass(frozen=True)
class StageFigures(FieldsAsJson):
    """One stage of a simulated step: its slowest and mean rank, balance and plan."""

    seconds: float
    mean_seconds: float
    imbalance: float
    gap_to_lower_bound: float
    algorithm: str
    padded: bool
    items: int
    max_tokens_per_rank: int


@dataclass(frozen=True, eq=False)
class StepFigures:
    """One simulated step under one strategy (the module docstring defines every figure).

    `rank_seconds[stage]` holds every rank's compute seconds in that stage, as the step
    uses them (for timelines; left out of `to_json()`).  `speedup_vs_none` is set by
    `run_simulation` (None from `simulate_step` alone).
    """

    step_seconds: float
    compute_seconds: float
    exchange_seconds: float
    planning_seconds: float
    planning_unhidden_seconds: float
    overhead_fraction: float
    idle_fraction: float
    mfu: float
    exchanges_per_step: int
    exchange_strategy: str
    bytes_moved: float
    bytes_inter_node: float
    memory_peak_gib: float
    memory_limit_gib: float
    oom: bool
    oom_ranks: int
    micro_batch_size: int | None
    per_stage: Mapping[str, StageFigures]
    rank_seconds: Mapping[str, np.ndarray] = field(repr=False)
    speedup_vs_none: float | None = None

    def to_json(self) -> dict:
        payload = {item.name: getattr(self, item.name) for item in dataclasses.fields(self)
                   if item.name not in ("rank_seconds", "speedup_vs_none")}
        payload["per_stage"] = {name: figures.to_json() for name, figures in self.per_stage.items()}
        if self.speedup_vs_none is not None:
            payload["speedup_vs_none"] = self.speedup_vs_none
        return payload


@dataclass(frozen=True)
class CompositionFigures(FieldsAsJson):
    """The composed embedding exchange (one) against the two-exchange scheme: bytes and seconds."""

    one_exchange_bytes_moved: float
    one_exchange_seconds: float
    two_exchange_bytes_moved: float
    two_exchange_seconds: float


@dataclass(frozen=True)
class BatchChoice:
    """How samples per rank were chosen: "explicit", or by "memory" (then every other field is set).

    `limited_by`: "memory" (the next grid value does not fit), "grid end" (the last grid
    value fits) or "over memory at the smallest"; `probed_memory_gib` maps each probed
    grid value (as a string) to `reference_strategy`'s peak GiB.
    """

    rule: str
    reference_strategy: str | None = None
    headroom: float | None = None
    limit_gib: float | None = None
    grid: tuple[int, ...] | None = None
    limited_by: str | None = None
    probed_memory_gib: Mapping[str, float] | None = None

    def to_json(self) -> dict:
        if self.rule == "explicit":
            return {"rule": "explicit"}
        return {**dataclasses.asdict(self), "grid": list(self.grid), "probed_memory_gib": dict(self.probed_memory_gib)}


@dataclass(frozen=True, eq=False)
class SimulationRun:
    """`run_simulation`'s result: the cluster, the batch and every strategy's step."""

    model: str
    model_params_billion: float
    gpus: int
    nodes: int
    workload: str
    samples_per_rank: int
    samples_per_rank_choice: BatchChoice
    seed: int
    composition: CompositionFigures | None
    strategies: Mapping[str, StepFigures]

    def to_json(self) -> dict:
        """The JSON form `orchmllm simulate --json` prints (per-rank seconds left out)."""
        return {"model": self.model, "model_params_billion": self.model_params_billion, "gpus": self.gpus,
                "nodes": self.nodes, "workload": self.workload, "samples_per_rank": self.samples_per_rank,
                "samples_per_rank_choice": self.samples_per_rank_choice.to_json(), "seed": self.seed,
                "composition": None if self.composition is None else self.composition.to_json(),
                "strategies": {name: figures.to_json() for name, figures in self.strategies.items()}}


def seconds_per_cost(gpu: GPU) -> float:
    """Seconds one FLOP of a stage cost model takes on a rank, recomputation included."""
    return RECOMPUTE_FACTOR / (gpu.peak_flops * gpu.kernel_efficiency)


def cluster(gpus: int) -> Topology:
    """H100 nodes of 8 GPUs; fewer than 8 GPUs form one node; at most `MAX_RANKS` (2**20) GPUs."""
    if not is_int(gpus) or gpus < 1:
        raise ValueError(f"`gpus` must be a positive int; got {gpus!r}")
    as_num_ranks(gpus)
    if gpus < 8:
        return Topology(1, int(gpus))
    return Topology.for_world_size(int(gpus), preset="h100")


def _exchanges(plan: PassPlan, strategy: Strategy) -> list[Exchange]:
    """Forward exchanges of the step, in order, leaving out those that move nothing."""
    embedding = [plan.embedding_exchange()] if strategy.composed else list(plan.two_exchange_scheme())
    return [exchange for exchange in [plan.input_exchange(), *embedding]
            if exchange.item_bytes.size and (strategy.exchange == "allgather" or exchange.bytes_moved > 0)]


def simulate_step(plan: StepPlan, strategy: Strategy, model: ModelConfig, gpu: GPU, topology: Topology,
                  planning_seconds: float | None = None) -> StepFigures:
    """Model one step of `plan`, a step of one pass (see the module docstring).

    `planning_seconds` defaults to the planner's own measurement `plan.planning_seconds`.
    A strategy with `micro_batch_sizes` runs with the largest that fits in memory (the
    smallest if none does), reported as "micro_batch_size".
    """
    if not strategy.micro_batch_sizes:
        return _simulate(plan, strategy, model, gpu, topology, planning_seconds, None)
    for size in sorted(strategy.micro_batch_sizes, reverse=True):
        result = _simulate(plan, strategy, model, gpu, topology, planning_seconds, size)
        if not result.oom:
            break
    return result


def _loads_and_tokens(plan: StepPlan, stage_plan, micro_batch_size: int | None):
    if micro_batch_size is None:
        return stage_plan.loads, stage_plan.tokens
    return micro_batched(plan, stage_plan, micro_batch_size)


def stage_rank_seconds(plan: StepPlan, gpu: GPU, micro_batch_size: int | None = None) -> dict[str, np.ndarray]:
    """Compute seconds of every rank in every stage, as the simulator models them (stage name -> (D,))."""
    rate = gpu.peak_flops * gpu.kernel_efficiency
    return {stage_plan.stage.name: _loads_and_tokens(plan, stage_plan, micro_batch_size)[0] * RECOMPUTE_FACTOR / rate
            for stage_plan in single_pass(plan).stage_plans}


def _simulate(plan: StepPlan, strategy: Strategy, model: ModelConfig, gpu: GPU, topology: Topology,
              planning_seconds: float | None, micro_batch_size: int | None) -> StepFigures:
    num_ranks = plan.num_ranks
    rank_seconds = stage_rank_seconds(plan, gpu, micro_batch_size)
    for seconds in rank_seconds.values():
        seconds.setflags(write=False)
    busy = np.stack(list(rank_seconds.values()))
    stored = np.zeros(num_ranks)
    working = np.zeros(num_ranks)
    model_flops = 0.0
    per_stage = {}
    for index, stage_plan in enumerate(single_pass(plan).stage_plans):
        stage = stage_plan.stage
        transformer = model.transformer_of(stage)
        loads, tokens = _loads_and_tokens(plan, stage_plan, micro_batch_size)
        real_flops = float(stage_costs(plan.batch, stage).sum()) if stage_plan.num_items else 0.0
        model_flops += real_flops
        stored += tokens * transformer.stored_bytes_per_token
        working = np.maximum(working, tokens * transformer.working_bytes_per_token)
        mean = float(loads.mean())
        per_stage[stage.name] = StageFigures(
            seconds=float(busy[index].max()), mean_seconds=float(busy[index].mean()),
            imbalance=float(loads.max() / mean) if mean > 0 else 1.0, gap_to_lower_bound=float(stage_plan.gap),
            algorithm=stage_plan.algorithm, padded=stage.padded, items=stage_plan.num_items,
            max_tokens_per_rank=int(tokens.max()))
    compute = float(busy.max(axis=1).sum())
    exchanges = _exchanges(single_pass(plan), strategy)
    exchange_seconds, buffers, bytes_moved, bytes_inter = 0.0, np.zeros(num_ranks), 0.0, 0.0
    for exchange in exchanges:
        forward = estimate_exchange(exchange.source, exchange.destination, exchange.item_bytes, topology,
                                    strategy.exchange)
        exchange_seconds += forward.seconds
        buffers = np.maximum(buffers, forward.rank_peak_bytes)
        bytes_moved += exchange.bytes_moved
        bytes_inter += forward.bytes_inter_node
        if exchange.name != "input":  # embedding gradients travel back the same way
            backward = estimate_exchange(exchange.destination, exchange.source, exchange.item_bytes, topology,
                                         strategy.exchange)
            exchange_seconds += backward.seconds
    memory = model.static_bytes(num_ranks) + stored + working + buffers
    planning = plan.planning_seconds if planning_seconds is None else float(planning_seconds)
    unhidden = max(0.0, planning - compute)
    step = compute + exchange_seconds + unhidden
    return StepFigures(
        step_seconds=step,
        compute_seconds=compute,
        exchange_seconds=exchange_seconds,
        planning_seconds=planning,
        planning_unhidden_seconds=unhidden,
        overhead_fraction=(exchange_seconds + unhidden) / step if step > 0 else 0.0,
        idle_fraction=1.0 - float(busy.sum()) / (num_ranks * compute) if compute > 0 else 0.0,
        mfu=model_flops / (step * num_ranks * gpu.peak_flops) if step > 0 else 0.0,
        exchanges_per_step=len(exchanges),
        exchange_strategy=strategy.exchange,
        bytes_moved=bytes_moved,
        bytes_inter_node=bytes_inter,
        memory_peak_gib=float(memory.max()) / GIB,
        memory_limit_gib=gpu.memory_bytes / GIB,
        oom=bool(memory.max() > gpu.memory_bytes),
        oom_ranks=int((memory > gpu.memory_bytes).sum()),
        micro_batch_size=micro_batch_size,
        per_stage=per_stage,
        rank_seconds=rank_seconds,
    )


def composition_comparison(plan: StepPlan, topology: Topology, exchange: str = "nodewise") -> CompositionFigures:
    """Bytes and modelled seconds of the composed embedding exchange vs the two-exchange scheme."""
    one = single_pass(plan).embedding_exchange()
    two = single_pass(plan).two_exchange_scheme()

    def seconds(e: Exchange) -> float:
        return estimate_exchange(e.source, e.destination, e.item_bytes, topology, exchange).seconds

    return CompositionFigures(one_exchange_bytes_moved=one.bytes_moved, one_exchange_seconds=seconds(one),
                              two_exchange_bytes_moved=sum(e.bytes_moved for e in two),
                              two_exchange_seconds=sum(seconds(e) for e in two))


class _Probe:
    """Sampled batches (each drawn once, the chosen one reused) and `BATCH_REFERENCE`'s peak memory on them.

    The strategies of `run_simulation` are then planned (and their planning timed) afresh
    on the chosen batch, so its figures equal those of an explicit run at that size.
    """

    def __init__(self, batch_for, config: ModelConfig, gpu: GPU, topology: Topology):
        self.batch_for, self.config, self.gpu, self.topology = batch_for, config, gpu, topology
        self.stages = config.stages()
        self.batches: dict[int, object] = {}

    def batch(self, samples_per_rank: int):
        if samples_per_rank not in self.batches:
            self.batches[samples_per_rank] = self.batch_for(samples_per_rank)
        return self.batches[samples_per_rank]

    def peak_gib(self, samples_per_rank: int) -> float:
        """Busiest rank's memory (GiB) under `BATCH_REFERENCE` on that batch."""
        strategy = STRATEGIES[BATCH_REFERENCE]
        plan = strategy.plan(self.stages, self.topology, self.batch(samples_per_rank),
                             seconds_per_cost=seconds_per_cost(self.gpu))
        return simulate_step(plan, strategy, self.config, self.gpu, self.topology,
                             planning_seconds=0.0).memory_peak_gib


def _choose(probe: _Probe, grid: tuple[int, ...], headroom: float) -> tuple[int, BatchChoice]:
    """Bisect `grid` for the largest value whose reference step fits in `headroom` of GPU memory."""
    limit = headroom * probe.gpu.memory_bytes / GIB
    fits, over = -1, len(grid)  # grid[fits] fits (or none does), grid[over] does not (or is past the end)
    probed = {}
    while over - fits > 1:
        middle = (fits + over) // 2
        peak = probe.peak_gib(grid[middle])
        probed[grid[middle]] = peak
        fits, over = (middle, over) if peak <= limit else (fits, middle)
    limited_by = "memory" if 0 <= fits < len(grid) - 1 else "grid end" if fits >= 0 else "over memory at the smallest"
    return grid[max(fits, 0)], BatchChoice("memory", BATCH_REFERENCE, headroom, limit, tuple(grid), limited_by,
                                           {str(k): probed[k] for k in sorted(probed)})


def _batch_source(workload: str, workload_file, num_ranks: int, seed: int, available: int | None):
    """(name, samples_per_rank -> Batch, largest samples per rank the source can supply within
    `MAX_STEP_SAMPLES`)."""
    most = MAX_STEP_SAMPLES // num_ranks
    if workload_file is None:
        return workload, lambda n: sample_workload(workload, num_ranks, n, seed), most
    return (str(workload_file), lambda n: load_workload_file(workload_file, n, num_ranks),
            min(available // num_ranks, most))


def check_simulation(model: str = "84b", gpus: int = 2560, workload: str = "default", workload_file=None,
                     samples_per_rank: int | None = None, strategies=None) -> int | None:
    """Validate the arguments of `run_simulation` before any work; ValueError naming the first bad one.

    A workload file is read whole: every line must be a valid sample whose segments the
    model encodes, and there must be enough samples for `gpus` ranks.  Returns the file's
    number of samples (None for a built-in workload).

    >>> check_simulation(model="10b", gpus=8, strategies=["ours", "magic"])
    Traceback (most recent call last):
    ...
    ValueError: unknown strategy 'magic'; choose from none, ...
    """
    check_model(model)
    for name in [] if strategies is None else strategies:
        get_strategy(name)
    num_ranks = cluster(gpus).world_size
    if samples_per_rank is not None and (not is_int(samples_per_rank) or samples_per_rank < 1):
        raise ValueError(f"`samples_per_rank` must be a positive int or None; got {samples_per_rank!r}")
    if samples_per_rank is not None:
        check_batch_size(num_ranks, samples_per_rank)
    if workload_file is None:
        check_workload(workload)
        return None
    modalities = [stage.modality for stage in MODELS[model].stages() if not stage.is_llm]
    available = check_workload_file(workload_file, modalities)
    if samples_per_rank is None:
        _checked_grid(SAMPLES_PER_RANK_GRID, available // num_ranks, workload_file)
    elif available < num_ranks * samples_per_rank:
        raise ValueError(f"workload file {workload_file} has {available} samples; {num_ranks} ranks × "
                         f"{samples_per_rank} samples per rank need {num_ranks * samples_per_rank}")
    return available


def choose_samples_per_rank(model: str = "84b", gpus: int = 2560, workload: str = "default", workload_file=None,
                            seed: int = 0, grid: tuple[int, ...] = SAMPLES_PER_RANK_GRID,
                            headroom: float = MEMORY_HEADROOM) -> tuple[int, BatchChoice]:
    """The memory-driven batch size of `run_simulation` (module docstring) and how it was found.

    Returns (samples_per_rank, a BatchChoice of rule "memory"): the largest grid value at which `BATCH_REFERENCE` fits
    in `headroom` of GPU memory and the
    next grid value does not (limited_by "memory"), or the last grid value if it fits
    ("grid end"), or the smallest if nothing fits ("over memory at the smallest").  Grid
    values a workload file has too few samples for are left out.
    """
    available = check_simulation(model, gpus, workload, workload_file)
    topology = cluster(gpus)
    _, batch_for, available = _batch_source(workload, workload_file, topology.world_size, seed, available)
    probe = _Probe(batch_for, MODELS[model], GPUS["h100"], topology)
    return _choose(probe, _checked_grid(grid, available, workload_file), _checked_headroom(headroom))


def _checked_grid(grid, available: int | None, workload_file) -> tuple[int, ...]:
    values = tuple(grid)
    if not values or any(not is_int(v) or v < 1 for v in values) \
            or list(values) != sorted(set(values)):
        raise ValueError(f"`grid` must be strictly increasing positive ints; got {grid!r}")
    if available is not None:
        values = tuple(v for v in values if v <= available)
        if not values:
            raise ValueError(f"workload file {workload_file} has fewer samples than one per rank on the grid "
                             f"{list(grid)}; pass samples_per_rank")
    return values


def _checked_headroom(headroom) -> float:
    if not is_real(headroom) or not 0 < headroom <= 1:
        raise ValueError(f"`headroom` must be a fraction in (0, 1]; got {headroom!r}")
    return float(headroom)


def run_simulation(model: str = "84b", gpus: int = 2560, workload: str = "default", workload_file=None,
                   samples_per_rank: int | None = None, strategies=None, seed: int = 0) -> SimulationRun:
    """Simulate one step of `model` on `gpus` H100s under each strategy.

    Args:
        model: a name in `list_models()` ("10b", "18b", "84b").
        gpus: data-parallel ranks, one per GPU, in nodes of 8 (fewer than 8: one node).
        workload: a name in `list_workloads()`; ignored when `workload_file` is given.
        workload_file: path of a JSON-lines workload (see `workloads.load_workload_file`).
        samples_per_rank: samples each rank draws per step; None (default) sizes the batch
            by memory, as training runs do: the largest value on `SAMPLES_PER_RANK_GRID` at
            which `ours` fits in `MEMORY_HEADROOM` of GPU memory (`choose_samples_per_rank`).
            Every strategy runs the same sampled batch either way.
        strategies: names from `strategies.STRATEGIES` (default: all); "none" is always
            simulated as the reference of `speedup_vs_none`.
        seed: seed of the sampled batch.

    Returns:
        A SimulationRun (its `to_json()` is what `orchmllm simulate --json` prints):
        model, gpus, nodes, workload, samples_per_rank and how it was chosen
        (`BatchChoice`), the composition figures of `ours`, and per strategy a
        StepFigures (step_seconds, speedup_vs_none, mfu, overhead_fraction,
        exchanges_per_step, oom, ..., per_stage, and every rank's seconds per stage).
    """
    available = check_simulation(model, gpus, workload, workload_file, samples_per_rank, strategies)
    names = list(STRATEGIES) if strategies is None else list(strategies)
    topology = cluster(gpus)
    config, gpu = MODELS[model], GPUS["h100"]
    workload_name, batch_for, available = _batch_source(workload, workload_file, topology.world_size, seed, available)
    probe = _Probe(batch_for, config, gpu, topology)
    if samples_per_rank is None:
        samples_per_rank, choice = _choose(probe, _checked_grid(SAMPLES_PER_RANK_GRID, available, workload_file),
                                           MEMORY_HEADROOM)
    else:
        samples_per_rank, choice = int(samples_per_rank), BatchChoice("explicit")
    batch = probe.batch(samples_per_rank)
    results, composition = {}, None
    for name in dict.fromkeys(["none", *names]):  # one strategy's plan alive at a time: each holds arrays per sample
        strategy = STRATEGIES[name]
        start = time.perf_counter()
        plan = strategy.plan(probe.stages, topology, batch, seconds_per_cost=seconds_per_cost(gpu))
        planning = time.perf_counter() - start
        results[name] = simulate_step(plan, strategy, config, gpu, topology, planning_seconds=planning)
        composition = composition_comparison(plan, topology) if name == "ours" else composition
        del plan
    reference = results["none"].step_seconds
    results = {name: dataclasses.replace(result, speedup_vs_none=reference / result.step_seconds
                                         if result.step_seconds > 0 else 1.0)
               for name, result in results.items()}
    return SimulationRun(
        model=model, model_params_billion=config.params / 1e9, gpus=topology.world_size, nodes=topology.num_nodes,
        workload=workload_name, samples_per_rank=samples_per_rank, samples_per_rank_choice=choice, seed=seed,
        composition=composition,
        strategies={name: results[name] for name in names})

"""Simulator of a step whose giant LLM items may run split over context-parallel groups.

Every strategy plans the same sampled batch; the encoder stages run as `ours` plans them (a
video's frames are separate encoder items already, so they need no split), and the LLM stage's
items are placed by the strategy (`context_parallel_peers`):

    none                 no balancing, no splitting: every item where it was sampled
    no_split             today's best: full orchestration (`strategies.STRATEGIES["ours"]`)
    static_cp            every LLM item split at one degree c (D / c groups, LPT on time at c);
                         c is the allowed degree above 1 with the fastest LLM stage (the best a
                         static configuration could pick for this batch)
    megatron_dynamic_cp  Megatron-LM's dynamic context parallelism; its docs make
                         `max_seqlen_per_dp_cp_rank` (the capacity) the tokens one rank holds in
                         a micro-batch, so it is tried at every power of two from the least that
                         fits the step's longest item in the widest group up to the LLM tokens a
                         rank's memory holds beside its encoder activations (`memory_capacity`),
                         and at that capacity itself; the fastest is kept (the peer at its best);
                         its waves run one after another
    ours                 `Orchestrator(..., context_parallel=spec)` (`ours_pass`): today's plan
                         bit for bit unless splitting pays; planned again under the capacity
                         above as the LLM's token budget when it splits and overflows it

The step (notation of `simulator`, recomputation included through `seconds_per_cost`):

    busy[s, r]    encoders as in `simulator`; LLM: the plan's per-rank time, i.e. for an item
                  at degree c, f(l) / (c · η) + κ (`ContextParallel.time`, in seconds here)
    compute       = Σ_encoders max_r busy + Σ_waves max_r busy[llm, wave]
    exchange      = fused input exchange + embedding exchange forward and backward: the
                    orchestrator's own exchanges for none, no_split and ours (a split sample's
                    text and embedding pieces go to the shards that hold them); for the peers,
                    today's with a split item's bytes shared equally by its group's ranks
    step          = compute + exchange + max(0, planning - compute)
    cp_bytes      = Σ over split items of (c - 1) · l · kv_bytes · layers · passes: the K/V
                    (and dK/dV) a ring moves; cp_bytes_inter_node the share on ring hops between
                    nodes (a group over k > 1 nodes crosses k of its c hops)
    cp_exposed    the communication left exposed (κ) on each wave's slowest rank, summed
    memory[r]     static + encoders' stored activations + the largest wave's LLM tokens
                  (`shard` tokens of split items) · stored bytes + one-layer working set + buffers

The split-cost spec (`split_spec`): the GPU's seconds per FLOP with recomputation, the cluster's
links, the LLM's layer count, K/V of 8 heads × 128 dims in bf16 (4096 B per token: the
grouped-query attention of the Qwen2-72B / Llama-3 models the configurations follow), and 4 K/V
passes per step (forward, recomputed forward, backward K/V and dK/dV).  Megatron's waves are
not charged the parameter all-gathers a real wave (a micro-batch under ZeRO-3) repeats: the
peer is modelled at its best.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..balancers import ContextParallel, ContextParallelPlan
from ..balancers.context_parallel import certify_split
from ..balancers.context_parallel.blocks import within_node
from ..balancers.context_parallel.plan import rank_pairs
from ..balancers.context_parallel.spec import as_degrees
from ..balancers.problem import InfeasibleError
from ..balancers.validation import is_int
from ..orchestrator.frames import stage_costs
from ..orchestrator.options import LOCALITY
from ..orchestrator.plan import Exchange, PassPlan
from ..orchestrator.planner import Orchestrator
from ..topology import Topology, estimate_exchange
from .context_parallel_peers import best_megatron_dynamic_cp, best_static_cp, megatron_capacities
from .microbatch_sim import check_simulated_samples
from .models import GIB, GPU, GPUS, MODELS, ModelConfig, check_model
from .simulator import MEMORY_HEADROOM, cluster, seconds_per_cost
from .strategies import STRATEGIES as PLAIN_STRATEGIES, single_pass
from .workloads import check_workload, sample_workload

STRATEGIES = ("none", "no_split", "static_cp", "megatron_dynamic_cp", "ours")
DEFAULT_SAMPLES_PER_RANK = 4
KV_BYTES_PER_TOKEN = 4096.0  # 8 K/V heads × 128 dims × (K, V) × 2 bytes
KV_PASSES = 4.0  # forward, recomputed forward, backward K/V and dK/dV


def split_spec(degrees, model: ModelConfig, gpu: GPU, topology: Topology) -> ContextParallel:
    """The split-cost spec of `model` on `topology` (module docstring); groups may cross nodes
    only when a degree is wider than a node."""
    degrees = as_degrees(degrees)
    return ContextParallel(degrees=degrees, allow_inter_node=degrees[-1] > topology.gpus_per_node,
                           seconds_per_cost=seconds_per_cost(gpu), kv_bytes_per_token=KV_BYTES_PER_TOKEN,
                           num_layers=model.llm.num_layers, kv_passes=KV_PASSES).on(topology)


def memory_capacity(model: ModelConfig, gpu: GPU, num_ranks: int, held_bytes: float = 0.0,
                    headroom: float = MEMORY_HEADROOM) -> int:
    """LLM tokens a rank holds within `headroom` of its memory: (headroom · memory - static - the
    `held_bytes` of other stages' activations) over the stored and working bytes of a token.

    >>> memory_capacity(MODELS["84b"], GPUS["h100"], 2560)
    42319
    """
    room = headroom * gpu.memory_bytes - model.static_bytes(num_ranks) - held_bytes
    return max(int(room // (model.llm.stored_bytes_per_token + model.llm.working_bytes_per_token)), 1)


@dataclass(frozen=True, eq=False)
class LlmSchedule:
    """Where the LLM items run: waves (run one after another) of split plans over item subsets."""

    waves: tuple[ContextParallelPlan, ...]
    items: tuple[np.ndarray, ...]
    planning_seconds: float
    degree: int | None = None  # static_cp's degree
    capacity: int | None = None  # Megatron's max_seqlen_per_dp_cp_rank
    own: PassPlan | None = None  # an orchestrator's pass plan that placed the items: its exchanges are the step's

    def placement(self, num_items: int) -> tuple[np.ndarray, np.ndarray]:
        """(block start, degree) of every LLM item."""
        start, degree = np.zeros(num_items, dtype=np.int64), np.zeros(num_items, dtype=np.int64)
        for wave, items in zip(self.waves, self.items):
            start[items], degree[items] = wave.assignment, wave.degree
        return start, degree


@dataclass(frozen=True, eq=False)
class ContextParallelStepResult:
    """One simulated step under one strategy (the module docstring defines every figure).

    `llm_plan` (left out of `to_json()`) is the LLM stage's plan, the first wave's for Megatron.
    """

    strategy: str
    step_seconds: float
    compute_seconds: float
    llm_seconds: float
    llm_seconds_over_bound: float
    exchange_seconds: float
    cp_exposed_seconds: float
    cp_bytes: float
    cp_bytes_inter_node: float
    items_split: int
    widest_degree: int
    waves: int
    planning_seconds: float
    planning_unhidden_seconds: float
    mfu: float
    memory_peak_gib: float
    oom: bool
    llm_plan: ContextParallelPlan = field(repr=False)
    speedup_vs_none: float = 1.0

    def to_json(self) -> dict:
        return {item.name: getattr(self, item.name) for item in dataclasses.fields(self) if item.name != "llm_plan"}


@dataclass(frozen=True, eq=False)
class ContextParallelSimulationRun:
    """`run_context_parallel_simulation`'s result: the cluster, the batch, the spec and every step."""

    model: str
    gpus: int
    nodes: int
    workload: str
    samples_per_rank: int
    seed: int
    degrees: tuple[int, ...]
    static_degree: int | None
    megatron_capacity: int | None
    llm_lower_bound_seconds: float
    strategies: dict[str, ContextParallelStepResult]

    def to_json(self) -> dict:
        payload = {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}
        payload["degrees"] = list(self.degrees)
        payload["strategies"] = {name: result.to_json() for name, result in self.strategies.items()}
        return payload


def _single(plan: ContextParallelPlan, seconds: float, degree: int | None = None,
            own: PassPlan | None = None) -> LlmSchedule:
    return LlmSchedule((plan,), (np.arange(plan.num_items),), seconds, degree, own=own)


def _certified(llm, judge: ContextParallel, name: str) -> ContextParallelPlan:
    """An orchestrator's LLM stage plan (split or not) as a split plan certified by `judge`."""
    return certify_split(llm.item_length, llm.loads.size, judge, llm.destination, llm.degree, cost=llm.stage.cost,
                         algorithm=name)


def encoder_bytes(plan: PassPlan, model: ModelConfig) -> float:
    """The most bytes of encoder activations a rank stores in `plan`."""
    stored = sum(stage.tokens * model.transformer_of(stage.stage).stored_bytes_per_token
                 for stage in plan.stage_plans if not stage.stage.is_llm)
    return float(np.max(stored, initial=0.0))


def ours_pass(stages, topology: Topology, batch, spec: ContextParallel, gpu: GPU, budget: int) -> PassPlan:
    """`Orchestrator(..., context_parallel=spec)`'s plan; when it splits and puts more than `budget` LLM
    tokens on a rank (the memory's), planned again under that budget, kept as it was when no plan
    fits it (the step then reports its memory as over)."""
    def plan(stages):
        return single_pass(Orchestrator(stages, topology, placement=LOCALITY, seconds_per_cost=seconds_per_cost(gpu),
                                        context_parallel=spec).plan(batch))

    free = plan(stages)
    if not free.splits or int(free.llm.tokens.max()) <= budget:
        return free
    try:
        return plan((*stages[:-1], replace(stages[-1], max_tokens_per_rank=budget)))
    except InfeasibleError:
        return free


def llm_schedules(base: dict[str, PassPlan], spec: ContextParallel, names, planning: dict[str, float],
                  capacities: list[int]) -> dict[str, LlmSchedule]:
    """The LLM placement of every strategy in `names`.  `base` holds the orchestrator's pass plans
    "none", "ours" (today's: no_split) and "ours_cp" (with splitting: ours), `planning` the seconds
    of "none", "no_split" and "ours" (the peers' planners' time is added to today's);
    `capacities` those Megatron is tried at."""
    llm = base["ours"].llm
    lengths, cost, num_ranks = llm.item_length, llm.stage.cost, llm.loads.size
    judge = replace(spec, degrees=tuple(sorted({1, *spec.degrees})))  # the peers run short items unsplit
    schedules = {}
    for name in names:
        start = time.perf_counter()
        if name in ("none", "no_split", "ours"):
            own = base["ours_cp" if name == "ours" else "none" if name == "none" else "ours"]
            schedules[name] = _single(_certified(own.llm, judge, name), planning[name], own=own)
        elif name == "static_cp":
            plan, degree = best_static_cp(lengths, num_ranks, judge, spec.degrees, cost=cost)
            seconds = planning["no_split"] + (time.perf_counter() - start) / max(len(spec.degrees) - 1, 1)
            schedules[name] = _single(plan, seconds, degree)  # a static configuration plans one degree per step
        elif name == "megatron_dynamic_cp":
            waves, capacity = best_megatron_dynamic_cp(lengths, num_ranks, judge, capacities, cost=cost)
            seconds = planning["no_split"] + (time.perf_counter() - start) / len(capacities)  # one capacity per step
            schedules[name] = LlmSchedule(waves.waves, waves.items, seconds, capacity=capacity)
    return schedules


def _shared(source: np.ndarray, item_of: np.ndarray, item_bytes: np.ndarray, start: np.ndarray,
            degree: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source, destination, bytes) of entries going to LLM items `item_of`, each entry's bytes
    shared equally by the ranks of its item's block."""
    reps = degree[item_of]
    entry = np.repeat(np.arange(item_of.size), reps)
    offset = np.arange(entry.size) - np.repeat(np.cumsum(reps) - reps, reps)
    return source[entry], start[item_of][entry] + offset, item_bytes[entry] / reps[entry]


def split_exchanges(plan: PassPlan, start: np.ndarray, degree: np.ndarray) -> tuple[Exchange, Exchange]:
    """The fused input exchange and the embedding exchange of `plan` with its LLM items on blocks
    (start, degree) instead of the plan's LLM ranks."""
    batch, llm = plan.batch, plan.llm
    parts = [(stage.source, stage.destination, stage.item_length * stage.stage.input_bytes_per_unit)
             for stage in plan.stage_plans if not stage.stage.is_llm]
    text = batch.sample_text * llm.stage.input_bytes_per_unit
    parts.append(_shared(llm.source, np.arange(llm.num_items), text.astype(np.float64), start, degree))
    inputs = Exchange("input", *(np.concatenate([part[k] for part in parts]) for k in range(3)))
    embedding = plan.embedding_exchange()
    return inputs, Exchange("embedding", *_shared(embedding.source, batch.segment_sample, embedding.item_bytes,
                                                  start, degree))


def _exchange_seconds(exchanges, topology: Topology) -> tuple[float, np.ndarray]:
    """Seconds of the step's exchanges (embeddings forward and back) and each rank's peak buffer bytes."""
    seconds, buffers = 0.0, np.zeros(topology.world_size)
    for exchange in exchanges:
        if not exchange.item_bytes.size or exchange.bytes_moved == 0:
            continue
        forward = estimate_exchange(exchange.source, exchange.destination, exchange.item_bytes, topology, "nodewise")
        seconds += forward.seconds
        buffers = np.maximum(buffers, forward.rank_peak_bytes)
        if exchange.name == "embedding":
            seconds += estimate_exchange(exchange.destination, exchange.source, exchange.item_bytes, topology,
                                         "nodewise").seconds
    return seconds, buffers


def _ring_figures(wave: ContextParallelPlan, lengths: np.ndarray, spec: ContextParallel
                  ) -> tuple[float, float, float]:
    """(K/V bytes, of which between nodes, exposed communication seconds on the slowest rank) of a wave."""
    split = wave.split_items
    c, start = wave.degree[split], wave.assignment[split]
    total = (c - 1) * lengths[split].astype(np.float64) * spec.kv_bytes_per_token * spec.num_layers * spec.kv_passes
    nodes = (start + c - 1) // spec.gpus_per_node - start // spec.gpus_per_node + 1
    inter = np.where(nodes > 1, total * nodes / c, 0.0)
    quiet = replace(spec, kv_bytes_per_token=0.0, latency_s=0.0)
    compute = quiet.item_times(wave.cost, lengths, wave.degree, within_node(wave.assignment, wave.degree,
                                                                            spec.gpus_per_node))
    items, ranks = rank_pairs(wave.assignment, wave.degree)
    exposed = np.bincount(ranks, weights=(wave.item_time - compute)[items], minlength=wave.num_ranks)
    slowest = int(np.argmax(wave.loads))
    return float(total.sum()), float(inter.sum()), float(exposed[slowest]) * spec.seconds_per_cost


def simulate_split_step(name: str, plan: PassPlan, schedule: LlmSchedule, spec: ContextParallel, model: ModelConfig,
                        gpu: GPU, topology: Topology, bound: float) -> ContextParallelStepResult:
    """Model one step of pass `plan` with its LLM items placed by `schedule` (module docstring);
    `bound`: the LLM stage's certified lower bound (cost units)."""
    num_ranks = plan.num_ranks
    stored, working = np.zeros(num_ranks), np.zeros(num_ranks)
    compute = model_flops = 0.0
    for stage_plan in plan.stage_plans:
        model_flops += float(stage_costs(plan.batch, stage_plan.stage).sum())
        if not stage_plan.stage.is_llm:
            transformer = model.transformer_of(stage_plan.stage)
            compute += float(stage_plan.loads.max()) * seconds_per_cost(gpu)
            stored += stage_plan.tokens * transformer.stored_bytes_per_token
            working = np.maximum(working, stage_plan.tokens * transformer.working_bytes_per_token)
    llm_tokens = np.max([wave.tokens for wave in schedule.waves], axis=0)
    stored += llm_tokens * model.llm.stored_bytes_per_token
    working = np.maximum(working, llm_tokens * model.llm.working_bytes_per_token)
    llm_cost = sum(wave.makespan for wave in schedule.waves)
    llm_seconds = llm_cost * spec.seconds_per_cost
    compute += llm_seconds
    rings = np.array([_ring_figures(wave, plan.llm.item_length[items], spec)
                      for wave, items in zip(schedule.waves, schedule.items)]).sum(axis=0)
    start, degree = schedule.placement(plan.llm.num_items)
    exchanges = ((plan.input_exchange(), plan.embedding_exchange()) if schedule.own is not None
                 else split_exchanges(plan, start, degree))
    exchange, buffers = _exchange_seconds(exchanges, topology)
    memory = model.static_bytes(num_ranks) + stored + working + buffers
    unhidden = max(0.0, schedule.planning_seconds - compute)
    step = compute + exchange + unhidden
    return ContextParallelStepResult(
        strategy=name, step_seconds=step, compute_seconds=compute, llm_seconds=llm_seconds,
        llm_seconds_over_bound=llm_cost / bound if bound > 0 else 1.0, exchange_seconds=exchange,
        cp_exposed_seconds=float(rings[2]), cp_bytes=float(rings[0]), cp_bytes_inter_node=float(rings[1]),
        items_split=int((degree > 1).sum()), widest_degree=int(degree.max(initial=1)), waves=len(schedule.waves),
        planning_seconds=schedule.planning_seconds, planning_unhidden_seconds=unhidden,
        mfu=model_flops / (step * num_ranks * gpu.peak_flops) if step > 0 else 0.0,
        memory_peak_gib=float(memory.max()) / GIB, oom=bool(memory.max() > gpu.memory_bytes),
        llm_plan=schedule.waves[0])


def check_context_parallel_simulation(model: str, gpus: int, workload: str, samples_per_rank: int, degrees,
                                      strategies) -> tuple[int, ...]:
    """Validate `run_context_parallel_simulation`'s arguments before any work; the degrees, sorted.

    ValueError naming the first bad argument (a degree not a power of two or above the ranks,
    an unknown strategy, model or workload).
    """
    check_model(model)
    check_workload(workload)
    if not is_int(samples_per_rank) or samples_per_rank < 1:
        raise ValueError(f"`samples_per_rank` must be a positive int; got {samples_per_rank!r}")
    for name in strategies:
        if name not in STRATEGIES:
            raise ValueError(f"unknown context-parallel strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    degrees = as_degrees(degrees)
    ranks = cluster(gpus).world_size
    check_simulated_samples(ranks, samples_per_rank, "context-parallel")
    if degrees[-1] > ranks:
        raise ValueError(f"`degrees` holds {degrees[-1]} > {ranks} gpus: a group cannot be larger than the ranks")
    return degrees


def run_context_parallel_simulation(model: str = "84b", gpus: int = 2560, *, workload: str = "long",
                                    samples_per_rank: int = DEFAULT_SAMPLES_PER_RANK, degrees=(1, 2, 4, 8),
                                    strategies=STRATEGIES, seed: int = 0) -> ContextParallelSimulationRun:
    """Simulate one step of `model` on `gpus` H100s under each context-parallel strategy
    (`STRATEGIES`; "none" is always simulated, as the reference of `speedup_vs_none`), the LLM's
    items splittable at `degrees`.  Every strategy runs the same sampled batch."""
    names = list(dict.fromkeys(strategies))
    degrees = check_context_parallel_simulation(model, gpus, workload, samples_per_rank, degrees, names)
    topology = cluster(gpus)
    config, gpu = MODELS[model], GPUS["h100"]
    stages = config.stages()
    batch = sample_workload(workload, topology.world_size, samples_per_rank, seed)
    base, planning = {}, {}
    for name, key in (("none", "none"), ("ours", "no_split")):
        start = time.perf_counter()
        base[name] = single_pass(PLAIN_STRATEGIES[name].plan(stages, topology, batch,
                                                              seconds_per_cost=seconds_per_cost(gpu)))
        planning[key] = time.perf_counter() - start
    spec = split_spec(degrees, config, gpu, topology)
    room = memory_capacity(config, gpu, topology.world_size, encoder_bytes(base["ours"], config))
    if "ours" in names:
        start = time.perf_counter()
        base["ours_cp"] = ours_pass(stages, topology, batch, spec, gpu, room)
        planning["ours"] = time.perf_counter() - start
    capacities = sorted({*megatron_capacities(base["ours"].llm.item_length, degrees[-1], room), room})
    schedules = llm_schedules(base, spec, dict.fromkeys(["none", *names]), planning, capacities)
    bound = schedules["none"].waves[0].lower_bound
    results = {name: simulate_split_step(name, schedule.own or base["ours"], schedule, spec, config, gpu, topology,
                                         bound) for name, schedule in schedules.items()}
    reference = results["none"].step_seconds
    return ContextParallelSimulationRun(
        model=model, gpus=topology.world_size, nodes=topology.num_nodes, workload=workload,
        samples_per_rank=samples_per_rank, seed=seed, degrees=degrees,
        static_degree=schedules["static_cp"].degree if "static_cp" in schedules else None,
        megatron_capacity=schedules["megatron_dynamic_cp"].capacity if "megatron_dynamic_cp" in schedules else None,
        llm_lower_bound_seconds=bound * spec.seconds_per_cost,
        strategies={name: replace(results[name], speedup_vs_none=reference / results[name].step_seconds
                                  if results[name].step_seconds > 0 else 1.0) for name in names})

"""Simulator of a micro-batched step: M gradient-accumulation micro-batches under a token budget.

ZeRO-3 / FSDP synchronise every rank in every layer of every micro-batch, so (notation of
`simulator`, with m the micro-batches):

    busy[m, s, r]  = hardware FLOPs of stage s on rank r in micro-batch m / (peak · efficiency)
    compute        = Σ_m Σ_s max_r busy[m, s, r]
    gather[m]      = parameter all-gathers of micro-batch m: every layer's bf16 parameters are
                     gathered for the forward, again for the recomputation and again for the
                     backward (3 · 2 B · params · (D - 1) / D per rank) at the inter-node
                     bandwidth of one GPU; they overlap with that micro-batch's compute, and
                     only what compute does not hide is exposed, plus the first layer's
                     gather of each pass (3 · 2 B · largest layer, never hidden):
                     exposed[m] = max(0, gather - compute[m]) + first-layer gathers
                     (this is why more micro-batches cost more: every one gathers again)
    exchange       = the fused input exchange of the step + forward and backward embedding
                     exchanges of every micro-batch (topology comm model)
    step           = compute + Σ_m exposed[m] + exchange + max(0, planning - compute)
    memory[r]      = static + max_m (stored activations + one-layer working set of micro-batch
                     m on r) + the input exchange's buffer (all micro-batches' raw inputs)

Gradient reduce-scatters run once per step (no sync but on the last micro-batch) and, like
the optimizer step, are the same for every strategy and left out.  Strategies (`STRATEGIES`):

    none              each rank splits the samples it drew into micro-batches in sampling
                      order (sequential fill under T), M = the largest count of any rank
    verl_dynamic_bsz  verl: equal-count Karmarkar-Karp across ranks, then each rank's own
                      micro-batches (reimplemented, `microbatch_peers`)
    megatron_hybrid   Megatron-LM's hybrid greedy, one micro-batch group at a time
    sorted_grid       first-fit-decreasing rows under T, rows sorted by Σ l², groups of D
    ours              joint cells (rank, micro-batch) for the whole step, every micro-batch's
                      encoders post-balanced across all ranks, embeddings straight to their
                      LLM rank
Peers move whole samples and run their encoders where the sample's LLM runs.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..balancers.validation import SizeLimitError
from ..orchestrator.frames import stage_costs
from ..orchestrator.step import StepPlan
from ..orchestrator.options import LOCALITY
from ..orchestrator.planner import Orchestrator
from ..topology import Topology, estimate_exchange
from .microbatch_peers import MICROBATCH_PEERS
from .models import GIB, GPU, GPUS, MODELS, ModelConfig, check_model
from .simulator import RECOMPUTE_FACTOR, cluster
from .workloads import sample_workload

PARAM_GATHERS_PER_MICROBATCH = 3  # forward, recomputation, backward
STRATEGIES = ("none", "verl_dynamic_bsz", "megatron_hybrid", "sorted_grid", "ours")


@dataclass(frozen=True)
class MicroBatchStepResult:
    """The modelled figures of one micro-batched step under one strategy (see module docstring)."""

    strategy: str
    num_microbatches: int
    step_seconds: float
    compute_seconds: float
    param_gather_exposed_seconds: float
    exchange_seconds: float
    planning_seconds: float
    planning_unhidden_seconds: float
    step_cost_over_bound: float
    mfu: float
    memory_peak_gib: float
    oom: bool
    speedup_vs_none: float = 1.0

    def to_json(self) -> dict:
        return asdict(self)


def microbatch_plan(strategy: str, stages, topology: Topology, batch, max_tokens_per_microbatch: int
                    ) -> StepPlan:
    """The micro-batched step plan of `strategy` (a name in `STRATEGIES`) for `batch`."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown micro-batch strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    if strategy == "ours":
        return Orchestrator(stages, topology, placement=LOCALITY,
                            max_tokens_per_microbatch=max_tokens_per_microbatch).plan(batch)
    start = time.perf_counter()
    llm = stages[-1]
    cells = MICROBATCH_PEERS[strategy](batch.sample_llm_length, batch.num_ranks, cost=llm.cost,
                                       max_tokens_per_microbatch=max_tokens_per_microbatch,
                                       sources=batch.sample_source)
    return Orchestrator(stages, topology, balance_encoders=False).plan_cells(batch, cells, start=start)


def simulate_microbatched_step(plan: StepPlan, strategy: str, model: ModelConfig, gpu: GPU,
                               topology: Topology, planning_seconds: float | None = None) -> MicroBatchStepResult:
    """Model one micro-batched step of `plan` (see the module docstring)."""
    num_ranks = plan.num_ranks
    rate = gpu.peak_flops * gpu.kernel_efficiency
    largest_layer = max(t.layer_params for t in (model.llm, *(e.transformer for e in model.encoders)))
    gather = (PARAM_GATHERS_PER_MICROBATCH * 2.0 * model.params * (num_ranks - 1) / num_ranks
              / topology.inter_node_bw_bytes_per_s) if num_ranks > 1 else 0.0
    first_layers = (PARAM_GATHERS_PER_MICROBATCH * 2.0 * largest_layer / topology.inter_node_bw_bytes_per_s
                    if num_ranks > 1 else 0.0)
    compute = exposed = exchange_seconds = model_flops = 0.0
    activations = np.zeros(num_ranks)
    for micro in plan.microbatches:
        micro_compute = 0.0
        stored, working = np.zeros(num_ranks), np.zeros(num_ranks)
        for stage_plan in micro.stage_plans:
            micro_compute += float(stage_plan.loads.max()) * RECOMPUTE_FACTOR / rate
            transformer = model.transformer_of(stage_plan.stage)
            stored += stage_plan.tokens * transformer.stored_bytes_per_token
            working = np.maximum(working, stage_plan.tokens * transformer.working_bytes_per_token)
            if stage_plan.num_items:
                model_flops += float(stage_costs(micro.batch, stage_plan.stage).sum())
        compute += micro_compute
        exposed += max(0.0, gather - micro_compute) + first_layers
        activations = np.maximum(activations, stored + working)
        embedding = micro.embedding_exchange()
        if embedding.item_bytes.size and embedding.bytes_moved > 0:
            for source, destination in ((embedding.source, embedding.destination),
                                        (embedding.destination, embedding.source)):
                exchange_seconds += estimate_exchange(source, destination, embedding.item_bytes, topology,
                                                      "nodewise").seconds
    inputs = plan.input_exchange()
    buffers = np.zeros(num_ranks)
    if inputs.item_bytes.size and inputs.bytes_moved > 0:
        estimate = estimate_exchange(inputs.source, inputs.destination, inputs.item_bytes, topology, "nodewise")
        exchange_seconds += estimate.seconds
        buffers = estimate.rank_peak_bytes
    memory = model.static_bytes(num_ranks) + activations + buffers
    planning = plan.planning_seconds if planning_seconds is None else float(planning_seconds)
    unhidden = max(0.0, planning - compute)
    step = compute + exposed + exchange_seconds + unhidden
    bound = plan.lower_bound
    return MicroBatchStepResult(
        strategy=strategy, num_microbatches=plan.num_microbatches, step_seconds=step, compute_seconds=compute,
        param_gather_exposed_seconds=exposed, exchange_seconds=exchange_seconds, planning_seconds=planning,
        planning_unhidden_seconds=unhidden, step_cost_over_bound=plan.step_cost / bound if bound > 0 else 1.0,
        mfu=model_flops / (step * num_ranks * gpu.peak_flops) if step > 0 else 0.0,
        memory_peak_gib=float(memory.max()) / GIB, oom=bool(memory.max() > gpu.memory_bytes))


DEFAULT_SAMPLES_PER_RANK = 32
MAX_SIMULATED_SAMPLES = 2**19  # a micro-batched or split step's samples: planning grows faster than n (probe32)


def check_simulated_samples(gpus: int, samples_per_rank: int, step: str = "micro-batched") -> None:
    """SizeLimitError, before sampling, when `gpus` × `samples_per_rank` passes `MAX_SIMULATED_SAMPLES` (with -T
    2560 × 200 plan in ~22 s CPU, 1.8 GB; 2560 × 1000 ran past 5 minutes and 3 GB; split: 4.7 GB at 1000)."""
    samples = gpus * samples_per_rank
    if samples > MAX_SIMULATED_SAMPLES:
        raise SizeLimitError(f"{gpus} GPUs × `samples_per_rank`={samples_per_rank} make {samples} samples, beyond "
                             f"MAX_SIMULATED_SAMPLES = 2**19 = {MAX_SIMULATED_SAMPLES}, the most a simulated {step} "
                             f"step plans (every strategy and peer plans them); use fewer samples per rank or GPUs")


@dataclass(frozen=True, eq=False)
class MicroBatchSimulationRun:
    """`run_microbatch_simulation`'s result: the cluster, the batch, the budget and every strategy's step."""

    model: str
    gpus: int
    nodes: int
    workload: str
    samples_per_rank: int
    max_tokens_per_microbatch: int
    seed: int
    strategies: dict[str, MicroBatchStepResult]

    def to_json(self) -> dict:
        return {"model": self.model, "gpus": self.gpus, "nodes": self.nodes, "workload": self.workload,
                "samples_per_rank": self.samples_per_rank, "max_tokens_per_microbatch": self.max_tokens_per_microbatch,
                "seed": self.seed, "strategies": {name: result.to_json() for name, result in self.strategies.items()}}


def run_microbatch_simulation(model: str = "84b", gpus: int = 2560, *, max_tokens_per_microbatch: int = 16384,
                              workload: str = "default", samples_per_rank: int = DEFAULT_SAMPLES_PER_RANK,
                              strategies=STRATEGIES, seed: int = 0) -> MicroBatchSimulationRun:
    """Simulate one micro-batched step of `model` on `gpus` H100s under each strategy.

    Every strategy runs the same sampled batch of `samples_per_rank` samples per rank (with a
    token budget the batch size is a training choice, not a memory limit); "none" is always
    simulated, as the reference of `speedup_vs_none`.
    """
    check_model(model)
    names = list(dict.fromkeys(strategies))
    for name in names:
        if name not in STRATEGIES:
            raise ValueError(f"unknown micro-batch strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    topology = cluster(gpus)
    check_simulated_samples(topology.world_size, samples_per_rank)
    config, gpu = MODELS[model], GPUS["h100"]
    stages = config.stages()
    batch = sample_workload(workload, topology.world_size, samples_per_rank, seed)
    results = {}
    for name in dict.fromkeys(["none", *names]):
        start = time.perf_counter()
        plan = microbatch_plan(name, stages, topology, batch, max_tokens_per_microbatch)
        results[name] = simulate_microbatched_step(plan, name, config, gpu, topology,
                                                   planning_seconds=time.perf_counter() - start)
    reference = results["none"].step_seconds
    return MicroBatchSimulationRun(
        model=model, gpus=topology.world_size, nodes=topology.num_nodes, workload=workload,
        samples_per_rank=samples_per_rank, max_tokens_per_microbatch=max_tokens_per_microbatch, seed=seed,
        strategies={name: dataclasses.replace(results[name], speedup_vs_none=reference / results[name].step_seconds
                                              if results[name].step_seconds > 0 else 1.0) for name in names})

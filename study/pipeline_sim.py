"""Simulator of a pipeline-parallel micro-batched step: P stages over the model's layers.

Model (the schedules of `balancers.pipeline.schedules`, per-stage times):

    replicas   D = gpus / P data-parallel replicas, each a pipeline of P GPUs; every replica
               draws `samples_per_rank` samples
    cells      each strategy gives every sample a cell (replica, micro-batch) over its LLM tokens
               (budget T); micro-batch m runs m-th on every replica
    stages     the LLM's layers split evenly, so every stage runs 1/P of a cell's LLM FLOPs;
               the encoders sit on the first stage, which also runs the encoder FLOPs of the
               cell's samples (unpadded, each segment by its encoder's cost model)
    seconds    FLOPs · RECOMPUTE_FACTOR / (peak · efficiency), split forward 1 / (1 + k) and
               backward k / (1 + k) (k = the pipeline's backward_factor)
    step       the slowest replica's schedule time (`replica_times`); bubble = 1 - busy GPU
               seconds / (D · P · step)

Point-to-point activations, the input exchange, gradient reduction and the optimizer step are
left out (the same for every strategy, or overlapped).  The PP-aware planner is given each
sample's encoder FLOPs as its first-stage part (`balance_microbatches(..., first_stage_costs=)`), so its
stage times are the simulator's: ours is never slower than the plain cells it starts from (those of
ours_unaware, but for the fewest micro-batches' plan or the joint greedy's, which ours_unaware keeps where
their Σ_m max is lower: `PipelineStep.unaware_step_time`).

Strategies (`STRATEGIES`):

    ours            the plain cells planned for M re-planned for the schedule (balance_microbatches(...,
                    pipeline=, first_stage_costs=)), encoders on the first stage
    ours_unaware    balance_microbatches without it: Σ_m max_r load, in its own order
                    (both plan each sample's LLM and encoder FLOPs together, `costs=`)
    verl_dynamic_bsz, sorted_grid   the micro-batch peers (`microbatch_peers`), their own M
    dynapipe_style  per-replica contiguous micro-batches (`pipeline_peers`)

ours, ours_unaware and dynapipe_style run the most micro-batches any peer chose (at least the
fewest that fit; interleaved: whole groups of P), so they never pay a larger bubble by running
fewer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..balancers import Pipeline, balance_microbatches
from ..balancers.microbatch.api import make_microbatch_problem
from ..balancers.pipeline import replica_times
from ..orchestrator.pipeline import sample_encoder_costs as encoder_flops  # FLOPs: the study's cost models
from ..orchestrator.samples import Batch
from .microbatch_peers import MICROBATCH_PEERS
from .models import GPUS, MODELS, check_model
from .pipeline_peers import dynapipe_style
from .simulator import RECOMPUTE_FACTOR
from .workloads import sample_workload

STRATEGIES = ("ours", "ours_unaware", "verl_dynamic_bsz", "sorted_grid", "dynapipe_style")
DEFAULT_SAMPLES_PER_RANK = 128  # per replica (P GPUs): M about 12 at T = 16k on the default mix


@dataclass(frozen=True)
class PipelineStepResult:
    """One strategy's modelled pipeline step (see the module docstring)."""

    strategy: str
    num_microbatches: int
    step_seconds: float
    bubble_fraction: float
    speedup_vs_unaware: float = 1.0

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class PipelineSimulationRun:
    """`run_pipeline_simulation`'s result: the setting and every strategy's step."""

    model: str
    gpus: int
    replicas: int
    pipeline: Pipeline
    workload: str
    samples_per_rank: int
    max_tokens_per_microbatch: int
    seed: int
    strategies: dict[str, PipelineStepResult]

    def to_json(self) -> dict:
        return {"model": self.model, "gpus": self.gpus, "replicas": self.replicas, "pipeline": self.pipeline.to_json(),
                "workload": self.workload, "samples_per_rank": self.samples_per_rank,
                "max_tokens_per_microbatch": self.max_tokens_per_microbatch, "seed": self.seed,
                "strategies": {name: result.to_json() for name, result in self.strategies.items()}}


def simulate_pipeline_step(strategy: str, rank: np.ndarray, microbatch: np.ndarray, num_microbatches: int,
                           llm_flops: np.ndarray, encoder: np.ndarray, pipeline: Pipeline, replicas: int,
                           seconds_per_flop: float) -> PipelineStepResult:
    """The step of these cells (module docstring): per-stage seconds, the schedule, the bubble."""
    num_microbatches = pipeline.runnable(num_microbatches)  # interleaved: empty micro-batches fill the last group
    cell = rank * num_microbatches + microbatch
    size = replicas * num_microbatches
    llm = np.bincount(cell, weights=llm_flops, minlength=size).reshape(replicas, num_microbatches)
    first = np.bincount(cell, weights=encoder, minlength=size).reshape(replicas, num_microbatches)
    per_stage = np.repeat((llm / pipeline.stages)[:, None, :], pipeline.stages, axis=1)
    per_stage[:, 0, :] += first
    whole = per_stage * seconds_per_flop * pipeline.stages  # a stage's share as the whole model's cost
    forward, backward = pipeline.stage_times(whole)
    times = replica_times(pipeline, forward, backward)
    step = float(times.max()) if times.size else 0.0
    busy = float(forward.sum() + backward.sum())
    return PipelineStepResult(strategy=strategy, num_microbatches=num_microbatches, step_seconds=step,
                              bubble_fraction=1.0 - busy / (replicas * pipeline.stages * step) if step > 0 else 0.0)


def _cells(batch: Batch, llm_stage, work: np.ndarray, encoder: np.ndarray, pipeline: Pipeline, budget: int,
           strategies) -> dict:
    """(rank, microbatch, M) of every strategy in `strategies`; ours plan `work` (LLM and encoder FLOPs), the
    PP-aware one with the `encoder` FLOPs on the first stage."""
    lengths, replicas = batch.sample_llm_length, batch.num_ranks
    fewest = make_microbatch_problem(lengths, replicas, max_tokens_per_microbatch=budget,
                                     cost=llm_stage.cost).min_microbatches
    pipeline.check_microbatches(pipeline.runnable(fewest))  # the slot limit refused before any strategy plans
    peers = {name: MICROBATCH_PEERS[name](lengths, replicas, cost=llm_stage.cost, max_tokens_per_microbatch=budget,
                                          sources=batch.sample_source)
             for name in ("verl_dynamic_bsz", "sorted_grid") if name in strategies}
    m = pipeline.runnable(max([fewest, *(plan.num_microbatches for plan in peers.values())]))
    options = dict(max_tokens_per_microbatch=budget, costs=work, num_microbatches=m)
    plans = {name: (plan.rank, plan.microbatch, plan.num_microbatches) for name, plan in peers.items()}
    unaware = balance_microbatches(lengths, replicas, **options)
    plans["ours_unaware"] = (unaware.rank, unaware.microbatch, m)
    if "ours" in strategies:  # the same plain cells re-planned for the schedule
        ours = balance_microbatches(lengths, replicas, **options, pipeline=pipeline, first_stage_costs=encoder)
        plans["ours"] = (ours.rank, ours.microbatch, m)
    if "dynapipe_style" in strategies:
        problem = make_microbatch_problem(lengths, replicas, max_tokens_per_microbatch=budget, cost=llm_stage.cost)
        plan = dynapipe_style(problem, batch.sample_source, m)
        plans["dynapipe_style"] = (plan.rank, plan.microbatch, plan.num_microbatches)
    return {name: plans[name] for name in strategies}


def run_pipeline_simulation(model: str = "84b", gpus: int = 256, *, pipeline: Pipeline,
                            max_tokens_per_microbatch: int = 16384, workload: str = "default",
                            samples_per_rank: int = DEFAULT_SAMPLES_PER_RANK, strategies=STRATEGIES,
                            seed: int = 0) -> PipelineSimulationRun:
    """Simulate one pipelined step of `model` on `gpus` H100s (gpus / P replicas) under each strategy."""
    check_model(model)
    if not isinstance(pipeline, Pipeline):
        raise TypeError(f"`pipeline` must be a Pipeline; got {type(pipeline).__name__}")
    if gpus % pipeline.stages:
        raise ValueError(f"`gpus`={gpus} must be a multiple of the pipeline's stages={pipeline.stages} "
                         f"(every replica is a pipeline of P GPUs)")
    names = list(dict.fromkeys(strategies))
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown pipeline strategy {unknown[0]!r}; choose from {', '.join(STRATEGIES)}")
    replicas = gpus // pipeline.stages
    config, gpu = MODELS[model], GPUS["h100"]
    stages = config.stages()
    batch = sample_workload(workload, replicas, samples_per_rank, seed)
    llm_flops = stages[-1].cost.item_costs(batch.sample_llm_length)
    encoder = encoder_flops(batch, stages)
    seconds_per_flop = RECOMPUTE_FACTOR / (gpu.peak_flops * gpu.kernel_efficiency)
    cells = _cells(batch, stages[-1], llm_flops + encoder, encoder, pipeline, max_tokens_per_microbatch,
                   set(names) | {"ours_unaware"})
    results = {name: simulate_pipeline_step(name, *cells[name], llm_flops, encoder, pipeline, replicas,
                                            seconds_per_flop) for name in dict.fromkeys([*names, "ours_unaware"])}
    reference = results["ours_unaware"].step_seconds
    return PipelineSimulationRun(
        model=model, gpus=gpus, replicas=replicas, pipeline=pipeline, workload=workload,
        samples_per_rank=samples_per_rank, max_tokens_per_microbatch=max_tokens_per_microbatch, seed=seed,
        strategies={name: PipelineStepResult(**{**asdict(results[name]), "speedup_vs_unaware":
                                                reference / results[name].step_seconds
                                                if results[name].step_seconds > 0 else 1.0}) for name in names})

"""Ablation strategies by name: how a step's samples are arranged and exchanged.

Each strategy turns (stages, topology, batch) into a `StepPlan` and says how the
exchanges run.  The names follow the OrchMLLM paper's ablations plus pre-balancing
baselines:

    none              no balancing: every item runs where it was sampled
    megatron          Megatron-LM-like: no rearrangement; each rank runs its samples in
                      fixed-size micro-batches (in sampling order, gradient accumulation),
                      every stage padded to the micro-batch's longest item; the simulator
                      picks the largest size in `micro_batch_sizes` that fits in memory, as
                      a practitioner would (the paper's 3.1× reference point)
    length_grouped    LLaVA / HF length-grouped sampling: the sampler deals the step's
                      samples, longest first, to the rank with the fewest tokens, n/D each
                      (no exchange; encoders run where the LLM runs)
    llm_only          balance the LLM stage only; encoders run where samples were drawn
    single_algorithm  every stage balanced with the LLM's algorithm as if unpadded
    allgather         full orchestration, but payloads move by all-gather
    two_exchange      full orchestration, embeddings sent home and then on (VeOmni,
                      MindSpeed-MM) instead of straight to their LLM rank
    no_placement      full orchestration without communication-aware placement: groups
                      land on ranks as the balancer numbers them
    ours              full orchestration: each stage with its own cost model and
                      algorithm, communication-aware placement, one fused input
                      exchange + one embedding exchange, node-wise all-to-all
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..balancers.problem import make_problem
from ..orchestrator.plan import PassPlan, StagePlan
from ..orchestrator.step import StepPlan
from ..orchestrator.options import LOCALITY
from ..orchestrator.planner import Orchestrator
from ..orchestrator.samples import Batch
from ..topology import Topology
from .peers import llava_length_grouped


@dataclass(frozen=True)
class Strategy:
    """How to plan and exchange a step (see the module docstring for the named ones)."""

    name: str
    description: str
    balance_encoders: bool = True
    balance_llm: bool = True
    uniform_algorithm: str | None = None
    length_grouped: bool = False
    padded: bool = False
    micro_batch_sizes: tuple[int, ...] = ()
    exchange: str = "nodewise"
    composed: bool = True
    placement: str | None = LOCALITY

    def plan(self, stages, topology: Topology, batch: Batch, seconds_per_cost: float | None = None) -> StepPlan:
        """The StepPlan this strategy produces for `batch` (`seconds_per_cost`: see `Orchestrator`)."""
        stages = tuple(stages)
        if self.padded:
            stages = tuple(dataclasses.replace(stage, padded=True) for stage in stages)
        if self.length_grouped:
            batch = length_grouped_batch(batch)
        orchestrator = Orchestrator(stages, topology, placement=self.placement, balance_encoders=self.balance_encoders,
                                    balance_llm=self.balance_llm, uniform_algorithm=self.uniform_algorithm,
                                    seconds_per_cost=seconds_per_cost)
        return orchestrator.plan(batch)


def single_pass(plan: StepPlan) -> PassPlan:
    """The one pass of a step planned without a token budget: what the strategies plan and the
    simulator models (`microbatch_sim` models steps of several micro-batches)."""
    if plan.num_microbatches != 1:
        raise ValueError(f"`plan` must be a step of one pass; got {plan.num_microbatches} micro-batches "
                         f"(`study.microbatch_sim.simulate_microbatched_step` models those)")
    return plan.microbatches[0]


def micro_batched(plan: StepPlan, stage_plan: StagePlan, micro_batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-rank cost and peak tokens when each rank runs its samples in padded micro-batches.

    The LLM rank's samples, in processing order, form micro-batches of `micro_batch_size`;
    an encoder item belongs to its sample's micro-batch.  A micro-batch costs
    count · f(max length) per stage; ranks add their micro-batches' costs and hold one
    micro-batch at a time (peak tokens = max count · max length).
    """
    llm = single_pass(plan).llm
    position = np.empty(llm.num_items, dtype=np.int64)
    position[llm.rank_items] = np.arange(llm.num_items) - np.repeat(llm.rank_offsets[:-1], np.diff(llm.rank_offsets))
    groups = -(-max(int(np.diff(llm.rank_offsets).max()), 1) // micro_batch_size)
    key = stage_plan.destination * groups + position[stage_plan.item_sample] // micro_batch_size
    size = plan.num_ranks * groups
    counts = np.bincount(key, minlength=size)
    longest = np.zeros(size, dtype=np.int64)
    np.maximum.at(longest, key, stage_plan.item_length)
    cost = np.where(counts > 0, counts * stage_plan.stage.cost.item_costs(longest), 0.0).reshape(plan.num_ranks, groups)
    tokens = (counts * longest).reshape(plan.num_ranks, groups)
    return cost.sum(axis=1), tokens.max(axis=1)


def length_grouped_batch(batch: Batch) -> Batch:
    """The batch as a length-grouped sampler would have dealt it (LLaVA `split_to_even_chunks`)."""
    problem = make_problem(batch.sample_llm_length, batch.num_ranks)
    sources = np.ascontiguousarray(llava_length_grouped(problem).assignment, dtype=np.int64)
    sources.setflags(write=False)
    return dataclasses.replace(batch, sample_source=sources)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (
    Strategy("none", "no balancing: items run where they were sampled", balance_encoders=False, balance_llm=False),
    Strategy("megatron", "Megatron-LM-like: fixed micro-batches padded to their longest item in every stage "
                         "(largest size that fits in memory), no rearrangement",
             balance_encoders=False, balance_llm=False, padded=True, micro_batch_sizes=(16, 8, 4, 2, 1)),
    Strategy("length_grouped", "LLaVA length-grouped sampling (pre-balancing of LLM tokens), no exchange",
             balance_encoders=False, balance_llm=False, length_grouped=True),
    Strategy("llm_only", "balance the LLM stage only; encoders run where samples were drawn", balance_encoders=False),
    Strategy("single_algorithm", "every stage balanced by the LLM's algorithm as if unpadded",
             uniform_algorithm="lpt"),
    Strategy("allgather", "full orchestration, payloads moved by all-gather instead of all-to-all",
             exchange="allgather"),
    Strategy("two_exchange", "full orchestration, embeddings sent home first, then to the LLM rank",
             composed=False),
    Strategy("no_placement", "full orchestration, groups placed as numbered (no communication-aware placement)",
             placement=None),
    Strategy("ours", "every stage balanced with its own model, communication-aware placement, "
                     "one fused input exchange + one embedding exchange, node-wise all-to-all"),
)}


def get_strategy(name: str) -> Strategy:
    """The strategy called `name`."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


"""Multi-stage orchestration: balance every encoder stage and the LLM, compose the routes.

For each stage s with items i (segments of its modality, or samples for the LLM):

    minimise  max_r cost_s(r)   s.t. tokens_s(r) <= cap_s        (cost_s: the stage's CostModel)

solved independently with the stage's own algorithm from `balancers.ALGORITHMS`, then the
encoder outputs are routed straight to the LLM rank of their sample (Π_M ∘ Π_E⁻¹, see
`plan.compose`).  Plain code:

    llm_dest = balance(sample llm lengths, D, stage=llm, keep near: the sampling rank)
    for each encoder stage:
        dest = balance(segment lengths, D, stage=encoder, keep near: llm_dest of the sample)
    route[segment] = (dest[segment], llm_dest[sample of segment])

Which group of items lands on which rank does not change a stage's makespan; the
orchestrator spends that freedom on locality: communication-aware balancing (the
balancers' `sources=` mode, within a makespan slack) or a relabelling of the groups
(`topology.place`).  Options switch stages off to express the paper's ablations (see
`strategies`).  Makespan guarantees are those of each stage's algorithm; the plan is
deterministic (same batch -> bit-identical plan).  With `max_tokens_per_microbatch` a step
is planned as M gradient-accumulation micro-batches (`orchestrator.step`).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import NamedTuple

import numpy as np

from ..balancers.api import solve, trusted_request
from ..balancers.context_parallel.split import allowed_degrees, split_stage
from ..balancers.locality.balance import FILL_ON_MISS
from ..balancers.microbatch.api import plan_microbatches
from ..balancers.microbatch.options import MicroBatchOptions
from ..balancers.microbatch.plan import MicroBatchPlan
from ..balancers.plan import BalancePlan, make_plan
from ..balancers.problem import InfeasibleError, Status, make_problem
from ..topology import PLACEMENTS, place
from .frames import split_frames, stage_costs, stage_frames, stage_pricing
from .options import LOCALITY, as_topology, plan_options
from .pipeline import cell_costs, faster_run, planned_run, under_llm_costs
from .plan import PassPlan, StagePlan, _frozen, constant, first_row_ranks
from .samples import Batch
from .shards import any_split
from .stages import (Stage, StageItems, check_microbatched_llm, check_stages, input_bytes, item_tokens,
                     stage_items, stage_named)
from .step import (StageCapError, StepPlan, capped_cell_lengths, capped_replan_note, check_cells, check_samples_fit,
                   check_segments_fit, least_moving, over_cap_note)

WHOLE_STEP_RANKS = 64  # ranks up to which "locality" also plans the step with "lap" and with no placement


class Parts(NamedTuple):
    """Encoder items that are parts of segments (a video split by frames): each part's first input
    unit and first embedding row within its segment."""

    first_unit: np.ndarray
    first_row: np.ndarray


def stage_plan(batch: Batch, stage: Stage, destination: np.ndarray, algorithm: str,
               balanced: BalancePlan | None = None, items: StageItems | None = None,
               outputs: np.ndarray | None = None, parts: Parts | None = None,
               item_time: np.ndarray | None = None) -> StagePlan:
    """Evaluate `destination` for `stage` (loads, tokens, bound) and lay items out per rank.

    `balanced`, when given, is the balancer's plan of this very assignment under this
    stage's cost model, whose loads, bound and item costs are reused (a `ContextParallelPlan`: its
    degrees and item times too); `items` and `outputs` (`item_tokens`) save recomputing them; `parts`
    says which parts of their segments the items are (None: whole segments, `stage_items`), `item_time` their
    costs (default: the stage's, `frames.stage_costs`).
    """
    items = stage_items(batch, stage) if items is None else items
    item_sample, item_segment, item_length = items
    num_ranks = batch.num_ranks
    destination = np.ascontiguousarray(destination, dtype=np.int64)
    if destination.shape != item_sample.shape:
        raise ValueError(f"stage {stage.name!r}: `destination` must have one rank per item "
                         f"({item_sample.size}); got shape {destination.shape}")
    if balanced is None and item_sample.size:
        problem = make_problem(item_length, num_ranks, padded=stage.padded, **stage_pricing(batch, stage))
        balanced = make_plan(problem, destination, Status.FEASIBLE, algorithm)
        item_time = balanced.item_costs if item_time is None else item_time
    if balanced is None:
        loads, tokens, makespan, bound = np.zeros(num_ranks), np.zeros(num_ranks, dtype=np.int64), 0.0, 0.0
        seconds = 0.0
    else:
        loads, tokens, makespan, bound = balanced.loads, balanced.tokens, balanced.makespan, balanced.lower_bound
        seconds = balanced.solve_seconds
    outputs = item_tokens(batch, stage, items) if outputs is None else outputs
    source = batch.sample_source if stage.is_llm else batch.sample_source[item_sample]
    degree = getattr(balanced, "degree", None)
    item_time = getattr(balanced, "item_time", None) if item_time is None else item_time
    if item_time is None and balanced is not None and balanced.cost == stage.cost:
        item_time = getattr(balanced, "item_costs", None)  # the balancer's, of these very lengths
    if item_time is None:
        item_time = stage.cost.item_costs(item_length)
    # unsplit items and whole segments share one constant (read-only, no memory per item)
    degree = constant(1, item_sample.size) if degree is None else _frozen(degree)
    whole = constant(0, item_sample.size)
    first_unit, first_row = (whole, whole) if parts is None else (parts.first_unit, parts.first_row)
    for array in (item_sample, item_segment, item_length, destination, source, item_time, first_unit, first_row,
                  outputs):
        array.setflags(write=False)
    plan = StagePlan(stage=stage, item_sample=item_sample, item_segment=item_segment, item_length=item_length,
                     source=source, destination=destination, loads=loads, tokens=tokens, makespan=makespan,
                     lower_bound=bound, algorithm=algorithm, degree=degree, item_time=item_time,
                     item_first_unit=first_unit, item_first_row=first_row, item_tokens=outputs, solve_seconds=seconds)
    if stage.is_llm:  # its layout, built on first read (`StagePlan._layout`), reads the batch
        object.__setattr__(plan, "_batch", batch)
    return plan


def checked(batch: Batch) -> Batch:
    """`batch`, validated by `Batch.from_arrays` unless that made it (`validated`): the stage plans trust its
    columns (`balancers.api.trusted_request`), and a `Batch(...)` made by hand checks none (review R18-03: negative
    lengths planned silently, a source past the ranks raised numpy's broadcast error)."""
    if not isinstance(batch, Batch):
        raise TypeError(f"`batch` must be a Batch; got {type(batch).__name__}")
    if getattr(batch, "validated", False):
        return batch
    return Batch.from_arrays(num_ranks=batch.num_ranks, modalities=batch.modalities, sample_text=batch.sample_text,
                             sample_source=batch.sample_source, sample_id=batch.sample_id,
                             segment_sample=batch.segment_sample, segment_modality=batch.segment_modality,
                             segment_length=batch.segment_length, segment_tokens=batch.segment_tokens,
                             segment_position=batch.segment_position, segment_frames=batch.segment_frames)


class Orchestrator:
    """Plans a step for `stages` (encoders then the LLM) on `topology` (or a number of ranks).

    Args:
        stages: `Stage` list, encoder stages first, the LLM stage last.
        topology: a `Topology`, or an int number of ranks (one node).
        The other arguments are keywords, checked once into `self.options` (a frozen `PlanOptions`):
        placement: how bytes are kept local.  "locality" (default): communication-aware
            balancing (`balance(..., sources=...)`), within (1 + makespan_slack) of the
            plain makespan items stay on their anchor rank, else on its node; a method of
            `topology.PLACEMENTS` ("lap", "lap_node", "ilp", "identity") relabels the
            balanced groups instead; None keeps the balancer's numbering.  Anchors: the
            LLM stage keeps each sample's text and embeddings on the rank that sampled
            it; each encoder item stays with the LLM rank of its sample, so that its
            embeddings need not move.  On up to WHOLE_STEP_RANKS ranks the whole step is
            compared with the steps of "lap" and of None (`step.least_moving`): one of those
            where it moves fewer bytes (across nodes, then ranks) at no higher step cost, or
            where the step exceeds None's by more than the slack; above, each stage's own pass
            decides (the two plans cost 2-3x the planning time, a LAP per stage 40-55 ms at
            2560 ranks).
        padded_placement: the same choice for padded stages, None by default: their exact
            optimum groups contiguous runs of sorted lengths, and relabelling or
            re-dealing them costs far more planning time (a slot re-deal and an
            assignment problem, 60 ms at 2560 ranks when measured on 2026-11-30) than the
            few percent of the step's bytes they carry.
        makespan_slack: relative makespan "locality" may add per stage to keep bytes local
            (the balancer's default, 0.002).
        seconds_per_cost: seconds one unit of the stages' cost takes on a rank (e.g.
            1 / achieved FLOP/s for FLOP cost models).  When given, "locality" spends on a
            stage at most the slack its bytes are worth: min(makespan_slack, E / C), where
            E = Σ anchor bytes / D / bandwidth (inter-node; intra-node on one node) is what
            a rank spends exchanging an average share of the stage's bytes and
            C = seconds_per_cost · Σ cost / D the least it computes, so the makespan added
            costs no more than that exchange (large models on fast links: near 0; small
            models, slow links: the full slack).  None (default): `makespan_slack` always.
        balance_encoders / balance_llm: False leaves that stage unbalanced (the ablations
            "llm_only" and "none"): its items stay on the rank that sampled them, or, with
            `max_tokens_per_microbatch`, an encoder's on the rank of its sample's cell (the
            cells move whole samples, as `plan_cells` says).
        uniform_algorithm: balance every stage with this algorithm, as if unpadded (the
            ablation "one algorithm for all stages"); plans are still evaluated with each
            stage's true cost model.
        max_tokens_per_microbatch: plan the step as M gradient-accumulation micro-batches of
            at most this many LLM tokens per rank (a `StepPlan` of M passes, see
            `orchestrator.step`); None plans one forward pass per rank (a step of one pass).  The LLM cells
            then come from `microbatch_algorithm`: a stage `algorithm` but 'lpt' / 'auto' is refused (unless
            `uniform_algorithm` replaces it).
        num_microbatches, microbatch_overhead, microbatch_algorithm, pipeline: passed to `balance_microbatches`
            (None: the smallest M that pays; cost of one more micro-batch in LLM cost units; the micro-batch
            algorithm; a `Pipeline`: cells for its schedule, `StepPlan.pipeline` the step with the encoders on
            the first stage (`orchestrator.pipeline`); not with `context_parallel`).
    """

    def __init__(self, stages, topology, **options):
        self.stages = check_stages(stages)
        self.topology = topology = as_topology(topology)
        self.options = plan_options(options)
        check_microbatched_llm(self.stages[-1], self.options.microbatching, self.options.uniform_algorithm)
        spec = self.options.context_parallel
        self.context_parallel = None if spec is None else spec.on(topology)
        if spec is not None:
            llm = self.stages[-1]
            if llm.padded:
                raise ValueError(f"`context_parallel` splits LLM samples of an unpadded stage; the LLM stage "
                                 f"{llm.name!r} is padded")
            allowed_degrees(self.context_parallel, topology.world_size, topology.gpus_per_node)
        options, self._others = self.options, ()  # "locality" is compared with "lap" and no placement (`plan`)
        if options.placement == LOCALITY and options.pipeline is None:
            self._others = (self._placed("lap", options.padded_placement and "lap"), self._placed(None, None))

    def _placed(self, placement: str | None, padded_placement: str | None) -> Orchestrator:
        """This orchestrator with other placements, its options copied (checked once, at construction)."""
        other, options = copy.copy(self), copy.copy(self.options)
        object.__setattr__(options, "placement", placement)
        object.__setattr__(options, "padded_placement", padded_placement)
        other.options, other._others = options, ()
        return other

    @property
    def num_ranks(self) -> int:
        return self.topology.world_size

    def plan(self, batch: Batch) -> StepPlan:
        """The StepPlan of `batch`: every stage balanced, encoder outputs routed to their LLM rank, in
        one pass, or with `max_tokens_per_microbatch` in the micro-batches of its cells.  The step is costed
        without its routes and rank layouts, built on their first read (`StepPlan.built()` builds them now), and
        its `planning_seconds` does not count them."""
        batch = checked(batch)
        self.topology.check_world_size(batch.num_ranks, "batch.num_ranks")
        known = {stage.modality for stage in self.stages}
        unknown = [name for code, name in enumerate(batch.modalities)
                   if name not in known and np.any(batch.segment_modality == code)]
        if unknown:
            raise ValueError(f"unknown modality {unknown[0]!r}: no stage encodes it; stages cover "
                             f"{sorted(known - {'llm'})}")
        start = time.perf_counter()
        step = self._plan_microbatches(batch, start) if self.options.microbatching is not None else self._plan(batch)
        if not self._others or batch.num_ranks > WHOLE_STEP_RANKS:
            return step
        lap, plain = self._others
        try:
            plain_step = plain.plan(batch)  # "lap" relabels the same cells' groups: the same micro-batches
            lap_step = lap.plan(batch) if plain_step.cells is None else lap._plan_cells(batch, plain_step.cells, start)
        except InfeasibleError:  # no plan of theirs within an encoder's cap: "locality"'s stands
            return step
        step = least_moving((step, lap_step, plain_step), self.options.makespan_slack, self.topology.gpus_per_node)
        return dataclasses.replace(step, planning_seconds=time.perf_counter() - start)

    def _plan(self, batch: Batch) -> StepPlan:
        """The step of one pass: the LLM stage balanced, then every encoder stage near its samples' LLM ranks."""
        start = time.perf_counter()
        *encoders, llm_stage = self.stages
        uniform = self.options.uniform_algorithm
        llm = stage_named(self._plan_stage, uniform, batch, llm_stage, stage_items(batch, llm_stage), None)
        plans = tuple(stage_named(self._plan_stage, uniform, batch, stage, stage_items(batch, stage), llm)
                      for stage in encoders) + (llm,)
        return StepPlan(batch=batch, stages=self.stages, microbatches=(PassPlan(batch, self.stages, plans),),
                        microbatch_samples=(llm.item_sample,),  # the LLM's items: every sample, in order
                        planning_seconds=time.perf_counter() - start)

    def _plan_microbatches(self, batch: Batch, start: float) -> StepPlan:
        """Cells (rank, micro-batch) for whole samples, then every micro-batch's encoders balanced
        across the ranks and routed to the LLM rank of their sample (see `orchestrator.step`).
        Where an encoder's cap (`max_tokens_per_rank`) leaves a micro-batch no plan, the cells are
        planned again counting every sample's share of the caps (`capped_cell_lengths`)."""
        *encoders, llm_stage = self.stages
        options = self.options.microbatching.with_budget(self._cell_budget())
        if batch.num_samples == 0:  # a step with no sample anywhere still runs its micro-batches
            m, overhead = options.empty_step_microbatches(), options.microbatch_overhead
            cells = MicroBatchPlan(
                rank=np.zeros(0, dtype=np.int64), microbatch=np.zeros(0, dtype=np.int64), num_microbatches=m,
                num_ranks=batch.num_ranks, cell_loads=np.zeros((m, batch.num_ranks)),
                cell_tokens=np.zeros((m, batch.num_ranks), dtype=np.int64), step_cost=m * overhead,
                lower_bound=m * overhead, status=Status.OPTIMAL, algorithm=options.algorithm,
                max_tokens_per_microbatch=options.max_tokens_per_microbatch, microbatch_overhead=overhead,
                padded=llm_stage.padded)
            return self._plan_cells(batch, cells, start)
        origins = {}
        if self.options.placement == LOCALITY:
            items = stage_items(batch, llm_stage)
            anchors, anchor_bytes = self._anchors(batch, llm_stage, items, item_tokens(batch, llm_stage, items), None)
            origins = dict(sources=anchors, item_bytes=anchor_bytes, topology=self.topology)
        try:
            return self._plan_cells(batch, self._cells(batch, options, origins), start)
        except StageCapError as error:
            capped = capped_cell_lengths(batch, encoders, options.max_tokens_per_microbatch)
            if llm_stage.padded or capped is None or np.array_equal(capped, batch.sample_llm_length):
                raise
            failure = error
        cells = self._cells(batch, options, origins, capped, (capped_replan_note(failure),))
        try:
            return self._plan_cells(batch, cells, start)
        except StageCapError as error:
            raise StageCapError(f"{error}, also with cells that count every sample's share of the encoders' caps "
                                f"(a sample holding more than a cap needs room on other ranks of its micro-batch)"
                                f"{over_cap_note(batch, encoders)}",
                                error.min_cap, error.stage, error.microbatch) from failure

    def _cells(self, batch: Batch, options: MicroBatchOptions, origins: dict, capped: np.ndarray | None = None,
               why: tuple[str, ...] = ()):
        """`plan_microbatches` of the samples' LLM tokens (from `origins`: sources, item bytes and
        topology, or none), or of their `capped_cell_lengths`, accounted in LLM tokens and costs (with the LLM
        problem's own bound, a relaxation of the capped one: still a bound).  With a pipeline (unpadded LLM) and
        `balance_encoders` off the cells see each sample's encoder costs on the first stage (`pipeline.cell_costs`).
        An error says `why` it arose, and names the LLM stage's cap where that bounds the cells."""
        llm_stage, tokens = self.stages[-1], batch.sample_llm_length
        budget, given = options.max_tokens_per_microbatch, self.options.max_tokens_per_microbatch
        if budget < given:
            why = (f"the LLM stage {llm_stage.name!r} has max_tokens_per_rank={llm_stage.max_tokens_per_rank}, below "
                   f"max_tokens_per_microbatch={given}: a cell holds at most {budget} tokens", *why)
        costs, first = cell_costs(batch, self.stages, self.options)
        try:
            if self.context_parallel is None:  # else a long sample is split between ranks
                check_samples_fit(batch, tokens, budget)
            if capped is None and first is None:
                return plan_microbatches(tokens, batch.num_ranks, options, cost=llm_stage.cost, padded=llm_stage.padded,
                                         context_parallel=self.context_parallel, **origins)
            costs = llm_stage.cost.item_costs(tokens) if costs is None else costs
            found = plan_microbatches(tokens if capped is None else capped, batch.num_ranks, options, costs=costs,
                                      first_stage_costs=first, **origins)
        except (InfeasibleError, ValueError) as error:
            if not why:
                raise
            note = f"{error} ({'; '.join(why)})"
            if isinstance(error, InfeasibleError):
                raise InfeasibleError(note, error.min_cap) from error
            raise ValueError(note) from error
        return under_llm_costs(batch, found, llm_stage, options.num_microbatches is not None)

    def _cell_budget(self) -> int:
        """The tokens a micro-batch cell may hold: max_tokens_per_microbatch, or the LLM stage's
        max_tokens_per_rank where that is lower."""
        budget, cap = self.options.max_tokens_per_microbatch, self.stages[-1].max_tokens_per_rank
        return budget if cap is None else min(cap, budget)

    def plan_cells(self, batch: Batch, cells, *, start: float | None = None) -> StepPlan:
        """The micro-batched plan of `batch` whose samples already have cells (a `MicroBatchPlan` of
        the LLM stage over its samples, e.g. a peer's): every micro-batch's encoder stages are
        balanced across the ranks (with `balance_encoders`; otherwise each segment runs on its
        sample's LLM rank, where the whole sample moved), outputs routed to their LLM rank."""
        start = time.perf_counter() if start is None else start
        batch = checked(batch)
        self.topology.check_world_size(batch.num_ranks, "batch.num_ranks")
        check_cells(batch, cells, self.stages[-1], None if self.options.microbatching is None else self._cell_budget())
        return self._plan_cells(batch, cells, start)

    def _plan_cells(self, batch: Batch, cells, start: float) -> StepPlan:
        """`plan_cells` of cells known to be the batch's (`_cells`' own)."""
        *encoders, llm_stage = self.stages
        samples, plans = [], []
        parts = (((np.arange(batch.num_samples), batch),) if cells.num_microbatches == 1 else
                 batch.split(cells.microbatch, cells.num_microbatches))
        passes = getattr(cells, "passes", None)
        for members, sub in parts:
            llm = stage_plan(sub, llm_stage, cells.rank[members], cells.algorithm, items=stage_items(sub, llm_stage),
                             balanced=None if passes is None else passes[len(samples)])
            stage_plans = [self._microbatch_stage(sub, stage, llm, len(samples)) for stage in encoders]
            samples.append(members)
            plans.append(PassPlan(sub, self.stages, (*stage_plans, llm)))  # routes built on first read
        run = dict(cells=cells, microbatches=tuple(plans), microbatch_samples=tuple(samples))
        if self.options.pipeline is not None:
            run = planned_run(batch, self.stages, options=self.options, **run)
            if run["cells"].pipeline is not None and run["pipeline"] is not run["cells"].pipeline:  # encoders work
                run = faster_run(batch, self.stages, self.options, run, self._unaware_plan(
                    batch, cells.num_microbatches), self._unaware_plan, self.topology.gpus_per_node)
        return StepPlan(batch=batch, stages=self.stages, **run, planning_seconds=time.perf_counter() - start)

    def _unaware_plan(self, batch: Batch, num_microbatches: int, cells: MicroBatchPlan | None = None
                      ) -> StepPlan | None:
        """The PP-unaware plan of a pipelined step (`pipeline.faster_run`: its step, on the step's own basis, is
        `unaware_step_time`, and it is run where faster): made without `pipeline=` and without placements (its
        cells as balanced for the same M, every micro-batch's encoders balanced; ~1.1-1.4x the pipelined plan's
        time, 10b model, 12 held-out batches); with `cells`, theirs with the encoders planned under this
        orchestrator's placements.  None where it finds no plan within the caps."""
        plain, placed = copy.copy(self), {} if cells is not None else dict(placement=None, padded_placement=None)
        plain.options = dataclasses.replace(self.options, pipeline=None, num_microbatches=num_microbatches, **placed)
        plain._others = ()
        try:
            if cells is not None:
                return plain._plan_cells(batch, cells, time.perf_counter())
            return plain._plan_microbatches(batch, time.perf_counter())
        except InfeasibleError:
            return None

    def _microbatch_stage(self, sub: Batch, stage: Stage, llm: StagePlan, index: int) -> StagePlan:
        """Micro-batch `index`'s encoder `stage`: balanced (`balance_encoders`), or where that finds no
        plan under the stage's cap, and without `balance_encoders`, each segment on its sample's LLM
        rank, which cells planned for the cap (`capped_cell_lengths`) keep within it."""
        items = stage_items(sub, stage)
        failure = None
        if self.options.balance_encoders:
            try:
                return self._plan_stage(sub, stage, items, llm, filled=True)
            except InfeasibleError as error:
                if stage.max_tokens_per_rank is None:
                    raise
                failure = error
        home = stage_plan(sub, stage, llm.destination[items.sample], "none", items=items)
        cap = stage.max_tokens_per_rank
        if cap is not None and home.tokens.size and int(home.tokens.max()) > cap:
            rank = int(np.argmax(home.tokens))
            balanced = "" if failure is None else f"balancing it failed ({failure}); "
            raise StageCapError(
                f"micro-batch {index}, stage {stage.name!r}: {balanced}its segments on their samples' ranks put "
                f"{int(home.tokens[rank])} tokens on rank {rank}, over max_tokens_per_rank={cap} (cells that are not "
                f"planned for the cap, or a sample holding more than it)", int(home.tokens[rank]), stage.name,
                index) from failure
        return home

    def _anchors(self, batch: Batch, stage: Stage, items: StageItems, outputs: np.ndarray, llm: StagePlan | None):
        """Where the stage's items should stay, and their bytes: the LLM stage keeps a sample's text
        and embeddings on the rank that sampled it; an encoder item (`outputs` embedding tokens)
        stays with its sample's LLM rank."""
        if llm is None:
            return batch.sample_source, input_bytes(batch, self.stages, stage)
        if any_split(llm.degree):  # a split sample's embeddings land on the ranks of its chunks
            return (first_row_ranks(llm, items.segment),
                    outputs * stage.output_bytes_per_token)
        return llm.destination[items.sample], outputs * stage.output_bytes_per_token

    @staticmethod
    def _split_frames(batch: Batch, stage: Stage, items: StageItems, today: BalancePlan, algorithm: str) -> StagePlan:
        """An unpadded encoder stage whose videos may split between frames (`orchestrator.frames`): today's
        plan unless parts of whole frames pay, with the bound of plans that may split either way."""
        frames = stage_frames(batch, items.segment)
        parts, plan = split_frames(items.length, frames, stage.cost, batch.num_ranks, today, algorithm,
                                   stage.max_tokens_per_rank)
        if parts is None:
            return stage_plan(batch, stage, plan.assignment, algorithm, balanced=plan, items=items,
                              item_time=plan.item_costs)
        per_frame_units, per_frame_rows = items.length[parts.item] // frames[parts.item], (
            batch.segment_tokens[items.segment[parts.item]] // frames[parts.item])
        part_items = StageItems(items.sample[parts.item], items.segment[parts.item], per_frame_units * parts.frames)
        return stage_plan(batch, stage, plan.assignment, algorithm, balanced=plan, items=part_items,
                          outputs=per_frame_rows * parts.frames, item_time=plan.item_costs,
                          parts=Parts(per_frame_units * parts.first_frame, per_frame_rows * parts.first_frame))

    def _slack(self, batch: Batch, stage: Stage, anchor_bytes: np.ndarray) -> float:
        """The makespan slack "locality" may spend on a stage (see `seconds_per_cost`)."""
        options, num_ranks = self.options, batch.num_ranks
        if options.seconds_per_cost is None:
            return options.makespan_slack
        compute = options.seconds_per_cost * float(stage_costs(batch, stage).sum()) / num_ranks
        topology = self.topology
        bandwidth = topology.inter_node_bw_bytes_per_s if topology.num_nodes > 1 else topology.intra_node_bw_bytes_per_s
        exchange = float(np.sum(anchor_bytes)) / num_ranks / bandwidth
        return min(options.makespan_slack, exchange / compute) if compute > 0 else options.makespan_slack

    def _plan_stage(self, batch: Batch, stage: Stage, items: StageItems, llm: StagePlan | None,
                    filled: bool = False) -> StagePlan:
        """Balance one stage, then place its groups (`llm` is the LLM plan, None for the LLM stage);
        `filled` (a micro-batch's stage): "locality" deals with fill="on_miss" (`balancers.balance`): a
        micro-batch's stages are small problems where the repair's rounds cost several times the deal."""
        item_sample, _, item_length = items
        options = self.options
        balanced = options.balance_llm if stage.is_llm else options.balance_encoders
        if not balanced or item_sample.size == 0:
            return stage_plan(batch, stage, batch.sample_source[item_sample], "none", items=items)
        if not stage.is_llm:
            check_segments_fit(batch, stage, items)
        algorithm = options.uniform_algorithm or stage.algorithm
        padded = False if options.uniform_algorithm else stage.padded
        placement = options.padded_placement if stage.padded else options.placement
        outputs = item_tokens(batch, stage, items)
        local = {}
        if placement == LOCALITY:
            anchors, anchor_bytes = self._anchors(batch, stage, items, outputs, llm)
            local = dict(sources=anchors, item_bytes=anchor_bytes, topology=self.topology,
                         makespan_slack=self._slack(batch, stage, anchor_bytes),
                         fill=FILL_ON_MISS if filled and not padded else None)

        def balanced_plan() -> BalancePlan:
            result = solve(trusted_request(item_length, batch.num_ranks, padded=padded, algorithm=algorithm,
                                           max_tokens_per_rank=stage.max_tokens_per_rank, **stage_pricing(batch, stage),
                                           **local))  # the batch's checked columns, the plans' ranks
            if placement not in PLACEMENTS:
                return result
            anchors, anchor_bytes = self._anchors(batch, stage, items, outputs, llm)
            return result.on_ranks(place(result.assignment, anchors, anchor_bytes, self.topology,
                                         method=placement).rank_of_group)

        if stage.is_llm and self.context_parallel is not None:
            result = split_stage(item_length, batch.num_ranks, self.context_parallel, stage.cost,
                                 stage.max_tokens_per_rank, balanced_plan)
        else:
            result = balanced_plan()
        if not stage.is_llm and not stage.padded and not padded and batch.segment_frames is not None:
            return self._split_frames(batch, stage, items, result, algorithm)
        plan = stage_plan(batch, stage, result.assignment, algorithm,
                          balanced=result if padded == stage.padded else None, items=items, outputs=outputs)
        cap = stage.max_tokens_per_rank
        if cap is not None and plan.tokens.size and int(plan.tokens.max()) > cap:  # balanced unpadded, run padded
            rank = int(np.argmax(plan.tokens))
            raise InfeasibleError(f"stage {stage.name!r}: uniform_algorithm {algorithm!r} balanced it unpadded and "
                                  f"put {int(plan.tokens[rank])} tokens (count · longest) on rank {rank}, over its "
                                  f"max_tokens_per_rank={cap}", min_cap=int(plan.tokens[rank]))
        return plan

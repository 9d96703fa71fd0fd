"""The step plan: a step of M >= 1 passes (gradient-accumulation micro-batches), each a `PassPlan`.

Without a token budget a step is one pass: every stage balanced over the whole batch
(`StepPlan.cells` is None, `microbatches` holds one `PassPlan`).  With
`max_tokens_per_microbatch` it is M micro-batches under that budget.  FSDP / ZeRO-3
synchronise every rank in every layer of every micro-batch, so a step of M micro-batches costs

    step = Σ_m Σ_s max_r cost_s(r, m)        (s: the stages, r: the ranks)

and every rank must run the same M.  The orchestrator plans it in two levels:

    cells = balance_microbatches(sample LLM lengths, D, max_tokens_per_microbatch=T)
        # every sample, with all its segments, gets a cell (rank r, micro-batch m);
        # the LLM stage of micro-batch m runs sample i on rank cells.rank[i]
    for m in range(M):
        sub = batch.take(samples of micro-batch m)
        each encoder stage of `sub` is post-balanced across the ranks as in a plain step,
        its outputs routed straight to the LLM rank of their sample (one embedding exchange
        per micro-batch)

Encoder stages need no joint planning: within a micro-batch they are balanced across all
ranks again, so Σ_m max_r enc(r, m) stays close to Σ_m (enc total of m) / D = enc total / D
whatever the grouping, up to the granularity of the largest items.  The certified bound of
an encoder stage is therefore max(Σ c / D, max c) over the whole step; that of the LLM stage
is the micro-batch plan's own.

The raw inputs of the whole step move in one fused exchange (`input_exchange()`), every item
straight to the rank that runs it in its micro-batch, when memory allows holding all of a
rank's micro-batches at once; otherwise the runtime exchanges each micro-batch's inputs
before it runs (`StepPlan.microbatches[m].input_exchange()`).
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

from ..balancers.locality.balance import moved
from ..balancers.microbatch.api import make_microbatch_problem
from ..balancers.microbatch.plan import MicroBatchPlan, cell_accounts, step_cost
from ..balancers.origins import Origins
from ..balancers.pipeline.step import PipelineStep
from ..balancers.problem import InfeasibleError
from ..balancers.validation import as_index
from .frames import frame_bound, stage_costs, stage_frames, whole_video
from .lazy import build as build_fields
from .plan import Exchange, PassPlan, _frozen
from .samples import Batch
from .stages import Stage


class StageCapError(InfeasibleError):
    """A micro-batch's encoder stage found no plan within its `max_tokens_per_rank` (`stage`: its
    name, `microbatch`: the index)."""

    def __init__(self, message: str, min_cap: int, stage: str, microbatch: int):
        super().__init__(message, min_cap)
        self.stage, self.microbatch = stage, microbatch


def capped_cell_lengths(batch: Batch, stages, budget: int) -> np.ndarray | None:
    """Each sample's tokens in a cell of `budget` tokens that counts encoder `stages`' caps on a
    rank's tokens per micro-batch (`max_tokens_per_rank` c_s): max(its LLM tokens,
    ⌈min(e_s, c_s) · budget / c_s⌉ for every capped stage s), e_s its tokens of s (padded: its
    segments × the stage's longest).  A cell within the budget then holds at most c_s of every
    capped stage, so where no sample holds more than c_s the segments can always run on their
    sample's rank; a sample holding more fills its cell alone and its segments need other ranks'
    room.  None when no cap could bind (none below its stage's tokens in the batch).

    >>> from orchmllm import CostModel
    >>> batch = Batch.from_arrays(num_ranks=2, modalities=("image",), sample_text=[100, 900], sample_source=[0, 1],
    ...                           segment_sample=[0, 1], segment_modality=[0, 0], segment_length=[600, 500],
    ...                           segment_tokens=[150, 100])
    >>> vision = Stage("vision", "image", CostModel(), max_tokens_per_rank=1000)
    >>> capped_cell_lengths(batch, [vision], 1200).tolist()  # 600 of 1000 image tokens: 720 of 1200
    [720, 1000]
    """
    lengths = None
    for stage, cap, tokens in _capped_stage_tokens(batch, stages):
        if cap >= int(tokens.sum()):  # one rank may hold the stage's every token
            continue
        shares, inverse = np.unique(np.minimum(tokens, cap), return_inverse=True)
        scaled = np.array([-(-share * budget // cap) for share in shares.tolist()], dtype=np.int64)  # exact, <= budget
        lengths = np.maximum(batch.sample_llm_length if lengths is None else lengths, scaled[inverse.ravel()])
    return lengths


def _capped_stage_tokens(batch: Batch, stages):
    """(stage, cap, each sample's tokens of it) for every encoder stage of `stages` with a cap and segments in
    `batch` (padded: the sample's segments × the stage's longest)."""
    for stage in stages:
        segments = batch.segments_of(stage.modality)
        if stage.is_llm or stage.max_tokens_per_rank is None or not segments.size:
            continue
        owners = batch.segment_sample[segments]
        if stage.padded:
            tokens = np.bincount(owners, minlength=batch.num_samples) * int(batch.segment_length[segments].max())
        else:
            tokens = np.zeros(batch.num_samples, dtype=np.int64)
            np.add.at(tokens, owners, batch.segment_length[segments])
        yield stage, int(stage.max_tokens_per_rank), tokens


def capped_replan_note(failure: StageCapError) -> str:
    """Why the cells were planned again on `capped_cell_lengths` (an error of that plan says so)."""
    return (f"stage {failure.stage!r} found no plan within its cap in micro-batch {failure.microbatch} ({failure}), "
            f"so every sample's cell tokens count its share of the encoders' caps (`capped_cell_lengths`: "
            f"conservative counts, so the fewest micro-batches named are theirs; fewer may fit the stages' caps)")


def over_cap_note(batch: Batch, stages) -> str:
    """What the capped cells cannot do (probe22 P22-16): samples holding more than a stage's cap each fill a cell
    alone, and the cells do not spread them over micro-batches ("" where no sample does)."""
    notes = []
    for stage, cap, tokens in _capped_stage_tokens(batch, stages):
        over = np.flatnonzero(tokens > cap)
        if over.size:
            notes.append(f"{over.size} samples each hold more of stage {stage.name!r} than its max_tokens_per_rank="
                         f"{cap} (up to {int(tokens[over].max())})")
    if not notes:
        return ""
    return (f"; {', '.join(notes)}: the cells give each a rank of its micro-batch and do not spread them over "
            f"micro-batches, so more micro-batches do not help, and a cap figure above counts only the micro-batch "
            f"they fell in; a larger cap, or fewer such samples per batch, may")


def check_segments_fit(batch: Batch, stage: Stage, items) -> None:
    """InfeasibleError naming the encoder `stage` and the sample when one of its segments (`items`, the stage's
    `planner.StageItems`) is longer than its cap: the balancer's own message names an index into the stage's
    segments, of no stage."""
    cap = stage.max_tokens_per_rank
    if cap is None or not items.length.size or int(items.length.max()) <= cap:
        return
    index = int(np.argmax(items.length))
    sample, longest = int(items.sample[index]), int(items.length[index])
    position = int(items.segment[index] - batch.sample_segment_offsets[sample])
    raise InfeasibleError(f"stage {stage.name!r} ({stage.modality}): max_tokens_per_rank={cap} is below segment "
                          f"{position} of sample id {int(batch.sample_id[sample])} ({longest} tokens); a cap of at "
                          f"least {longest} is needed{whole_video(batch, int(items.segment[index]))}", min_cap=longest)


def check_samples_fit(batch: Batch, lengths: np.ndarray, budget: int) -> None:
    """InfeasibleError naming by id (the balancer names an index) a sample whose cell tokens exceed `budget`."""
    index = int(np.argmax(lengths))
    longest = int(lengths[index])
    if longest > budget:
        raise InfeasibleError(f"sample id {int(batch.sample_id[index])} has {longest} LLM tokens > "
                              f"max_tokens_per_microbatch={budget}; no micro-batch can hold it: a budget of at least "
                              f"{longest} is needed", min_cap=longest)


def _check_fields(cells: MicroBatchPlan, num_items: int, num_ranks: int) -> None:
    """Shapes and dtypes of a MicroBatchPlan's arrays (a hand-built one may disagree with itself)."""
    m = cells.num_microbatches
    if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or m < 1:
        raise ValueError(f"`cells.num_microbatches` must be a positive int; got {m!r}")
    for name, shape, kind in (("rank", (num_items,), "iu"), ("microbatch", (num_items,), "iu"),
                              ("cell_loads", (m, num_ranks), "f"), ("cell_tokens", (m, num_ranks), "iu")):
        value = getattr(cells, name)
        if not isinstance(value, np.ndarray) or value.shape != shape or value.dtype.kind not in kind:
            what = "ints" if "i" in kind else "floats"
            raise ValueError(f"`cells.{name}` must be a numpy array of shape {shape} ({what}); got "
                             f"{type(value).__name__} {getattr(value, 'shape', '')}")


def check_cells(batch: Batch, cells, llm: Stage, max_tokens: int | None) -> None:
    """Raise unless `cells` is a MicroBatchPlan of `batch`'s samples on its ranks for the LLM stage
    `llm`: its cells' loads, tokens and step cost those of this batch's samples under `llm`'s cost
    (padded or not), its bound not above its step cost, every cell within `max_tokens` (None: the
    plan's own budget) and the LLM stage's `max_tokens_per_rank`.  Cells planned for other samples,
    ranks, lengths, costs or a larger budget are refused."""
    if not isinstance(cells, MicroBatchPlan):
        raise TypeError(f"`cells` must be a MicroBatchPlan (`balance_microbatches` or a peer's); got "
                        f"{type(cells).__name__}")
    if cells.num_items != batch.num_samples or cells.num_ranks != batch.num_ranks:
        raise ValueError(f"`cells` place {cells.num_items} items on {cells.num_ranks} ranks; the batch has "
                         f"{batch.num_samples} samples on {batch.num_ranks} ranks (one cell per sample)")
    _check_fields(cells, batch.num_samples, batch.num_ranks)
    m, num_ranks = int(cells.num_microbatches), batch.num_ranks
    if cells.rank.size and (cells.rank.min() < 0 or cells.rank.max() >= num_ranks or cells.microbatch.min() < 0
                            or cells.microbatch.max() >= m):
        raise ValueError(f"`cells` hold a rank outside [0, {num_ranks}) or a micro-batch outside [0, {m})")
    if cells.padded != llm.padded:
        raise ValueError(f"`cells` were planned {'padded' if cells.padded else 'unpadded'}; the LLM stage "
                         f"{llm.name!r} is {'padded' if llm.padded else 'unpadded'}")
    budget = cells.max_tokens_per_microbatch if max_tokens is None else max_tokens
    limit = f"the budget of {budget} tokens per micro-batch"
    if llm.max_tokens_per_rank is not None and llm.max_tokens_per_rank < budget:
        budget = llm.max_tokens_per_rank
        limit = f"the LLM stage {llm.name!r}'s max_tokens_per_rank={budget}"
    lengths = batch.sample_llm_length
    if lengths.size and int(lengths.max()) > budget:
        raise ValueError(f"sample {int(np.argmax(lengths))} holds {int(lengths.max())} LLM tokens, over {limit}")
    problem = make_microbatch_problem(lengths, num_ranks, cost=llm.cost, padded=llm.padded,
                                      max_tokens_per_microbatch=budget, microbatch_overhead=cells.microbatch_overhead)
    loads, tokens = cell_accounts(problem, cells.rank.astype(np.int64), cells.microbatch.astype(np.int64), m)
    if not np.array_equal(tokens, cells.cell_tokens):
        r_m = np.unravel_index(int(np.argmax(tokens != cells.cell_tokens)), tokens.shape)
        raise ValueError(f"`cells` were planned for other lengths: cell (rank {r_m[1]}, micro-batch {r_m[0]}) "
                         f"holds {int(tokens[r_m])} of this batch's LLM tokens, the plan counts "
                         f"{int(cells.cell_tokens[r_m])}")
    cost = step_cost(loads, problem.microbatch_overhead)
    if not np.array_equal(loads, cells.cell_loads) or cost != cells.step_cost:
        raise ValueError(f"`cells` were planned under another cost: their step cost is {cells.step_cost}, this "
                         f"batch's under the LLM stage {llm.name!r}'s cost {cost}")
    if not cells.lower_bound <= cost:
        raise ValueError(f"`cells` claim a lower bound {cells.lower_bound} above their step cost {cost}")
    if tokens.size and int(tokens.max()) > budget:
        r_m = np.unravel_index(int(np.argmax(tokens)), tokens.shape)
        raise ValueError(f"`cells` put {int(tokens[r_m])} LLM tokens in cell (rank {r_m[1]}, micro-batch {r_m[0]}), "
                         f"over {limit}")


@dataclass(frozen=True, eq=False)
class StepPlan:
    """A step of `num_microbatches` passes: one `PassPlan` each, and the cells of its samples.

    `cells` is the balancers' `MicroBatchPlan` of the LLM stage over the step's samples
    (`cells.rank[i]`, `cells.microbatch[i]`) when the step was planned under a token budget;
    None for a step of one pass over the whole batch.  `pipeline`, for a step planned with
    `Orchestrator(..., pipeline=)`: the schedule's step of the plan as it runs, every micro-batch's
    encoder loads on its rank's first stage (`orchestrator.pipeline.planned_step`: step time, replica
    times, bound, gap, status, bubble); `cells.pipeline` is the cells planner's own view of it.
    `microbatch_samples[m]` and `microbatch_segments[m]` are the global sample and segment indices of micro-batch m
    (ascending) and `microbatches[m]` its PassPlan, over `batch.take(microbatch_samples[m])`
    (the batch itself for a step of one pass): sample k and segment j inside it are
    `microbatch_samples[m][k]`, `microbatch_segments[m][j]`.

    What the plan holds or costs is a property (`step_cost`, `stage_step_costs`, `lower_bound`,
    `microbatch_of_samples`, ...); what takes an argument or builds an object is a method
    (`stage_destinations(index)`, `digest()`, `input_exchange()`).
    """

    batch: Batch
    stages: tuple[Stage, ...]
    microbatches: tuple[PassPlan, ...]
    microbatch_samples: tuple[np.ndarray, ...]
    cells: MicroBatchPlan | None = None
    planning_seconds: float = 0.0  # `Orchestrator.plan`'s, without the routes and layouts `built()` builds
    pipeline: PipelineStep | None = None

    @property
    def num_microbatches(self) -> int:
        return len(self.microbatches)

    @functools.cached_property
    def microbatch_segments(self) -> tuple[np.ndarray, ...]:
        return tuple(self.batch.segments_of_samples(samples) for samples in self.microbatch_samples)

    @property
    def num_ranks(self) -> int:
        return self.batch.num_ranks

    @property
    def microbatch_overhead(self) -> float:
        """The cost of one more micro-batch, in LLM cost units (0 for a step of one pass)."""
        return 0.0 if self.cells is None else self.cells.microbatch_overhead

    @property
    def stage_step_costs(self) -> dict[str, float]:
        """Σ_m max_r cost_s(r, m) of every stage s (stage name -> cost)."""
        return {stage.name: float(sum(plan.stage_plans[index].makespan for plan in self.microbatches))
                for index, stage in enumerate(self.stages)}

    @property
    def step_cost(self) -> float:
        """Σ_m Σ_s max_r cost_s(r, m) + M · microbatch_overhead: what the synchronised micro-batches cost."""
        return float(sum(self.stage_step_costs.values())) + self.num_microbatches * self.microbatch_overhead

    @property
    def stage_lower_bounds(self) -> dict[str, float]:
        """A bound on Σ_m max_r cost_s(r, m): for a step of one pass each stage plan's own; under a
        token budget one that holds for every grouping into micro-batches."""
        if self.cells is None:
            return {plan.stage.name: float(plan.lower_bound) for plan in self.microbatches[0].stage_plans}
        bounds = {}
        for stage in self.stages[:-1]:
            segments = self.batch.segments_of(stage.modality)
            frames = stage_frames(self.batch, segments) if not stage.padded else np.ones_like(segments)
            bounds[stage.name] = frame_bound(stage_costs(self.batch, stage), frames, self.num_ranks)
        bounds[self.stages[-1].name] = float(self.cells.lower_bound)  # M_min · overhead included
        return bounds

    @property
    def lower_bound(self) -> float:
        return float(sum(self.stage_lower_bounds.values()))

    @property
    def gap(self) -> float:
        """step_cost / lower_bound - 1 (0 when both are 0)."""
        bound = self.lower_bound
        if bound == 0:
            return 0.0 if self.step_cost == 0 else float("inf")
        return self.step_cost / bound - 1.0

    @functools.cached_property
    def microbatch_of_samples(self) -> np.ndarray:
        """The micro-batch of every sample of the step (int64, read-only)."""
        if self.cells is not None:
            return self.cells.microbatch
        return _frozen(np.zeros(self.batch.num_samples, dtype=np.int64))

    def stage_destinations(self, index: int) -> np.ndarray:
        """The rank that runs every item of stage `index` in its micro-batch, over the whole step's items
        (global segment order for an encoder stage, samples for the LLM)."""
        index = as_index(index, "index", len(self.stages), "the number of stages")
        stage = self.stages[index]
        if self.num_microbatches == 1:
            return self.microbatches[0].stage_plans[index].destination
        if stage.is_llm:
            return self.cells.rank
        destination = np.full(self.batch.num_segments, -1, dtype=np.int64)
        for segments, plan in zip(self.microbatch_segments, self.microbatches):
            stage_plan = plan.stage_plans[index]
            destination[segments[stage_plan.item_segment]] = stage_plan.destination
        return destination[self.batch.segments_of(stage.modality)]

    def digest(self) -> str:
        """SHA-256 of the cells and of every micro-batch's plan: equal on ranks that computed the same plan."""
        if self.cells is None:
            return self.microbatches[0].digest()
        digest = hashlib.sha256(self.cells.digest().encode())
        for plan in self.microbatches:
            digest.update(plan.digest().encode())
        return digest.hexdigest()

    def built(self) -> StepPlan:
        """This plan, with every pass's routes and its stages' rank layouts built now.  `Orchestrator.plan` costs a
        step without them and builds each on its first read (`orchestrator.lazy`), so a step that is only costed
        (a search, the simulator) never pays for them; call `built()` where the plan is made when they are read
        elsewhere, e.g. in a planning thread whose plans the training loop runs, so that the loop does not build
        them (`MultiStageRuntime.plan` builds its routes inside the call, `Prefetcher`'s thread included)."""
        for plan in self.microbatches:
            for part in (plan, *plan.stage_plans):
                build_fields(part)
        return self

    def input_exchange(self) -> Exchange:
        """The fused input exchange of the whole step: every segment's raw input and every sample's
        text straight to the rank that runs it in its micro-batch, in one all-to-all."""
        parts = [plan.input_exchange() for plan in self.microbatches]
        if len(parts) == 1:
            return parts[0]
        return Exchange("input", np.concatenate([part.source for part in parts]),
                        np.concatenate([part.destination for part in parts]),
                        np.concatenate([part.item_bytes for part in parts]))

    def embedding_exchanges(self) -> tuple[Exchange, ...]:
        """One embedding exchange per micro-batch (encoder rank -> LLM rank of the sample)."""
        return tuple(plan.embedding_exchange() for plan in self.microbatches)


def moved_bytes(step: StepPlan, gpus_per_node: int) -> tuple[float, float]:
    """(bytes that leave their node, bytes that leave their rank) over the step's input exchange and embedding
    exchanges: the locality objective of a whole step, compared lexicographically as the balancers' passes are."""
    node = rank = 0.0
    for exchange in (step.input_exchange(), *step.embedding_exchanges()):
        exchange_node, exchange_rank = moved(exchange.destination,
                                             Origins(exchange.source, exchange.item_bytes, gpus_per_node))
        node, rank = node + exchange_node, rank + exchange_rank
    return node, rank


def within_slack(step: StepPlan, plain: StepPlan, makespan_slack: float) -> bool:
    """Whether `step` costs at most (1 + makespan_slack) times `plain` (the same batch's step with no placement)."""
    return step.step_cost <= plain.step_cost * (1.0 + makespan_slack)


def least_moving(steps: tuple[StepPlan, ...], makespan_slack: float, gpus_per_node: int) -> StepPlan:
    """Of a communication-aware step `steps[0]` and the same batch's steps planned otherwise (the last one with no
    placement: the plain step), the first unless another moves fewer bytes (`moved_bytes`) at no higher step cost,
    or it is not `within_slack` of the plain step; then the one of those (of those within the slack) moving the
    fewest bytes (the lower step cost, then the earlier, on ties).  Each stage keeps its own items near their
    anchors, so a stage's saving can cost a later stage more (an LLM rank chosen for the text pulls embeddings from
    encoders placed elsewhere), and micro-batched cells re-form the encoders' micro-batches: the whole step is what
    is compared."""
    chosen, plain = steps[0], steps[-1]
    moved = [moved_bytes(step, gpus_per_node) for step in steps]
    if within_slack(chosen, plain, makespan_slack):
        better = [k for k in range(1, len(steps)) if steps[k].step_cost <= chosen.step_cost and moved[k] < moved[0]]
    else:
        better = [k for k in range(1, len(steps)) if within_slack(steps[k], plain, makespan_slack)]
    return steps[min(better, key=lambda k: (moved[k], steps[k].step_cost, k), default=0)]

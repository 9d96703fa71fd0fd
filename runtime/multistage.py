"""Multi-stage runtime: every encoder and the LLM balanced, two exchanges per pass.

Driven by the orchestrator's `StepPlan` (computed identically on every rank from the all-gathered lengths): a step
of M passes, one without a token budget, M gradient-accumulation micro-batches with `max_tokens_per_microbatch=T`
(see `orchestrator.step`), the same M on every rank:

    routes = runtime.plan(local_samples, loss_tokens=...)   # metadata all-gather + plan
    moved = runtime.dispatch(routes, text=..., per_sample=..., inputs={modality: packed}, samples=local_samples)
        # one fused all-to-all for the whole step: raw segment inputs to their encoder rank, text and
        # per-sample tensors to their LLM rank (samples: refuse routes kept from another step)
    for micro in runtime.microbatches(routes, moved):
        with accumulate(model, micro):                       # gradient sync on the last only
            packed = runtime.forward(micro.routes, micro.data, encoders={modality: fn}, text_embedding=fn)
            # encoders run on their balanced items; their outputs go straight to the LLM rank of their
            # sample (Π_M ∘ Π_E⁻¹, one autograd all-to-all whose backward sends the gradients back to
            # the encoder ranks) and are assembled with the text embeddings into this rank's packed LLM sequence
            loss_sum = my_llm(packed.embeddings, packed.sample_lengths) ...
            normalize_loss(loss_sum, micro).backward()       # / loss tokens of the whole step

Model-agnostic: an encoder is any callable `fn(inputs, lengths) -> embeddings`, packed over its items along dim 0
(`lengths[k]` input rows in, `Segment.tokens` rows out); the text embedding any callable on the packed text ids. The
runtime never sees the model. A video (`Segment(frames=F)`: F rides in the metadata all-gather) may run as parts of
whole frames on several encoder ranks (`frames.py`): its encoder is then called on each part as an item of its own,
so it must attend within a frame, and the parts' embeddings reach their LLM ranks in the same exchanges.

The encoder contract: every encoder is called on every rank, with empty inputs (0 rows) where a rank holds none of
its modality, and its output must depend on every trainable parameter there too (run the layers on the empty tensor;
never return early), because DDP and FSDP reduce every parameter's gradient on every rank. The runtime checks it on
each encoder's first call and on every call with empty inputs (`check_encoders`, see `encoders.py`) and raises
`EncoderContractError` on every rank, naming the rank and the parameters.

Cross-rank agreement is checked on every rank: a fingerprint of the stages and options with the first metadata
all-gather (`ConfigMismatchError`, naming the options), the plan's identity and the schema of the dispatched tensors
and of the encoders' outputs before their all-to-alls (`PlanMismatchError`, `SchemaMismatchError`); see
`agreement.py`."""

from __future__ import annotations

import time
import weakref
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..balancers.validation import as_bool, as_int
from ..orchestrator.frames import stage_frames
from ..orchestrator.plan import PassPlan
from ..orchestrator.planner import Orchestrator
from ..orchestrator.samples import Batch, Sample
from ..orchestrator.stages import check_stages
from ..orchestrator.step import StepPlan
from .agreement import SchemaGuard, fingerprint, kept_plan_problem, option_table, plan_word, sites_word
from .alltoall import runtime_transport
from .comm import group_rank, group_size
from .cp_rows import note_epoch
from .encoders import (call_problem, checked_call, contract_problem, output_problem, sharded_problem,
                       unrecorded_problem, unseen_module)
from .exchange import RAW_INPUTS_FIX, ExchangeMeta, Piece, detached_problem, exchange, exchange_with_grad, ranges
from .frames import InputUnits
from .metadata import check_agreement, gather_metadata, join_failed
from .microbatch import MicroBatch, iterate, loop_left, new_step
from .pairing import split_rows
from .prefetch import metadata_group_of
from .routes import (Assembled, Dispatched, PassRoutes, StepInputs, StepRoutes, check_pass, check_step, pass_problem,
                     plan_identity)
from .sample_tables import SAMPLE_COLUMNS, SEGMENT_COLUMNS, sample_tables
from .sharding import TextUnits, pass_layout
from .steps import StepClock, contract_of, plan_runner

_MAKERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # routes -> the runtime that made them (`_runner`)


class MultiStageRuntime:
    """Run a multimodal step with every stage balanced (see module docstring).

    Args:
        stages: orchestrator `Stage`s, encoder stages then the LLM stage.
        group: the data-parallel process group (None: world, or no-op without one).
        transport: `FlatAllToAll(group)` (default) or `HierarchicalAllToAll`.
        check_plan: also all-gather a digest of every rank's step plan; raise on mismatch
            (for time-limited solvers; configuration mismatches are always caught).
        topology: passed to `Orchestrator` (default: one node of the group's size).
        fused_input_exchange: with micro-batches, move the raw inputs of the whole step in one all-to-all before
            the first micro-batch (True, the default), or each micro-batch's inputs just before it runs (False: less
            memory, M exchanges; routes made once then keep one step: `dispatch` has no header to tell the ranks'
            loops apart).
        check_encoders: check the encoder contract (module docstring) on each encoder's and the text embedding's
            first call and on every call with empty input, where an early return would leave parameters out: their
            outputs' autograd graphs must reach every trainable parameter of the module (an `nn.Module`, its bound
            method, or either under functools.partial; other callables, such as a lambda calling the module, are
            refused), else every rank raises `EncoderContractError`, as where outputs need grad on some ranks only
            (the exchange's header says).  False where unused parameters are harmless (gradients reduced by hand,
            DDP with find_unused_parameters): the embedding exchange then records its backward on every rank.
        orchestrator_options: e.g. balance_encoders=False, balance_llm=False (no balancing),
            max_tokens_per_microbatch=T (gradient accumulation: see `microbatches`).
    """

    def __init__(self, stages, *, group=None, transport=None, check_plan: bool = False, topology=None,
                 fused_input_exchange: bool = True, check_encoders: bool = True, **orchestrator_options):
        self.stages = check_stages(stages)
        self.group = group
        self.fused_input_exchange = as_bool(fused_input_exchange, "fused_input_exchange")
        self.transport = runtime_transport(group, transport)  # `group` and it checked
        self.check_plan = as_bool(check_plan, "check_plan")
        self.orchestrator = Orchestrator(self.stages, group_size(group) if topology is None else topology,
                                         **orchestrator_options)
        self.modalities = tuple(stage.modality for stage in self.stages[:-1])
        self.config_options = option_table({  # what every rank must share, by argument name
            "stages": self.stages, **dict(sorted(self.orchestrator.options.items())), "topology": repr(topology),
            "transport": type(self.transport).__name__, "gpus_per_node": getattr(self.transport, "gpus_per_node", None),
            "check_plan": self.check_plan, "fused_input_exchange": self.fused_input_exchange})
        self.config_fingerprint = fingerprint(*self.config_options.items())
        self.guards = {"dispatch": SchemaGuard("dispatch"), "embeddings": SchemaGuard("encoder outputs")}
        self.check_encoders = as_bool(check_encoders, "check_encoders")
        self._checked: set[str] = set()  # the encoders (and the text embedding) whose first call was checked
        self._reached: dict[str, set | None] = {}  # what each one's first checked call with items depended on
        self._yielded: list = []  # (index, weak reference to `micro.data`) of the latest step's micro-batches
        self._clock, self._looped = StepClock(begun=False), None  # the latest loop's step, and its routes
        self._planned, self._exchanged = False, False  # whether it made routes, dispatched some (`_runner`)

    def gather_batch(self, samples: Sequence[Sample], metadata_group=None, loss_tokens=None) -> Batch:
        """All-gather every rank's sample metadata into the global `Batch` (a collective)."""
        return self._gather(samples, metadata_group, loss_tokens)[0]

    def _gather(self, samples, metadata_group, loss_tokens) -> tuple[Batch, int, int]:
        """The global `Batch`, the loss tokens of all its samples and the plan's identity (the same on
        every rank: the configuration and what was gathered), from the metadata all-gathers."""
        group = metadata_group_of(metadata_group, self.group)
        try:
            new_step(planning=True)  # the loop of the step dispatched may still run (a plan made inside it)
            sample_table, segment_table = sample_tables(samples, self.modalities, loss_tokens)
        except (TypeError, ValueError):
            join_failed(group, SAMPLE_COLUMNS)  # the other ranks raise too, instead of waiting in the gather
            raise
        trained = self._clock.step.trained  # whether a loop trained: the model check is due until one did
        gathered_samples = gather_metadata(sample_table, group, num_columns=SAMPLE_COLUMNS,
                                           fingerprint=self.config_fingerprint, what="stage configuration",
                                           options=self.config_options, state=sites_word(
                                               self.guards.values(), trained[0]) if group is self.group else 0)
        if not gathered_samples.state_agreed:  # a runtime built since on some ranks (probe27 P27-08): every rank
            # starts afresh, so the next training loop's model check runs on every rank, not on those ranks alone
            self.guards = {site: SchemaGuard(guard.what) for site, guard in self.guards.items()}
            trained[0] = False
        gathered_segments = gather_metadata(segment_table, group, num_columns=SEGMENT_COLUMNS)
        samples_all, segments_all = gathered_samples.values, gathered_segments.values
        frames = segments_all[:, 4]
        plan_id = plan_word(self.config_fingerprint, gathered_samples.counts, samples_all, gathered_segments.counts,
                            segments_all)
        return Batch.from_arrays(
            num_ranks=int(gathered_samples.counts.size), modalities=self.modalities,
            sample_text=samples_all[:, 0], sample_source=gathered_samples.source_ranks, sample_id=samples_all[:, 2],
            segment_sample=np.repeat(np.arange(samples_all.shape[0], dtype=np.int64), samples_all[:, 1]),
            segment_modality=segments_all[:, 0], segment_length=segments_all[:, 1],
            segment_tokens=segments_all[:, 2], segment_position=segments_all[:, 3],
            segment_frames=frames if np.any(frames > 1) else None), int(samples_all[:, 3].sum()), \
            plan_id

    def plan(self, samples: Sequence[Sample], *, loss_tokens=None, metadata_group=None) -> StepRoutes:
        """Gather metadata, plan every stage, build this rank's routes (a collective).

        With `max_tokens_per_microbatch`, the routes of the step's micro-batches; `loss_tokens` (one count per local
        sample, default its text tokens) ride in the same all-gather and give the step's global loss denominator.
        So does a word of this runtime's state (its exchange sites, whether a loop of it trained): where a runtime was
        built since on some ranks only, every rank starts afresh (the model check runs on every rank at the next
        training loop, as at the first step), instead of that rank alone waiting in it."""
        start = time.perf_counter()
        batch, num_loss_tokens, plan_id = self._gather(samples, metadata_group, loss_tokens)
        step = self.orchestrator.plan(batch)
        if self.check_plan:
            check_agreement(fingerprint(self.config_fingerprint, step.digest()),
                            metadata_group_of(metadata_group, self.group), "step plan")
        return self.routes(step, num_loss_tokens, time.perf_counter() - start, plan_id)

    def routes(self, step: StepPlan, num_loss_tokens: int | None = None, planning_seconds: float = 0.0,
               plan_id: int = 0) -> StepRoutes:
        """This rank's routes for a step plan (pure; no communication); `num_loss_tokens` the loss tokens of the whole
        step on every rank (default: its text tokens).

        `plan_id` is the step's identity, which every exchange of it checks (`plan` derives it from the gathered
        metadata; 0: from the step's batch and this runtime's configuration); the plan itself rides in it too, so
        ranks that planned differently fail the header, not the payload; micro-batch m's routes carry one derived
        from it and m."""
        if not isinstance(step, StepPlan):
            raise TypeError(f"`step` must be a StepPlan (`Orchestrator.plan`); got {type(step).__name__}")
        rank, size = group_rank(self.group), group_size(self.group)
        if step.num_ranks != size:
            raise ValueError(f"step plan is for {step.num_ranks} ranks but the group has {size}")
        batch = step.batch
        num_loss_tokens = int(batch.sample_text.sum()) if num_loss_tokens is None else \
            as_int(num_loss_tokens, "num_loss_tokens", minimum=0)
        if not plan_id:
            plan_id = plan_word(self.config_fingerprint, batch.sample_text, batch.sample_source, batch.segment_length,
                                batch.segment_tokens)
        plan_id = plan_word(plan_id, *plan_identity(step))
        segment_source = batch.sample_source[batch.segment_sample]
        input_units = tuple(InputUnits.of_step(step, index) for index in range(len(self.stages) - 1))
        input_routes = tuple(ExchangeMeta(segment_source[units.segment], units.destination, rank, size, plan_id)
                             for units in input_units)
        microbatches = tuple(self._pass_routes(plan, rank, size, plan_word(plan_id, index))
                             for index, plan in enumerate(step.microbatches))
        units = TextUnits.of_step(step)
        made = StepRoutes(step, rank, microbatches, input_routes, units.route(batch, rank, size, plan_id),
                          int(num_loss_tokens), planning_seconds, units, input_units)
        self._planned = True
        for routes in (made, *microbatches):
            _MAKERS[routes] = self
        return made

    def _runner(self, routes) -> "MultiStageRuntime":
        """The runtime that runs `routes` (`dispatch`, `microbatches`, `forward`): the one that made them or this one
        (`steps.plan_runner`), whatever the options of each: routes carry their plan, and their maker's sites and model
        check are those its peers run (an evaluation runtime without `check_encoders`, given the training routes on
        one rank, owed no check where its peers ran one, and every rank waited until the group's timeout)."""
        return plan_runner(self, _MAKERS.get(routes) if isinstance(routes, (StepRoutes, PassRoutes)) else None)

    @staticmethod
    def _pass_routes(plan: PassPlan, rank: int, size: int, plan_id: int) -> PassRoutes:
        """This rank's exchange routes in one pass of a step."""
        encoder_plans = plan.stage_plans[:-1]
        input_routes = tuple(ExchangeMeta(p.source, p.destination, rank, size, plan_id) for p in encoder_plans)
        pieces = tuple(np.flatnonzero(plan.route_stage == index) for index in range(len(encoder_plans)))
        embedding_routes = tuple(ExchangeMeta(plan.route_encoder_rank[entries], plan.route_llm_rank[entries], rank,
                                              size, plan_id) for entries in pieces)
        units = TextUnits.of_pass(plan)
        return PassRoutes(plan, rank, input_routes, units.route(plan.batch, rank, size, plan_id), embedding_routes,
                          units, pieces)

    def dispatch(self, routes: StepRoutes, *, text: Mapping[str, torch.Tensor],
                 per_sample: Mapping[str, torch.Tensor] | None = None,
                 inputs: Mapping[str, torch.Tensor] | None = None, stats: dict | None = None,
                 samples: Sequence[Sample] | None = None) -> StepInputs:
        """The fused input exchange of the whole step (one all-to-all; none yet without `fused_input_exchange`), to be
        iterated with `microbatches`.

        `text`: per-token tensors packed over this rank's samples (rows = text tokens); `per_sample`: one row per
        sample; `inputs`: modality -> raw inputs packed over this rank's segments of that modality (rows = segment
        lengths); none may require grad (they move without their graph).  Every rank passes the same keys (a
        modality absent locally still needs an empty tensor of the right trailing shape and dtype).  Packed tensors
        have no sample boundaries, so routes kept by every rank from an earlier step go unseen where row totals
        match, unless `samples` gives this rank's samples (as given to `plan`): they are checked against the
        routes', and every rank raises `PlanMismatchError` naming the rank and its first sample that differs.  A new
        step begins at the next `microbatches` after other routes' dispatch, or these where every rank ran a loop
        since the latest (each rank's fact rides in the header); else it is a second dict of the step."""
        if (runner := self._runner(routes)) is not self:
            return runner.dispatch(routes, text=text, per_sample=per_sample, inputs=inputs, stats=stats,
                                   samples=samples)
        check_step(routes, text, per_sample, inputs)
        self._exchanged = True
        ended = None if routes is self._looped else self._clock.step  # a second batch dict of the step ends none
        problem = loop_left(ended) or (None if samples is None else self._samples_problem(routes, samples))
        self._clock.tell(self.guards["dispatch"])  # every rank's, in the fused exchange's header
        moved = self._dispatch_step(routes, text, per_sample, inputs, stats, problem)
        note_epoch(self.group)  # every rank's alike: a context-parallel layout kept from before it is named (`cp_rows`)
        self._clock.dispatched(self.guards["dispatch"], self.group, other=routes is not self._looped)
        return moved

    def _samples_problem(self, routes: StepRoutes, samples) -> Exception | None:
        """Why this rank's `samples` are not those `routes` were planned from (text, segments, id; each segment's
        modality, length, tokens, position, frames: not loss tokens, whose total alone the routes keep), or None."""
        try:
            given = sample_tables(samples, self.modalities)
        except (TypeError, ValueError) as error:
            return error
        batch, home = routes.batch, np.flatnonzero(routes.batch.sample_source == routes.rank)
        segments = batch.segments_of_samples(home)
        samples_problem = kept_plan_problem(routes.rank, given[0][:, :3], np.stack(
            [batch.sample_text[home], np.diff(batch.sample_segment_offsets)[home], batch.sample_id[home]], axis=1),
            "sample", "(text, segments, id)")
        return samples_problem or kept_plan_problem(routes.rank, given[1], np.stack(
            [batch.segment_modality[segments], batch.segment_length[segments], batch.segment_tokens[segments],
             batch.segment_position[segments], stage_frames(batch, segments)], axis=1), "segment",
            "(modality, length, tokens, position, frames)")

    def _dispatch_pass(self, routes: PassRoutes, text, per_sample, inputs, stats, problem=None) -> Dispatched:
        """One pass's input exchange (a micro-batch's, without `fused_input_exchange`)."""
        plan = routes.plan
        result = self._exchange_inputs(routes.text_route, routes.text_units,
                                       np.flatnonzero(plan.batch.sample_source == routes.rank), routes.input_routes,
                                       [stage_plan.item_length for stage_plan in plan.stage_plans[:-1]], text,
                                       per_sample, inputs, stats, problem)
        return Dispatched(result["inputs"], self._input_lengths(routes), result["text"], result["per_sample"], routes)

    def _input_lengths(self, routes: PassRoutes) -> dict:
        """Modality -> the lengths of the segments this rank encodes in the pass (int64 tensors)."""
        return {modality: torch.from_numpy(plan.item_length[route.dest_items].copy())
                for modality, route, plan in zip(self.modalities, routes.input_routes, routes.plan.stage_plans[:-1])}

    def _exchange_inputs(self, text_route: ExchangeMeta, units: TextUnits, home: np.ndarray, input_routes,
                         input_rows, text, per_sample, inputs, stats, problem=None) -> dict:
        """Inputs, text pieces and per-sample tensors (of this rank's `home` samples: a copy to every rank of
        a split sample's group) along their routes in one fused all-to-all (`problem`: this rank's reason not
        to, which every rank raises)."""
        per_sample = {key: units.expand(tensor, home) for key, tensor in (per_sample or {}).items()}
        inputs = dict(inputs or {})
        missing = [m for m, r in zip(self.modalities, input_routes) if m not in inputs and r.num_items]
        problem = problem or (ValueError(f"`inputs` lacks modality {missing[0]!r}, which the global batch contains")
                              if missing else None) or detached_problem(  # every rank raises it, naming this one
            {"inputs": inputs, "text": text, "per_sample": per_sample}, text_route.rank, RAW_INPUTS_FIX)
        copies = units.copies if np.any(units.copies != 1) else 1
        where = {("text", None): (text_route, units.tokens), ("per_sample", None): (text_route, copies)}
        for modality, route, rows in zip(self.modalities, input_routes, input_rows):
            where[("inputs", modality)] = (route, rows)
        pieces, names = [], []
        for kind, tensors in (("inputs", inputs), ("text", text), ("per_sample", per_sample)):
            for key in (self.modalities if kind == "inputs" else sorted(tensors)):
                if key in tensors:
                    route, rows = where[(kind, key if kind == "inputs" else None)]
                    pieces.append(Piece(route, tensors[key], rows, f"{kind}:{key}", kind == "per_sample"))
                    names.append((kind, key))
        moved = exchange(pieces, self.transport, stats, guard=self.guards["dispatch"], problem=problem)
        result = {"inputs": {}, "text": {}, "per_sample": {}}
        for (kind, key), tensor in zip(names, moved):
            result[kind][key] = tensor
        return result

    def _dispatch_step(self, routes: StepRoutes, text, per_sample, inputs, stats, problem) -> StepInputs:
        """Fused: the whole step's inputs in one all-to-all, then split per micro-batch.  Otherwise
        the local tensors split per micro-batch, each exchanged when `microbatches` reaches it."""
        step, batch, count = routes.step, routes.batch, routes.num_microbatches
        sample_microbatch = step.microbatch_of_samples
        units, home = routes.text_units, np.flatnonzero(batch.sample_source == routes.rank)
        if self.fused_input_exchange:
            held = (routes.text_route.dest_items, [route.dest_items for route in routes.input_routes])
            result = self._exchange_inputs(routes.text_route, units, home, routes.input_routes,
                                           [parts.length for parts in routes.input_units],
                                           text, per_sample, inputs, stats, problem)
            sample_rows, sample_parts = units.copies[held[0]], units.microbatch[held[0]]
        else:
            held = (routes.text_route.source_items, [route.source_items for route in routes.input_routes])
            result = {"text": dict(text), "per_sample": dict(per_sample or {}), "inputs": dict(inputs or {})}
            sample_rows, sample_parts = np.ones(home.size, dtype=np.int64), sample_microbatch[home]
        held_units, parts_held = held
        split = {"text": {key: split_rows(tensor, units.tokens[held_units], units.microbatch[held_units], count)
                          for key, tensor in result["text"].items()},
                 "per_sample": {key: split_rows(tensor, sample_rows, sample_parts, count)
                                for key, tensor in result["per_sample"].items()}, "inputs": {}}
        for modality, parts, held_parts in zip(self.modalities, routes.input_units, parts_held):
            if modality in result["inputs"]:
                split["inputs"][modality] = split_rows(result["inputs"][modality], parts.length[held_parts],
                                                       parts.microbatch[held_parts], count)
        parts = [{kind: {key: pieces[index] for key, pieces in split[kind].items()} for kind in split}
                 for index in range(count)]
        if not self.fused_input_exchange:
            return StepInputs(routes, tuple(dict(part, problem=problem) for part in parts), exchanged=False,
                              stats=stats)
        dispatched = tuple(Dispatched(part["inputs"], self._input_lengths(micro), part["text"], part["per_sample"],
                                      micro) for part, micro in zip(parts, routes.microbatches))
        return StepInputs(routes, dispatched, exchanged=True, stats=stats)

    def microbatches(self, routes: StepRoutes, moved: StepInputs):
        """Yield this rank's micro-batches of a dispatched step (`runtime.microbatch.MicroBatch`).

        `micro.routes` and `micro.data` go to `forward`; every rank yields the same number (an empty one included:
        all take part in every collective).  Without the fused input exchange, inputs are exchanged here."""
        if (runner := self._runner(routes)) is not self:
            return runner.microbatches(routes, moved)
        if getattr(moved, "routes", None) is not routes:
            raise TypeError("`microbatches` takes the routes of `plan` and what `dispatch` returned for them")
        size = group_size(self.group)
        new_step()  # on the thread that runs the step (a prefetcher plans on another)
        # layouts wherever this runtime splits or the routes' plan does (routes of another runtime)
        splitting = self.orchestrator.context_parallel is not None or any(p.splits for p in routes.step.microbatches)
        step = self._clock.loop()  # the next after a dispatch of other routes, or of these after every rank's loop
        self._yielded, self._looped = [], routes
        last = routes.num_microbatches - 1  # the last micro-batch's backward reduces gradients
        contract = contract_of(step, np.diff(routes.microbatches[last].plan.shards.rank_offsets), self.group)

        def generate():
            for index, (micro, part) in enumerate(zip(routes.microbatches, moved.parts)):
                data = part if moved.exchanged else self._dispatch_pass(micro, stats=moved.stats, **part)
                self._yielded.append((index, weakref.ref(data)))
                members, shards = routes.step.microbatch_samples[index], micro.plan.shards
                rows = shards.rows_on(routes.rank)  # this rank's LLM samples, or its shards of split ones
                layout = pass_layout(micro.plan, routes.rank, size, members, self.group) if splitting else None
                yield MicroBatch(index, routes.num_microbatches, members[shards.sample[rows]], data,
                                 routes.num_loss_tokens, size, micro, torch.from_numpy(shards.tokens[rows].copy()),
                                 layout, step, contract)
        return iterate(generate())

    def forward(self, routes: PassRoutes, moved: Dispatched, *, encoders: Mapping[str, Callable],
                text_embedding: Callable, text_key: str = "input_ids", stats: dict | None = None) -> Assembled:
        """Encode balanced items, send embeddings to their LLM rank, assemble packed sequences.

        Every encoder is called on every rank, with empty inputs where a rank has no items of its modality, so every
        rank takes part in the embedding exchange and in its backward; its output must depend on every parameter
        there too (the encoder contract, module docstring).  A rank whose encoders break it, or return the wrong
        shape, or whose `moved` is another pass's data than `routes`', is named on every rank before the exchange."""
        if (runner := self._runner(routes)) is not self:
            return runner.forward(routes, moved, encoders=encoders, text_embedding=text_embedding, text_key=text_key,
                                  stats=stats)
        check_pass(routes, moved)
        step = routes.plan
        problem = pass_problem(routes, moved)
        if problem is None:
            outputs, text_embedded, problems = self._encode(routes, moved, encoders, text_embedding, text_key)
            problem = problems[0] if problems else None
        else:  # every rank raises it at the exchange, without encoding another pass's data
            outputs, text_embedded = [torch.empty(0)] * len(self.modalities), None
        pieces = [Piece(route, tensor, step.route_tokens[entries], f"embeddings:{modality}")
                  for route, tensor, entries, modality in zip(routes.embedding_routes, outputs, routes.embedding_pieces,
                                                              self.modalities)]
        guard = self.guards["embeddings"]  # whether this rank records the exchange's backward rides in its header
        records = torch.is_grad_enabled() and (not self.check_encoders or any(out.requires_grad for out in outputs))
        guard.tell(False, records)
        arrived = exchange_with_grad(pieces, self.transport, stats, guard=guard, problem=problem,
                                     record=not self.check_encoders)  # the checked contract: grads agree
        if guard.records_differ():  # ranks that record it would wait for the others
            raise unrecorded_problem(records, outputs, self.modalities, self.group)
        return self._assemble(routes, text_embedded, arrived, moved)

    def _encode(self, routes: PassRoutes, moved: Dispatched, encoders, text_embedding, text_key):
        """(each encoder's output, the text embedding's, what is wrong with them) of a pass (`forward`): a callable
        missing or not taking the contract's arguments, a broken contract, an output of the wrong shape."""
        problems, outputs, shapes, called = [], [], [], []
        if not (hasattr(encoders, "keys") and hasattr(encoders, "__getitem__")):  # a Mapping, an nn.ModuleDict
            problems.append(TypeError(f"`encoders` must map each modality to its encoder; got "
                                      f"{type(encoders).__name__}"))
            encoders = {}
        for modality, route, plan in zip(self.modalities, routes.input_routes, routes.plan.stage_plans[:-1]):
            what = f"encoder {modality!r}"
            problem = ValueError(f"`encoders` lacks modality {modality!r}") if modality not in encoders else \
                call_problem(what, encoders[modality], "(packed inputs, their lengths)", 2)
            if problem is not None:
                problems.append(problem)
                outputs.append(torch.empty(0))
                continue
            called.append((what, encoders[modality]))
            embedded = self._call(what, encoders[modality], moved.inputs[modality], moved.input_lengths[modality],
                                  problems=problems, num_items=route.dest_items.size)
            shapes.append((what, embedded, int(plan.item_tokens[route.dest_items].sum())))  # a video part: its frames'
            outputs.append(embedded if isinstance(embedded, torch.Tensor) else torch.empty(0))
        text = moved.text.get(text_key)
        problem = call_problem("`text_embedding`", text_embedding, "(token ids)", 1) if text is not None else \
            ValueError(f"`text_key` {text_key!r} is not a key of `micro.data.text` (keys: {sorted(moved.text)})")
        text_embedded, width = None, None
        if problem is None:
            called.append(("`text_embedding`", text_embedding))
            text_items = np.count_nonzero(routes.text_units.tokens[routes.text_route.dest_items])  # text-less chunks
            text_embedded = self._call("`text_embedding`", text_embedding, text, problems=problems,
                                       num_items=int(text_items))
            problem = output_problem("`text_embedding`", text_embedded, len(text), None)
            width = None if problem else text_embedded.shape[1]
        problems += filter(None, [*(output_problem(*shape, width) for shape in shapes), problem])
        if self.check_encoders:  # a lambda hides the module whose contract `_call` checks
            problems += filter(None, (unseen_module(what, function) for what, function in called))
        return outputs, text_embedded, problems

    def _call(self, what: str, function: Callable, *args, problems: list, num_items: int):
        """`function(*args)`, checking the encoder contract (`check_encoders`) on the first call of `what`, its
        first with items (whose reach an empty call must match) and every empty one; a broken contract, or a call
        on FSDP2-sharded parameters outside their module's forward, joins `problems` (raised at the exchange)."""
        try:
            if not self.check_encoders or (what in self._checked and num_items and what in self._reached):
                return function(*args)
            output, unused, reached = checked_call(function, *args, expected=self._reached.get(what))
        except RuntimeError as error:
            problems.append(sharded_problem(what, function, error))
            return None
        self._checked.add(what)
        if num_items and torch.is_grad_enabled():
            self._reached.setdefault(what, reached)
        if unused:
            problems.append(contract_problem(what, group_rank(self.group), num_items, unused))
        return output

    def _assemble(self, routes: PassRoutes, text_embedded: torch.Tensor, arrived: Sequence[torch.Tensor],
                  moved: Dispatched) -> Assembled:
        """Interleave text embeddings and received segment embeddings into packed sequences (private: raw
        tensors carry no pass, so only `forward`, which checks `moved` against `routes`, calls it); the result
        knows `moved.text` and the step's other micro-batches (`Assembled.scatter_text`)."""
        step, rank = routes.plan, routes.rank
        recipe = step.assembly(rank)
        samples, sample_lengths, num_tokens = recipe.samples, recipe.sample_lengths, recipe.num_tokens
        text_source = ranges(recipe.text_buffer_offset, recipe.text_length)
        text_destination = ranges(recipe.text_llm_offset, recipe.text_length)
        destinations = [text_destination]
        for route, entries in zip(routes.embedding_routes, routes.embedding_pieces):
            landed = entries[route.dest_items]
            destinations.append(ranges(step.route_llm_offset[landed], step.route_tokens[landed]))
        destination = np.concatenate(destinations)
        if destination.size != num_tokens:
            raise RuntimeError(f"assembly covers {destination.size} rows of a {num_tokens}-token sequence")
        gather = np.empty(num_tokens, dtype=np.int64)
        gather[destination] = np.arange(destination.size)
        device = text_embedded.device
        text_rows = text_embedded.index_select(0, torch.from_numpy(text_source).to(device))
        combined = torch.cat([text_rows, *[a.to(text_embedded.dtype) for a in arrived]])
        embeddings = combined.index_select(0, torch.from_numpy(gather).to(device))
        if text_source.size != text_embedded.shape[0]:
            raise RuntimeError(f"assembly places {text_source.size} of {text_embedded.shape[0]} text tokens")
        text_positions = np.empty(text_source.size, dtype=np.int64)
        text_positions[text_source] = text_destination
        return Assembled(embeddings, torch.from_numpy(np.array(sample_lengths, dtype=np.int64)).to(device),
                         samples, torch.from_numpy(text_positions).to(device), moved.text,
                         tuple(entry for entry in self._yielded if entry[1]() is not moved))


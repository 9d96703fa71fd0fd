"""Single-stage post-balancing dispatcher: wrap a batch dict, not the model.

    plan = dispatcher.plan(lengths)              # all-gather lengths, same plan on every rank
    balanced = dispatcher.dispatch(batch, plan)  # one fused all-to-all of every tensor
    ... model(balanced) ...
    home = dispatcher.combine(outputs, plan)     # optional: per-item outputs back home

`batch` maps names to tensors packed over this rank's items along dim 0: per-token
tensors (input ids, labels, patches) own `lengths[i]` rows per item, per-item tensors
(listed in `per_item_keys`: sample ids, grid sizes) one row.  After `dispatch` the rank
holds the items the plan gave it, in ascending global index (see `exchange.py`), and
`plan.local_lengths` says how long each is.  With `group=None` or one rank, every call
runs the same path with no communication.

Cross-rank agreement is checked on every rank: the configuration's fingerprint rides with
the lengths all-gather (a mismatch names the options that differ), and the schema of `batch`
(keys, dtypes, trailing shapes, per-item or per-token) and the identity of the plan (a rank
dispatching along an earlier step's plan) ride in the payload all-to-all's header where every
rank is known to hold the plan (`combine` after its agreed dispatch; `dispatch` with `check_plan`, or where
every rank's word of the code it plans with, carried by the lengths all-gather, is the same:
`routes.planner_word`), else in one small all-reduce before it (see `agreement.py`).  An earlier
plan kept by every rank passes them all where each rank's row totals match (packed rows carry no item
boundaries, and a plan used again is also how a second dict of its step or a plan prefetched ahead looks): `dispatch`'s
`lengths=`/`loss_tokens=` (as given to `plan`) check this step's items against the plan's.
One rank dispatching an earlier plan object of the same identity as its peers' fresh one (the configuration
and the gathered lengths and loss tokens, which a plan is a function of) is let pass: it moves the same rows to
the same ranks (sample ids and every other per-item row travel in `batch`, not in the plan); the object only
says whether a step ended at the dispatch (another object) or goes on (the same: a second dict, a plan made
once), so that rank ends its step at its next `microbatches` instead (where every rank ran a loop since the
latest dispatch, as with a plan made once), with the same micro-batches and gradients; a refusal of its own
loop left early then comes from there, on that rank alone.
Every call is a self-contained collective, so a step may call `plan`/`dispatch` once
per micro-batch.  A dispatcher built again on some ranks is found by its first `plan`, whose all-gather carries a
word of every rank's exchange sites (where they differ, every rank starts its sites afresh).  A plan given to
another dispatcher of its group goes through the one that made it where that one has exchanged before or the other
has made no plan (`steps.plan_runner`; of other options, with the other's refusal, raised on every rank): its peers'
headers may ride in the payload, a new site's go in an all-reduce.

With `context_parallel=ContextParallel(...)` the plan may split a giant item over a group of
ranks: its per-token rows travel as zigzag chunks in the same one all-to-all (`sharding.py`),
each rank's micro-batch lists its sequences, shards included, in `micro.layout` (a
`ContextParallelLayout`: `context_parallel_attention(q, k, v, micro.layout)`, unsplit positions
for RoPE from `micro.layout.positions()`), and `combine` puts every chunk back at the item's home.
Per-item rows go to every rank of the group; per-item outputs come home from group rank 0.  A micro-batch's
layout is for its own body (and its recompute): attending with another micro-batch's is a
`ContextParallelError` on every rank of the pair (`cp_rows`).
"""

from __future__ import annotations

import time
import weakref
from typing import Mapping

import numpy as np
import torch
import torch.distributed as dist

from ..balancers import balance
from ..balancers.context_parallel import ContextParallel
from ..balancers.microbatch.api import plan_microbatches
from ..balancers.pipeline import Pipeline
from .agreement import PlanMismatchError, SchemaGuard, fingerprint, option_table, plan_word, sites_word
from .alltoall import runtime_transport
from .carry import split_step
from .comm import collective, comm_device, group_rank, group_size
from .cp_rows import note_epoch
from .dispatch_plan import DispatchPlan, exchanged_by, maker_token
from .exchange import Reference, detached_problem, exchange, exchange_with_grad, grad_mode_problem
from .metadata import check_agreement, gather_metadata, join_failed
from .microbatch import MicroBatch, iterate, loop_left, new_step
from .options import DispatchOptions, as_keys, check_names
from .pairing import in_microbatch_order, merge_rows, split_sums
from .prefetch import metadata_group_of
from .routes import expected_pieces, planner_word, site_pieces
from .sharding import StepSharding, item_groups
from .step_items import items_problem, local_tables, named_by_rank
from .steps import StepClock, contract_of


COMBINE_ORDERS = (None, "local_items", "microbatches")  # what one mapping of outputs may follow (`combine`)


def _checked_plan(plan) -> DispatchPlan:
    """`plan` when it is a `DispatchPlan`; else a TypeError naming what was passed."""
    if not isinstance(plan, DispatchPlan):
        raise TypeError(f"`plan` must be the DispatchPlan that `plan()` returned; got {type(plan).__name__}")
    return plan


class PostBalancingDispatcher:
    """Balance one stage across the ranks of `group` and move its batch accordingly.

    Every argument is checked once, here: `group` and `transport` by `alltoall.runtime_transport`,
    the others into the frozen `self.options` (`runtime.options.DispatchOptions`), which every step
    plans from and every rank fingerprints.

    Args:
        group: the data-parallel process group (None: the world, or no-op without one).
        algorithm, cost, padded, max_tokens_per_rank, time_limit: passed to `balance()`;
            every rank must use the same (a time-limited exact solver can stop at different
            plans on different ranks: with `check_plan`, on by default then, every rank follows rank 0's).
        per_item_keys: batch keys with one row per item; all others have one row per token.
        check_plan: also all-gather a digest of each rank's plan right after planning; where they differ,
            every rank follows the plan of the group's rank 0 under a `time_limit` (one broadcast), else
            raises `PlanMismatchError` naming disagreeing ranks (default: only with a `time_limit`;
            the exchange header compares plans and configurations whatever this says).
        transport: `FlatAllToAll(group)` (default) or `HierarchicalAllToAll(gpus_per_node, group)`.
        max_tokens_per_microbatch: plan the step as gradient-accumulation micro-batches of at
            most this many tokens per rank (`balance_microbatches`; see `runtime.microbatch`
            for the loop); `num_microbatches`, `microbatch_overhead` and
            `microbatch_algorithm` are passed to it.  Replaces `max_tokens_per_rank` and `algorithm`.
        context_parallel: a `ContextParallel` spec: `balance(..., context_parallel=)` (or
            `balance_microbatches`) may split an item over an aligned group of ranks; the
            micro-batches then carry `layout`s.
        pipeline: a `Pipeline`: `balance_microbatches(..., pipeline=)` plans the cells for its
            schedule (micro-batch m runs m-th); needs `max_tokens_per_microbatch`; not with
            `context_parallel`.
    """

    def __init__(self, *, group=None, algorithm: str = "auto", cost=None, padded: bool = False,
                 max_tokens_per_rank: int | None = None, time_limit: float | None = None,
                 per_item_keys=(), check_plan: bool | None = None, transport=None,
                 max_tokens_per_microbatch: int | None = None, num_microbatches: int | None = None,
                 microbatch_overhead: float = 0.0, microbatch_algorithm: str = "auto",
                 context_parallel: ContextParallel | None = None, pipeline: Pipeline | None = None):
        self.group = group
        self.options = DispatchOptions(
            algorithm=algorithm, cost=cost, padded=padded, max_tokens_per_rank=max_tokens_per_rank,
            time_limit=time_limit, per_item_keys=per_item_keys, check_plan=check_plan,
            max_tokens_per_microbatch=max_tokens_per_microbatch, num_microbatches=num_microbatches,
            microbatch_overhead=microbatch_overhead, microbatch_algorithm=microbatch_algorithm,
            context_parallel=context_parallel, pipeline=pipeline)
        self.transport = runtime_transport(group, transport)  # `group` and it checked
        self.config_options = option_table({  # what every rank must share, by argument name
            **dict(self.options.items()), "per_item_keys": list(self.options.per_item_keys),
            "transport": type(self.transport).__name__,
            "gpus_per_node": getattr(self.transport, "gpus_per_node", None)})
        self.config_fingerprint = fingerprint(*self.config_options.items())
        self.guards = {"dispatch": SchemaGuard("dispatch"), "combine": SchemaGuard("combine")}
        self._latest: DispatchPlan | None = None  # the latest dispatch's plan
        self._expected: DispatchPlan | None = None  # the latest plan made on `group`, where known alike (`plan`)
        self._returned: dict = {}  # key -> a weak reference to each tensor the latest plan's dispatches returned
        self._given: dict = {}  # key -> a weak reference to each tensor given to them (`_local_batch`)
        self._carried: PlanMismatchError | None = None  # a refusal of `microbatches` for the next exchange header
        self._planned, self._exchanged = False, False  # whether it made a plan, ran an exchange (`steps.plan_runner`)
        self._token = maker_token(self)  # names it to copies of its plans in this process
        self._clock = StepClock()  # the latest dispatch's step, which its micro-batches carry

    def plan(self, lengths, *, loss_tokens=None, metadata_group=None) -> DispatchPlan:
        """Gather every rank's item lengths and compute the plan (a collective).

        `loss_tokens` (default: `lengths`) are the tokens of each item that count in the
        loss; their sum over every rank rides in the same all-gather and normalises the
        loss of every micro-batch (`normalize_loss(loss_sum, micro)`).  `metadata_group`
        runs the metadata collectives on another group (on a `Prefetcher`'s thread its group is
        the default); the route is still for this dispatcher's group.
        """
        group = metadata_group_of(metadata_group, self.group)
        start = time.perf_counter()
        try:
            new_step(planning=True)  # the loop of the step dispatched may still run (a plan made inside it)
            lengths, losses = local_tables(lengths, loss_tokens)
        except (TypeError, ValueError):
            join_failed(group, 2)  # the other ranks raise too, instead of waiting in the gather
            raise
        planner = balance if self.options.microbatching is None else plan_microbatches
        metadata = gather_metadata(np.hstack([lengths, losses]), group, num_columns=2,
                                   fingerprint=self.config_fingerprint, what="dispatcher configuration",
                                   options=self.config_options, planner=planner_word(self.options, planner),
                                   state=sites_word(self.guards.values(), self._clock.step.trained[0])
                                   if group is self.group else 0)
        microbatch = np.zeros(metadata.num_items, dtype=np.int64)
        count = 1 if self.options.microbatching is None else self.options.microbatching.empty_step_microbatches()
        plan = None
        try:
            if metadata.num_items and self.options.microbatching is not None:
                plan = planner(metadata.column(0), int(metadata.counts.size), self.options.microbatching,
                               **self.options.microbatch_arguments())
            elif metadata.num_items:
                plan = planner(metadata.column(0), int(metadata.counts.size), **self.options.balance_arguments())
        except ValueError as error:  # an item named by its index in the gathered batch: by its rank's, too
            if (renamed := named_by_rank(error, metadata.counts)) is error:
                raise
            raise renamed from error
        digest = plan.digest() if plan else ""
        if self.options.check_plan:
            plan, digest = self._agreed(plan, digest, group)
        if plan is not None and self.options.microbatching is not None:
            microbatch, count = plan.microbatch, plan.num_microbatches
        if metadata.counts.size != group_size(self.group):
            raise ValueError(f"metadata group has {metadata.counts.size} ranks but the dispatcher's group has "
                             f"{group_size(self.group)}")
        first, degree = item_groups(plan, metadata.num_items)
        # the plan itself rides in the route's word: ranks whose solvers stopped at different plans (a
        # wall-clock limit) or kept another step's plan fail the exchange header, never the payload
        words = (self.config_fingerprint, metadata.counts, metadata.values, digest)
        sharding = StepSharding.build(metadata.column(0), metadata.counts, first, degree, microbatch,
                                      group_rank(self.group), lambda digest: plan_word(*words, digest)
                                      if degree.size and degree.max() > 1 else plan_word(*words))
        made = DispatchPlan(metadata, plan, sharding.route, time.perf_counter() - start, microbatch, count, sharding,
                            self.config_fingerprint, self.config_options, self)
        self._planned = True
        if group is self.group:  # made on every rank at this point of `group`'s collectives, the same plan where
            # `check_plan` agreed it or every rank planned with the same code (`routes.planner_word`)
            self._expected = made if self.options.check_plan or metadata.planner else None
            if not metadata.state_agreed:  # a dispatcher built since on some ranks: every rank's sites start afresh,
                # and the model check (due until a loop trained) runs on every rank, not on those alone (rt42)
                self.guards = {site: SchemaGuard(guard.what) for site, guard in self.guards.items()}
                self._clock.step.trained[0] = False
        return made

    def _agreed(self, plan, digest: str, group):
        """(`plan`, its `digest`) where every rank of `group` made the same; else, under a `time_limit` (an exact
        solver that the wall clock stopped at different plans on different ranks), the plan of the group's rank 0,
        which every rank then follows (one broadcast, on this path only), and its digest; without one,
        `PlanMismatchError` on every rank."""
        try:
            check_agreement(fingerprint(self.config_fingerprint, digest), group)
            return plan, digest
        except PlanMismatchError:
            if self.options.time_limit is None:
                raise
        shared = [plan]
        with collective("plan broadcast (time-limited solvers stopped at different plans)", group):
            dist.broadcast_object_list(shared, src=0 if group is None else dist.get_global_rank(group, 0), group=group,
                                       device=comm_device(group))
        return shared[0], shared[0].digest() if shared[0] else ""

    def _move(self, batch: Mapping[str, torch.Tensor], sharding: StepSharding, per_item_keys,
              site: str, differentiable: bool, problem: Exception | None = None,
              sums: frozenset = frozenset(), expected: DispatchPlan | None = None) -> dict[str, torch.Tensor]:
        """Move `batch` out along the plan's route (`site` "dispatch") or home along its inverse ("combine")
        (`routes.site_pieces`; keys in `sums` come home added, `split_reduce`); `expected`: the plan every rank
        knows every rank was to follow (`routes`), whose pieces carry the header, or None."""
        if not isinstance(batch, Mapping):
            raise TypeError(f"`batch` must be a mapping of names to tensors; got {type(batch).__name__}")
        home = site == "combine"
        check_names(batch, f"{'outputs' if home else 'batch'}` keys must be str names")
        keys = sorted(batch)
        pieces = site_pieces(batch, keys, sharding, per_item_keys, home, sums)
        reference = None if expected is None else Reference(expected.route.plan_id, expected_pieces(
            expected.sharding, home, comm_device(self.group)))
        # differentiable: every rank runs the reverse exchange, also one whose tensors need no gradient (probe55)
        move = exchange_with_grad if differentiable else exchange
        self._exchanged = True
        carried, self._carried = self._carried, None  # every rank raises it here (`_followed`)
        guard, records = self.guards[site], differentiable and torch.is_grad_enabled()  # as `move` records a node
        if home:  # whether this rank records rides in the header, at a dispatch beside the step clock's fact
            guard.tell(False, records)
        else:
            self._clock.tell(guard, records)
        moved = move(pieces, self.transport, guard=guard, problem=carried or problem, reference=reference)
        if guard.records_differ():  # the recording ranks would wait in their backward's reverse exchange
            raise grad_mode_problem(site, records, self.group)
        note_epoch(self.group)  # a collective: a context-parallel layout kept from before it is named (`cp_rows`)
        return {key: sharding.home_sums(tensor) if key in sums else tensor for key, tensor in zip(keys, moved)}

    def dispatch(self, batch: Mapping[str, torch.Tensor], plan: DispatchPlan, *, lengths=None, loss_tokens=None,
                 differentiable: bool = False) -> dict[str, torch.Tensor]:
        """Move every tensor of `batch` to the ranks the plan assigns its items (one all-to-all).

        Every rank must pass the same keys, dtypes and trailing shapes, and this step's plan; otherwise every
        rank raises `SchemaMismatchError` or `PlanMismatchError` naming the ranks that differ (a plan kept from an
        earlier step by some ranks included).  A packed batch has no item boundaries, so a plan kept by every
        rank goes unseen where each rank's row totals match, unless `lengths` gives this rank's item lengths (as
        given to `plan`): they are then checked against the plan's, and every rank raises `PlanMismatchError`
        naming the rank and its first item that differs; `loss_tokens` (as given to `plan`) are checked the
        same way (a plan of the same lengths but other loss tokens scales the loss).
        `microbatches` and `combine` then take this plan (the latest dispatch's); dispatching it again (a second batch
        dict of the step) stays in its step, which the next plan's dispatch ends (refused on every rank where this
        thread left the step's loop before its last micro-batch, its gradient sync held), or, where the plan is
        dispatched again after the step's loop (a plan made once), the next `microbatches`.  `differentiable=True` lets
        gradients of the results flow back to the inputs (a tensor that requires grad is refused without it); the
        backwards of its `microbatches` run the reverse exchange once, in the last one's, with every micro-batch's
        gradient (`runtime.carry`): the last micro-batch's loss must reach its rows on every rank (an empty one's
        too), and its backward runs last.  Ranks dispatching in other grad modes, or `differentiable`s, all raise.
        """
        if (owner := exchanged_by(self, _checked_plan(plan), "dispatch")) is not self:
            return owner.dispatch(batch, plan, lengths=lengths, loss_tokens=loss_tokens, differentiable=differentiable)
        problem = ((None if plan is self._latest else loop_left(self._clock.step))
                   or self._foreign_problem(plan, "dispatch") or items_problem(plan, lengths, loss_tokens)
                   or (None if differentiable else detached_problem({"batch": batch}, plan.route.rank)))
        moved = self._move(batch, plan.sharding, self.options.per_item_keys, "dispatch", differentiable, problem,
                           expected=self._expected)
        if plan is not self._latest:
            self._latest, self._returned, self._given = plan, {}, {}
            self._clock.end()
        else:  # the step's plan again: a plan made once (the next step), or a second batch dict of the step
            self._clock.dispatched(self.guards["dispatch"], self.group)
        self._returned.update((key, weakref.ref(tensor)) for key, tensor in moved.items())
        self._given.update((key, weakref.ref(value)) for key, value in batch.items() if isinstance(value, torch.Tensor))
        return moved

    def _foreign_problem(self, plan: DispatchPlan, call: str) -> PlanMismatchError | None:
        """Why `call` may not take `plan`: one made by a dispatcher of other options, whose layout,
        micro-batches or keys are not this one's; or None."""
        if plan.config_fingerprint == self.config_fingerprint:
            return None
        theirs, ours = plan.config_options, self.config_options
        names = [name for name in dict.fromkeys([*theirs, *ours]) if theirs.get(name) != ours.get(name)]
        detail = "; ".join(f"`{name}` {theirs.get(name, '(absent)')!r} there, {ours.get(name, '(absent)')!r} here"
                           for name in names) or "their reprs agree (another orchmllm version?)"
        return PlanMismatchError(f"{call} on rank {plan.route.rank}: the plan was made by a dispatcher with other "
                                 f"options ({detail}); pass {call} the plans of this dispatcher's own `plan()`")

    def _kept_problem(self, plan: DispatchPlan, call: str) -> PlanMismatchError | None:
        """Why `call` may not follow `plan`: one made by a dispatcher of other options, or another plan
        than the latest dispatch's (one kept from an earlier step); or None."""
        foreign = self._foreign_problem(plan, call)
        if foreign is not None or self._latest is None or plan.route.plan_id == self._latest.route.plan_id:
            return foreign
        return PlanMismatchError(
            f"{call} on rank {plan.route.rank}: the plan is not the one the latest dispatch followed "
            f"({plan.route.plan_id & (2**64 - 1):016x} vs {self._latest.route.plan_id & (2**64 - 1):016x}); pass "
            f"{call} the plan of the step you dispatched: a plan kept from an earlier step, or a later step "
            f"dispatched first? (a dispatcher holds one step in flight; to overlap steps, alternate two dispatchers)")

    def _followed(self, plan: DispatchPlan, moved) -> DispatchPlan:
        """The plan `microbatches` follows: `plan`, unless `_kept_problem` refuses it (kept from another step, or
        another dispatcher's).  `microbatches` runs no collective to tell the peers, which run the latest dispatch's
        micro-batches and would meet this rank in no collective of their model, so where `moved` is what that
        dispatch returned, over several ranks, that dispatch's plan is followed (the micro-batches of the data held)
        and the refusal rides in the header of this dispatcher's next exchange (`dispatch`, `combine`), where every
        rank raises it; otherwise it is raised here, on this rank alone."""
        problem = self._kept_problem(plan, "microbatches")
        if problem is None:
            return plan
        held = bool(moved) and all(  # a mapping of tensors (`_local_batch`)
            key in self._returned and self._returned[key]() is tensor for key, tensor in moved.items())
        if self._latest is None or not held or group_size(self.group) == 1:
            raise problem
        self._carried = problem
        return self._latest

    def _carry(self, problem: PlanMismatchError) -> None:
        """Raise `problem` (another dispatcher's refusal of this one's plan, `exchanged_by`) on every rank in this
        dispatcher's next exchange, unless one is carried already."""
        self._carried = self._carried or problem

    def _local_batch(self, moved) -> None:
        """A TypeError where `moved` is not a mapping of tensors; a ValueError where one of them is a tensor given to
        the latest plan's `dispatch` on this rank (its local batch), not one that dispatch returned: its rows are this
        rank's own items, not the plan's (every rank runs the same loop, so every rank raises)."""
        odd = "" if isinstance(moved, Mapping) else f"; got {type(moved).__name__}"
        odd = odd or next((f"; `moved[{key!r}]` is a {type(tensor).__name__}" for key, tensor in moved.items()
                           if not isinstance(tensor, torch.Tensor)), "")
        if odd:
            raise TypeError(f"`moved` must be the mapping of tensors that `dispatch` returned{odd}")
        mine = {id(reference()) for reference in self._returned.values()}
        given = next((key for key, tensor in moved.items() if id(tensor) not in mine and any(
            reference() is tensor for reference in self._given.values())), None)
        if given is not None:
            raise ValueError(f"`moved[{given!r}]` is a tensor this rank gave `dispatch` (its local batch), not one "
                             f"`dispatch` returned: its rows are this rank's own items, not those the plan gave it; "
                             f"pass `microbatches` what `dispatch` returned (`moved = dispatcher.dispatch(batch, "
                             f"plan)`)")

    def microbatches(self, plan: DispatchPlan, moved: Mapping[str, torch.Tensor]):
        """Yield this rank's micro-batches of a dispatched step (`runtime.microbatch.MicroBatch`).

        Every rank yields the plan's `num_microbatches` (1 without a budget), an empty one with empty tensors, so
        all take part in every collective of every micro-batch.  A plan other than the latest dispatch's (one kept
        from an earlier step) is refused: over several ranks, with `moved` as that dispatch returned it, this rank
        yields the latest dispatch's micro-batches, as its peers do, and every rank raises `PlanMismatchError` at
        this dispatcher's next `dispatch` or `combine` (no collective runs here to tell them sooner); else it raises
        here, on this rank alone.  `micro.data` maps each key to
        the rows of the micro-batch's items, in ascending global index, and `micro.lengths` each item's length:

            for micro in dispatcher.microbatches(plan, moved):
                with accumulate(model, micro):
                    loss_sum = model(micro.data["input_ids"], micro.lengths)  # cu_seqlens from the lengths
                    normalize_loss(loss_sum, micro).backward()
        """
        if (owner := exchanged_by(self, _checked_plan(plan), "microbatches")) is not self:
            return owner.microbatches(plan, moved)
        new_step()  # on the thread that runs the step (a prefetcher plans on another)
        self._local_batch(moved)
        plan = self._followed(_checked_plan(plan), moved)
        step = self._clock.loop()  # loops without a dispatch between them (a no-grad pass, epochs) are one step
        items, tokens = plan.local_items, plan.local_lengths
        microbatch = plan.item_microbatch[items]
        count, size = plan.num_microbatches, group_size(self.group)
        rows = {key: np.ones(items.size, dtype=np.int64) if key in self.options.per_item_keys else tokens
                for key in moved}
        parts, step.carried = split_step(moved, rows, microbatch, count)  # differentiable: one reverse exchange
        layout = (lambda index: None) if self.options.context_parallel is None else \
            (lambda index: self._microbatch_layout(plan, index))
        last = plan.route.dest_ranks[plan.item_microbatch[plan.sharding.unit_item] == count - 1]
        contract = contract_of(step, np.bincount(last, minlength=size), self.group)
        step.empty = frozenset(range(count)) - frozenset(microbatch.tolist())  # a loop may skip those
        return iterate(MicroBatch(index, count, items[microbatch == index],
                                  {key: parts[key][index] for key in sorted(parts)}, plan.num_loss_tokens, size,
                                  lengths=torch.from_numpy(tokens[microbatch == index]), layout=layout(index),
                                  step=step, contract=contract)
                       for index in range(count))

    def _microbatch_layout(self, plan: DispatchPlan, index: int):
        """Micro-batch `index`'s layout, as the loop reaches it: every rank of the group yields every micro-batch
        in order, so each begins a layout epoch alike (`cp_rows`), and a layout of another micro-batch of the step
        used in it swaps its header where its peers swap theirs (named on both ranks, never read as keys)."""
        note_epoch(self.group, collective=False)  # a rank that listed the step's micro-batches alone counts more
        return plan.sharding.layout(index, self.group)

    def combine(self, outputs, plan: DispatchPlan, *, per_item_keys=None, split_reduce=None, order=None,
                differentiable: bool = True) -> dict[str, torch.Tensor]:
        """Send per-item or per-token outputs of the balanced items back to their home ranks.

        `outputs` is either a list of `(micro, mapping)` pairs, one per micro-batch in any order, each
        mapping with the rows of its micro-batch's items in the order of `micro.data` (what a micro-batch
        loop collects: `outputs.append((micro, {"score": model(micro.data)}))`), or one mapping whose rows
        follow `plan.local_items` (the order of what `dispatch` returned, not the micro-batches' one after
        the other).  Where this rank's items come in another order micro-batch by micro-batch, one
        mapping must say its `order`: "local_items", or "microbatches" (each micro-batch's rows, as in
        `micro.data`, one micro-batch after the other); without it every rank raises ValueError.  A bare
        list of mappings is taken with one micro-batch only: with several, nothing in the outputs says
        which micro-batch each is (a list in another order, of equal row counts, would go home to the
        wrong items), so every rank raises ValueError naming the pairs.
        `plan` is the latest dispatch's (else every rank raises `PlanMismatchError`).
        `per_item_keys` (default: the dispatcher's) name the outputs with one row per item.

        A split item (context parallelism) has a per-item row on every rank of its group, each computed
        from that rank's shard: where the plan splits one, `split_reduce` says for each per-item output
        what comes home, "sum" (the group's rows added: a score summed over the item's tokens; gradients
        flow to every row) or "first" (group rank 0's: a value the group agrees on, an id or an
        all-reduced score); one name for all, or a mapping key -> name.  Without it every rank raises
        ValueError naming the item, never a partial row.

        `differentiable` (the default): gradients of what comes home flow back to the outputs through one
        reverse all-to-all, which every rank's backward runs, so every rank's loss must reach its combined
        rows where any rank's does, a rank with no home items too (e.g. `home[key].sum() * 0`, not parameters
        times 0; else its peers wait in that exchange until the group's timeout); False for outputs that take
        no gradient (logged scores).  Ranks running it in other grad modes, or `differentiable`s, all raise.
        """
        if (owner := exchanged_by(self, _checked_plan(plan), "combine")) is not self:
            return owner.combine(outputs, plan, per_item_keys=per_item_keys, split_reduce=split_reduce, order=order,
                                 differentiable=differentiable)
        per_item, keying = self.options.per_item_keys, None
        try:  # a str was a set of its letters (probe29 P29-06: outputs home to other items where rows matched)
            per_item = per_item if per_item_keys is None else as_keys(per_item_keys)
        except TypeError as error:
            keying = error
        ordering = None if order in COMBINE_ORDERS else ValueError(f"`order` must be None or one of "
                                                                   f"{COMBINE_ORDERS[1:]}; got {order!r}")
        problem = self._kept_problem(_checked_plan(plan), "combine") or ordering or keying
        outputs, merging = (self._ordered(outputs, plan, per_item, order) if isinstance(outputs, Mapping)
                            else self._merged(*in_microbatch_order(outputs, plan, self._clock.step), plan, per_item))
        problem = problem or merging
        keys = sorted((key for key in outputs if key in per_item), key=str)
        sums, reducing = split_sums(split_reduce, keys, plan.sharding)
        return self._move(outputs, plan.sharding, per_item, "combine", differentiable, problem or reducing, sums,
                          self._latest)

    @classmethod
    def _ordered(cls, outputs: Mapping, plan: DispatchPlan, per_item, order) -> tuple[dict, Exception | None]:
        """One mapping of outputs (`combine`) in `plan.local_items` order, from the `order` its rows follow,
        and why it cannot be (None when it can): an order left unsaid where the two differ."""
        microbatch = plan.item_microbatch[plan.local_items]
        if order == "local_items" or bool(np.all(np.diff(microbatch) >= 0)):  # the orders agree: one micro-batch
            return dict(outputs), None  # after the other is already item order
        if order is None:
            return dict(outputs), ValueError(
                f"`outputs` is one mapping, but rank {plan.route.rank}'s items come in another order micro-batch by "
                f"micro-batch ({len(microbatch)} items over {plan.num_microbatches} micro-batches) than in "
                f"`plan.local_items`: pass the list of each micro-batch's outputs, or say the mapping's `order`: "
                f"'microbatches' (their rows one after the other) or 'local_items' (what `dispatch` returned)")
        parts = [{} for _ in range(plan.num_microbatches)]
        for key, tensor in outputs.items():
            rows = np.ones(microbatch.size, dtype=np.int64) if key in per_item else plan.local_lengths
            sizes = [int(rows[microbatch == m].sum()) for m in range(plan.num_microbatches)]
            if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0 or tensor.shape[0] != sum(sizes):
                return dict(outputs), ValueError(f"`outputs[{key!r}]` must hold {sum(sizes)} rows (this rank's "
                                                 f"micro-batches' rows one after the other)")
            for part, piece in zip(parts, tensor.split(sizes)):
                part[key] = piece
        return cls._merged(parts, None, plan, per_item)

    @staticmethod
    def _merged(parts, problem: Exception | None, plan: DispatchPlan, per_item) -> tuple[dict, Exception | None]:
        """The outputs of each micro-batch (`combine`), in micro-batch order, as one mapping in `plan.local_items`
        order, and why they do not fit the plan's micro-batches (`problem`: found before; None when they fit)."""
        if problem is not None:
            return dict(parts[0]), problem
        odd = next((index for index, part in enumerate(parts) if set(part) != set(parts[0])), None)
        if odd is not None:
            return dict(parts[0]), ValueError(f"`outputs[{odd}]` has keys {sorted(map(str, parts[odd]))} but "
                                              f"`outputs[0]` has {sorted(map(str, parts[0]))}")
        items, merged = plan.local_items, {}
        microbatch = plan.item_microbatch[items]
        for key in parts[0]:
            rows = np.ones(items.size, dtype=np.int64) if key in per_item else plan.local_lengths
            try:
                merged[key] = merge_rows([part[key] for part in parts], rows, microbatch, f"`outputs[m][{key!r}]`")
            except ValueError as error:
                return dict(parts[0]), error
        return merged, None

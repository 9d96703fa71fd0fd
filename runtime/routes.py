"""What the multi-stage runtime hands around in a step: this rank's routes of every pass and of the
whole step, what the input exchange delivered, and the packed LLM input `forward` assembles; and the
pieces a dispatcher's exchange sites move along a step's route, and those every rank expects there.

`dispatch` moves a batch out along the plan's route and `combine` outputs home along its inverse; a split
item's (context parallelism) per-item rows go to every rank of its group and come home as group rank 0's,
or, for keys summed (`split_reduce='sum'`), as every group rank's (`site_pieces`).  A guarded exchange
whose guard expects a plan and a schema (`exchange.Reference`) carries its header in the payload all-to-all
itself: every rank must then send segments of the sizes its peers expect, so a rank that passes other
pieces (another step's plan, another schema, input that fails its checks) sends zeros of the expected
pieces instead (`expected_pieces`), and every rank raises from the headers.  The expected plan must be one
every rank knows to be the same: one every rank followed (the latest dispatch's), one `check_plan` agreed, or
one every rank made with the same `planner_word`, which the metadata all-gather carried before planning.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ..balancers import get_algorithm, get_microbatch_algorithm
from ..balancers.registry import built_in
from ..orchestrator.plan import PassPlan
from ..orchestrator.samples import Batch
from ..orchestrator.step import StepPlan
from .agreement import PlanMismatchError, code_word
from .exchange import ExchangeMeta, Piece
from .frames import InputUnits
from .sharding import TextUnits


@dataclass(frozen=True, eq=False)
class PassRoutes:
    """One pass (micro-batch) of a step plan with the exchange routes this rank uses in it."""

    plan: PassPlan
    rank: int
    input_routes: tuple[ExchangeMeta, ...]  # one per encoder stage
    text_route: ExchangeMeta  # text pieces to their LLM rank (a sample's, or a split sample's chunks)
    embedding_routes: tuple[ExchangeMeta, ...]  # encoder rank -> LLM rank, one per encoder stage, over its pieces
    text_units: TextUnits
    embedding_pieces: tuple[np.ndarray, ...]  # the plan's route entries of each encoder stage

    @property
    def batch(self) -> Batch:
        return self.plan.batch


@dataclass(frozen=True, eq=False)
class StepRoutes:
    """A step plan with this rank's routes: one `PassRoutes` per micro-batch, and the whole
    step's input routes (every item, or a video's frame parts, straight to the rank that runs it in
    its micro-batch) for the fused input exchange."""

    step: StepPlan
    rank: int
    microbatches: tuple[PassRoutes, ...]
    input_routes: tuple[ExchangeMeta, ...]  # one per encoder stage, over its `input_units`
    text_route: ExchangeMeta  # the step's text pieces to their LLM rank
    num_loss_tokens: int  # loss tokens of the whole step on every rank
    planning_seconds: float  # `plan`'s wall time: the metadata all-gathers and the step's plan (not these routes)
    text_units: TextUnits
    input_units: tuple[InputUnits, ...]  # one per encoder stage: its segments, or their frame parts

    @property
    def batch(self) -> Batch:
        return self.step.batch

    @property
    def num_microbatches(self) -> int:
        return len(self.microbatches)


@dataclass(frozen=True, eq=False)
class Dispatched:
    """What the input exchange delivered to this rank for one pass, whose `routes` `forward` takes with it."""

    inputs: dict  # modality -> packed raw inputs of the segments this rank encodes
    input_lengths: dict  # modality -> int64 tensor of their lengths (encoder units)
    text: dict  # name -> packed per-token tensors of this rank's LLM samples
    per_sample: dict  # name -> one row per LLM sample of this rank
    routes: PassRoutes  # the pass it was dispatched for


@dataclass(frozen=True, eq=False)
class StepInputs:
    """What `dispatch` returned for a step: per micro-batch, its `Dispatched` (fused exchange
    done) or this rank's local tensors of it (`exchanged` False: moved one by one)."""

    routes: StepRoutes
    parts: tuple
    exchanged: bool
    stats: dict | None = None


@dataclass(frozen=True, eq=False)
class Assembled:
    """This rank's packed LLM input and where its pieces came from."""

    embeddings: torch.Tensor  # (num_tokens, hidden): samples packed in ascending order
    sample_lengths: torch.Tensor  # int64 (num_samples,)
    samples: np.ndarray  # global sample indices, ascending
    text_positions: torch.Tensor  # int64: packed row of every received text token
    text: Mapping  # the pass's `micro.data.text`, which `scatter_text` reads by key
    other_passes: tuple = ()  # (index, weak reference to its `Dispatched`) of the step's other micro-batches

    def scatter_text(self, values, fill) -> torch.Tensor:
        """Place per-text-token `values` (e.g. labels) at their packed rows; `fill` elsewhere.

        `values` is best a key of this micro-batch's `micro.data.text` (`packed.scatter_text("labels", fill)`);
        a tensor must hold its rows, one per text token: another micro-batch's tensor of as many rows is
        refused where it is one `microbatches` yielded (a copy of it cannot be told apart)."""
        if isinstance(values, str):
            if values not in self.text:
                raise ValueError(f"`values` {values!r} is not a key of this micro-batch's `micro.data.text` "
                                 f"(keys: {sorted(self.text)})")
            values = self.text[values]
        count = self.text_positions.numel()
        if not isinstance(values, torch.Tensor) or values.dim() == 0 or values.shape[0] != count:
            got = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values).__name__
            raise ValueError(f"`values` must hold one row per text token of this micro-batch ({count}, as "
                             f"`micro.data.text`'s tensors do), or be a key of it, e.g. 'labels'; got {got}")
        self._check_own(values)
        out = values.new_full((self.embeddings.shape[0], *values.shape[1:]), fill)
        return out.index_copy(0, self.text_positions, values)

    def _check_own(self, values: torch.Tensor) -> None:
        """ValueError where `values` shares its storage with a text tensor of another micro-batch of the step."""
        if not values.numel():
            return
        storage = values.untyped_storage().data_ptr()
        for index, ref in self.other_passes:
            other = ref()
            for key, tensor in ({} if other is None else other.text).items():
                if tensor.numel() and tensor.untyped_storage().data_ptr() == storage:
                    raise ValueError(f"`values` is micro-batch {index}'s `micro.data.text[{key!r}]`, not this "
                                     f"micro-batch's: pass the key, `packed.scatter_text({key!r}, fill)`, which reads "
                                     f"the micro-batch's own")


def plan_identity(step: StepPlan) -> tuple:
    """What tells a step's plan from another of the same gathered metadata (the identity its routes carry): the
    cells and every stage's destinations (routes follow from them), or with split items the whole digest (degrees,
    parts, pieces).  The destinations hash in a fifth of the digest's time."""
    if any(plan.splits for plan in step.microbatches):
        return (step.digest(),)
    cells = () if step.cells is None else (step.cells.rank, step.cells.microbatch)
    return (*cells, *(plan.destination for micro in step.microbatches for plan in micro.stage_plans))


def check_step(routes, text, per_sample, inputs) -> None:
    """TypeError unless `MultiStageRuntime.dispatch` got the step's routes (what `plan` returned) and mappings
    of names to tensors (`per_sample` and `inputs` may be None)."""
    if not isinstance(routes, StepRoutes):
        raise TypeError(f"`routes` must be what `plan` returned for this step, a StepRoutes; "
                        f"got {type(routes).__name__}")
    for name, value in (("text", text), ("per_sample", per_sample), ("inputs", inputs)):
        if not isinstance(value, Mapping) and (value is not None or name == "text"):
            raise TypeError(f"`{name}` must be a mapping of names to tensors{'' if name == 'text' else ' or None'}; "
                            f"got {type(value).__name__}")


def check_pass(routes, moved) -> None:
    """TypeError unless `routes` and `moved` are a micro-batch's routes and data (`micro.routes`, `micro.data`),
    what `MultiStageRuntime.forward` takes (the step's `StepRoutes` or `StepInputs` are the natural slip)."""
    for name, value, kind, source in (("routes", routes, PassRoutes, "micro.routes"),
                                      ("moved", moved, Dispatched, "micro.data")):
        if not isinstance(value, kind):
            step = " (the whole step's: pass a micro-batch's, from `runtime.microbatches`)" \
                if isinstance(value, (StepRoutes, StepInputs)) else ""
            raise TypeError(f"`{name}` must be a micro-batch's `{source}`, a {kind.__name__}; got "
                            f"{type(value).__name__}{step}")


def pass_problem(routes: PassRoutes, moved: Dispatched) -> PlanMismatchError | None:
    """Why `moved` may not go with `routes` in `forward` (None when it may): it was dispatched for another
    pass, whose samples would be packed at `routes`' boundaries."""
    if moved.routes is routes:
        return None
    return PlanMismatchError(f"forward on rank {routes.rank}: `moved` was dispatched for other routes than `routes` "
                             f"(another micro-batch's or another step's); pass forward one micro-batch's "
                             f"`micro.routes` and `micro.data`")


PACKAGE = __name__.split(".")[0] + "."  # the module names of orchmllm's own functions
# the name of a key whose split item's rows come home added (ranks that keep one differ)
SUMMED = " (split_reduce='sum')"


def planner_word(options, planner) -> int:
    """What this rank plans with under these `DispatchOptions`, for the metadata all-gather (`gather_metadata`'s
    `planner`): `agreement.code_word()` where a plan is a function of the gathered metadata and of that code alone,
    made by `planner` (the function the dispatcher calls) from orchmllm's own code, with one of its own algorithms
    that no clock stops (no `time_limit`, not an exact one); else 0.  Where every rank sends the same nonzero word,
    every rank knows before planning that every rank makes the same plan, which may then size the payload
    all-to-all that carries the exchange header; a plugin, a planner replaced at run time, another orchmllm
    checkout, numpy or host may plan otherwise (probe24 P24-01: an all-to-all sized by unequal plans aborts in gloo
    and hangs in NCCL), so their plans keep the header all-reduce, which names the ranks that differ."""
    if options.time_limit is not None or not getattr(planner, "__module__", "").startswith(PACKAGE):
        return 0
    record = (get_algorithm(options.algorithm) if options.microbatching is None
              else get_microbatch_algorithm(options.microbatch_algorithm))
    return code_word() if built_in(record) and not record.exact else 0


def site_rows(sharding, home: bool, per_item: bool, summed: bool):
    """Rows per unit of a key moved out (`home` False) or home: per token, per item (a row for every rank of a
    split item's group), or home from group rank 0 alone (per item, not `summed`); an int 1 for per-item keys
    where nothing is split."""
    if not per_item:
        return sharding.item_rows(False)
    return sharding.item_rows(True, True) if home and not summed else sharding.item_rows(True)


def site_pieces(batch, keys, sharding, per_item_keys, home: bool, sums=frozenset()) -> list[Piece]:
    """The pieces of `batch[key]` for `keys`, out along `sharding`'s route or home along its inverse."""
    route = sharding.route.inverse() if home else sharding.route
    pieces = []
    for key in keys:
        per_item = key in per_item_keys
        summed = home and per_item and key in sums
        tensor = batch[key]
        if per_item and not summed:
            tensor = sharding.first_copies(tensor) if home else sharding.copies(tensor)
        pieces.append(Piece(route, tensor, site_rows(sharding, home, per_item, summed), key + SUMMED if summed
                            else key, per_item))
    return pieces


def expected_pieces(sharding, home: bool, device) -> Callable:
    """`exchange.Reference.pieces` of a site along `sharding`'s route (`home`: its inverse): zero pieces of a
    schema, of the rows the site's pieces of that schema would have on this rank (the route built only where
    they are: after a miss)."""

    def pieces(schema) -> list[Piece]:
        route = sharding.route.inverse() if home else sharding.route
        made = []
        for entry in schema:
            per_item = entry.rows_per_item != -1  # a row per item (1), or per group rank of a split one (-2)
            rows = site_rows(sharding, home, per_item, home and per_item and entry.name.endswith(SUMMED))
            count = int(route.item_rows(rows)[route.source_items].sum())
            made.append(Piece(route, entry.zeros(count, device), rows, entry.name, per_item))
        return made
    return pieces

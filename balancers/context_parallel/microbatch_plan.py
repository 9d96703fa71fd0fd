"""The plan of `balance_microbatches(..., context_parallel=)` (`microbatch.py`, whose docstring states the problem):
micro-batches whose items may run split, made from every micro-batch's split plan or from today's plan."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..microbatch.plan import MicroBatchPlan, step_cost
from ..problem import Status
from ..validation import as_index
from .plan import ContextParallelPlan
from .spec import ContextParallel


@dataclass(frozen=True, eq=False, kw_only=True)
class SplitMicroBatchPlan(MicroBatchPlan):
    """A `MicroBatchPlan` whose items may run split: item i runs in micro-batch `microbatch[i]` on
    the `degree[i]` ranks `item_ranks(i)` from `rank[i]`, each spending `item_time[i]` (its unsplit
    cost when the degree is 1); `cell_loads` and `cell_tokens` count it on every rank of its group.
    `passes[m]` is micro-batch m's split plan over its items (ascending; None for an empty one), `passes`
    None when no item is split.
    With no item split it is the `MicroBatchPlan` of the same cells, digest included."""

    degree: np.ndarray
    item_time: np.ndarray
    context_parallel: ContextParallel
    passes: tuple[ContextParallelPlan | None, ...] | None = None

    @property
    def split_items(self) -> np.ndarray:
        """Indices of the items that run split, ascending."""
        return np.flatnonzero(self.degree > 1)

    def item_ranks(self, item: int) -> np.ndarray:
        """The ranks holding item `item`'s shards in its micro-batch, in shard order."""
        item = as_index(item, "item", self.num_items, "num_items")
        return self.rank[item] + np.arange(self.degree[item], dtype=np.int64)

    def items_of(self, rank: int, microbatch: int) -> np.ndarray:
        """Indices of the items with a shard in cell (rank, microbatch), ascending (each an int in range)."""
        rank = as_index(rank, "rank", self.num_ranks, "num_ranks")
        microbatch = as_index(microbatch, "microbatch", self.num_microbatches, "num_microbatches")
        return np.flatnonzero((self.rank <= rank) & (rank < self.rank + self.degree) & (self.microbatch == microbatch))

    def to_json(self) -> dict:
        """The `MicroBatchPlan`'s JSON and every item's degree and per-rank time."""
        return {**super().to_json(), "degree": self.degree.tolist(), "item_time": self.item_time.tolist()}

    def digest(self) -> str:
        """The `MicroBatchPlan` digest, and of the degrees when some item is split."""
        digest = super().digest()
        if not self.split_items.size:
            return digest
        return hashlib.sha256(digest.encode() + self.degree.astype("<i8").tobytes()).hexdigest()


def wrap_unsplit(plan: MicroBatchPlan, spec: ContextParallel, costs: np.ndarray,
                 bound: float | None = None) -> SplitMicroBatchPlan:
    """Today's plan as a split plan of degree 1 everywhere; `bound` (valid for split plans)
    replaces its own when given, and its status then stands only where the step meets it."""
    fields = {name: getattr(plan, name) for name in plan.__dataclass_fields__}
    if bound is not None:
        bound = min(bound, plan.step_cost)
        fields.update(lower_bound=bound, status=Status.OPTIMAL if plan.step_cost == bound else (
            Status.FEASIBLE if plan.status is Status.OPTIMAL else plan.status))
    degree, item_time = np.ones(plan.num_items, dtype=np.int64), np.array(costs, dtype=np.float64)
    degree.setflags(write=False)
    item_time.setflags(write=False)
    return SplitMicroBatchPlan(**fields, degree=degree, item_time=item_time, context_parallel=spec)


def assemble(lengths: np.ndarray, microbatch: np.ndarray, passes: list, num_ranks: int, spec: ContextParallel,
              budget: int, overhead: float) -> SplitMicroBatchPlan:
    """The split plan of the cells: every micro-batch m's items (`microbatch`) as its split plan `passes[m]`
    places them (None for an empty one)."""
    rank = np.empty(lengths.size, dtype=np.int64)
    degree = np.empty(lengths.size, dtype=np.int64)
    item_time = np.empty(lengths.size)
    loads = np.zeros((len(passes), num_ranks))
    tokens = np.zeros((len(passes), num_ranks), dtype=np.int64)
    for m, plan in enumerate(passes):
        if plan is not None:
            items = np.flatnonzero(microbatch == m)
            rank[items], degree[items], item_time[items] = plan.assignment, plan.degree, plan.item_time
            loads[m], tokens[m] = plan.loads, plan.tokens
    microbatch = microbatch.copy()
    for array in (rank, microbatch, degree, item_time, loads, tokens):
        array.setflags(write=False)
    step = step_cost(loads, overhead)
    return SplitMicroBatchPlan(rank=rank, microbatch=microbatch, num_microbatches=len(passes), num_ranks=num_ranks,
                               cell_loads=loads, cell_tokens=tokens, step_cost=step, lower_bound=0.0,
                               status=Status.FEASIBLE, algorithm="context_parallel", max_tokens_per_microbatch=budget,
                               microbatch_overhead=overhead, padded=False, degree=degree, item_time=item_time,
                               context_parallel=spec, passes=tuple(passes))

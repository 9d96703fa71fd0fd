"""`ContextParallelPlan`: a `BalancePlan` whose items may run split over aligned groups of ranks."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..plan import BalancePlan, integral, rounded_down
from ..problem import Problem, Status, token_sums
from ..validation import as_index
from .blocks import groups_disjoint, within_node
from .layout import shards_of
from .spec import ContextParallel


@dataclass(frozen=True, eq=False, kw_only=True)
class ContextParallelPlan(BalancePlan):
    """Where every item runs, at which degree, and what each rank then costs.

    Item i runs on the `degree[i]` ranks `item_ranks(i)` = assignment[i], assignment[i] + 1, ...
    (an aligned block; rank k of it holds zigzag shard k, `layout.py`), each spending
    `item_time[i]` on it (its unsplit cost when the degree is 1).  `loads`, `tokens`,
    `makespan`, `lower_bound` (valid for every plan that may split) and `status` count split
    items on every rank of their group.  With no item split it is the `BalancePlan` of the
    same assignment, digest included.
    """

    degree: np.ndarray
    item_time: np.ndarray
    context_parallel: ContextParallel

    @property
    def split_items(self) -> np.ndarray:
        """Indices of the items that run split (degree above 1), ascending."""
        return np.flatnonzero(self.degree > 1)

    def item_ranks(self, item: int) -> np.ndarray:
        """The ranks holding item `item`'s shards, in shard order."""
        item = as_index(item, "item", self.num_items, "num_items")
        return self.assignment[item] + np.arange(self.degree[item], dtype=np.int64)

    def items_of(self, rank: int) -> np.ndarray:
        """Indices of the items with a shard on `rank` (an int in range), ascending."""
        rank = as_index(rank, "rank", self.num_ranks, "num_ranks")
        return np.flatnonzero((self.assignment <= rank) & (rank < self.assignment + self.degree))

    def on_ranks(self, rank_of_group: np.ndarray) -> ContextParallelPlan:
        """`BalancePlan.on_ranks`, where every split item's group lands on ranks in its order from an aligned
        start, inside a node where it was (its time unchanged), e.g. whole nodes relabelled; else ValueError
        naming the item (a group's ranks cannot be moved apart)."""
        moved = super().on_ranks(rank_of_group)
        ranks, gpus = np.asarray(rank_of_group), self.context_parallel.gpus_per_node
        for item in self.split_items.tolist():
            group, size = self.item_ranks(item), int(self.degree[item])
            landed = ranks[group]
            start = int(landed[0])
            if not (np.array_equal(landed, start + np.arange(size)) and start % size == 0
                    and within_node(start, size, gpus) == within_node(int(group[0]), size, gpus)):
                raise ValueError(f"`rank_of_group` would move split item {item}'s group {group.tolist()} onto ranks "
                                 f"{landed.tolist()}, not an aligned block in order as it was; relabel whole groups "
                                 f"(e.g. nodes) only")
        return moved

    def to_json(self) -> dict:
        """The `BalancePlan`'s JSON (`assignment`: each item's first rank) and every item's degree and
        per-rank time."""
        return {**super().to_json(), "degree": self.degree.tolist(), "item_time": self.item_time.tolist()}

    def digest(self) -> str:
        """SHA-256 of the assignment, and of the degrees when some item is split."""
        if not self.split_items.size:
            return super().digest()
        data = self.assignment.astype("<i8").tobytes() + self.degree.astype("<i8").tobytes()
        return hashlib.sha256(data).hexdigest()


def rank_pairs(start: np.ndarray, degree: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(item, rank) of every shard, in item order then shard order."""
    items = np.repeat(np.arange(start.size), degree)
    offsets = np.arange(items.size) - np.repeat(np.cumsum(degree) - degree, degree)
    return items, start[items] + offsets


def split_times(problem: Problem, spec: ContextParallel, start: np.ndarray, degree: np.ndarray,
                gpus_per_node: int) -> np.ndarray:
    """Each item's per-rank time on its block: f(l) unsplit, `spec.time` of its group split."""
    times = problem.item_costs.copy()
    split = np.flatnonzero(degree > 1)
    inside = within_node(start[split], degree[split], gpus_per_node)
    times[split] = spec.item_times(problem.cost, problem.lengths[split], degree[split], inside)
    return times


def rank_accounts(problem: Problem, spec: ContextParallel, gpus_per_node: int, start: np.ndarray,
                  degree: np.ndarray, item_time: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loads, tokens) per rank of items on blocks (start, degree), degree 0 leaving an item out,
    and every item's per-rank time (`split_times`; `item_time`: those, where the caller has them).

    Loads are summed in item order then shard order, so with no item split they are exactly
    `problem.rank_loads`; a split item puts its layout's shard tokens on each rank.
    """
    if item_time is None:
        item_time = split_times(problem, spec, start, degree, gpus_per_node)
    items, ranks = rank_pairs(start, degree)
    loads = np.bincount(ranks, weights=item_time[items], minlength=problem.num_ranks)
    shards = problem.lengths[items]
    for c in np.flatnonzero(np.bincount(degree[degree > 1])).tolist():  # the split degrees (`np.unique`'s, faster)
        pairs = np.flatnonzero(degree[items] == c)
        shards[pairs] = shards_of(problem.lengths[items[pairs[::c]]], c).ravel()  # the problem's checked lengths
    return loads, token_sums(ranks, shards, problem.num_ranks), item_time


def certify(problem: Problem, spec: ContextParallel, gpus_per_node: int, start: np.ndarray, degree: np.ndarray,
            status: Status, algorithm: str, bound: float, solve_seconds: float = 0.0,
            exact_bound: bool = False, accounts: tuple | None = None) -> ContextParallelPlan:
    """Check a split plan (aligned blocks, in node where required, one group per rank, token
    budget) and wrap it with loads, tokens, the given bound and the status it earns.  The bound is
    lowered by the float error of the plan's load sums (`plan.rounded_down`, as `make_plan` does)
    unless `exact_bound` (a certified plan's own bound, passed through).  `accounts`: the plan's
    `rank_accounts` where the caller has them (the local search's), else computed here.

    A violation is a planner bug, so it raises RuntimeError rather than hand out the plan.
    """
    start = np.ascontiguousarray(start, dtype=np.int64)
    degree = np.ascontiguousarray(degree, dtype=np.int64)
    d = problem.num_ranks
    split = degree > 1
    if (np.any(~np.isin(degree, spec.degrees)) or np.any(start % degree) or start.min() < 0
            or np.any(start + degree > d)):
        raise RuntimeError(f"{algorithm!r} placed an item outside the aligned blocks of degrees {spec.degrees}")
    if not spec.allow_inter_node and not within_node(start[split], degree[split], gpus_per_node).all():
        raise RuntimeError(f"{algorithm!r} put a group across nodes of {gpus_per_node} gpus")
    if not groups_disjoint(start[split], degree[split], d):
        raise RuntimeError(f"{algorithm!r} put a rank in two context-parallel groups")
    loads, tokens, item_time = rank_accounts(problem, spec, gpus_per_node, start, degree) if accounts is None \
        else accounts
    cap = problem.max_tokens_per_rank
    if cap is not None and tokens.max() > cap:
        rank = int(np.argmax(tokens))
        raise RuntimeError(f"{algorithm!r} put {int(tokens[rank])} tokens on rank {rank}, over "
                           f"max_tokens_per_rank={cap}")
    makespan = float(loads.max())
    if not exact_bound:  # an fsum bound, lowered by the float error of the plan's own sums (`rounded_down`)
        bound = rounded_down(float(bound), makespan, d, problem.item_costs, lambda: integral(problem.item_costs))
    bound = min(float(bound), makespan)  # float sums in another order never lift a bound above a plan reached
    if makespan == bound:
        status = Status.OPTIMAL
    for array in (start, degree, item_time, loads, tokens):
        array.setflags(write=False)
    return ContextParallelPlan(assignment=start, loads=loads, tokens=tokens, makespan=makespan, lower_bound=bound,
                               status=status, algorithm=algorithm, num_ranks=d, padded=False, cost=problem.cost,
                               solve_seconds=solve_seconds, degree=degree, item_time=item_time, context_parallel=spec)

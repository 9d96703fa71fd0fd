"""Exact split micro-batches on tiny instances the planner refuses: every grouping of the items, each micro-batch
laid out exactly.

    minimise  Σ_m peak(S_m) + M · overhead  over the set partitions {S_1, ..., S_k} of the items,
              k <= M where `num_microbatches` = M is fixed (the rest empty, their overhead only), else M = k,
    peak(S) = the least peak of the items S in one micro-batch within the budget (`exact.exact_split`)

As plain code: `min(sum(peak(s) for s in p) + m * overhead for p in partitions(items))`.  Each subset's
peak is searched at most a few times, only below what the best step found leaves it (2^n subsets, Bell(n)
partitions: 203 at n = 6); the optimum is proven where every search finished.  The planner's fills group
a micro-batch up to its share of the tokens, so on tiny instances they can miss the grouping that lays out
(probe25 P25-07: [28, 27, 25, 8] on 2 ranks, T = 27, M = 2 was refused, the brute force packs it at step 173;
the free M took 3 micro-batches at 190).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ..microbatch.plan import float_sum
from ..problem import InfeasibleError, Status, make_problem
from .exact import block_options, exact_split
from .microbatch_bound import split_bound
from .plan import certify
from .spec import ContextParallel

EXACT_MAX_ITEMS, EXACT_MAX_RANKS = 6, 8
"""Instances this small get the exact micro-batch search where the planner refuses them."""
SLACK = 1e-9
"""Relative margin below a subset's peak floor (its float sums may round a hair above a plan's)."""


def partitions(num_items: int, most: int):
    """Every set partition of range(num_items) into at most `most` blocks, as block labels per item, each block
    labelled by its first item's order (restricted growth strings).

    >>> list(partitions(3, 2))
    [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    """
    def grow(labels: tuple, blocks: int):
        if len(labels) == num_items:
            yield labels
            return
        for label in range(min(blocks + 1, most)):
            yield from grow(labels + (label,), max(blocks, label + 1))
    yield from grow((), 0)


class _Peaks:
    """The exact pass plan of each subset of the items below a peak asked for (`__call__`), and a lower bound of
    its peak, searched or not (`floor`): max(each item's least time, Σ least work / D), a hair lowered."""

    def __init__(self, lengths: np.ndarray, num_ranks: int, spec: ContextParallel, cost, budget: int):
        self.lengths, self.num_ranks, self.spec, self.cost, self.budget = lengths, num_ranks, spec, cost, budget
        self.plans: dict[tuple, object] = {}
        self.proven = True
        options = block_options(self._problem(list(range(lengths.size))), spec, spec.gpus_per_node)
        self.least_time = [min((t for _, _, t, _ in found), default=math.inf) for found in options]
        self.least_work = [min((c * t for _, c, t, _ in found), default=math.inf) for found in options]

    def _problem(self, items: list):
        return replace(make_problem(self.lengths[items], self.num_ranks, cost=self.cost),
                       max_tokens_per_rank=self.budget)

    def floor(self, items: tuple) -> float:
        work = float_sum([self.least_work[k] for k in items]) / self.num_ranks
        return max(max(self.least_time[k] for k in items), work) * (1 - SLACK)

    def __call__(self, items: tuple, below: float):
        """The exact pass plan of `items` where its peak is below `below` (else None), each subset searched again
        only below a higher `below` than before and where no plan was found (a plan found is the least)."""
        plan, searched = self.plans.get(items, (None, -math.inf))
        if plan is None and below > searched:
            problem = self._problem(list(items))
            start, degree, finished = exact_split(problem, self.spec, self.spec.gpus_per_node, below)
            self.proven &= finished
            plan = None if start is None else certify(problem, self.spec, self.spec.gpus_per_node, start, degree,
                                                      Status.FEASIBLE, "context_parallel", 0.0)
            self.plans[items] = (plan, below)
        return plan if plan is not None and plan.makespan < below else None


def exact_microbatches(lengths: np.ndarray, num_ranks: int, spec: ContextParallel, cost, budget: int,
                       overhead: float, num_microbatches: int | None) -> tuple:
    """((micro-batch of each item, the pass plans (None where empty), step) of the least step (the first partition
    in `partitions`' order on a tie), or None where no grouping lays out; whether that is proven).  A
    micro-batch is searched only below what the best step leaves it after the others' peaks (or floors) and the
    overheads, a hair raised; a partition is left where that is nothing."""
    peaks = _Peaks(lengths, num_ranks, spec, cost, budget)
    best, step_best = None, math.inf
    for labels in partitions(lengths.size, num_microbatches or lengths.size):
        count = max(labels) + 1
        blocks = [tuple(k for k, label in enumerate(labels) if label == m) for m in range(count)]
        known = [peaks.floor(items) for items in blocks] + [(num_microbatches or count) * overhead]
        passes = []
        for m, items in enumerate(blocks):
            room = step_best - float_sum(known[:m] + known[m + 1:])
            plan = peaks(items, room + SLACK * step_best) if room > 0 else None
            if plan is None:
                break
            known[m] = plan.makespan
            passes.append(plan)
        else:
            step = float_sum(known)
            if step < step_best:
                best, step_best = (np.array(labels, dtype=np.int64), passes, step), step
    if best is not None:
        best[1].extend([None] * ((num_microbatches or len(best[1])) - len(best[1])))
    return best, peaks.proven


def exact_or_planned(planned, lengths: np.ndarray, num_ranks: int, spec: ContextParallel, cost, budget: int,
                     overhead: float, num_microbatches: int | None, assemble):
    """`planned()` (a split micro-batch plan), or where it raises InfeasibleError on a tiny instance the exact plan
    (proven optimal where every search finished), that refusal where no grouping lays out.
    `assemble(microbatch, passes)` makes the plan."""
    try:
        return planned()
    except InfeasibleError:
        if lengths.size > EXACT_MAX_ITEMS or num_ranks > EXACT_MAX_RANKS or not lengths.size:
            raise
        found, proven = exact_microbatches(lengths, num_ranks, spec, cost, budget, overhead, num_microbatches)
        if found is None:
            raise
    exact = assemble(*found[:2])
    bound = exact.step_cost if proven else min(exact.step_cost, split_bound(lengths, num_ranks, spec, cost, budget,
                                                                            overhead, num_microbatches)[0])
    return replace(exact, lower_bound=bound, status=Status.OPTIMAL if exact.step_cost == bound else Status.FEASIBLE)

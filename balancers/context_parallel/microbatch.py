"""`balance_microbatches(..., context_parallel=spec)`: micro-batches whose giant items may run split.

Every item i gets a micro-batch m_i and a group of c_i ranks (an aligned block, `blocks.py`):

    minimise  Σ_m max_r L(r, m) + M · overhead,   L(r, m) = Σ_{i in m, r ∈ G_i} t_i(c_i, G_i)
    s.t.      tokens(r, m) = Σ_{i in m, r ∈ G_i} shard_r(l_i, c_i) <= T     (every cell)
              at most one split group per rank per micro-batch

As plain code: `loads[m][r] += t_i` for every rank r of item i's group in its micro-batch,
`step = sum(max(loads[m]) for m in range(M)) + M * overhead`.

Bound: `microbatch_bound.py` (why Σ_m max_r L(r, m) is at least it).
With C = {1} it is today's problem, planned and bounded as today.

Algorithm:

    P = today's plan (`balance_microbatches` without splitting) when every item fits T
    if no item exceeds T or costs more than a micro-batch's mean share Σ f / (D · M_P):  return P
        (bound Σ f / D + ⌈Σ l / (D · T)⌉ · overhead: any plan works at least Σ f)
    if the split bound (a hair lowered) · (1 + min_gain) >= P's step:  return P, no split plan can beat it by
        min_gain (items just over T / 2, probe25 P25-05: 16 micro-batches of one item a rank, 58 pass plans)
    for a fill of 95 %, 90 %, 85 %, 80 %, 70 %, 50 % of a micro-batch's D · T tokens, until every one fits
            and then while the least step of the best and the repaired plan is above the bound by more than 3 %
            (the best kept), until a fill that needs more micro-batches than the best does not beat it:
        micro-batches: items by least time, longest first, fill one micro-batch after another
            within its tokens, its level's work and D ranks held alone (`group_microbatches`)
        each micro-batch: `balance(..., context_parallel=spec, max_tokens_per_rank=T)` (the split
            planner: canonical allotment at its bound, groups on aligned blocks, local search)
        a fill without layout while none has laid out, M not fixed (until one repair lays out): that grouping
            again, its micro-batch without layout spilling items over T to the next and refilled (`repair.py`)
        the first fill, M not fixed: its micro-batch of most items is planned only once the next fill does
            not beat the others' peaks + its pass bound, where those are above the goal (`_deferred`: the 95 %-full
            micro-batch of the long workload, 0.3 s; not planned, it is not known to have a layout to repair);
            a later fill's, not where that sum is above the best or the repaired plan's step (the fill cannot beat
            it), planned in turn only until the peaks found + the others' pass bounds (raised where the packing
            bound proves it, `packing_bound.py`) pass it
    for the fills' best and the repaired plan, the lower step first, the other only where its step is below the
        first's after this, while above the bound by more than 3 %: move items out of the micro-batch furthest
        above its own pass bound into another where both micro-batches' plans lower the step (`regroup.py`); the
        lower step is the best
    with M free and the best still above the bound by more than 3 %: where it is the repaired plan with a micro-batch
        above its own bound by more than RETRY_STACK, the plan of a fixed M (every fill at M planned); then, at most
        RETRY_ITEMS items or the best above the bound by more than RETRY_FAR, of a fixed M + 1, M + 2, ... (empty
        micro-batches dropped) in turn while each lowers the step (`_more_counts`)
    return the best split plan (the fills' on a tie) if it splits and beats P by more than min_gain, else P;
    with M free, no plan and no P: the plan of a fixed M above the fills' (`_more_microbatches`), if one lays out
    with M fixed: never above the free M's plan padded with empty micro-batches (`fewer.py`)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from ..cost import CostModel
from ..microbatch.options import microbatch_options
from ..microbatch.plan import float_sum
from ..origins import as_origins
from ..problem import InfeasibleError, Status, as_lengths, as_num_ranks, as_time_limit, exact_sum, make_problem
from ..validation import as_int, as_real
from .dual_feasible import cannot_lay_out
from .exact_microbatch import exact_or_planned
from .fewer import at_most, within_tokens
from .grouping import group_microbatches, row_least
from .microbatch_plan import SplitMicroBatchPlan, assemble, wrap_unsplit
from .plan import ContextParallelPlan
from .regroup import regroup
from .repair import repaired_grouping
from .spec import ContextParallel
from .bound import Allotment
from .split import balance_split, pass_allotment
from .step_times import StepTimes
from .microbatch_bound import split_bound
from .packing_bound import Pieces, raised_floors

FILLS = (0.95, 0.9, 0.85, 0.8, 0.7, 0.5)
"""Shares of a micro-batch's D · T tokens the grouping fills, tried in turn (the fewest micro-batches
those tokens need, at least today's M): until every micro-batch has a split plan within T, then
while the step (the best's or the repaired plan's) is above the bound by more than RETRY_GAP and no fill
needing more micro-batches than the best lost to it, the least step kept."""
RETRY_GAP = 0.03
"""Share above the bound past which the fills go on, the micro-batch search runs and more counts are tried.  The
repaired plan within it ends the fills as the best does (ties_giant, D = 512 x 16: 5.5x -> 1.7x the default mix, the
same plans on held-out seeds).  A wider stop for the fills alone (15 %: the long workload's step in half the time)
lost up to 14 % on held-out giant mixes (documents, D = 64 x 32, T = 64k: a first plan of 1 micro-batch 1.15x the
bound, 1.01x with the next fill's 2), cxf53's study."""
RETRY_ITEMS = 256
"""Items at most for which a free M above the bound by more than RETRY_GAP tries fixed counts above its own
(`_more_counts`; a speed rule: on probe26's mixes of 16-96 items 55 of 400 plans 0.4-48 % lower in 2.1x the time;
on the benchmark's mixes of 2-16k items 10 of 144 plans 0.1-1.9 % lower in 3.1x, up to 17x)."""
RETRY_STACK = 0.1
"""Share above its own pass bound of a micro-batch's peak past which, where the searched plan is the repaired one,
the free M tries its own count fixed (`_more_counts`, `_stacked`): the search found no move out of that micro-batch,
and the fills at that count were dropped against the repaired plan's step before the search (zeros_giants, seeds
200-229, held out: at D = 512 x 16 6 of 30 steps 3.5-7.0 % lower, the five above 1.10 the bound (1.121-1.128) at
1.049-1.063, the worst 1.128 -> 1.090; at D = 64 2 of 30 1.4-1.5 % lower; no plan changed on the 7 families' seeds
7-37, 11, 41, 101 and 123 at D = 64 and 512, the giant mixes' seeds 100-101 or the long workload's step)."""
RETRY_FAR = 0.08
"""Share above the bound of the searched plan past which the free M tries fixed counts above its own whatever the
items' count (pow2, D = 64 x 16, seeds 304, 305, 309: 1.091-1.104 the bound -> 1.033-1.041 in 5-15x the time; held
out, cxr54: 3 of 384 rows lower (1.081 -> 1.028, 1.081 -> 1.064, 1.056 -> 1.049; 2-3x), none higher)."""
FLOOR_SLACK = 1e-9
"""Relative margin below a deferred fill's bound (its float sums may round a hair above a plan's)."""


def _plan_pass(lengths: np.ndarray, items: np.ndarray, num_ranks: int, spec: ContextParallel, cost,
               budget: int, checked: bool = False, allotment: Allotment | None = None) -> ContextParallelPlan | None:
    """The split plan of `items` in one micro-batch (the split planner within the budget); None when it finds
    no layout within the budget, or when none exists (`dual_feasible.py`: not planned then; a third of the
    passes at T = 16k on the long workload's step, D = 2560 x 16, spill probes above all); `checked`: that
    certificate was judged already (and failed to rule the items out); `allotment`: their `pass_allotment`."""
    if not checked and cannot_lay_out(lengths[items], num_ranks, np.array(spec.degrees, dtype=np.int64), budget):
        return None
    try:
        return balance_split(lengths[items], num_ranks, spec, cost=cost, algorithm="lpt", max_tokens_per_rank=budget,
                             time_limit=None, topology=None, unsupported={}, warn=False, allotment=allotment)
    except InfeasibleError:
        return None


class _PassPlans:
    """`_plan_pass` of each set of items, planned once: fills and the search over the micro-batches often ask
    for the same micro-batch again (the long workload at D = 2560 x 16, T = 64k: 14 plans of 8 sets)."""

    def __init__(self, lengths: np.ndarray, num_ranks: int, spec: ContextParallel, cost, budget: int):
        self.lengths, self.context, self.plans, self.allotments = lengths, (num_ranks, spec, cost, budget), {}, {}
        self.times = StepTimes(lengths, spec, cost)  # the items' times, shared by the sets' allotments and pieces
        self.certified: dict[bytes, bool] = {}  # `certified_none` of each set, judged once
        self.packed: dict[bytes, Pieces] = {}

    def key(self, items: np.ndarray) -> bytes:
        """What a set's plan, bound and certificate depend on: its items' lengths in order (equal lengths in other
        items share them: ties_giant, D = 512, T = 32k, 16 a rank)."""
        return self.lengths[np.asarray(items, dtype=np.int64)].tobytes()

    def __call__(self, items: np.ndarray) -> ContextParallelPlan | None:
        key = self.key(items)
        if key not in self.plans:  # the certificate judged once per set, here or by `certified_none`
            allotment = None if self.certified_none(items) else self.allotment(items)
            self.plans[key] = None if allotment is None else _plan_pass(self.lengths, items, *self.context, True,
                                                                        allotment)
        return self.plans[key]

    def certified_none(self, items: np.ndarray) -> bool:
        """True where `dual_feasible` proves that `items` have no layout in one micro-batch (`self(items)` is None
        then, unplanned); False at once for a set planned with a layout.  Each set judged once (the fills, the
        grouping's plans and the spill's search ask again)."""
        key = self.key(items)
        if self.plans.get(key) is not None:
            return False
        if key not in self.certified:
            num_ranks, spec, _, budget = self.context
            self.certified[key] = cannot_lay_out(self.lengths[items], num_ranks, np.array(spec.degrees, dtype=np.int64),
                                                 budget)
        return self.certified[key]

    def allotment(self, items: np.ndarray) -> Allotment | None:
        """`pass_allotment` of `items`, made once per set for its plan and bound (zeros_giants: 31 sets of 35)."""
        key = self.key(items)
        if key not in self.allotments:
            self.allotments[key] = pass_allotment(self.lengths[items], *self.context, self.times.reader(items))
        return self.allotments[key]

    def bound(self, items: np.ndarray) -> float:
        """The split planner's bound of `items` in one micro-batch, below its plan's peak (0 where it has none),
        made once per set (the fills' deferrals ask for the same sets again: 3 of 10 at T = 64k)."""
        allotment = self.allotment(items)
        return 0.0 if allotment is None else allotment.bound()

    def pieces(self, items: np.ndarray) -> Pieces:
        """`items` in one micro-batch for the packing bound (`packing_bound.py`), made once per `key`."""
        key = self.key(items)
        if key not in self.packed:
            self.packed[key] = Pieces(self.lengths[items], *self.context, self.times.rows(items))
        return self.packed[key]

    def floor(self, items: np.ndarray) -> float:
        """`bound` a hair lowered (FLOOR_SLACK), below the peak of `self(items)` whatever the float rounding."""
        return self.bound(items) * (1 - FLOOR_SLACK)


def _split_cells(lengths, num_ranks, spec, budget, overhead, num_microbatches, ordered, table, room, fixed: bool,
                 plan_pass: _PassPlans, repair: bool = False, defer: float | None = None, refuse: bool = False,
                 packed: bool = False) -> tuple:
    """(the split plan of `num_microbatches` micro-batches (`group_microbatches` of the items `ordered`, then
    the split planner in each, `plan_pass`), or None when some micro-batch finds no layout within the budget;
    with `repair`, the plan of that grouping after its micro-batches without layout spill (`repair.py`), or
    None).  With
    `defer`, a `_Deferred` instead where `_deferred` (early, without `repair`: see there) leaves its micro-batch of
    most items unplanned.  With `refuse` (the caller treats such a fill and one without layout alike), None unplanned
    where the certificate rules out one of its micro-batches (allbig, D = 2560, T = 32k: 20 plans of 2 fills)."""
    microbatch = group_microbatches(ordered, num_ranks, num_microbatches, room)
    if not fixed:  # a micro-batch left empty only costs its overhead
        used, microbatch = np.unique(microbatch, return_inverse=True)
        num_microbatches = used.size
    if refuse and any(plan_pass.certified_none(np.flatnonzero(microbatch == m)) for m in range(num_microbatches)):
        return None, None
    deferred = None if defer is None else _deferred(microbatch, num_microbatches, overhead, plan_pass, defer,
                                                    None if repair else ordered.times, packed)
    if deferred is not None:
        return deferred, None
    return _grouping_planned(lengths, microbatch, num_microbatches, num_ranks, spec, budget, overhead, table,
                             plan_pass, repair)


@dataclass(frozen=True)
class _Deferred:
    """A fill whose micro-batch of most items is not planned yet: its grouping and a lower bound of its step."""

    microbatch: np.ndarray
    num_microbatches: int
    floor: float


def _deferred(microbatch, num_microbatches, overhead, plan_pass, goal: float, times=None,
              packed: bool = False) -> _Deferred | None:
    """The grouping with every micro-batch but that of most items planned, where each has a plan and their
    peaks, the split planner's bound of the one left and the overheads sum above `goal` (the first fill's: the
    fills go on whatever its plan; a later one's: the best step, which it cannot beat); else None.  With the
    items' least `times` (a later fill, whose floor only has to pass the goal): planned only until the peaks
    found, the others' pass bounds (below their peaks) and the rest sum above it (then the floor is that sum),
    those whose bound is furthest above their longest item's least time first (a bound the longest item sets
    is near the peak; one the work sets is not: the long workload, T = 32k, 2 plans of 3).  `packed` (a later fill
    whose floor counts only where it passes the goal): the others' bounds first raised where the packing bound
    proves it (`packing_bound.raised_floors`; allbig, D = 512, T = 32k: the fills of 80, 70 and 50 %, 61 plans
    before, none).  Whether the floor passes the goal is then as before (the others' peaks and the bound of the one
    left decide it), except where one of the others has no layout: before, the fill was found without one where its
    planning reached that micro-batch before the floor passed the goal; now it is deferred (it cannot beat the goal
    either way)."""
    sizes = np.bincount(microbatch, minlength=num_microbatches)
    left = int(np.argmax(sizes))
    others = [np.flatnonzero(microbatch == m) for m in np.flatnonzero(sizes).tolist() if m != left]
    rest = [plan_pass.bound(np.flatnonzero(microbatch == left)), num_microbatches * overhead]
    floors, peaks = [], []
    if times is not None:
        floors = [plan_pass.bound(items) for items in others]
        if packed:
            floors = raised_floors(others, floors, float_sum(rest), goal / (1 - FLOOR_SLACK), plan_pass.pieces)
        order = np.argsort([float(times[items].max()) - floor for items, floor in zip(others, floors)], kind="stable")
        others, floors = [others[k] for k in order], [floors[k] for k in order]
    for items in others:
        if floors and float_sum(peaks + floors[len(peaks):] + rest) * (1 - FLOOR_SLACK) > goal:
            break
        plan = plan_pass(items)
        if plan is None:
            return None
        peaks.append(float(plan.loads.max()))
    floor = float_sum(peaks + floors[len(peaks):] + rest) * (1 - FLOOR_SLACK)
    return _Deferred(microbatch, num_microbatches, floor) if floor > goal else None


def _grouping_planned(lengths, microbatch, num_microbatches, num_ranks, spec, budget, overhead, table, plan_pass,
                      repair: bool) -> tuple:
    """`_split_cells` of the grouping `microbatch`."""
    found = _planned(lengths, microbatch, num_microbatches, num_ranks, spec, budget, overhead, plan_pass)
    if found is not None or not repair:
        return found, None
    repaired = repaired_grouping(microbatch, lengths, row_least(table), budget, plan_pass, plan_pass)
    return None, None if repaired is None else assemble(lengths, *repaired, num_ranks, spec, budget, overhead)


def _planned(lengths, microbatch, num_microbatches, num_ranks, spec, budget, overhead, plan_pass):
    """The split plan of the grouping `microbatch`, or None where a micro-batch finds no layout: None unplanned
    where the certificate rules one out (`_PassPlans.certified_none`; the allbig family at D = 512, T = 32k: the
    later fills planned 18 micro-batches before the one certified without layout)."""
    groups = [np.flatnonzero(microbatch == m) for m in range(num_microbatches)]
    if any(plan_pass.certified_none(items) for items in groups if items.size):
        return None
    passes = []
    for items in groups:
        plan = plan_pass(items) if items.size else None
        if items.size and plan is None:
            return None
        passes.append(plan)
    return assemble(lengths, microbatch, passes, num_ranks, spec, budget, overhead)


def _regrouped(plan: SplitMicroBatchPlan, lengths: np.ndarray, spec: ContextParallel, table: np.ndarray,
               goal: float, plan_pass: _PassPlans) -> SplitMicroBatchPlan:
    """`plan` after the local search over its micro-batches (`regroup.py`, each planned by `plan_pass`),
    which stops once the step is within `goal`."""
    num_ranks, budget, overhead = plan.num_ranks, plan.max_tokens_per_microbatch, plan.microbatch_overhead
    microbatch, passes = regroup(plan.microbatch, list(plan.passes), lengths, table,
                                 np.array(spec.degrees, dtype=np.int64), budget,
                                 goal - plan.num_microbatches * overhead, plan_pass)
    return assemble(lengths, microbatch, passes, num_ranks, spec, budget, overhead)


def _searched(plans: tuple, lengths: np.ndarray, spec: ContextParallel, table: np.ndarray, goal: float,
              plan_pass: _PassPlans) -> tuple[SplitMicroBatchPlan | None, int | None]:
    """(the least step of `plans` (the fills' best, the repaired plan; None where absent; the first on a tie), and
    its index in `plans`), or (None, None); each above `goal` searched (`_regrouped`) in order of step, the second only
    where its step is below the first's searched one: the search never raises a step, and it rarely lowers one past
    the other's (the long workload at D = 2560 x 16, T = 16k, seeds 7, 8, 11: never, the second's search 0.5-0.8 s of
    a 2.2-4.3 s planning; zeros_giants at D = 512 x 16: seeds 5 and 23, the fills' 1.05, the repaired 1.12 the bound,
    see `_more_counts`)."""
    found = None
    for index in sorted((k for k, plan in enumerate(plans) if plan is not None), key=lambda k: plans[k].step_cost):
        plan = plans[index]
        if found is not None and plan.step_cost >= found[0].step_cost:
            break
        if plan.split_items.size and plan.step_cost > goal:
            plan = _regrouped(plan, lengths, spec, table, goal, plan_pass)
        if found is None or (plan.step_cost, index) < (found[0].step_cost, found[1]):
            found = plan, index
    return (None, None) if found is None else found


def split_microbatches(lengths, num_ranks, spec: ContextParallel, *, cost, budget: int, overhead: float,
                       num_microbatches: int | None, plain, plans: _PassPlans | None = None) -> SplitMicroBatchPlan:
    """Today's plan (`plain()`, a MicroBatchPlan, or InfeasibleError) unless a split plan beats it
    by more than min_gain (see the module); `lengths` int64, `spec` on its topology already; `plans`: the
    micro-batch plans made already for these lengths, ranks, spec, cost and budget (`_more_counts`)."""
    clock = time.perf_counter()
    costs = make_problem(lengths, num_ranks, cost=cost).item_costs
    if not spec.splits:
        return wrap_unsplit(plain(), spec, costs)
    gain = 1 + spec.min_gain
    today, refusal = None, None
    try:
        today = plain() if spec.degrees[0] == 1 and int(lengths.max(initial=0)) <= budget else None  # P28-01
    except InfeasibleError as error:
        refusal = error
    fewest = max(1, -(-int(lengths.sum()) // (num_ranks * budget)))
    first = num_microbatches or (today.num_microbatches if today is not None else fewest)
    total = exact_sum(costs)
    if today is not None and not np.any(costs * num_ranks * first > total):  # no giant: every plan works Σ f
        return wrap_unsplit(today, spec, costs, float_sum([total / num_ranks, (num_microbatches or fewest) * overhead]))
    bound, fewest, table, ordered = split_bound(lengths, num_ranks, spec, cost, budget, overhead, num_microbatches)
    if today is not None and bound * (1 - FLOOR_SLACK) * gain >= today.step_cost:  # no split plan beats it enough
        return wrap_unsplit(today, spec, costs, bound)
    best, repaired, tokens = None, None, int(lengths.sum())
    plan_pass = _PassPlans(lengths, num_ranks, spec, cost, budget) if plans is None else plans
    pending = None  # the first fill, deferred (`_deferred`): planned only where the second does not beat it
    for fill in FILLS:
        room = int(fill * num_ranks * budget)
        m = max(first, -(-tokens // room))
        over = num_microbatches is not None and m > num_microbatches  # this fill needs more than the fixed M
        ahead = [plan.step_cost for plan in (best, repaired) if plan is not None]  # what a later fill must beat
        if (best is not None and over) or (ahead and min(ahead) <= bound * (1 + RETRY_GAP)):
            break
        cells = (lengths, num_ranks, spec, budget, overhead, num_microbatches or m, ordered, table,
                 -(-tokens // num_microbatches) if over else room, num_microbatches is not None, plan_pass)
        alone = best is None and repaired is None and pending is None and num_microbatches is None
        defer = min(ahead) if ahead and num_microbatches is None else None
        found, spilled = _split_cells(*cells, repair=alone, defer=bound * (1 + RETRY_GAP) if alone else defer,
                                      refuse=not alone and best is None and pending is None,
                                      packed=best is None or defer == best.step_cost)  # the floor's value unused
        if isinstance(found, _Deferred) and not alone:  # it cannot beat the best (or the repaired plan)
            if best is not None and found.floor > best.step_cost and found.num_microbatches > best.num_microbatches:
                break
            continue
        if isinstance(found, _Deferred):
            pending = found
            continue
        if pending is not None and not (found is not None and found.step_cost < pending.floor):
            best, repaired = _grouping_planned(lengths, pending.microbatch, pending.num_microbatches, num_ranks, spec,
                                               budget, overhead, table, plan_pass, True)
            if best is None and repaired is None and found is None:  # as planned in turn: this fill repaired too
                found, spilled = _split_cells(*cells, repair=True)
        pending = None
        repaired = spilled if spilled is not None else repaired
        if found is not None and (best is None or found.step_cost < best.step_cost):
            best = found
        elif found is not None and found.num_microbatches > best.num_microbatches:
            break  # fewer, fuller micro-batches did better; lower fills only add micro-batches
        if over:  # the fullest fill the fixed M allows was tried (no plan at a lower fill yet)
            break
    best, source = _searched((best, repaired), lengths, spec, table, bound * (1 + RETRY_GAP), plan_pass)
    if num_microbatches is None and best is not None and best.step_cost > bound * (1 + RETRY_GAP):
        best = _more_counts(best, lengths, num_ranks, spec, cost, budget, overhead, today, refusal, bound, plan_pass,
                            source == 1 and _stacked(best))
    if best is None or not best.split_items.size or (today is not None and best.step_cost * gain >= today.step_cost):
        later = None if today is not None or num_microbatches is not None else _more_microbatches(
            lengths, num_ranks, spec, cost, budget, overhead, plain, max(first, -(-tokens // room)), bound)
        if later is not None:
            return replace(later, solve_seconds=time.perf_counter() - clock)
        if today is None:
            raise refusal if refusal is not None else InfeasibleError(
                f"the split planner found no micro-batches of {num_ranks} ranks within max_tokens_per_microbatch="
                f"{budget} (micro-batches filled to {', '.join(f'{fill:.0%}' for fill in FILLS)} of their tokens); a "
                f"larger budget or `num_microbatches` may fit", min_cap=budget + 1)
        return wrap_unsplit(today, spec, costs, bound)
    bound = min(bound, best.step_cost)
    status = Status.OPTIMAL if best.step_cost == bound else Status.FEASIBLE
    return replace(best, lower_bound=bound, status=status, solve_seconds=time.perf_counter() - clock)


def _stacked(plan: SplitMicroBatchPlan) -> bool:
    """Whether some micro-batch of `plan` peaks above its own pass bound by more than RETRY_STACK: the micro-batch
    search found no move out of it (a spill's first micro-batch of 140 giants of 80-100k tokens at T = 32k, each on
    4 ranks or more of 512, 1.275x its bound: zeros_giants, D = 512 x 16, seed 5)."""
    return any(float(cell.loads.max()) > cell.lower_bound * (1 + RETRY_STACK)
               for cell in plan.passes or () if cell is not None)


def _more_counts(best: SplitMicroBatchPlan, lengths, num_ranks, spec, cost, budget, overhead, today, refusal,
                 bound: float, plans: _PassPlans, spilled: bool) -> SplitMicroBatchPlan:
    """With M free, `best` (M micro-batches) above the bound by more than RETRY_GAP and at most RETRY_ITEMS items (or
    above it by more than RETRY_FAR, whatever their count):
    the plans of a fixed M + 1, M + 2, ... (each without its empty micro-batches) in turn while each lowers the step
    and stays above that, the lowest kept (`best` on a tie): the fills' count compares the fills' plans before the
    search over their micro-batches, which can take a fixed M + 1's plan below the free M's (probe27 P27-09: up to
    1.9x on giant-heavy mixes of 16-96 items).  `spilled` (`best` is the repaired plan searched, `_stacked`): a
    fixed M's own plan first, whatever the items' count: its fills are all planned, while the free M's were dropped
    against the repaired plan's step before the search, which lowered a fill's grouping past it (zeros_giants,
    D = 512 x 16, seeds 5 and 23: 1.126 and 1.119 the bound, 1.051 and 1.045 with M = 4 fixed).  `today` and
    `refusal`: today's plan and its refusal, asked again; `plans`: the micro-batch plans made so far, shared by every
    count."""

    def known():
        if today is None:
            raise refusal
        return today
    own, far = best.num_microbatches, best.step_cost > bound * (1 + RETRY_FAR)
    count = own - 1 if spilled else own
    while best.step_cost > bound * (1 + RETRY_GAP) and count < lengths.size and (
            count < own or far or lengths.size <= RETRY_ITEMS):
        count += 1
        try:
            more = split_microbatches(lengths, num_ranks, spec, cost=cost, budget=budget, overhead=overhead,
                                      num_microbatches=count, plain=known, plans=plans)
        except InfeasibleError:
            more = None
        if more is not None and more.passes is not None and None in more.passes:  # an empty one costs its overhead
            used, microbatch = np.unique(more.microbatch, return_inverse=True)
            more = assemble(lengths, microbatch, [more.passes[m] for m in used.tolist()], num_ranks, spec, budget,
                            overhead)
        if more is not None and more.step_cost < best.step_cost:
            best = more
        elif count > own:
            return best
    return best


def _more_microbatches(lengths, num_ranks, spec, cost, budget, overhead, plain, fills_most: int,
                       bound: float) -> SplitMicroBatchPlan | None:
    """With M free and no fill laid out, the plan of the first fixed M that lays out of M + 1, M + 2, 2 (M + 2)
    and 4 (M + 2) (M = `fills_most`, the fills' most; each at most one item a micro-batch), or None: a fill groups a
    micro-batch up to its share of the tokens, and an odd node's aligned blocks can leave every fill's grouping
    without a layout that more micro-batches have (review10 R10-11).  Its bound is `bound`, the free M's."""
    for count in sorted({min(count, lengths.size) for count in (fills_most + 1, fills_most + 2, 2 * fills_most + 4,
                                                                 4 * fills_most + 8)} - set(range(fills_most + 1))):
        try:
            plan = split_microbatches(lengths, num_ranks, spec, cost=cost, budget=budget, overhead=overhead,
                                      num_microbatches=count, plain=plain)
        except InfeasibleError:
            continue
        floor = min(bound, plan.step_cost)
        return replace(plan, lower_bound=floor, status=Status.OPTIMAL if plan.step_cost == floor else Status.FEASIBLE)
    return None


def balance_microbatches_split(context_parallel, lengths, num_ranks, *, unsplit, max_tokens_per_microbatch, cost, costs,
                               padded, num_microbatches, microbatch_overhead, topology, **plain) -> SplitMicroBatchPlan:
    """`balance_microbatches(..., context_parallel=)` (see there), validated here once: today's plan is
    that call without `context_parallel` (`unsplit`, which the caller passes so that this room does not
    import it back; `plain`: its other arguments), kept unless splitting pays; `topology` (world size
    num_ranks, or None) gives the node size and links."""
    if not isinstance(context_parallel, ContextParallel):
        raise TypeError(f"`context_parallel` must be a ContextParallel; got {type(context_parallel).__name__}")
    if costs is not None or padded is not False or plain.get("pipeline") is not None:
        raise ValueError("`context_parallel` cannot be combined with `costs`, `padded` or `pipeline` (split items "
                         "need a `cost` model of their lengths, unpadded, in a plain step of micro-batches)")
    lengths = as_lengths(lengths)
    num_ranks = as_num_ranks(num_ranks)
    budget = as_int(max_tokens_per_microbatch, "max_tokens_per_microbatch", minimum=1)
    fixed = within_tokens(lengths, num_ranks, budget, as_int(num_microbatches, "num_microbatches", minimum=1,
                                                             optional=True), max(context_parallel.degrees))
    overhead = as_real(microbatch_overhead, "microbatch_overhead")
    if cost is not None and not isinstance(cost, CostModel):
        raise TypeError(f"`cost` must be a CostModel or None; got {type(cost).__name__}")
    spec = context_parallel
    if topology is not None:
        if getattr(topology, "world_size", None) != num_ranks:
            raise ValueError(f"`topology` has world size {getattr(topology, 'world_size', None)} != num_ranks "
                             f"{num_ranks}")
        spec = spec.on(topology)
    spec.warn_unit_cost(cost)
    today = dict(plain, topology=topology if plain.get("sources") is not None else None)
    model = CostModel() if cost is None else cost
    # today's arguments checked here, whatever the lengths: its planner reads them only where it is made (P28-04)
    microbatch_options(budget, fixed, overhead, plain.get("algorithm", "auto"))
    as_time_limit(plain.get("time_limit"))
    as_origins(make_problem(lengths, num_ranks, cost=model), today.get("sources"), today.get("item_bytes"),
               today["topology"])

    def planned():
        return at_most(lambda count: split_microbatches(
            lengths, num_ranks, spec, cost=model, budget=budget, overhead=overhead, num_microbatches=count,
            plain=lambda: unsplit(lengths, num_ranks, max_tokens_per_microbatch=budget, cost=cost,
                                  num_microbatches=count, microbatch_overhead=microbatch_overhead, **today)),
            fixed)
    if not spec.splits:
        return planned()
    return exact_or_planned(planned, lengths, num_ranks, spec, model, budget, overhead, fixed,
                            lambda microbatch, passes: assemble(lengths, microbatch, passes, num_ranks, spec, budget,
                                                                 overhead))

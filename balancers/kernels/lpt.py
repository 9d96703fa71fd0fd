"""Longest processing time first (Graham 1969), the OrchMLLM paper's greedy.

minimise max(loads) where loads[r] = sum(cost[i] for i on r): sort items by cost,
largest first (ties by index), give each to the least-loaded rank (ties by rank):

    for i in sorted(items, key=lambda i: (-cost[i], i)):
        r = min(range(D), key=lambda r: (loads[r], r)); loads[r] += cost[i]

Guarantee: makespan <= (4/3 - 1/(3D)) · OPT for the unpadded cost.

The unpadded kernel gives the bit-identical assignment of that heap loop, but places items a round at a time
with numpy: with ranks sorted by (load, rank) and the next items sorted by cost, the k-th item goes to the k-th
rank exactly when that rank stays ahead of every rank already topped up in the round (checked, ties included);
the first item where that fails starts the next round. A round that places fewer than D/s items (s = 8; over
4096 ranks 16 for float costs, 64 on integer keys) is redone as D steps of a heap, so every O(D log D) round
pays for at least D/s items: O(s · n log D) in all, s a constant; below 32 ranks, where rounds hold only a few
items, the heap loop runs alone.  A run of equal float costs filling 1/8 of a round or more, or all that a heap
round would hold, is placed at once (`lpt_runs`: the least slots of the ranks, merged).  Integer costs sort as unique
int64 keys (cost · n + index, load · D + rank), much faster than stable sorts; when every load stays exact (below
2**53 once the costs' common power of two is divided out), each rank is a single sorted key (load << shift) | rank
and a round is one prefix minimum and one sort (full rounds of equal costs keep the keys' order: a run of them is
one step). With a memory cap, the least-loaded rank that still has room is taken (`lpt_capped`: the uncapped plan up
to its first overflow, then rounds that never offer a full rank twice; the uncapped plan is kept when it already
fits, since the choices are then the same). Padded ranks cost count · f(max length); items go longest first to the
rank whose cost grows least, in O(n log D) with a heap.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import heapq

import numpy as np

from ..bounds import cap_refusal
from ..problem import (InfeasibleError, KernelResult, Problem, integer_values, rank_tokens,
                       read_only, sorted_order)
from .last_units import LastUnits as _LastUnits, same_memory  # `_LastUnits`: the tests' name
from .lpt_rounds import integer_loads, ranks_by_load, round_length, smallest_ranks  # noqa: F401 (callers' names)
from .lpt_runs import RUN_SHARE, EqualRuns, merged_order, place_run


def _heap_round(loads: np.ndarray, costs: np.ndarray, items: np.ndarray,
                assignment: np.ndarray) -> None:
    heap = list(zip(loads.tolist(), range(loads.size)))
    heapq.heapify(heap)
    for item, cost in zip(items.tolist(), costs.tolist()):
        load, rank = heapq.heappop(heap)
        assignment[item] = rank
        heapq.heappush(heap, (load + cost, rank))
    for load, rank in heap:
        loads[rank] = load


def _key_steps(sorted_costs: np.ndarray, num_ranks: int, start: np.ndarray | None = None
               ) -> tuple[np.ndarray, int, np.ndarray, int, np.ndarray | None] | None:
    """Integer costs (largest first) as int64 key increments cost << shift, for keys
    (load << shift) | rank, the shift, the ranks' first keys, sorted (loads 0, or `start`), the
    unit of their loads (`divisor`) and `start` in that unit (None without); None unless LPT then
    sums every load exactly and its keys fit int64.

    The costs (and start loads) are first divided by the largest power of two dividing them
    all: that is exact and float rounding is scale-free, so the quotients' LPT makes the same
    choices.  A rank takes an item only as the least loaded, at most (Σ start + total) / D, so
    no LPT load ever passes that + max cost, nor max start (Graham's argument; by induction
    each sum up to then is exact below 2**53).  The float totals are within a factor
    1 ± n·2**-53 of the exact ones: twice the bound covers them.
    """
    kept = _KEPT_UNITS.get(sorted_costs)
    if kept is None:
        integers = integer_values(sorted_costs)
        if integers is None:
            return None
        kept = (integers, int(np.bitwise_or.reduce(integers)), float(sorted_costs.sum()), None)
    integers, cost_bits, total, steps_made = kept
    starts = None if start is None else integer_values(start)
    if start is not None and starts is None:
        return None
    bits = cost_bits | (0 if starts is None else int(np.bitwise_or.reduce(starts)))
    divisor = bits & -bits if bits else 1
    shift = max(num_ranks - 1, 1).bit_length()
    if not _sums_exact(sorted_costs, total, num_ranks, start, divisor, shift):
        return None
    exponent = divisor.bit_length() - 1
    if steps_made is not None and steps_made[:2] == (exponent, shift):
        steps = steps_made[2]
    else:
        steps = read_only((integers >> exponent) << shift)
        _KEPT_UNITS.keep((sorted_costs,), lambda: (integers, cost_bits, total, (exponent, shift, steps)))
    if starts is None:
        return steps, shift, np.arange(num_ranks, dtype=np.int64), divisor, None
    starts >>= exponent  # a copy of `start` (`integer_values`), in place: fewer fresh pages
    keys = np.left_shift(starts, shift)
    keys |= np.arange(num_ranks, dtype=np.int64)  # unique keys: any sort agrees (`_START_SORT`)
    keys.sort(kind="quicksort" if _START_SORT * np.count_nonzero(keys[1:] < keys[:-1]) > keys.size else _SORT_KIND)
    return steps, shift, keys, divisor, starts


def _sums_exact(sorted_costs: np.ndarray, total: float, num_ranks: int, start: np.ndarray | None, divisor: int,
                shift: int) -> bool:
    """`_key_steps`' range rule: LPT from `start` (multiples of `divisor`, like the costs) keeps every load below
    2**53 units of `divisor` and its keys (load << shift) | rank below 2**62."""
    begun = 0.0 if start is None else float(start.sum()) / num_ranks + float(start.max())
    most = 2.0 * (total / num_ranks + float(sorted_costs[0]) + begun) / divisor
    return most < 2.0**53 and most * 2.0**shift < 2.0**62


_KEPT_UNITS, _KEPT_PLAN = _LastUnits(), _LastUnits()
_SHARING = contextvars.ContextVar("lpt_sharing", default=False)


@contextlib.contextmanager
def sharing_plans(active: bool = True):
    """Within (where `active`): `solve(..., shared=True)` keeps its plan for `greedy_from` (a pipeline planner
    follows).  Elsewhere it keeps none: the memory of a plan held to no use slows the rest of a plain plan
    (~2 % at D = 2560 × 32, M 3: allocations miss the freed block)."""
    token = _SHARING.set(active)
    try:
        yield
    finally:
        _SHARING.reset(token)


def _greedy_by_keys(steps: np.ndarray, shift: int, keys: np.ndarray, num_ranks: int, order: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The rounds of `greedy_unpadded` on exact integer loads, every rank held as one int64 key
    (load << shift) | rank, kept sorted (from `keys`): a round is one prefix minimum, its update
    one sort (none for full rounds of one step, which repeat while the step does); the assignment
    and the final keys (unsorted after a last round of several steps)."""
    n, mask = steps.size, (1 << shift) - 1
    assignment = np.empty(n, dtype=np.int64)
    position = 0
    while position < n:
        if steps[position] == 0:  # the costs left are 0: each goes to the least key, which stays the least
            assignment[order[position:]] = keys[0] & mask
            break
        size = min(n - position, num_ranks)
        topped = keys[:size] + steps[position: position + size]
        # Item k goes to the k-th key iff that key is below every key topped up before it: surely so when the
        # largest key is below the least plus the round's least step.  Keys rise and the prefix minima of the
        # topped ones fall, so once an item fails every later one does: when the last goes (one minimum),
        # they all do; the prefix minimum finds the first that fails otherwise.
        placed = size
        if size > 1 and keys[size - 1] >= keys[0] + steps[position + size - 2] and \
                keys[size - 1] > topped[:-1].min():
            placed = int((keys[1:size] > np.minimum.accumulate(topped[:-1])).argmax()) + 1  # the first True
        if (_WIDE_KEY_HEAP_SHARE if num_ranks > _WIDE_ROUND else 8) * placed < size:
            loads = _loads_by_rank(keys, shift)
            _heap_round(loads, steps[position: position + size] >> shift, order[position: position + size],
                        assignment)
            keys = np.sort((loads << shift) | np.arange(num_ranks))
            position += size
            continue
        if placed == num_ranks and steps[position + placed - 1] == steps[position]:
            # Every rank took the same step: the keys keep their order, so the next full blocks of
            # that step repeat this round (each rank one item, in the same order) at once.
            rounds = 1
            while (position + (rounds + 1) * num_ranks <= n
                   and steps[position + (rounds + 1) * num_ranks - 1] == steps[position]):
                rounds += 1
            assignment[order[position: position + rounds * num_ranks]] = np.tile(keys & mask, rounds)
            keys = keys + rounds * steps[position]
            position += rounds * num_ranks
            continue
        assignment[order[position: position + placed]] = keys[:placed] & mask
        position += placed
        if placed == num_ranks:
            keys = topped
        else:  # keys are this function's own (`_key_steps`' fresh ones, then its own)
            keys[:placed] = topped[:placed]
        if position < n:  # the last round's keys are left unsorted (callers read their loads by rank)
            keys = _front_sorted(keys, min(n - position, num_ranks))
    return assignment, keys


def _front_sorted(keys: np.ndarray, count: int) -> np.ndarray:
    """`keys` (unique), their `count` least first, ascending, the rest in any order: all the next round of
    `_greedy_by_keys` reads in order (a heap round and the loads by rank read every key, in any order), so the same
    choices.  Where count <= size / 4, a partition first (a pipeline's shaped LPT, D = 2560 x 32, M 32: 81 920 keys,
    14 561-17 920 read: 0.79-0.91 -> 0.29-0.35 ms)."""
    if _FRONT_SHARE * count > keys.size:
        keys.sort(kind=_SORT_KIND)  # keys are unique, so every sort agrees
        return keys
    keys = np.partition(keys, count - 1)
    keys[:count].sort(kind=_SORT_KIND)
    return keys


# The keys' sort: timsort, which merges the runs that a round's topped keys (sorted keys plus sorted steps) and a
# raised start (rows of one level each) hold.  On 1163 such arrays (plain and pipeline plans, D 512 and 2560, M free,
# 8, 16, 32) it took 88 ms against introsort's 632 (D = 2560 x 32, M 16, 1F1B: the raised start's 40 960 keys 0.92
# vs 1.41 ms, the first round's 0.50 vs 1.45); introsort won, by 1 µs, on two (1024 keys); a rule on the runs
# counted (introsort above size / 40) took 316 ms.  40 960 random keys: introsort 1.5 ms, timsort 2.0.
_SORT_KIND = "stable"
# A start's keys sort by introsort where over a quarter fall below the one before (a pipeline's raised start, D = 2560
# x 32, M 32: 1.6-1.9 -> 0.9 ms; offsets alone, timsort 0.17-0.28 vs 0.8); 68 start arrays of pipeline plans (D 64 to
# 2560, M 8-32, three schedules, seeds 3, 5): timsort 13.8 ms, introsort 12.6, this rule 8.8 (numpy 2.4, load 3.5).
_START_SORT = 4
_FRONT_SHARE = 4  # a round reading at most a quarter of the keys sorts those alone (`_front_sorted`)
_ROUNDS_FROM_RANKS = 32  # below, one heap loop is faster (50 000 items on 4 ranks: 18 ms vs 145 ms)
# A round over more than _WIDE_ROUND ranks is redone as a heap only where it placed under 1/16 of them (float costs) or
# 1/64 (integer keys): a heap step costs 1.2-4.9 µs there, a float round 40-190 ns a rank, a round of keys 3-4 ns.
# D = 2560 x 32, M 32, seeds 5, 7, 41, the plain planner's float LPT (81 920 cells): a 7680-item round, 210 -> 20 ms;
# D = 512 x 16, M 16, 4 of the default mix's rows on keys (8192 cells): a 512-item round, 18 -> 0.6 ms.
_WIDE_ROUND, _WIDE_HEAP_SHARE, _WIDE_KEY_HEAP_SHARE = 4096, 16, 64


def greedy_unpadded(costs: np.ndarray, num_ranks: int, order: np.ndarray | None = None) -> np.ndarray:
    """LPT assignment for additive costs, bit-identical to the heap loop (`order`: `sorted_order(costs)`
    when already known)."""
    order = sorted_order(costs) if order is None else order
    return _greedy_sorted(costs[order], num_ranks, order)


def greedy_from(sorted_costs: np.ndarray, num_ranks: int, order: np.ndarray, start: np.ndarray,
                lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """`greedy_unpadded` (the costs in `order`, largest first) from the ranks' loads `start` (>= 0), each rank's
    Σ cost of its items (exact: `np.bincount(assignment, costs)` in any order) and, where `solve` summed them
    already, its Σ `lengths` (`rank_tokens`; else None), or None unless the costs
    and loads make LPT's integer keys (`_key_steps`) over 32 ranks or more: the choices of LPT after one
    pinned placeholder costing base + start[r] on every rank r, any base above every cost
    (`microbatch.cells.lpt_cells`), without them.  From zero loads these are the keys, rounds and answer of
    `greedy_unpadded`'s integer keys: the plan `solve` shared last over the same sorted costs (kept, read-only)
    where there was one, its items taken in `order` where it ran on them in another (its tokens then None)."""
    kept = None if start.any() else _KEPT_PLAN.get(sorted_costs)  # `solve(..., shared=True)`'s
    tokens = None
    if kept is not None and kept[0] == num_ranks:
        _, assignment, keys, shift, divisor, tokens, kept_order, kept_lengths = kept
        if not (same_memory(kept_order, order) and same_memory(kept_lengths, lengths)):
            # the same costs, the items in another order (`auto.in_canonical_order`): LPT's j-th choice depends on
            # the costs alone, so the item j-th in `order` takes the cell the kept plan gave its j-th item
            assignment, tokens = _in_order(assignment, kept_order, order), None
    else:
        key_steps = None if num_ranks < _ROUNDS_FROM_RANKS else _key_steps(sorted_costs, num_ranks, start)
        if key_steps is None:
            return None
        steps, shift, keys, divisor, units = key_steps
        assignment, keys = _greedy_by_keys(steps, shift, keys, num_ranks, order)
        return assignment, _loads_by_rank(keys, shift, units) * float(divisor), tokens
    return assignment, _loads_by_rank(keys, shift) * float(divisor), tokens  # from zero loads


def greedy_prefix(sorted_costs: np.ndarray, num_ranks: int, start: np.ndarray, count: int, raised: float
                  ) -> tuple[np.ndarray, np.ndarray] | None:
    """The first `count` choices of `greedy_from` (the rank of each cost, largest first) and the ranks' loads after
    them (exact, without `start`), or None unless it runs on integer keys (`_key_steps`) and LPT from `start` +
    `raised` on every rank (`microbatch.cells.lpt_cells`' placeholders) sums exactly too.  LPT takes each cost by the
    loads the costs before it left, so these are the first choices of the whole run, and of that raised LPT (exact:
    the same comparisons) with or without a cap while they fit it (`lpt_capped` takes the uncapped plan up to the
    first overflow); each rank's load then is at least these."""
    key_steps = None if num_ranks < _ROUNDS_FROM_RANKS else _key_steps(sorted_costs, num_ranks, start)
    if key_steps is None:
        return None
    steps, shift, keys, divisor, units = key_steps
    if raised % divisor or not _sums_exact(sorted_costs, float(sorted_costs.sum()), num_ranks, start + raised,
                                           divisor, shift):
        return None
    ranks, keys = _greedy_by_keys(steps[:count], shift, keys, num_ranks, np.arange(count))
    return ranks, _loads_by_rank(keys, shift, units) * float(divisor)


def _loads_by_rank(keys: np.ndarray, shift: int, start: np.ndarray | None = None) -> np.ndarray:
    """Each rank's load (int64, whole units) from the keys (load << shift) | rank of all ranks, less its `start`
    (by rank, the same units; the sums are exact: `_key_steps`) where given."""
    loads = np.empty(keys.size, dtype=np.int64)
    loads[keys & ((1 << shift) - 1)] = keys >> shift
    if start is not None:
        loads -= start
    return loads


def _in_order(assignment: np.ndarray, kept_order: np.ndarray, order: np.ndarray) -> np.ndarray:
    """`assignment` (of the items in `kept_order`'s numbering) for the items of `order` (the same costs largest
    first): item order[j] takes what kept_order[j] took.

    >>> _in_order(np.array([5, 6, 7]), np.array([2, 0, 1]), np.array([1, 2, 0])).tolist()
    [6, 7, 5]
    """
    placed = np.empty_like(assignment)
    placed[order] = assignment[kept_order]
    return placed


def _greedy_sorted(sorted_costs: np.ndarray, num_ranks: int, order: np.ndarray, keys_out: list | None = None
                   ) -> np.ndarray:
    """`greedy_unpadded` given the costs in `order` (largest first) already; on integer keys, their final keys,
    shift and divisor appended to `keys_out` where given."""
    if num_ranks < _ROUNDS_FROM_RANKS:  # rounds of a few items cost more than the heap loop itself
        assignment = np.empty(sorted_costs.size, dtype=np.int64)
        _heap_round(np.zeros(num_ranks), sorted_costs, order, assignment)
        return assignment
    key_steps = _key_steps(sorted_costs, num_ranks)
    if key_steps is not None:
        assignment, keys = _greedy_by_keys(*key_steps[:3], num_ranks, order)
        if keys_out is not None:
            keys_out += (keys, key_steps[1], key_steps[3])
        return assignment
    assignment = np.empty(sorted_costs.size, dtype=np.int64)
    loads = np.zeros(num_ranks)
    n, position = sorted_costs.size, 0
    integer = integer_loads(sorted_costs, num_ranks)
    # given_up: where the run ends that `place_run` could not place (float rounding): no more tries in it (probe57 L2)
    runs, ranks, given_up = EqualRuns(sorted_costs, num_ranks), None, 0
    while position < n:
        stop = min(n, position + num_ranks)
        ranks = ranks_by_load(loads, integer) if ranks is None else ranks  # kept where a run placed at once
        chunk = sorted_costs[position:stop]
        if chunk[0] == 0:  # the costs left are 0: each goes to the least loaded rank, which stays so
            assignment[order[position:]] = ranks[0]
            break
        run = runs.at(position) if position >= given_up else 0
        # at once where a round would place under 1/RUN_SHARE of the run: the loads spread over its cost before that
        spread = run and loads[ranks[min(run // RUN_SHARE, num_ranks - 1)]] - loads[ranks[0]] >= chunk[0]
        after_run = _run_placed(loads, ranks, sorted_costs, order, position, run, assignment) if spread else None
        if after_run is not None:
            position, ranks = position + run, after_run
            continue
        given_up = runs.end(position) if spread else given_up
        placed = round_length(loads[ranks[: stop - position]], ranks[: stop - position], chunk, integer)
        if (_WIDE_HEAP_SHARE if num_ranks > _WIDE_ROUND else 8) * placed < stop - position:
            stop = min(stop, runs.next_start(position))
            tried = position >= given_up and stop <= runs.end(position)
            ranks = _run_placed(loads, ranks, sorted_costs, order, position, stop - position, assignment) \
                if tried else None
            if ranks is None:
                given_up = runs.end(position) if tried else given_up
                _heap_round(loads, chunk[: stop - position], order[position:stop], assignment)
            position = stop
            continue
        ranks = ranks[:placed]
        assignment[order[position: position + placed]] = ranks
        loads[ranks] += chunk[:placed]
        position, ranks = position + placed, None
    return assignment


def _run_placed(loads: np.ndarray, ranks: np.ndarray, sorted_costs: np.ndarray, order: np.ndarray, position: int,
                run: int, assignment: np.ndarray) -> np.ndarray | None:
    """The ranks by (load, rank) once the `run` equal costs from `position` are placed at once (`lpt_runs`), `loads`
    and `assignment` updated; None where not placed.  `ranks`: all of them by (load, rank) before."""
    chosen = ranks[:run]
    after = (loads[ranks[run]], int(ranks[run])) if run < ranks.size else None
    placed = place_run(loads[chosen], chosen, float(sorted_costs[position]), run, after=after)
    if placed is None:
        return None
    assignment[order[position: position + run]], taken, loads[chosen] = placed
    return merged_order(loads, np.concatenate((chosen[taken == 0], ranks[chosen.size:])), chosen[taken > 0])


def _greedy_padded(problem: Problem, cap: int | None) -> np.ndarray:
    """Longest first, to the rank whose padded cost count · f(max length) grows least.

    Items come longest first, so a non-empty rank's longest item is fixed and adding an
    item raises its cost to (count + 1) · f(longest); an empty rank would cost f(l).  Empty
    ranks fill in index order.  A rank over the cap stays over it, so it leaves the heap.
    """
    lengths = problem.lengths
    order = np.lexsort((np.arange(problem.num_items), -lengths))
    unit = problem.cost.item_costs(lengths).tolist()
    lengths_list = lengths.tolist()
    assignment = np.empty(problem.num_items, dtype=np.int64)
    heap: list[tuple[float, int, int, int, float]] = []  # (cost with one more item, rank, count, longest, f(longest))
    next_empty = 0
    for item in order.tolist():
        while heap and cap is not None and (heap[0][2] + 1) * heap[0][3] > cap:
            heapq.heappop(heap)
        empty_key = (unit[item], next_empty) if next_empty < problem.num_ranks else None
        if heap and (empty_key is None or heap[0][:2] < empty_key):
            _, rank, count, longest, longest_cost = heapq.heappop(heap)
        elif empty_key is not None:
            rank, count, longest, longest_cost = next_empty, 0, lengths_list[item], unit[item]
            next_empty += 1
        else:
            raise _no_room(problem, item, cap)
        assignment[item] = rank
        count += 1
        heapq.heappush(heap, ((count + 1) * longest_cost, rank, count, longest, longest_cost))
    return assignment


def _no_room(problem: Problem, item: int, cap: int, uncapped: np.ndarray | None = None) -> InfeasibleError:
    """The greedy got stuck; the cap its uncapped plan needs is one at which it cannot (unpadded:
    `uncapped`, the plan the capped greedy started from; padded: computed here)."""
    proven = None if problem.padded else cap_refusal(problem.lengths, problem.num_ranks, cap)
    if proven is not None:
        return proven
    exact = "algorithm='exact'"  # which says so where its MILP is over its size (probe23 P23-06)
    if problem.padded:
        uncapped, exact = _greedy_padded(problem, None), "algorithm='padded' (exact)"
    enough = int(rank_tokens(problem, uncapped).max())
    return InfeasibleError(
        f"`lpt` found no rank with room for item {item} ({int(problem.lengths[item])} tokens) under "
        f"max_tokens_per_rank={cap}; lpt fits under a cap of {enough}, and a smaller cap may still "
        f"be feasible: try {exact}", min_cap=enough, heuristic="lpt")


def _no_completion(problem: Problem, cap: int, item: int, uncapped: np.ndarray) -> InfeasibleError:
    """`solve(..., quick_refusal=True)`'s error: the capped greedy cannot finish (`lpt_capped.cannot_finish`)."""
    enough = int(rank_tokens(problem, uncapped).max())
    return InfeasibleError(
        f"`lpt` cannot place the items from item {item} on (the first its uncapped plan has no room for) "
        f"under max_tokens_per_rank={cap}: they need more room of their lengths than the ranks have left; "
        f"lpt fits under a cap of {enough}", min_cap=enough, heuristic="lpt")


def solve(problem: Problem, quick_refusal: bool = False, shared: bool = False) -> KernelResult:
    """LPT kernel: unpadded or padded, with or without a memory cap.  `quick_refusal`: an unpadded
    capped greedy that provably cannot finish gives up where it first leaves the uncapped plan,
    naming no item of its own (for callers that only need to know that it found no room).  `shared`: the
    caller never writes the plan, so within `sharing_plans` the uncapped one (on integer keys) is made read-only and
    kept for `greedy_from`, which returns it for the same sorted costs and order from zero loads (no copy)."""
    cap = problem.max_tokens_per_rank
    if problem.padded:
        return KernelResult(_greedy_padded(problem, cap))
    keys = [] if shared and _SHARING.get() else None
    assignment = _greedy_sorted(problem.sorted_costs, problem.num_ranks, problem.cost_order, keys)
    tokens = None if cap is None else rank_tokens(problem, assignment)
    if keys:  # kept for `greedy_from` from zero loads
        _KEPT_PLAN.keep((problem.sorted_costs, problem.cost_order, problem.lengths),
                        lambda: (problem.num_ranks, read_only(assignment), read_only(keys[0]), *keys[1:],
                                 None if tokens is None else read_only(tokens), problem.cost_order, problem.lengths))
    # The capped greedy makes the same choices as long as each chosen rank had room, which
    # holds whenever the uncapped plan ends within the cap.
    if tokens is not None and tokens.max() > cap:
        from .lpt_capped import greedy_capped  # it builds on this module's rounds

        hopeless = functools.partial(_no_completion, uncapped=assignment) if quick_refusal else None
        assignment = greedy_capped(problem, cap, assignment, functools.partial(_no_room, uncapped=assignment),
                                   hopeless)
    return KernelResult(assignment)

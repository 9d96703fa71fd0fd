"""Local search over a split plan's micro-batches: move items out of one above its own bound.

A step costs Σ_m max_r L(r, m).  The grouping (`grouping.group_microbatches`) fills micro-batches by
tokens, work and the ranks items hold alone, but giants are lumps: a micro-batch whose work nears D times
its longest item's time stacks two giants on a group above that time, and the small items that crowd a
token-bound micro-batch land on its giants' groups.  Either way that micro-batch's plan ends above its own
pass bound (the split planner's bound over its items), where moving a few of its items to another
micro-batch lowers the step.  From the plan of the fills:

    for at most MAX_MOVES moves, while Σ_m max_r L(r, m) is above the goal (the bound and RETRY_GAP):
        m = the micro-batch furthest above its pass bound (by e > 0), among those not tried since they changed
        sets of m's items to move: each of the CANDIDATES longest items on m's most-loaded rank alone,
            and the crowd: m's items by time ascending, each taken while one of its ranks is above the
            pass bound
        for each set S, where the most m can fall without it (to its longest least time, its work / D, its
            loads with S taken out) beats the least estimated rise of another micro-batch k,
            max(cost_k, S's longest least time, (work_k + S's least work) / D) − cost_k, plus the best fall:
            the TARGETS micro-batches k of least estimated rise, each with S (in turn until one lays out; where
            none does, S stays), then m planned without S, unless with every target planned m's pass bound
            without S shows that no move can beat the best fall (`_certified_fall`)
        apply the move whose two plans lower the step most, by at least e / MAX_MOVES (MAX_MOVES such moves
            would take m to its bound) and MIN_FALL of the step, or mark m tried

Every micro-batch is planned by the split planner (`plan_pass`), so a move's fall is the step's own and
the step never rises; counts (not a clock) bound the search, so every rank gets the same plan.  The
estimates only skip plans that are unlikely to pay.  On the long workload (D = 2560, 3 micro-batches of
giants and 38k small items) three moves fell by 0.01-0.04 % of the step each for 0.25 s of a 1.4 s step;
with MIN_FALL none is made (step / bound 1.0705 -> 1.0715), and on held-out seeds 137-140 (288 rows) the
median step / bound stays 1.0043, the worst 1.0919 -> 1.0954, 29 rows up to 1.3 % higher, none lower, in
0.79 of the planning time (bench_notes cp26g_s9).
Keeping the other items of a micro-batch that a set leaves where they were (2caa316, reverted) took 0.8-0.9
of that step's time but raised twice as many held-out steps as it lowered (up to 2.8 %); planning again
only the chosen move's source found more moves there and took 1.3-1.7× (bench_notes cp26e_s8, cp26f_s8).
"""

from __future__ import annotations

import math

import numpy as np

from ..problem import token_sums
from .grouping import row_least
from .plan import ContextParallelPlan, rank_pairs

MAX_MOVES = 8
"""Moves the search makes at most."""
CANDIDATES = 2
"""Longest items of the crowded micro-batch's most-loaded rank each tried alone."""
TARGETS = 2
"""Micro-batches (least estimated rise first) each set is planned into."""
MIN_FALL = 1e-3
"""Share of the step a move must lower it by (and e / MAX_MOVES): the estimates skip planning smaller ones."""
FLOAT_SLACK = 1e-9
"""Relative margin under which a rank's load counts as at its pass bound (its float sum may exceed it by an ulp), and
below which a pass bound lies under every plan's peak (a float sum may fall an ulp under the exact bound)."""


def regroup(microbatch: np.ndarray, passes: list, lengths: np.ndarray, table: np.ndarray, degrees: np.ndarray,
            budget: int, goal: float, plan_pass) -> tuple[np.ndarray, list]:
    """(every item's micro-batch, every micro-batch's split plan) after the search (see the module) from
    `microbatch` and `passes` (None for an empty micro-batch); `table`: every item's best-case time per
    degree (columns `degrees`, inf where a shard exceeds `budget`); it stops once Σ_m max_r L(r, m) <= `goal`;
    `plan_pass(items)` is the split plan of those items in one micro-batch (None where none fits the budget)."""
    microbatch, passes = microbatch.copy(), list(passes)
    estimates = (row_least(table), row_least(table * degrees))
    costs = [float(plan.loads.max()) if plan is not None else 0.0 for plan in passes]
    tried: set[int] = set()
    for _ in range(MAX_MOVES):
        excess = [costs[m] - passes[m].lower_bound if passes[m] is not None and m not in tried else -math.inf
                  for m in range(len(passes))]
        m = int(np.argmax(excess))
        if math.fsum(costs) <= goal or not excess[m] > 0:
            break
        move = _best_move(m, microbatch, passes, costs, lengths, estimates, budget, plan_pass,
                          max(excess[m] / MAX_MOVES, MIN_FALL * math.fsum(costs)))
        if move is None:
            tried.add(m)
            continue
        moved, target, without, joined = move
        microbatch[moved] = target
        passes[m], passes[target] = without, joined
        costs[m], costs[target] = float(without.loads.max()), float(joined.loads.max())
        tried.discard(target)
    return microbatch, passes


def _best_move(m: int, microbatch: np.ndarray, passes: list, costs: list, lengths: np.ndarray, estimates: tuple,
               budget: int, plan_pass, least_fall: float) -> tuple | None:
    """(items moved, target micro-batch, m's plan without them, the target's plan with them) of the move
    out of micro-batch m that lowers the step most, by at least `least_fall` (see the module); None when
    none does.  A set is planned only where m's plan with the set taken out (not planned again) falls by
    more than the least estimated rise plus the best fall so far."""
    plan, items = passes[m], np.flatnonzero(microbatch == m)
    least = estimates[0]
    held = token_sums(microbatch, lengths, len(passes))
    best, best_fall = None, least_fall
    for chosen in _sets(plan):
        moved, rest = items[chosen], np.delete(items, chosen)
        left = float(plan.loads.sum() - np.dot(plan.item_time[chosen], plan.degree[chosen]))
        most = costs[m] - max(float(least[rest].max()), left / plan.num_ranks, float(_without(plan, chosen).max()))
        rises = sorted(_rises(m, moved, held, passes, costs, lengths, estimates, plan.num_ranks * budget))
        if not rises or not most - rises[0][0] > best_fall:
            continue
        targets = [k for _, k in rises[:TARGETS]]
        joins = [np.sort(np.concatenate((np.flatnonzero(microbatch == k), moved))) for k in targets]
        laid = []
        for joined in joins:  # until one target lays the set out
            laid.append(plan_pass(joined))
            if laid[-1] is not None:
                break
        if laid[-1] is None:  # no target lays the set out: no move, m not planned
            continue
        if len(laid) == len(joins) and not _certified_fall(costs, m, rest, targets, laid, plan_pass) > best_fall:
            continue
        without = plan_pass(rest)
        lowered = -math.inf if without is None else costs[m] - float(without.loads.max())
        for k, with_set in zip(targets, joins):
            if not lowered > best_fall:
                break
            joined = plan_pass(with_set)
            if joined is not None and lowered - (float(joined.loads.max()) - costs[k]) > best_fall:
                best_fall = lowered - (float(joined.loads.max()) - costs[k])
                best = (moved, k, without, joined)
    return best


def _certified_fall(costs: list, m: int, rest: np.ndarray, targets: list, laid: list, plan_pass) -> float:
    """The most the step can fall by moving a set out of micro-batch m into one of `targets`, whose plans with it
    (`laid`, None where none) are all made: m's plan without it (of the items `rest`) costs at least their pass bound
    (`plan_pass.bound`, under any plan's peak but for float error, FLOAT_SLACK), so m falls by at most its cost
    less that, and target k rises by its plan's peak less its cost.  At or below the fall a move must beat, m is
    not planned without the set (the long workload at D = 2560 x 16, T = 16k: 2 of its 29 regroup plans)."""
    most = costs[m] - plan_pass.bound(rest) * (1 - FLOAT_SLACK)
    return max(most - (float(joined.loads.max()) - costs[k]) for k, joined in zip(targets, laid) if joined is not None)


def _rises(m: int, moved: np.ndarray, held: np.ndarray, passes: list, costs: list, lengths: np.ndarray,
           estimates: tuple, room: int) -> list[tuple[float, int]]:
    """(estimated rise, micro-batch) of every other micro-batch whose tokens (`held`: each micro-batch's) hold
    `moved` too (`room` tokens): max(its cost, the moved items' longest least time, (its work + theirs) / D) − its
    cost."""
    least, work = estimates
    out, tokens, longest, extra = [], int(lengths[moved].sum()), float(least[moved].max()), float(work[moved].sum())
    for k, plan in enumerate(passes):
        if k == m or int(held[k]) + tokens > room:
            continue
        total = float(plan.loads.sum()) if plan is not None else 0.0
        rise = max(costs[k], longest, (total + extra) / passes[m].num_ranks)
        out.append((rise - costs[k], k))
    return out


def _without(plan: ContextParallelPlan, chosen: np.ndarray) -> np.ndarray:
    """The plan's rank loads with the items `chosen` taken out (no other item moved), subtracted in their order."""
    loads = plan.loads.copy()
    items, ranks = rank_pairs(plan.assignment[chosen], plan.degree[chosen])
    np.subtract.at(loads, ranks, plan.item_time[chosen][items])  # in pair order: each rank's as one by one
    return loads


def _sets(plan: ContextParallelPlan) -> list[np.ndarray]:
    """Indices (into the plan's items) of each set of items to try moving out: each of the CANDIDATES longest
    items on the most-loaded rank alone, then the crowd (`_crowd`); a set of every item left out."""
    rank = int(np.argmax(plan.loads))
    on = np.flatnonzero((plan.assignment <= rank) & (rank < plan.assignment + plan.degree))
    sets = [np.array([k]) for k in on[np.lexsort((on, -plan.item_time[on]))][:CANDIDATES].tolist()]
    crowd = _crowd(plan, plan.lower_bound * (1 + FLOAT_SLACK))
    if crowd.size > 1:
        sets.append(crowd)
    return [chosen for chosen in sets if chosen.size < plan.num_items]


def _crowd(plan: ContextParallelPlan, limit: float) -> np.ndarray:
    """The plan's items by time ascending (ties by index), each taken out while one of its ranks is above
    `limit`, in that order (see the module).

    A rank below the limit stays below (loads only fall), so only the ranks above it walk their items, in
    that order, each until it falls to the limit.  Up to its first split item a rank's walk is its own: all
    of them at once, an item a rank a step (numpy).  From there (its group's first split item: no rank is in
    two groups, and a group's ranks hold the same split items) a group's ranks walk together and apart from
    the other groups' (`_group_walks`).  Each rank subtracts the items taken out in the order they are, as a
    walk over every item would."""
    items, ranks, positions = _pairs_above(plan, plan.loads > limit)
    if not items.size:
        return np.zeros(0, dtype=np.int64)
    first = np.flatnonzero(np.concatenate(([True], ranks[1:] != ranks[:-1])))
    ends = np.append(first[1:], items.size)
    split = np.flatnonzero(plan.degree[items] > 1)
    later = np.searchsorted(split, first)  # each rank's first split pair, if any
    runs = np.minimum(np.where(later < split.size, split[np.minimum(later, max(split.size - 1, 0))], ends), ends) \
        if split.size else ends
    loads, walking, taken = plan.loads.copy(), first.copy(), []
    while True:  # each rank's own walk, one item a step
        step = np.flatnonzero((walking < runs) & (loads[ranks[first]] > limit))
        if not step.size:
            break
        pairs = walking[step]
        loads[ranks[pairs]] -= plan.item_time[items[pairs]]
        taken.append(pairs)
        walking[step] += 1
    taken = np.concatenate(taken) if taken else np.zeros(0, dtype=np.int64)
    rest = np.flatnonzero((walking < ends) & (loads[ranks[first]] > limit))
    which, left = rank_pairs(walking[rest], ends[rest] - walking[rest])  # the pairs left, rank by rank
    group = plan.assignment[items[walking[rest]]][which]  # the start of each one's group
    key, once = np.unique(group * plan.num_items + positions[left], return_index=True)  # a split item once a group
    walked = _group_walks(plan, loads, limit, items[left[once]], key // plan.num_items)
    found = np.concatenate((taken, left[once][walked]))
    return items[found[np.argsort(positions[found])]]


def _pairs_above(plan: ContextParallelPlan, above: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(item, rank, the item's position) of every shard on a rank `above`, by rank, then by position: the rank of
    the item's time ascending (ties by index) among the items with a shard there.  Only those items are sorted (the
    regroup's crowds: 8-28k of 27-39k items on the long workload), by their times' ranks among the distinct ones
    (`np.unique`: 16-bit keys sort stably in linear time, 6k distinct times there), and their shards by rank
    stably (16 bits as well: pairs made in position order stay in it on each rank)."""
    held = np.concatenate(([0], np.cumsum(above)))  # ranks above before each rank
    crowded = np.flatnonzero(held[plan.assignment + plan.degree] > held[plan.assignment])
    distinct, rank_of_time = np.unique(plan.item_time[crowded], return_inverse=True)
    ordered = crowded[np.argsort(_narrow(rank_of_time, distinct.size), kind="stable")]
    positions, ranks = rank_pairs(plan.assignment[ordered], plan.degree[ordered])
    on = above[ranks]
    positions, ranks = positions[on], ranks[on]
    by_rank = np.argsort(_narrow(ranks, plan.num_ranks), kind="stable")
    positions, ranks = positions[by_rank], ranks[by_rank]
    return ordered[positions], ranks, positions


def _narrow(keys: np.ndarray, bound: int) -> np.ndarray:
    """`keys` (all below `bound`) as 16-bit integers where they fit (numpy sorts those stably in linear time)."""
    return keys.astype(np.uint16) if bound <= 1 << 16 else keys


def _group_walks(plan: ContextParallelPlan, loads: np.ndarray, limit: float, items: np.ndarray,
                 groups: np.ndarray) -> np.ndarray:
    """Indices of `items` taken out: each group (`groups`: the start of the items' group, ascending, each group's
    items by position, its first split) walks its items, one a step and all groups at once, taking one out while
    one of its ranks is above `limit` (a split item's: its group's), until the group's ranks all are not;
    `loads` (the ranks' after their own walks) lowered in place."""
    if not items.size:
        return np.zeros(0, dtype=np.int64)
    heads = np.flatnonzero(np.concatenate(([True], groups[1:] != groups[:-1])))
    tails = np.append(heads[1:], items.size)
    base, width = groups[heads], plan.degree[items[heads]]
    pointer, alive, taken = heads.copy(), np.arange(heads.size), []
    while alive.size:
        member, cover = rank_pairs(base[alive], width[alive])
        peak = np.maximum.reduceat(loads[cover], np.cumsum(width[alive]) - width[alive])
        k = items[pointer[alive]]
        split = plan.degree[k] > 1
        take = np.where(split, peak, loads[plan.assignment[k]]) > limit
        hit = (take & split)[member]
        loads[cover[hit]] -= plan.item_time[k][member[hit]]  # no rank twice: one item a group, groups apart
        lone = take & ~split
        loads[plan.assignment[k[lone]]] -= plan.item_time[k[lone]]
        taken.append(pointer[alive][take])
        pointer[alive] += 1
        alive = alive[(peak > limit) & (pointer[alive] < tails[alive])]  # a group whose ranks fell takes no more
    return np.concatenate(taken)

"""The split micro-batch bound (`microbatch.split_microbatches`, whose docstring states the problem):
canonical allotment, stacked and leader bounds.

Laying a plan's micro-batches end to end is one pass whose rank r works Σ_m L(r, m) <=
step, in which every item keeps its degree and every shard holds at most T tokens, so the
canonical allotment of that pass (`bound.py`, each item's degrees those whose largest shard fits
T) bounds Σ_m max_r L(r, m); so do `stacked_bound` (the costliest micro-batches hold the
items of the largest least times, which need several micro-batches by their tokens or the ranks their
shards hold alone, and at most j · D · T tokens of the work) and `leader_bound` (the micro-batch of the
longest item leaves its group's ranks no time for others at its cost, so its other ranks hold at most
(D − c) · T tokens of the work); the D · M cells hold every token, so M >= ⌈Σ l / (D · T)⌉ and the bound is
the largest of the three + that M (or the given one) · overhead.  None of them asks where groups sit, so on
nodes where some blocks straddle two and are left out (`blocks.py`) they stay bounds (fewer blocks only raise
the optimum).
"""

from __future__ import annotations

import numpy as np

from ..microbatch.plan import float_sum
from ..problem import exact_sum, make_problem
from .bound import least_work
from .grouping import ByTime, by_time, row_least
from .spec import ContextParallel
from .split import allot, allowed_degrees


def split_bound(lengths: np.ndarray, num_ranks: int, spec: ContextParallel, cost, budget: int,
                overhead: float, num_microbatches: int | None) -> tuple[float, int, np.ndarray, ByTime]:
    """(the step bound every split plan meets, the fewest micro-batches the tokens need, every
    item's time at every allowed degree, inf where a shard exceeds the budget, the items by their least
    time as the fills read them (`grouping.by_time`, whose order `stacked_bound` reads too; free where
    `num_microbatches` is None: the grouping may then open micro-batches past the count)): see the module,
    and `stacked_bound`."""
    problem = make_problem(lengths, num_ranks, cost=cost)
    degrees = allowed_degrees(spec, num_ranks, spec.gpus_per_node)
    allotment = allot(problem, spec, degrees, spec.gpus_per_node, budget, one_pass=False)
    fewest = max(1, -(-int(lengths.sum()) // (num_ranks * budget)))
    m = fewest if num_microbatches is None else num_microbatches
    work = problem.item_costs.copy()
    work[allotment.candidates] = least_work(allotment.times, allotment.degrees, allotment.allowed)[:, 0]
    # Any item may split in some micro-batch: its least time is over every degree its shards fit.
    split, every = degrees > 1, np.empty((lengths.size, degrees.size))
    every[:, ~split] = problem.item_costs[:, None]  # `item_times` at degree 1: the unsplit cost, the same floats
    every[:, split] = spec.item_times(problem.cost, lengths[:, None], degrees[None, split],
                                      (degrees[split] <= spec.gpus_per_node)[None, :])
    table = np.where(-(-lengths[:, None] // degrees[None, :]) <= budget, every, np.inf)
    ordered = by_time(table, degrees, problem.item_costs, lengths, budget, num_microbatches is None)
    alone = alone_ranks(table, degrees, lengths, budget)
    dense = density_order(lengths, work)
    bound = max(allotment.bound(),
                stacked_bound(ordered.times, ordered.order, work, lengths, alone, num_ranks, budget, dense),
                leader_bound(table, degrees, work, lengths, num_ranks, budget, dense))
    return float_sum([bound, m * overhead]), fewest, table, ordered


def alone_ranks(table: np.ndarray, degrees: np.ndarray, lengths: np.ndarray, budget: int) -> np.ndarray:
    """Ranks each item holds alone in any micro-batch: where at every degree its shards fit (`table`
    finite) each of them holds more than T / 2 tokens, the smallest such degree (no two such shards
    share a rank); else 0.

    >>> alone_ranks(np.array([[np.inf, 1.0], [2.0, 1.0]]), np.array([1, 2]), np.array([30, 10]), 16).tolist()
    [2, 0]
    """
    smallest, lone = np.zeros(lengths.size, dtype=degrees.dtype), np.ones(lengths.size, dtype=bool)
    for k in range(degrees.size - 1, -1, -1):  # column by column (`grouping.row_least`), the smallest degree last
        fits = np.isfinite(table[:, k])
        lone &= ~fits | (2 * (lengths // degrees[k]) > budget)  # its smallest shard holds more than T / 2
        smallest = np.where(fits, degrees[k], smallest)
    return np.where(lone, smallest, 0)


def stacked_bound(times: np.ndarray, order: np.ndarray, work: np.ndarray, lengths: np.ndarray, alone: np.ndarray,
                  num_ranks: int, budget: int, dense: np.ndarray) -> float:
    """max over j of Σ_{i<j} τ_i + (W − K_j) / D, a bound on Σ_m max_r L(r, m).

    Leaders: with items by least time τ descending, the first k_i of them (every item of time >= τ_(k_i))
    hold more than i · D · T tokens, or more than i · D ranks alone (`alone`, `alone_ranks`), so they span
    i + 1 micro-batches and the (i + 1)-th costliest micro-batch costs at least τ_i = τ_(k_i).  Crowded:
    the j costliest hold at most j · D · T tokens, so at most K_j of the least work W (the most work that
    many tokens hold, a fractional knapsack by work per token), and the others cost at least (W − K_j) / D
    together.  j = 0 is W / D; j = 1, τ_max + (W − K_1) / D.  `order`: the items by τ, longest first (ties by
    index); `dense`: `density_order(lengths, work)`.

    >>> work, lengths = np.array([10.0, 1.0, 1.0]), np.array([4, 4, 4])
    >>> stacked_bound(work, np.arange(3), work, lengths, np.zeros(3, dtype=np.int64), 2, 4,
    ...               density_order(lengths, work))  # the leaders 10 + 1 (crowded: 10 + 1 / 2)
    11.0
    >>> work, lengths = np.array([9.0, 8.0, 1.0, 1.0]), np.array([3, 3, 3, 3])
    >>> stacked_bound(work, np.arange(4), work, lengths, np.zeros(4, dtype=np.int64), 1, 4,
    ...               density_order(lengths, work))  # W / D, the optimum (the leaders: 9 + 8 + 1)
    19.0
    """
    if not times.size:
        return 0.0
    room = num_ranks * budget
    tokens, ranks = np.cumsum(lengths[order]), np.cumsum(alone[order])
    spans = max(-(-int(tokens[-1]) // room), -(-int(ranks[-1]) // num_ranks))
    marks = np.arange(spans, dtype=np.int64)
    leaders = np.zeros(spans)
    for prefix, unit in ((tokens, room), (ranks, num_ranks)):
        first = np.searchsorted(prefix, marks * unit, side="right")  # first index whose prefix exceeds i units
        inside = first < order.size
        leaders[inside] = np.maximum(leaders[inside], times[order[first[inside]]])
    total = exact_sum(work)
    held = most_work(lengths, work, np.arange(spans + 1, dtype=np.int64) * room, dense)
    ahead = np.concatenate(([0.0], np.cumsum(leaders)))
    return float(np.max(ahead + np.maximum(0.0, total - held) / num_ranks))


def density_order(lengths: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Items by work per token, densest first (ties by index; an item of no tokens first)."""
    return np.argsort(-np.divide(work, lengths, out=np.full(work.size, np.inf), where=lengths > 0), kind="stable")


def most_work(lengths: np.ndarray, work: np.ndarray, space: np.ndarray, dense: np.ndarray) -> np.ndarray:
    """The most work items of `lengths` tokens can hold within each `space` tokens: a fractional knapsack
    by work per token (an upper bound on the work of any items within that many tokens), the items taken
    in the order `dense` (`density_order`; an item of no tokens and no work may sit anywhere in it).

    >>> lengths, work = np.array([4, 4]), np.array([8.0, 2.0])
    >>> most_work(lengths, work, np.array([0, 2, 6, 9]), density_order(lengths, work)).tolist()
    [0.0, 4.0, 9.0, 10.0]
    """
    density = np.divide(work, lengths, out=np.full(work.size, np.inf), where=lengths > 0)
    held_tokens, held_work = np.cumsum(lengths[dense]), np.concatenate(([0.0], np.cumsum(work[dense])))
    whole = np.searchsorted(held_tokens, space, side="right")  # items taken whole within the space
    rate = np.where(whole < dense.size, density[dense[np.minimum(whole, dense.size - 1)]], 0.0)  # the next item's
    partial = (space - np.concatenate(([0], held_tokens))[whole]) * rate
    return np.where(whole < dense.size, held_work[whole] + np.nan_to_num(partial, posinf=0.0), held_work[-1])


def leader_bound(table: np.ndarray, degrees: np.ndarray, work: np.ndarray, lengths: np.ndarray, num_ranks: int,
                 budget: int, dense: np.ndarray) -> float:
    """min over the degrees c the longest item g may run at of t_g(c) + (W − w_g − K_c) / D, a bound on
    Σ_m max_r L(r, m) (`table`: every item's best-case time per degree, inf where a shard exceeds T).

    The micro-batch holding g costs L >= t_g(c) on g's group of c ranks, whose other work fits in
    c · (L − t_g(c)); its other D − c ranks hold at most (D − c) · T tokens, so at most K_c (`most_work`)
    of the others' least work W − w_g; the rest runs in the other micro-batches, at least its share of D
    ranks.  L + (W − w_g − K_c − c · (L − t_g(c))) / D grows with L, so L = t_g(c) bounds the step.
    `dense`: `density_order(lengths, work)` (g's place in it then holds no tokens and no work).

    >>> work, lengths = np.array([10.0, 1.0, 1.0]), np.array([8, 4, 4])
    >>> leader_bound(np.array([[np.inf, 6.0], [1.0, 0.6], [1.0, 0.6]]), np.array([1, 2]), work, lengths, 2, 4,
    ...              density_order(lengths, work))  # g at degree 2 holds both ranks
    7.0
    """
    g = int(np.argmax(row_least(table)))
    fits = np.flatnonzero(np.isfinite(table[g]))
    others_lengths, others_work = lengths.copy(), work.copy()
    others_lengths[g], others_work[g] = 0, 0.0
    held = most_work(others_lengths, others_work, (num_ranks - degrees[fits]) * budget, dense)
    return float(np.min(table[g, fits] + np.maximum(0.0, exact_sum(others_work) - held) / num_ranks))

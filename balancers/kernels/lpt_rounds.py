"""One round of LPT in numpy: the ranks by (load, rank), and how many of the next items the heap loop gives them in
that order (`lpt`, `karmarkar_karp` and the locality kernels' rounds).

Item k of a round goes to the k-th least-loaded rank exactly when that rank stays ahead of every rank topped up
before it in the round: (loads[k], ranks[k]) < min over j < k of (loads[j] + costs[j], ranks[j]).
"""

from __future__ import annotations

import numpy as np

from ..problem import integer_keys_fit


def integer_loads(costs: np.ndarray, num_ranks: int) -> bool:
    """Whether loads (sums of `costs`) make int64 keys load · D + rank that sort like (load, rank)."""
    return float(costs.sum()) * num_ranks < 2.0**62 and integer_keys_fit(costs, 1)  # the cheap test first


def ranks_by_load(loads: np.ndarray, integer: bool) -> np.ndarray:
    """Ranks by (load, rank) ascending."""
    if integer:
        return np.sort(loads.astype(np.int64) * loads.size + np.arange(loads.size)) % loads.size
    return np.argsort(loads, kind="stable")


def smallest_ranks(loads: np.ndarray, count: int, integer: bool) -> np.ndarray:
    """The first `count` of `ranks_by_load(loads)`, by partial selection when that is cheaper."""
    size = loads.size
    if 4 * count >= size:
        return ranks_by_load(loads, integer)[:count]
    if integer:
        keys = loads.astype(np.int64) * size + np.arange(size)  # unique: any selection agrees
        chosen = np.argpartition(keys, count - 1)[:count]
        return chosen[np.argsort(keys[chosen])]
    threshold = np.partition(loads, count - 1)[count - 1]
    below = np.flatnonzero(loads < threshold)
    tied = np.flatnonzero(loads == threshold)[: count - below.size]  # lowest ranks first
    chosen = np.concatenate((below, tied))
    return chosen[np.lexsort((chosen, loads[chosen]))]


def round_length(loads_sorted: np.ndarray, ranks_sorted: np.ndarray, costs: np.ndarray,
                 integer: bool = False) -> int:
    """How many of `costs` the heap loop would give to the ranks in sorted order.

    Item k goes to ranks_sorted[k] iff (loads_sorted[k], ranks_sorted[k]) is below
    (loads_sorted[j] + costs[j], ranks_sorted[j]) for every j < k.  With `integer` loads
    (see `integer_loads`) the pairs become int64 keys load · D + rank and the check is one
    prefix minimum; otherwise the loads first, then the ties among them (`_first_tie_lost`).
    """
    topped = loads_sorted + costs
    if integer:
        scale = ranks_sorted.max() + 1
        keys = topped.astype(np.int64) * scale + ranks_sorted
        waiting_keys = loads_sorted[1:].astype(np.int64) * scale + ranks_sorted[1:]
        failed = np.flatnonzero(waiting_keys > np.minimum.accumulate(keys)[:-1])
        return int(failed[0]) + 1 if failed.size else costs.size
    prefix_min = np.minimum.accumulate(topped)[:-1]
    waiting = loads_sorted[1:]
    not_strict = np.flatnonzero(waiting >= prefix_min)
    if not not_strict.size:
        return costs.size
    first = int(not_strict[0])
    if waiting[first] > prefix_min[first]:
        return first + 1
    above = np.flatnonzero(waiting[not_strict] > prefix_min[not_strict])  # the first item losing on its load alone
    ties = not_strict[:above[0]] if above.size else not_strict
    lost = _first_tie_lost(topped, prefix_min, ranks_sorted, ties)
    return lost + 1 if lost is not None else int(not_strict[above[0]]) + 1 if above.size else costs.size


def _first_tie_lost(topped: np.ndarray, prefix_min: np.ndarray, ranks_sorted: np.ndarray, ties: np.ndarray
                    ) -> int | None:
    """The first of `ties` (j: item j + 1's load equals prefix_min[j], the least of topped[:j + 1]) where a rank
    topped up to that load before has a lower rank than ranks_sorted[j + 1], or None.

    Those ranks are the ones of topped[i] == prefix_min[i] (i <= j) within the run of prefix minima equal to
    prefix_min[j] (a run starts where the minimum falls, at such a rank): a minimum of rank keys that each run
    lowers below every earlier one, one prefix minimum in all."""
    count = int(ties[-1]) + 1
    minima = prefix_min[:count]
    runs = np.concatenate(([0], np.cumsum(minima[1:] != minima[:-1])))
    scale = int(ranks_sorted[:count + 1].max()) + 1
    rank_keys = np.where(topped[:count] == minima, ranks_sorted[:count], scale) - runs * (scale + 1)
    least = np.minimum.accumulate(rank_keys)[ties] + runs[ties] * (scale + 1)
    lost = np.flatnonzero(ranks_sorted[ties + 1] > least)
    return int(ties[lost[0]]) if lost.size else None

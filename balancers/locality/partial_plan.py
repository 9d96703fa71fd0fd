"""A partial plan under a makespan target and a token cap, as the communication-aware phases build it.

Destinations (-1 while unplaced), rank loads and rank tokens (`take`, `put` and `put_runs`
count tokens only under a cap: without one no check reads them), kept consistent; items are
also indexed by their cost rank (largest first, ties by index) so that phases can search
sorted runs of them.  Where every item costs the same (`uniform`: a micro-batch of one video
size's frames), the cost rank is the index itself and no phase reads a cost or a rank through
the cost order (`costs_of`, `items_ranked`): the same values without their gathers.
"""

from __future__ import annotations

import functools

import numpy as np

from ..problem import Problem


class PartialPlan:
    """Destinations, rank loads and rank tokens of a partial plan under a target and a cap."""

    def __init__(self, problem: Problem, target: float):
        self.costs, self._lengths = problem.item_costs, problem.lengths
        self.target = target
        self.cap = np.inf if problem.max_tokens_per_rank is None else float(problem.max_tokens_per_rank)
        self.item_of_rank = problem.cost_order  # largest first, ties by index
        self.rank_bits = problem.num_items.bit_length()  # cost ranks fit this many bits
        # One cost for every item: the cost order is the index order (ties by index), so no gather needs it.
        self.uniform = problem.num_items > 0 and bool(problem.sorted_costs[0] == problem.sorted_costs[-1])
        rank_type = np.int32 if self.rank_bits < 31 else np.int64
        if self.uniform:
            self.cost_rank = np.arange(problem.num_items, dtype=rank_type)
        else:
            self.cost_rank = np.empty(problem.num_items, dtype=rank_type)
            self.cost_rank[self.item_of_rank] = np.arange(problem.num_items)
        self.sorted_costs = problem.sorted_costs
        # ... and every sum of up to n of them exact, in any order: such sums are counts times the cost
        self.exact_cost = float(problem.sorted_costs[0]) if self.uniform and exact_sums(
            float(problem.sorted_costs[0]), problem.num_items) else None
        self.destinations = np.full(problem.num_items, -1, dtype=np.int64)
        self.loads = np.zeros(problem.num_ranks)
        self.tokens = np.zeros(problem.num_ranks)

    @functools.cached_property
    def negated_sorted_costs(self) -> np.ndarray:
        """-sorted_costs (ascending: binary searches by cost), made where first read (a deal of one cost reads none)."""
        return -self.sorted_costs

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """The items' lengths as float64, converted where first read (without a cap, few deals read them)."""
        return self._lengths.astype(np.float64)

    def group_keys(self, groups: np.ndarray, items: np.ndarray | None) -> np.ndarray:
        """The keys group << rank_bits | cost rank of `items` (None: every item), groups[k] the
        (non-negative) group of the k-th, sorted: int32 where every key fits (its sort takes half
        the time of int64's), else int64.  One plain sort: numpy's SIMD sort of packed keys beats ordering
        the runs of equal groups even where items ascend in a few long runs (AVX-512, numpy 2.4)."""
        narrow = groups.size == 0 or (int(groups.max()) + 1) << self.rank_bits <= 2**31
        keys = groups.astype(np.int32 if narrow else np.int64)
        keys <<= self.rank_bits
        keys |= self.cost_rank if items is None else items if self.uniform else self.cost_rank[items]
        keys.sort()
        return keys

    def costs_of(self, items: np.ndarray) -> np.ndarray:
        """`costs[items]`, without the gather where every item costs the same."""
        return np.full(items.shape, self.sorted_costs[0]) if self.uniform else self.costs[items]

    def ranked_costs(self, cost_ranks: np.ndarray) -> np.ndarray:
        """`sorted_costs[cost_ranks]`: the costs of these cost ranks (without the gather where every item costs the
        same)."""
        return np.full(cost_ranks.shape, self.sorted_costs[0]) if self.uniform else self.sorted_costs[cost_ranks]

    def items_ranked(self, cost_ranks: np.ndarray) -> np.ndarray:
        """`item_of_rank[cost_ranks]`: the items of these cost ranks (themselves where every item costs the same)."""
        return cost_ranks if self.uniform else self.item_of_rank[cost_ranks]

    def fits(self, items: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """Whether each item fits on its rank under the target and the cap (rows of a 2-D `ranks`
        when `items` has a trailing axis of 1)."""
        fits = self.loads[ranks] + self.costs[items] <= self.target
        if self.cap < np.inf:
            fits &= self.tokens[ranks] + self.lengths[items] <= self.cap
        return fits

    def take(self, items: np.ndarray) -> None:
        """Remove placed items from their ranks."""
        np.subtract.at(self.loads, self.destinations[items], self.costs[items])
        if self.cap < np.inf:
            np.subtract.at(self.tokens, self.destinations[items], self.lengths[items])
        self.destinations[items] = -1

    def put_runs(self, items: np.ndarray, ranks: np.ndarray, costs: np.ndarray | None = None) -> None:
        """Place items on ranks (a rank any number of times); `costs`, the items' costs where the caller has them."""
        self.destinations[items] = ranks
        costs = self.costs[items] if costs is None else costs
        self.loads += np.bincount(ranks, weights=costs, minlength=self.loads.size)
        if self.cap < np.inf:
            self.tokens += np.bincount(ranks, weights=self.lengths[items], minlength=self.loads.size)

    def put_one(self, item: int, rank: int) -> None:
        """Place one item on a rank (`put` of one, without arrays of one)."""
        self.destinations[item] = rank
        self.loads[rank] += self.costs[item]
        if self.cap < np.inf:
            self.tokens[rank] += self.lengths[item]

    def put(self, items: np.ndarray, ranks: np.ndarray) -> None:
        """Place items on ranks (each rank at most once per call)."""
        self.destinations[items] = ranks
        self.loads[ranks] += self.costs[items]
        if self.cap < np.inf:
            self.tokens[ranks] += self.lengths[items]


def exact_sums(cost: float, count: int) -> bool:
    """Whether every sum of up to `count` copies of `cost` (> 0) is exact in float64, whatever the order: cost is
    m · 2**e with m odd and count · m < 2**53, so each partial sum k · cost is a float.

    >>> exact_sums(3 * 2.0**21, 10**6), exact_sums(0.1, 3), exact_sums(0.0, 5)
    (True, False, False)
    """
    if not 0 < cost < np.inf:
        return False
    numerator, _ = cost.as_integer_ratio()  # cost = numerator / 2**k, or numerator itself
    return count * (numerator >> ((numerator & -numerator).bit_length() - 1)) < 2**53


def node_of(ranks: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """`ranks // gpus_per_node` (non-negative ranks): a shift where the node size is a power of two (5x faster
    than numpy's integer division on 10^5 ranks), the same integers.

    >>> node_of(np.array([0, 7, 8, 17]), 8).tolist(), node_of(np.array([0, 5, 6, 13]), 6).tolist()
    ([0, 0, 1, 2], [0, 0, 1, 2])
    """
    if gpus_per_node & (gpus_per_node - 1) == 0:
        return ranks >> (gpus_per_node.bit_length() - 1)
    return ranks // gpus_per_node


def on_other_nodes(ranks: np.ndarray, others: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Whether ranks[i] and others[i] (non-negative) lie on different nodes: their bits above the node size's
    differ where it is a power of two (one pass, no node arrays), else `node_of` of each.

    >>> on_other_nodes(np.array([0, 7, 8]), np.array([7, 8, 15]), 8).tolist()
    [False, True, False]
    """
    if gpus_per_node & (gpus_per_node - 1) == 0:
        return np.bitwise_xor(ranks, others) >= gpus_per_node
    return node_of(ranks, gpus_per_node) != node_of(others, gpus_per_node)


def runs(sorted_keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start of the run of equal keys each entry belongs to, its position inside that run)."""
    n = sorted_keys.size
    starts = np.flatnonzero(np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1]))) if n else sorted_keys
    run_start = np.repeat(starts, np.diff(np.append(starts, n)))
    return run_start, np.arange(n) - run_start

"""verl's `get_seqlen_balanced_partitions`, backed by orchmllm's balancers.

verl (`verl/utils/seqlen_balancing.py`) splits a batch into k partitions whose sums of
`seqlen_list` (sequence lengths, or the workloads of its `calculate_workload`) are
balanced, with Karmarkar–Karp, for its DP ranks (`equal_size=True`) and its micro-batches
(`equal_size=False`).  The contract kept here, read from verl's code (none of it copied):

- `seqlen_list`: ints or floats (a list, a numpy array, a torch tensor on any device, as
  verl's trainer passes its workloads); `k_partitions`: an int; `equal_size`: a bool, or 0 / 1
  as a config may give it (verl takes any truthy value; here a string or 2 is refused);
- returns k lists of Python ints, every index 0..n-1 once, each list sorted ascending and
  none empty; with `equal_size` every list holds n / k;
- raises AssertionError, as verl's asserts do, when n < k, and when `equal_size` is set
  and k does not divide n (here `VerlContractError`, also a ValueError; k < 1 too);
- orders the partitions as verl's final sort does: largest sum first, ties by more items
  (verl then compares its sets' items in its merge order; here the smaller first index).

Each plan is the best of verl's own Karmarkar–Karp (`verl_karmarkar_karp`, reimplemented:
the same plans), orchmllm's (the balanced variant with `equal_size`) and LPT, with free
sizes then improved by a short local search: never worse than verl's plan, much better
where Karmarkar–Karp is weak (equal sizes on long-tailed workloads), and faster than
verl's at verl's sizes (`benchmarks/bench_verl.py`); for the
best plan at any cost, `balance(seqlen_list, k, equal_counts=equal_size)` searches longer.
On purpose, values must be finite and non-negative (verl balances NaN or negative values
into arbitrary partitions, or asserts on an empty one), and no partition is ever empty
(verl asserts when its merges leave one).

    from orchmllm.integrations.verl import get_seqlen_balanced_partitions
    # in place of: from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

from ..balancers.constraints import equal_counts
from ..balancers.kernels import karmarkar_karp, lpt
from ..balancers.kernels.karmarkar_karp import find_roots
from ..balancers.problem import as_lengths, make_problem, rank_loads
from ..balancers.search import local_search
from ..balancers.validation import as_array, as_bool, as_int, as_item_bytes, check_dense_tensor, is_int

SEARCH_WORK_PER_ITEM = 20
"""Local-search work (`local_search.improve`'s candidates, ~20 ns each) per item with free sizes."""


class VerlContractError(AssertionError, ValueError):
    """An input verl's `get_seqlen_balanced_partitions` asserts against: an AssertionError
    there (so callers' handlers keep working), a ValueError as orchmllm raises for bad input."""


def get_seqlen_balanced_partitions(seqlen_list, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Split indices 0..n-1 into `k_partitions` sorted, non-empty lists of balanced sums.

    Minimises the largest sum of `seqlen_list` over the partitions (the best of verl's
    Karmarkar–Karp, orchmllm's and LPT, locally improved with free sizes), every list holding n / k
    items when `equal_size`; the lists come largest sum first, as verl returns them.

    >>> get_seqlen_balanced_partitions([5, 4, 3, 3, 3], 2, equal_size=False)  # sums 9 and 9
    [[2, 3, 4], [0, 1]]
    >>> get_seqlen_balanced_partitions([8, 1, 1, 1, 1, 1, 1, 1], 2, equal_size=True)  # sums 11 and 4
    [[0, 2, 4, 6], [1, 3, 5, 7]]
    >>> get_seqlen_balanced_partitions([0.5, 2.25, 1.75], 2, equal_size=False)  # equal sums: more items first
    [[0, 2], [1]]
    >>> get_seqlen_balanced_partitions([1, 2, 3], 2, equal_size=True)
    Traceback (most recent call last):
    ...
    orchmllm.integrations.verl.VerlContractError: equal_size=True needs k_partitions=2 to divide the 3 items ...
    """
    k = as_int(k_partitions, "k_partitions")
    if is_int(equal_size):  # 0 / 1 from a config, as verl's `if` takes them; bools are no ints here
        if equal_size not in (0, 1):
            raise ValueError(f"`equal_size` must be a bool, or 0 / 1; got {equal_size!r}")
        equal_size = bool(equal_size)
    equal_size = as_bool(equal_size, "equal_size")
    array = as_array(_host_values(seqlen_list), "seqlen_list", "numbers")
    if array.ndim != 1:
        raise ValueError(f"`seqlen_list` must be 1-D; got shape {array.shape}")
    if k < 1:
        raise VerlContractError(f"`k_partitions` must be at least 1; got {k}")
    if array.size < k:
        raise VerlContractError(f"number of items:[{array.size}] < k_partitions:[{k}]: verl asserts at least one "
                                f"item per partition")
    if equal_size and array.size % k:
        raise VerlContractError(f"equal_size=True needs k_partitions={k} to divide the {array.size} items "
                                f"({array.size} % {k} = {array.size % k}), as verl asserts")
    if array.dtype.kind == "f":
        costs = as_item_bytes(array, array.size, "seqlen_list")
        lengths = np.zeros(array.size, dtype=np.int64)  # only a memory cap counts them; none here
    else:
        lengths, costs = as_lengths(array, "seqlen_list"), None
    try:
        problem = make_problem(lengths, k, costs=costs, equal_counts=equal_size)
    except ValueError as error:  # the sums' checks name the balancers' arguments; the caller passed `seqlen_list`
        raise ValueError(f"`seqlen_list`: {error}") from error
    assignment = _balanced(problem)
    return _partitions(_fill_empty(assignment, problem.item_costs, k), problem.item_costs, k)


def _balanced(problem) -> np.ndarray:
    """verl's own Karmarkar–Karp (`verl_karmarkar_karp`), orchmllm's and LPT, whichever has the smallest largest
    sum (ties: the first, verl's); with free sizes, improved by a local search of `SEARCH_WORK_PER_ITEM` work per
    item.  verl's plan is a start, so no plan is worse than verl's: orchmllm's Karmarkar–Karp breaks ties and
    merges otherwise, and the better of it and LPT was worse than verl's on ~1 % of uniform random instances."""
    kernels = ((equal_counts.solve_karmarkar_karp, equal_counts.solve_lpt) if problem.equal_counts
               else (karmarkar_karp.solve, lpt.solve))
    verls = verl_karmarkar_karp(problem.item_costs, problem.num_ranks, problem.equal_counts)
    starts = [verls] + [kernel(problem).assignment for kernel in kernels]
    best = min(starts, key=lambda start: rank_loads(problem, start).max())
    if problem.equal_counts:
        return best.copy()
    return local_search.improve(problem, best, SEARCH_WORK_PER_ITEM * problem.num_items).assignment.copy()


def verl_karmarkar_karp(weights: np.ndarray, num_ranks: int, equal_size: bool) -> np.ndarray:
    """verl's `karmarkar_karp` (k-way largest differencing, reimplemented: the same plans), a rank per item;
    with `equal_size`, k | n items in n / k groups of k, one per rank.

    A state is a list of up to k sets kept by sum, largest first (absent sets are empty).
    Repeatedly merge the two states of largest spread (max sum - min sum), pairing the
    largest set of one with the smallest of the other.  Sets are labelled by one of their
    items; a merge records which label absorbed which, resolved at the end.
    """
    n, k = weights.size, num_ranks
    order = np.lexsort((np.arange(n), weights))  # ascending, ties by index, as verl sorts
    parent = np.arange(n, dtype=np.int64)
    heap: list[tuple[float, float, int, np.ndarray, np.ndarray]] = []
    arrival = itertools.count()  # final tie-break: the older state first

    def push(sums: np.ndarray, labels: np.ndarray) -> None:
        by_sum = np.argsort(-sums, kind="stable")  # equal sums keep their (deterministic) order
        sums, labels = sums[by_sum], labels[by_sum]
        low = sums[-1] if sums.size == k else 0.0
        heapq.heappush(heap, (-(sums[0] - low), -sums[0], next(arrival), sums, labels))

    step = k if equal_size else 1
    for start in range(0, n, step):
        labels = order[start:start + step]
        push(weights[labels], labels.copy())
    while len(heap) > 1:
        *_, sums_a, labels_a = heapq.heappop(heap)
        *_, sums_b, labels_b = heapq.heappop(heap)
        p, q = sums_a.size, sums_b.size
        # Set i of A meets set k-1-i of B: A[k-q:p] meets B[k-p:q] reversed; B[:k-p]
        # meets empty sets of A, A[:k-q] empty sets of B.
        both = max(p + q - k, 0)
        a_met, b_met = slice(p - both, p), slice(q - both, q)
        parent[labels_b[b_met][::-1]] = labels_a[a_met]
        sums = np.concatenate((sums_a[:p - both], sums_a[a_met] + sums_b[b_met][::-1], sums_b[:q - both]))
        labels = np.concatenate((labels_a, labels_b[:q - both]))
        push(sums, labels)
    *_, _, final_labels = heap[0]
    rank_of_root = np.empty(n, dtype=np.int64)
    rank_of_root[final_labels] = np.arange(final_labels.size)
    return rank_of_root[find_roots(parent)]  # every label to the root that absorbed it


def _host_values(seqlen_list):
    """A tensor (on any device, with or without grad; dense: `check_dense_tensor`) as a list; anything else as
    given."""
    if hasattr(seqlen_list, "detach"):
        check_dense_tensor(seqlen_list, "seqlen_list")
    if not isinstance(seqlen_list, np.ndarray) and callable(getattr(seqlen_list, "tolist", None)):
        return seqlen_list.tolist()
    return seqlen_list


def _fill_empty(assignment: np.ndarray, costs: np.ndarray, k: int) -> np.ndarray:
    """Move the cheapest item of the partition with most items to each empty one.

    Only zero costs can leave a partition empty; the largest sum never grows (the donor
    loses an item, the empty partition gets less than the donor held), and with n >= k the
    partition with most items holds two whenever one is empty.
    """
    counts = np.bincount(assignment, minlength=k)
    for empty in np.flatnonzero(counts == 0).tolist():
        donor = int(np.argmax(counts))
        items = np.flatnonzero(assignment == donor)
        assignment[items[int(np.argmin(costs[items]))]] = empty
        counts[donor] -= 1
        counts[empty] += 1
    return assignment


def _partitions(assignment: np.ndarray, costs: np.ndarray, k: int) -> list[list[int]]:
    """The partitions as sorted lists, largest sum first, then more items, then smaller first index."""
    members = np.argsort(assignment, kind="stable")  # every partition's items in ascending order
    counts = np.bincount(assignment, minlength=k)
    parts = np.split(members, np.cumsum(counts)[:-1])
    sums = np.bincount(assignment, weights=costs, minlength=k)
    order = np.lexsort(([int(part[0]) for part in parts], -counts, -sums))
    return [parts[partition].tolist() for partition in order.tolist()]

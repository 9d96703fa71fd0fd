"""verl's `get_seqlen_balanced_partitions`, backed by orchmllm's balancers.

verl (`verl/utils/seqlen_balancing.py`) splits a batch into k partitions whose sums of
`seqlen_list` (sequence lengths, or the workloads of its `calculate_workload`) are
balanced, with Karmarkar–Karp, for its DP ranks (`equal_size=True`) and its micro-batches
(`equal_size=False`).  The contract kept here, read from verl's public code (none of it is
copied): k lists of indices, each sorted ascending, together covering every index once,
none empty; with `equal_size` every list has the same length.

One difference, on purpose: verl asserts that k divides n when `equal_size` is set; here
the sizes are then floor(n / k) or ceil(n / k) (`balance(..., equal_counts=True)`).

    from orchmllm.integrations.verl import get_seqlen_balanced_partitions
    # in place of: from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions
"""

from __future__ import annotations

import numpy as np

from ..balancers import balance
from ..balancers.problem import as_lengths
from ..balancers.validation import as_bool, as_int


def get_seqlen_balanced_partitions(seqlen_list, k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Split indices 0..n-1 into `k_partitions` sorted, non-empty lists of balanced sums.

    Minimises the largest sum of `seqlen_list` over the partitions (orchmllm's `auto`:
    never worse than Karmarkar–Karp or LPT, often optimal), every list holding n / k
    items when `equal_size` (floor or ceil when k does not divide n).  A plan that leaves
    a list empty (only possible with zero lengths or fewer items than lists could fill) is
    replaced by the equal-size plan, which never does.

    >>> get_seqlen_balanced_partitions([5, 4, 3, 3, 3], 2, equal_size=False)
    [[0, 1], [2, 3, 4]]
    >>> get_seqlen_balanced_partitions([8, 1, 1, 1, 1, 1, 1, 1], 2, equal_size=True)
    [[0, 5, 6, 7], [1, 2, 3, 4]]
    """
    lengths = as_lengths(seqlen_list, "seqlen_list")
    k = as_int(k_partitions, "k_partitions", minimum=1)
    equal_size = as_bool(equal_size, "equal_size")
    if lengths.size < k:
        raise ValueError(f"`seqlen_list` has {lengths.size} items < k_partitions={k}; every partition needs one")
    plan = balance(lengths, k, equal_counts=equal_size)
    if not equal_size and np.bincount(plan.assignment, minlength=k).min() == 0:
        plan = balance(lengths, k, equal_counts=True)
    return [plan.items_of(rank).tolist() for rank in range(k)]

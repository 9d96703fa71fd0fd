"""Keep-together groups: items with the same group id land on the same rank.

minimise max_r sum(cost[i] for i on r)  subject to  group[i] == group[j] => rank[i] == rank[j],
i.e. balance one super-item per group, of length sum(lengths in it) and cost
sum(costs in it), with any unpadded kernel, then send every item to its group's rank
(verl's `get_group_balanced_partitions` for GRPO responses of one prompt or a shared
prefix).  The transformation is exact: plans of the groups are the plans of the items
that keep groups together, with the same tokens and, up to float summation order, the
same loads.  Groups are ordered by id, so ties break by the smallest id.
"""

from __future__ import annotations

import numpy as np

from ..problem import InfeasibleError, Problem
from ..validation import as_array


def as_groups(groups, num_items: int) -> np.ndarray:
    """Validate group ids (ints or strs, one per item) to int64 labels 0..G-1 in sorted id order.

    >>> as_groups(["b", "a", "b"], 3).tolist()
    [1, 0, 1]
    """
    array = as_array(groups, "groups", "group ids (ints or strs)")
    python = (not isinstance(groups, np.ndarray) or groups.dtype == object) and not hasattr(groups, "detach")  # items
    if python and (  # numpy printed ints as strs beside a str id, read bools as ints
            array.dtype.kind == "U" and not all(isinstance(g, str) for g in groups)
            or array.dtype.kind in "iu" and any(isinstance(g, (bool, np.bool_)) for g in groups)):
        kinds = {str if isinstance(g, str) else bool if isinstance(g, (bool, np.bool_)) else
                 int if isinstance(g, (int, np.integer)) else type(g) for g in groups}
        names = ", ".join(sorted(kind.__name__ for kind in kinds))
        raise TypeError(f"`groups` must hold group ids of one kind, all ints or all strs; got {names} (an id "
                        f"printed alike in two kinds, \"1\" and 1, would be taken for one group)")
    if array.dtype.kind not in "iuU" or array.dtype.kind == "b":
        raise TypeError(f"`groups` must hold integer or str group ids; got dtype {array.dtype}")
    if array.shape != (num_items,):
        raise ValueError(f"`groups` must hold one group id per item, shape ({num_items},); got shape {array.shape}")
    return np.unique(array, return_inverse=True)[1].astype(np.int64).reshape(num_items)


def group_problem(problem: Problem, labels: np.ndarray) -> Problem:
    """The problem of one super-item per group (unpadded, no equal counts); a group's cost is its items' summed
    in ascending order, so that permuted items give the same floats (and `auto` the same plan quality)."""
    num_groups = int(labels.max()) + 1
    lengths = np.zeros(num_groups, dtype=np.int64)
    np.add.at(lengths, labels, problem.lengths)  # exact: the total fits int64 (checked by make_problem)
    order = np.lexsort((problem.item_costs, labels))  # each group's costs summed in one order, whatever the items'
    costs = np.bincount(labels[order], weights=problem.item_costs[order], minlength=num_groups)
    cap = problem.max_tokens_per_rank
    if cap is not None and lengths.max() > cap:
        group = int(np.argmax(lengths))
        members = np.flatnonzero(labels == group)
        raise InfeasibleError(
            f"`max_tokens_per_rank`={cap} is below the {int(lengths[group])} tokens of the group of items "
            f"{members[:8].tolist()}{' ...' if members.size > 8 else ''}, which stays on one rank; a cap of at "
            f"least {int(lengths[group])} is needed", min_cap=int(lengths[group]))
    for array in (lengths, costs):
        array.setflags(write=False)
    return Problem(lengths=lengths, item_costs=costs, num_ranks=problem.num_ranks, cost=None, padded=False,
                   max_tokens_per_rank=cap, time_limit=problem.time_limit)

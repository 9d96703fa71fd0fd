"""Deals inside groups of cells, every group at once: the phases of `microbatch_locality`.

Group g owns the cells g·G .. g·G + G - 1 (a rank's M micro-batch cells, or a node's
M · gpus_per_node).  Each group's items go largest first to a cell of their group where
they fit:

    room = [limit - load[c] for c in cells]; token_room = [cap - tokens[c] for c in cells]
    for i in sorted(items, key=lambda i: (-cost[i], i)):
        fitting = [c for c in cells_of(group[i]) if cost[i] <= room[c] and length[i] <= token_room[c]]
        if fitting:      # else i is left over
            c = max(fitting, key=lambda c: (room[c], -c)) if least_loaded else fitting[0]
            room[c], token_room[c] = room[c] - cost[i], token_room[c] - length[i]
    then every item dealt goes on its cell (loads and tokens summed by cell)

`least_loaded`: LPT inside the group (the roomiest cell, i.e. worst fit: the cells end
level); otherwise first fit (first-fit decreasing: the first cells fill up, the last keep
their room for larger items dealt later).  Groups share no cell, so the t-th items of all
groups are placed in one vectorised turn over a (groups, G) array: turns number the items
of the largest group, not all items.  Groups with more than `MAX_TURNS` items (skewed
sources) are dealt by `locality_deal.take_in_node`'s windows instead (under the plan's
target).  Plain code: `reference.group_deal`.
Original to orchmllm.
"""

from __future__ import annotations

import numpy as np

from .deal import take_in_node
from .partial_plan import PartialPlan

MAX_TURNS = 128  # more items in one group: windows (a turn costs ~0.05 ms however few groups it serves)


def by_group(state: PartialPlan, groups: np.ndarray, items: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """`items` (None: all, groups[i] the group of item i) ordered by (group, cost rank), each
    group's largest first with ties by index (groups[k] the group of items[k]), and the group of
    each (non-decreasing), from one sort of packed keys (`PartialPlan.group_keys`)."""
    keys = state.group_keys(groups, items)
    return state.item_of_rank[keys & ((1 << state.rank_bits) - 1)], keys >> state.rank_bits


def deal_in_groups(state: PartialPlan, ordered: np.ndarray, owner: np.ndarray, cells_per_group: int,
                   limit: float, least_loaded: bool) -> np.ndarray:
    """Deal `ordered` items (group owner[k] for ordered[k], as `by_group` orders them; cell c is
    in group c // cells_per_group) as the module docstring's loop does; returns the items left
    over.

    >>> from orchmllm.balancers.problem import make_problem
    >>> state = PartialPlan(make_problem([5, 4, 3, 3, 2], 4), target=6.0)
    >>> ordered, owner = by_group(state, np.array([0, 0, 0, 1, 1]), np.arange(5))  # cells 0, 1 and 2, 3
    >>> left = deal_in_groups(state, ordered, owner, 2, 6.0, least_loaded=False)
    >>> state.destinations.tolist(), state.loads.tolist(), left.tolist()
    ([0, 1, -1, 2, 2], [5.0, 4.0, 5.0, 0.0], [2])
    """
    starts = np.flatnonzero(np.concatenate(([True], owner[1:] != owner[:-1]))) if owner.size else owner
    counts = np.diff(np.append(starts, owner.size))
    left = []
    crowded = counts > MAX_TURNS
    if crowded.any():
        in_crowded = np.repeat(crowded, counts)
        home = np.zeros(state.costs.size, dtype=np.int64)  # a cell of the item's group, as take_in_node reads it
        home[ordered] = owner * cells_per_group
        left.append(take_in_node(state, home, cells_per_group, np.sort(ordered[in_crowded])))
        ordered, owner, counts = ordered[~in_crowded], owner[~in_crowded], counts[~crowded]
        starts = np.cumsum(counts) - counts
    if ordered.size:
        left.append(_deal_by_turns(state, ordered, owner[starts], starts, counts, cells_per_group, limit,
                                   least_loaded))
    return np.concatenate(left) if left else ordered


def _deal_by_turns(state: PartialPlan, ordered: np.ndarray, groups: np.ndarray, starts: np.ndarray,
                   counts: np.ndarray, cells_per_group: int, limit: float, least_loaded: bool) -> np.ndarray:
    """Deal the runs ordered[starts[j]:starts[j] + counts[j]] (group groups[j]) by turns; returns
    the items left over."""
    by_count = np.argsort(-counts, kind="stable")  # the groups still dealt at turn t are a prefix
    starts, counts = starts[by_count], counts[by_count]
    first_cell = groups[by_count] * cells_per_group
    cells = first_cell[:, None] + np.arange(cells_per_group)  # a row per group
    dealing = np.searchsorted(-counts, -np.arange(int(counts[0])), side="left")  # groups with more than t items
    cost, length = state.costs[ordered], state.lengths[ordered]
    flat = _turns(cost, length, starts, limit - state.loads[cells], state.cap - state.tokens[cells], dealing,
                  least_loaded)
    kept = flat >= 0
    placed = cells.reshape(-1)[flat[kept]]  # each cell's items in turn order, as the loop adds them
    state.destinations[ordered[kept]] = placed
    state.loads += np.bincount(placed, weights=cost[kept], minlength=state.loads.size)
    state.tokens += np.bincount(placed, weights=length[kept], minlength=state.loads.size)
    return ordered[~kept]


def _turns(cost: np.ndarray, length: np.ndarray, starts: np.ndarray, room: np.ndarray, token_room: np.ndarray,
           dealing: np.ndarray, least_loaded: bool) -> np.ndarray:
    """Turn t deals the item at position starts[j] + t (cost[.], length[.]) to the j-th group (a
    row of `room` and `token_room`, its cells' cost and token room, updated in place) for
    j < dealing[t]; returns each position's cell as an index into `room` flattened, -1 where
    none fits."""
    flat_room, flat_token_room = room.reshape(-1), token_room.reshape(-1)
    base = np.arange(room.shape[0]) * room.shape[1]
    chosen = np.empty(cost.size, dtype=np.int64)
    for turn, k in enumerate(dealing.tolist()):
        at = starts[:k] + turn
        turn_cost, turn_length = cost[at], length[at]
        # The rule's cell by cost room alone; where that one lacks token room, the rule's cell
        # among those with both (rare: token-tight cells).
        cell = (room[:k] if least_loaded else turn_cost[:, None] <= room[:k]).argmax(axis=1)
        flat = base[:k] + cell
        cell_room, cell_token_room = flat_room[flat], flat_token_room[flat]
        placed = turn_cost <= cell_room
        short = turn_length > cell_token_room
        if np.count_nonzero(short):
            short = np.flatnonzero(short & placed)
            fits = (turn_cost[short, None] <= room[short]) & (turn_length[short, None] <= token_room[short])
            cell[short] = (np.where(fits, room[short], -np.inf) if least_loaded else fits).argmax(axis=1)
            placed[short] = fits[np.arange(short.size), cell[short]]
            flat[short] = base[short] + cell[short]
            cell_room[short], cell_token_room[short] = flat_room[flat[short]], flat_token_room[flat[short]]
        if np.count_nonzero(placed) == k:
            flat_room[flat] = cell_room - turn_cost
            flat_token_room[flat] = cell_token_room - turn_length
            chosen[at] = flat
        else:  # an item that fits nowhere takes 0 from a cell: x - 0.0 == x, no bit changes
            flat_room[flat] = cell_room - turn_cost * placed
            flat_token_room[flat] = cell_token_room - turn_length * placed
            chosen[at] = np.where(placed, flat, -1)
    return chosen

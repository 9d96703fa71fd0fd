"""Communication-aware deal with a filler: the phases of `locality`, tight enough to skip repair.

    filler = the smallest items, `filler_share` of the total cost (they carry few bytes)
    for the items longer than cap / 2, then cap / 4, then the rest (wide items first, while
            cells still have the token room they need), largest first:
        to the least-loaded of their own rank's cells that fit (`cells_per_rank` of them),
        then of their node's, then of all (`locality_deal.take_in_node` / `take_anywhere`)
    the filler, largest first, to the least-loaded cells (LPT: it tops every cell up)
    repair (`locality_repair`) while a cell is above the target

Dealt last, small items fill the rooms the deals leave, as the last items of plain LPT
do, so the deal meets a target with almost no slack where the plain phases leave ranks
above it for the repair (its searches cost far more than the deal).  Original to orchmllm.
"""

from __future__ import annotations

import numpy as np

from .locality_deal import keep_home, take_anywhere, take_in_node
from .locality_repair import repair
from .partial_plan import PartialPlan

TIERS = (2, 4)  # items longer than cap / 2, then cap / 4, then the rest
FINE_TIERS = (2, 4, 8, 16)  # for caps so tight that the coarse tiers leave no token room
FILLER_SHARE = 0.003  # the least share of the total cost dealt last as filler
MAX_FILLER_SHARE = 0.01  # the most: coarse items (few per rank) leave a wide slack no filler closes


def filler_share(slack: float) -> float:
    """The share of the cost kept as filler for a target `slack` above the mean load: twice the
    slack (the rooms the deals leave sum to about the slack), within [FILLER_SHARE, MAX_FILLER_SHARE].

    >>> filler_share(0.0005), filler_share(0.004), filler_share(0.2)
    (0.003, 0.008, 0.01)
    """
    return min(max(FILLER_SHARE, 2.0 * slack), MAX_FILLER_SHARE)


def fill_locally(state: PartialPlan, home: np.ndarray, item_bytes: np.ndarray, cells_per_rank: int,
                 gpus_per_node: int, share: float, tiers: tuple[int, ...] = TIERS) -> None:
    """Place every item of `state` (none placed yet) near `home` (its source cell: `home //
    cells_per_rank` is its rank, `home // (cells_per_rank · gpus_per_node)` its node), within the
    target where the deal and the repair manage; `locality_deal.NoRoom` when no cell has token
    room for an item.  With a cap, items longer than cap / tiers[0], then cap / tiers[1], ...
    are dealt first, tier by tier."""
    order = state.item_of_rank
    ascending = -state.negated_sorted_costs[::-1]  # the costs in `order`, read backwards
    count = int(np.searchsorted(np.cumsum(ascending), share * float(ascending.sum())))
    filler = np.zeros(order.size, dtype=bool)
    filler[order[order.size - count:]] = True
    per_node = cells_per_rank * gpus_per_node
    tiers = tiers if state.cap < np.inf else ()
    tier = np.searchsorted(-state.cap / np.asarray(tiers, dtype=np.float64), -state.lengths, side="right")
    for items in (np.flatnonzero((tier == k) & ~filler) for k in range(len(tiers) + 1)):
        if cells_per_rank == 1:  # keep_home: the same choices as a deal to one cell, in far fewer rounds
            keep_home(state, home, items)
            left = items[state.destinations[items] < 0]
        else:
            left = take_in_node(state, home, cells_per_rank, items)
        take_anywhere(state, take_in_node(state, home, per_node, left))
    take_anywhere(state, np.flatnonzero(filler))
    if state.loads.max() > state.target:
        repair(state, home, item_bytes, per_node)

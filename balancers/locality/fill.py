"""Communication-aware deal with a filler: the phases of `locality`, tight enough to skip repair.

    filler = the smallest items, `filler_share` of the total cost (they carry few bytes)
    for the items longer than cap / 2, then cap / 4, then the rest (wide items first, while
            ranks still have the token room they need), largest first:
        kept on their own rank while they fit (`locality_deal.keep_home`), then to the
        least-loaded ranks of their node that fit, then of all (`take_in_node` / `take_anywhere`)
    the filler, largest first, to the least-loaded ranks (LPT: it tops every rank up)
    repair (`locality_repair`) while a rank is above the target

Dealt last, small items fill the rooms the deals leave, as the last items of plain LPT
do, so the deal meets a target with almost no slack where the plain phases leave ranks
above it for the repair (its searches cost far more than the deal).  Original to orchmllm.
"""

from __future__ import annotations

import numpy as np

from .deal import keep_home, selection, take_anywhere, take_in_node
from .partial_plan import PartialPlan
from .repair import repair

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


def filler_items(state: PartialPlan, share: float) -> np.ndarray:
    """The filler: the smallest items, `share` of the total cost (the tail of the cost order).

    The running sum of the ascending costs is taken over a prefix that grows fourfold until it reaches
    `share` of the total (a prefix's running sum is the first entries of the whole one's): the
    filler is a small share, and the whole running sum cost more than the rest of the choice.
    """
    ascending = state.sorted_costs[::-1]  # the costs in cost order, read backwards (a view: summed in this order)
    needed, size = share * float(ascending.sum()), 1024
    while True:
        running = np.cumsum(ascending[:size])
        if size >= ascending.size or running[-1] >= needed:
            count = int(np.searchsorted(running, needed))
            return state.item_of_rank[state.item_of_rank.size - count:]
        size *= 4


def length_tiers(state: PartialPlan, tiers: tuple[int, ...]) -> np.ndarray:
    """Each item's tier: k for the items longer than cap / tiers[k] (the first such k), len(tiers)
    for the rest."""
    return np.searchsorted(-state.cap / np.asarray(tiers, dtype=np.float64), -state.lengths, side="right")


def fill_locally(state: PartialPlan, home: np.ndarray, item_bytes: np.ndarray, gpus_per_node: int,
                 share: float, max_lpt_rounds: int | None = None) -> None:
    """Place every item of `state` (none placed yet) near `home` (its source rank), within the
    target where the deal and the repair manage; `locality_deal.NoRoom` when no rank has token
    room for an item, or past `max_lpt_rounds` LPT rounds of one `take_anywhere` (token room
    binds).  With a cap, items longer than cap / TIERS[0], then cap / TIERS[1], ... are dealt
    first, tier by tier."""
    filler_at = filler_items(state, share)
    dealt = state.costs.size - filler_at.size
    if state.uniform and state.cap == np.inf:  # one tier, and the cost order is the index order: the filler is a tail
        tiers, filler_at = [np.arange(dealt)], np.arange(dealt, state.costs.size)
    else:
        filler = np.zeros(state.costs.size, dtype=bool)
        filler[filler_at] = True
        if state.cap < np.inf:
            tier = length_tiers(state, TIERS)
            tiers = [np.flatnonzero((tier == k) & ~filler) for k in range(len(TIERS) + 1)]
        else:  # one tier: every item but the filler
            tiers = [np.flatnonzero(~filler)]
        filler_at = np.flatnonzero(filler)
    for items in tiers:
        keep_home(state, home, items)
        unplaced = items[state.destinations[selection(items)] < 0]  # a view where the tier is one run (no gather)
        take_anywhere(state, take_in_node(state, home, gpus_per_node, unplaced), max_lpt_rounds)
    take_anywhere(state, filler_at, max_lpt_rounds)
    if state.loads.max() > state.target:
        repair(state, home, item_bytes, gpus_per_node)

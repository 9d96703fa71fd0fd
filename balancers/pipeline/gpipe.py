"""GPipe's concentrated start: the giant items packed first-fit onto few replicas for a target step.

With uniform stages a GPipe replica runs in (X + (P - 1)·max_k x_k) / P (`schedules.gpipe_time`, X = Σ x
over its M cells): it pays its largest cell P - 1 more times and every other cell once, so giants of
similar size cost less together on one replica than one per replica, where LPT and the shaped starts put
them.  For a target step T the giants (items above the mean cell X̄ / M), costliest first, go to the first
replica r (lowest index) where

    X_r + c + M·o + (P - 1)·max(max(h_r, c) + o, (X_r + c) / M + o) <= P·T      (h_r: r's costliest item)

and T is feasible when they all fit and the room left under T holds the other items (Σ_r room_r >= their
sum); bisection on T between `low` and `high` (BISECTIONS steps) keeps the least feasible T.  The other items
then go by LPT, costliest first, to the replica of least X_r + (P - 1)·h_r (its P·T while its head is its
largest cell), and each replica's items are cut into M near-flat cells by `order.reshape`.
"""

from __future__ import annotations

import numpy as np

from ..kernels.lpt import _heap_round
from .order import reshape

BISECTIONS = 12


def concentrated(item_costs: np.ndarray, lengths: np.ndarray, costliest: np.ndarray, num_ranks: int,
                 num_microbatches: int, stages: int, overhead: float, max_tokens: int, low: float, high: float
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """(replica, slot) per item of the concentrated cells (see the module), or None where no target in
    [`low`, `high`] is feasible or a replica's cells find no room in the token budget; `low` and `high` in
    P·(step) units, i.e. a replica's X + (P - 1)·max x.  `costliest`: the items by cost, largest first."""
    d, m, p, o = num_ranks, num_microbatches, stages, overhead
    total = float(item_costs.sum())
    giants = costliest[item_costs[costliest] > total / (d * m)]
    rest = float(item_costs[costliest[giants.size:]].sum())
    best = None
    for _ in range(BISECTIONS):
        target = (low + high) / 2
        placed = _first_fit(item_costs[giants], d, m, p, o, target, rest)
        if placed is None:
            low = target
        else:
            high, best = target, placed
    if best is None:
        return None
    replica, others = np.empty(item_costs.size, dtype=np.int64), costliest[giants.size:]
    replica[giants] = best[0]
    _heap_round(best[1] + (p - 1) * best[2], item_costs[others], others, replica)  # LPT from these loads
    loads = np.bincount(replica, weights=item_costs, minlength=d)
    slot, failed = reshape(item_costs, lengths, replica, np.repeat(loads[:, None] / m, m, axis=1), max_tokens,
                           costliest)
    return None if failed.any() else (replica, slot)


def _first_fit(costs: np.ndarray, d: int, m: int, p: int, o: float, target: float, rest: float):
    """(replica per giant, X, h) of the first-fit for `target` (module docstring), or None where it fails."""
    loads, heads = np.zeros(d), np.zeros(d)
    replica = np.empty(costs.size, dtype=np.int64)
    limit = target - m * o - (p - 1) * o
    used = 0  # first-fit opens replicas in index order: the used ones are a prefix, the rest empty
    for i, c in enumerate(costs.tolist()):
        after = loads[:used] + c
        fits = np.flatnonzero(after + (p - 1) * np.maximum(np.maximum(heads[:used], c), after / m) <= limit)
        if fits.size:
            r = int(fits[0])
        elif used < d and c + (p - 1) * max(c, c / m) <= limit:
            r, used = used, used + 1
        else:
            return None
        replica[i], loads[r], heads[r] = r, loads[r] + c, max(heads[r], c)
    room = np.minimum(limit - (p - 1) * heads, limit * m / (m + p - 1)) - loads
    return (replica, loads, heads) if float(np.maximum(room, 0.0).sum()) >= rest else None


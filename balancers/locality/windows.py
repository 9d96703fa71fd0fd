"""The windows of the across-node repair pass (`repair.repair_across_nodes`): each over-target item's candidate
partners are one slice of the items in largest-first order, and the most room over a slice bounds what its row can
fix."""

from __future__ import annotations

import numpy as np

from .partial_plan import PartialPlan


def window_max(values: np.ndarray, width: int) -> np.ndarray:
    """max(values[k:k + width]) for every start k (values.size - width + 1 of them), by doubling spans.

    >>> window_max(np.array([3.0, 1.0, 4.0, 1.0, 5.0]), 3).tolist()
    [4.0, 4.0, 5.0]
    """
    span, most = 1, values
    while 2 * span <= width:
        most = np.maximum(most[:-span], most[span:])  # most[k] = max(values[k:k + 2 * span])
        span *= 2
    return np.maximum(most[:most.size - (width - span)], most[width - span:])


def candidate_windows(state: PartialPlan, candidates: int) -> dict[str, np.ndarray]:
    """Candidate j of row i is position start_i + j of the largest-first order, then candidates + 1 of none (a move): a
    row's partners, their costs and (under a cap, where they count) their lengths are one slice (a window, row
    start_i) of these, built in one pass over the order."""
    pad = candidates + 1
    columns = {"partner": np.concatenate([state.item_of_rank, np.full(pad, -1)]),
               "cost": np.concatenate([state.negated_sorted_costs, np.zeros(pad)])}
    np.negative(columns["cost"], out=columns["cost"])
    if state.cap < np.inf:
        columns["length"] = np.concatenate([state.lengths[state.item_of_rank], np.zeros(pad)])
    return {name: np.lib.stride_tricks.as_strided(values, (values.size - candidates, pad), values.strides * 2,
                                                  writeable=False) for name, values in columns.items()}

"""The best shape of a replica's cells for a schedule, and the bound it certifies.

A replica's pipeline time is the longest path through its schedule's operation graph
(`schedules`), and with uniform stages each operation lasts α·x_k or β·x_k (divided by v),
x_k the cost of slot k, so every path is linear in x and the time T(x) = max over paths
of a_path · x is convex, piecewise linear and homogeneous.  Over cells x >= 0 with
Σ x = 1 its least value τ solves

    minimise t  s.t.  a_path · x <= t for every path,  Σ x = 1,  x >= 0

with the paths generated as needed (Kelley's cutting planes): solve over the paths known,
evaluate T at the answer, add its critical path, until they meet.  Every replica whose
cells sum to X runs at least τ·X (T(x) >= τ·Σ x), so τ·X̄ bounds every plan's step.  The
bound is certified by weak duality, not by the solver's tolerance: for weights y >= 0,
Σ y = 1 on the known paths, max_path a·x >= Σ y·a·x >= min_k (yᵀA)_k · Σ x.

1F1B's optimum is not flat: light micro-batches first and last shorten the fill and
drain more than they cost the steady state (P = 8, M = 16: 0.927 × the flat time).
GPipe's is flat (its closed form), and so, on the sizes tried, is the interleaved one's.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from .schedules import programs
from .spec import Pipeline

MAX_CUTS = 400
TOLERANCE = 1e-9  # stop when the true time at the answer is within this of the paths' bound
ROUNDING = 1e-12  # the certified bound's float products are rounded: it drops by this fraction


def critical_path(pipeline: Pipeline, x: np.ndarray) -> tuple[float, np.ndarray]:
    """(time, a): the replica time at cells `x` (slot order) and the coefficients per slot of a
    longest path, a · x == time."""
    stage, slot, is_backward, previous, needed = programs(pipeline, x.size)
    share = pipeline.forward_share / pipeline.virtual_stages
    weight = np.where(is_backward.astype(bool), share * pipeline.backward_factor, share)
    duration = weight * x[slot]
    end, came_from = np.zeros(stage.size), np.full(stage.size, -1)
    for op in range(stage.size):
        before = [p for p in (previous[op], needed[op]) if p >= 0]
        start = 0.0
        for p in before:
            if end[p] > start:
                start, came_from[op] = end[p], p
        end[op] = start + duration[op]
    op = int(np.argmax(end))
    coefficients = np.zeros(x.size)
    while op >= 0:
        coefficients[slot[op]] += weight[op]
        op = int(came_from[op])
    return float(end.max()), coefficients


def best_profile(pipeline: Pipeline, num_microbatches: int) -> tuple[float, np.ndarray]:
    """(τ, x): a certified lower bound τ on T(x) over cells x >= 0 summing to 1, and the best cells
    found (sum 1, slot order); see the module."""
    return _profile(pipeline, num_microbatches)[:2]


def path_bound(pipeline: Pipeline, cell_costs: np.ndarray) -> np.ndarray:
    """Per row of cell costs (rows, M) in run order, max over the paths `best_profile` met of a · x: a
    lower bound on the row's replica time (uniform stages; float products, so compare with a margin)."""
    paths = _profile(pipeline, cell_costs.shape[1])[2]
    return (cell_costs @ paths.T).max(axis=1)


@lru_cache(maxsize=128)
def _profile(pipeline: Pipeline, num_microbatches: int) -> tuple[float, np.ndarray, np.ndarray]:
    """`best_profile`'s (τ, x) and the coefficients of the paths it met, (paths, M)."""
    from scipy.optimize import linprog

    m = num_microbatches
    x = np.full(m, 1.0 / m)
    if pipeline.schedule == "gpipe":  # its closed form: flat cells are optimal; paths (α + β)·(1 + (P - 1)·e_k)
        p = pipeline.stages
        paths = (1.0 + (p - 1) * np.eye(m)) * (pipeline.forward_share * (1 + pipeline.backward_factor))
        x.setflags(write=False)
        paths.setflags(write=False)
        return (1 + (p - 1) / m) / p * (1 - ROUNDING), x, paths
    best_time, cuts = np.inf, []
    best, bound = x, 0.0
    for _ in range(MAX_CUTS):
        for point in (x, (x + best) / 2):  # the answer and halfway to the best: stabilised cuts
            time, path = critical_path(pipeline, point)
            if time < best_time:
                best_time, best = time, point
            cuts.append(path)
        a = np.array(cuts)
        result = linprog(np.r_[np.zeros(m), 1.0], A_ub=np.c_[a, -np.ones(len(cuts))], b_ub=np.zeros(len(cuts)),
                         A_eq=np.r_[np.ones(m), 0.0][None, :], b_eq=[1.0],
                         bounds=[(0, None)] * m + [(None, None)], method="highs")
        if result.status != 0:
            break
        weights = np.maximum(-result.ineqlin.marginals, 0.0)
        if weights.sum() > 0:
            bound = max(bound, float(((weights / weights.sum()) @ a).min()))
        if best_time <= bound * (1 + TOLERANCE):
            break
        x = np.maximum(result.x[:m], 0.0)
        x = x / x.sum()
    best, paths = best.copy(), np.array(cuts)
    best.setflags(write=False)
    paths.setflags(write=False)
    return bound * (1 - ROUNDING), best, paths

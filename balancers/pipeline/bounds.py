"""Certified lower bounds on a pipeline step's time over every plan of its items.

Notation of `schedules` (uniform stages): a cell costing x runs f = α·x forward and b = β·x
backward on every stage, α = 1 / (P·(1 + k)), β = k·α, so each stage of a replica works
X·(α + β) = X / P in all, X = Σ x over its M cells.  Every plan of the step's items with M
micro-batches on D replicas has a replica with X >= X̄ = (Σ c + D·M·o) / D (o: the
micro-batch overhead every cell pays) and one holding the costliest item, x' >= c_max + o
with X' >= x' + (M - 1)·o.

Any schedule: T >= x', the chain of the costliest cell's forward through every stage and its
backward back (P·(f + b) = x); with M given, T >= τ·X̄, τ the least time of cells summing to 1
in any shape and order (`profile.best_profile`, certified by duality), and T >= τ·X_k where
X_k = (k + 1)·c_(kD+1) + M·o: some replica holds k + 1 of the k·D + 1 costliest items
(pigeonholes; GPipe: (X_k + (P - 1)·(c_(kD+1) + o)) / P, its largest cell that big).

GPipe (closed form, `schedules.gpipe_time`): T_r = (X_r + (P - 1)·max x) / P, so the
giant's replica gives T >= (X' + (P - 1)·x') / P, and with M free max x >= X̄ / M gives
T >= X̄·(1 + (P - 1)/M) / P for the least M allowed.

1F1B: two paths through the operation graph, for every slot k:

    path 1: F(0..k) on stage 0, F(k) on stages 1..P-1, the last stage's ops from B(k) on,
            B(M-1) on stages P-2..0:   T >= Σ f + Σ_{j>=k} b_j + (P - 1)·(f_k + b_{M-1})
    path 2: F(0) on stages 0..P-2, the last stage's ops up to B(k), B(k) on stages P-2..0,
            stage 0's backwards after it:   T >= (P - 1)·(f_0 + b_k) + Σ_{j<=k} f_j + Σ b

so with k the giant's slot T >= max(α·(X' + (P - 1)·x') + β·x', β·(X' + (P - 1)·x') + α·x'),
and with every cell at least o, T >= X̄ / P + (P - 1)·(α + β)·o.

Interleaved (v chunks per stage): the last stage first runs F(0) of chunk 0, which first
crosses P - 1 stages, and last runs B(M - 1) of chunk 0, which then crosses P - 1 more:
T >= X / P + (P - 1)·(f_0 + b_{M-1}) / v >= max(X̄, X') / P + (P - 1)·(α + β)·o / v.
"""

from __future__ import annotations


import numpy as np

from ..problem import exact_sum
from .profile import best_profile
from .spec import Pipeline


def step_bound(pipeline: Pipeline, item_costs: np.ndarray, num_ranks: int, counts: np.ndarray,
               overhead: float, first_stage: np.ndarray | None = None, total: float | None = None,
               ranked: np.ndarray | None = None) -> float:
    """A step time no plan of these items on `num_ranks` replicas beats, in any order, with any
    number of micro-batches in `counts` (see the module docstring; the best shape's bound for a
    single count, the closed forms for several); `total`: Σ `item_costs` correctly rounded (`exact_sum`), and
    `ranked`: `item_costs` largest first (a problem's `sorted_costs`), when the caller has them.  With
    `first_stage` parts e (`Pipeline.stage_times`): the bound of the costs c - e spread evenly (every
    operation lasts at least that long), or the first stage's mean work Σ ((c - e) / P + e) / D + M·o / P,
    the larger."""
    if first_stage is not None:
        spread = np.asarray(item_costs, dtype=np.float64) - first_stage
        first = exact_sum(np.ascontiguousarray(first_stage))
        work = ((exact_sum(spread) / pipeline.stages + first) / num_ranks
                + float(np.min(counts)) * overhead / pipeline.stages)
        return max(step_bound(pipeline, spread, num_ranks, counts, overhead), work)
    p, m = pipeline.stages, np.asarray(counts, dtype=np.float64)
    alpha = pipeline.forward_share
    beta = alpha * pipeline.backward_factor
    if total is None:
        total = exact_sum(np.ascontiguousarray(item_costs, dtype=np.float64))
    mean = total / num_ranks + m * overhead
    if not len(item_costs):
        top = overhead
    else:
        top = float(np.max(item_costs) if ranked is None else ranked[0]) + overhead
    giant_row = top + (m - 1) * overhead
    if pipeline.schedule == "gpipe":
        bounds = np.maximum(mean * (1 + (p - 1) / m), giant_row + (p - 1) * top) / p
    elif pipeline.schedule == "interleaved":
        bounds = np.maximum(mean, giant_row) / p + (p - 1) * (alpha + beta) * overhead / pipeline.virtual_stages
    else:
        giant = np.maximum(alpha * (giant_row + (p - 1) * top) + beta * top,
                           beta * (giant_row + (p - 1) * top) + alpha * top)
        bounds = np.maximum(giant, mean / p + (p - 1) * (alpha + beta) * overhead)
    if m.size == 1:  # the best shape of one replica's cells (`profile`), certified
        tau = best_profile(pipeline, int(m[0]))[0]
        if ranked is None:
            ranked = np.sort(np.asarray(item_costs, dtype=np.float64))[::-1]
        bounds = np.maximum(bounds, tau * max(mean[0], _crowded(pipeline, ranked, num_ranks, int(m[0]), overhead,
                                                                tau)))
    return max(float(np.min(bounds)), top)


def _crowded(pipeline: Pipeline, ranked: np.ndarray, num_ranks: int, num_microbatches: int, overhead: float,
             tau: float) -> float:
    """X such that τ·X bounds the step by pigeonholes: some replica holds k + 1 of the k·D + 1
    costliest items, so its cells sum to at least (k + 1)·c_(kD+1) + M·o, and (GPipe) its largest
    cell is at least c_(kD+1) + o; the largest over k, as an equivalent X of τ·X (`ranked`: the costs largest
    first)."""
    ranked = np.asarray(ranked[::num_ranks], dtype=np.float64)  # c_(kD+1), k = 0, 1, ...
    crowded = (np.arange(ranked.size) + 1) * ranked + num_microbatches * overhead
    if pipeline.schedule == "gpipe":
        times = (crowded + (pipeline.stages - 1) * (ranked + overhead)) / pipeline.stages
        return float(times.max(initial=0.0)) / tau
    return float(crowded.max(initial=0.0))

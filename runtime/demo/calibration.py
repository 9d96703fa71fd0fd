"""Fit a stage's `CostModel` from timings of whole packed batches.

A packed stage costs  seconds(batch) ≈ k + sum(f(l) for l in batch),
f(l) = per_item + linear·l + quadratic·l², k a per-call constant that every rank pays
once and that balancing cannot change.  Non-negative least squares over the features
[1, count, sum l, sum l²] of timed batches (scipy `nnls`, columns scaled) gives the
coefficients; `k` is dropped.  Timing batches rather than single items measures the
per-item cost as the stage really incurs it when items are packed together.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.optimize import nnls

from ...balancers import CostModel


def fit_packed_cost(batches: Sequence[Sequence[int]], seconds: Sequence[float]) -> tuple[CostModel, float]:
    """CostModel from (batch lengths, seconds) pairs, and the fit's relative RMS error."""
    if len(batches) != len(seconds) or len(batches) < 4:
        raise ValueError(f"need at least 4 timed batches with one time each; got {len(batches)} batches "
                         f"and {len(seconds)} times")
    design = np.array([[1.0, len(b), float(np.sum(b)), float(np.sum(np.square(np.asarray(b, dtype=np.float64))))]
                       for b in batches])
    target = np.asarray(seconds, dtype=np.float64)
    scale = np.maximum(design.max(axis=0), 1e-300)
    coefficients, _ = nnls(design / scale, target)
    coefficients /= scale
    error = float(np.sqrt(np.mean((design @ coefficients - target) ** 2)) / max(target.mean(), 1e-300))
    _, per_item, linear, quadratic = coefficients.tolist()
    if per_item == linear == quadratic == 0:
        linear = float(target.mean() / max(design[:, 2].mean(), 1.0))
    return CostModel(per_item=per_item, linear=linear, quadratic=quadratic), error


def fit_split_efficiency(shard_tokens: Sequence[int], degrees: Sequence[int], unsplit_seconds: Sequence[float],
                         shard_seconds: Sequence[float]) -> tuple[float, float]:
    """`ContextParallel.half_efficiency_tokens` h from timed shards, and the fit's relative RMS error.

    A split item's shard on one of c ranks takes f(l) / (c · η(s)) with η(s) = s / (s + h), s its
    tokens, f(l) the whole item's time (`unsplit_seconds`); so 1/η − 1 = h / s, fitted by least
    squares through the origin in x = 1/s, and clamped at 0 (a shard faster than f(l)/c, e.g. a
    cache effect, is no efficiency loss the planner should charge).

    >>> h, error = fit_split_efficiency([512, 256], [2, 4], [1.0, 1.0], [0.5 * 612 / 512, 0.25 * 356 / 256])
    >>> round(h, 6), error < 1e-9
    (100.0, True)
    """
    shards, degree, unsplit, seconds = (np.asarray(values, dtype=np.float64) for values in
                                        (shard_tokens, degrees, unsplit_seconds, shard_seconds))
    if not shards.size or not shards.shape == degree.shape == unsplit.shape == seconds.shape:
        raise ValueError("need one shard size, degree, unsplit time and shard time per measurement; got "
                         f"{shards.size}, {degree.size}, {unsplit.size} and {seconds.size}")
    if np.any(shards < 1) or np.any(degree < 1) or np.any(unsplit <= 0) or np.any(seconds <= 0):
        raise ValueError("shard sizes and degrees must be >= 1 and times positive")
    x, y = 1.0 / shards, seconds * degree / unsplit - 1.0
    half = max(float(x @ y / (x @ x)), 0.0)
    predicted = unsplit / degree * (1.0 + half * x)
    return half, float(np.sqrt(np.mean((predicted - seconds) ** 2)) / seconds.mean())

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

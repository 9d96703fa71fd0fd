"""Calibrate a cost model from measured timings, then balance with it.

Measures the real time of a small transformer layer's work on sequences of several lengths
(numpy on this CPU: QKV/MLP matmuls grow linearly with l, attention scores
quadratically), fits f(l) = per_item + linear·l + quadratic·l² with `CostModel.fit`
(non-negative least squares), and balances a batch with the fitted model.  On a cluster,
time your encoder or LLM layer on one GPU the same way (torch.cuda.synchronize around it).

    python3.11 examples/calibrate_cost_model.py
"""

from __future__ import annotations

import os

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # one BLAS thread: steadier timings on a shared machine

import time  # noqa: E402

import numpy as np  # noqa: E402

from orchmllm import CostModel, balance  # noqa: E402

HIDDEN = 128


def layer_seconds(length: int, weights: np.ndarray, repeats: int = 5) -> float:
    """Best-of-`repeats` wall time of one attention + MLP pass over `length` tokens."""
    x = np.random.default_rng(length).standard_normal((length, HIDDEN)).astype(np.float32)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        q, k, v = x @ weights[0], x @ weights[1], x @ weights[2]
        scores = q @ k.T
        out = (scores / np.sqrt(HIDDEN)) @ v
        np.maximum(out @ weights[3], 0.0) @ weights[4].T
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((5, HIDDEN, HIDDEN)).astype(np.float32)
    lengths = np.array([64, 128, 256, 384, 512, 768, 1024, 1536, 2048])
    seconds = np.array([layer_seconds(int(n), weights) for n in lengths])
    model = CostModel.fit(lengths, seconds)
    predicted = model.item_costs(lengths)
    error = np.abs(predicted - seconds) / seconds
    print(f"fitted f(l) = {model.per_item:.3g} + {model.linear:.3g}*l + {model.quadratic:.3g}*l^2 seconds")
    print(f"relative error of the fit: median {np.median(error):.1%}, max {error.max():.1%}")
    for length, measured, fit in zip(lengths, seconds, predicted):
        print(f"  l={length:5d}  measured {1e3 * measured:8.3f} ms  fitted {1e3 * fit:8.3f} ms")
    batch = rng.integers(32, 2048, 64)
    plan = balance(batch, 8, cost=model, algorithm="lpt")
    naive = model.item_costs(batch).reshape(8, 8).sum(axis=1)
    print(f"balanced 64 sequences on 8 ranks: slowest rank {1e3 * plan.makespan:.2f} ms "
          f"(as sampled {1e3 * naive.max():.2f} ms, lower bound {1e3 * plan.lower_bound:.2f} ms)")


if __name__ == "__main__":
    main()

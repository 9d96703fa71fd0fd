"""Karmarkar–Karp's runs of LPT steps go on through the small parts that join them at once."""

import numpy as np
import pytest

from orchmllm.balancers.kernels import karmarkar_karp
from orchmllm.balancers.kernels.reference import dense_kk
from orchmllm.study.workloads import sample_workload


def joins(costs: np.ndarray, num_ranks: int, monkeypatch) -> tuple[int, np.ndarray]:
    """(how many times two parts were joined, the differencing assignment)."""
    calls = []
    combine = karmarkar_karp._combine
    monkeypatch.setattr(karmarkar_karp, "_combine", lambda a, b, stream: calls.append(1) or combine(a, b, stream))
    assignment = karmarkar_karp.differencing(costs, num_ranks)
    return len(calls), assignment


def test_kk_runs_on_through_parts_that_join_at_once(monkeypatch):
    # Cause of the 74 ms of KK at 2560 x 32 on the long-tailed mix: every time a few waiting
    # items exceeded the big part's spread they became a part of their own, joined it, and
    # the big part's run of LPT steps restarted, ~3 numpy rounds per few items (113 joins here
    # before; they place each item where the run's next LPT step would, so the run goes on).
    costs = sample_workload("long_tail", 64, 32, seed=0).sample_llm_length.astype(float)
    count, assignment = joins(costs, 64, monkeypatch)
    assert count <= 45
    loads = np.bincount(assignment, weights=costs, minlength=64)
    np.testing.assert_array_equal(np.sort(loads), dense_kk(costs, 64))


@pytest.mark.parametrize("seed", range(6))
def test_runs_through_joins_keep_dense_differencing(seed):
    # Items of one size scale, a few far larger than the spread: joins of every size below D
    # (and some of D, which stop the run), with ties.
    rng = np.random.default_rng(seed)
    num_ranks = int(rng.choice([3, 8, 40]))
    costs = np.concatenate((rng.integers(1, 60, 20 * num_ranks), rng.integers(200, 260, num_ranks + seed)))
    costs = costs.astype(float)
    loads = np.bincount(karmarkar_karp.differencing(costs, num_ranks), weights=costs, minlength=num_ranks)
    np.testing.assert_array_equal(np.sort(loads), dense_kk(costs, num_ranks))

"""The micro-batch certificate's sums and sorts, made cheaper, give what the plain ones gave: `exact_sum` is
fsum's correctly rounded sum, `beyond_one_microbatch`'s partial sort takes the cover a stable sort of every item
takes, and `cost_unit`'s sampled refusal is the full one's."""

import math

import numpy as np
import pytest

from orchmllm.balancers.microbatch.bounds import beyond_one_microbatch
from orchmllm.balancers.sums import exact_sum
from orchmllm.balancers.plan import cost_unit


def _values(family: str, rng: np.random.Generator) -> np.ndarray:
    n = int(rng.integers(1, 3000))
    return {
        "uniform": lambda: rng.random(n),
        "quadratic": lambda: (lambda l: l + 1e-4 * l * l)(rng.integers(0, 16384, n).astype(float)),
        "thirds": lambda: rng.integers(0, 2**40, n) / 3.0,
        "wide": lambda: rng.random(n) * 2.0 ** rng.integers(-60, 60, n),  # over 30 binades: fsum itself
        "tiny": lambda: np.where(rng.random(n) < 0.5, -0.0, rng.random(n) * 2.0**-1000),
        "huge": lambda: (1 + rng.random(n) * 1e-15) * 2.0**1020,  # sums beyond float64
        "scaled": lambda: rng.random(n) * 2.0 ** float(rng.choice([-960, -899, -850, 850, 898, 960])),
        "integers": lambda: rng.integers(0, 2**52, n).astype(float),
    }[family]()


@pytest.mark.parametrize("family", ["uniform", "quadratic", "thirds", "wide", "tiny", "huge", "scaled", "integers"])
def test_exact_sum_is_fsum(family):
    rng = np.random.default_rng(len(family))
    for _ in range(40):
        values = _values(family, rng)
        try:
            expected = math.fsum(values.tolist())
        except OverflowError:
            with pytest.raises(OverflowError):
                exact_sum(values)
            continue
        assert exact_sum(values) == expected


def _stably_sorted_cover(costs, lengths, num_ranks, capacity, total, tokens, bound):
    """`beyond_one_microbatch` as it was: every item with tokens, but the costliest, by cost per token (stable)."""
    beyond, top = tokens - num_ranks * capacity, int(np.argmax(costs))
    if beyond <= 0 or float(costs.max()) + (total - float(costs.max())) * beyond / ((tokens - capacity) * num_ranks) \
            <= bound:
        return 0.0
    holding = np.flatnonzero(lengths > 0)
    holding = holding[holding != top]
    order = holding[np.argsort(costs[holding] / lengths[holding], kind="stable")]
    covered = np.cumsum(lengths[order])
    whole = int(np.searchsorted(covered, beyond))
    short = beyond - (int(covered[whole - 1]) if whole else 0)
    cover = math.fsum(costs[order[:whole]].tolist()) + float(costs[order[whole]]) * short / float(lengths[order[whole]])
    return (float(costs.max()) + cover / num_ranks) * (1.0 - 1e-9)


@pytest.mark.parametrize("family", ["quadratic", "linear", "few ratios", "random", "zeros"])
def test_partial_sort_takes_the_stable_sorts_cover(family):
    """Ties of cost per token (linear: all tie; few ratios: many at the partition's threshold) go by index."""
    rng, covers = np.random.default_rng(7), 0
    for _ in range(30):
        n, capacity = int(rng.integers(500, 8000)), int(rng.integers(64, 4000))
        lengths = np.minimum((rng.pareto(float(rng.uniform(0.6, 2.0)), n) * capacity / 50).astype(np.int64), capacity)
        costs = {"quadratic": lambda: lengths + 1e-4 * lengths.astype(float) ** 2,
                 "linear": lambda: lengths * 1.0,
                 "few ratios": lambda: rng.integers(1, 4, n) * lengths * 1.0,
                 "random": lambda: rng.random(n) * 100 * (lengths > 0),
                 "zeros": lambda: np.where(rng.random(n) < 0.3, 0.0, rng.exponential(5, n) * lengths)}[family]()
        num_ranks = max(1, int(lengths.sum() // capacity // rng.uniform(1.05, 4)))
        args = costs, lengths, num_ranks, capacity, math.fsum(costs.tolist()), int(lengths.sum()), 0.0
        assert beyond_one_microbatch(*args) == _stably_sorted_cover(*args)
        covers += _stably_sorted_cover(*args) > 0
    assert covers >= 25


def test_cost_unit_refuses_past_its_sample():
    """Integer costs for the first values and a finer one later: no unit, as without the sample."""
    integers = np.arange(1.0, 200.0)
    assert cost_unit(integers) == 1.0
    assert cost_unit(np.append(integers, 0.1)) is None
    assert cost_unit(np.append(integers, 0.5)) == 0.5

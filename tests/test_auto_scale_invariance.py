"""`balance`'s default 'auto' plans the same assignment when every cost is rescaled by a power of two (exact in
float64): its searches work in the costs' unit (`plan.cost_unit`), not in integers, and so does the certificate
(its bound is rounded up to that unit: x0.5 or x1024 read `optimal` where x1 does).

probe27 P27-06: integer costs planned makespan 141, optimal; the same costs x0.5 or x1024, 142, feasible with bound
140.75: the bound was rounded up, L2 lifted it and the minimum-slack packings were tried for integer costs only, in
the unit 1 (x1024: the target was 140.75 units of 1024; x0.5: no packings at all).
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import balance

SCALES = [2.0**-3, 0.5, 2.0, 2.0**10]


def probe27_instance():
    """probe27's c06 (f11_scale_auto.py's generator, seed 88): 47 items of integer costs 0-99 on 16 ranks."""
    rng = np.random.default_rng(88)
    num_ranks = int(rng.choice([2, 4, 8, 16, 32, 64]))
    n = int(num_ranks * rng.choice([1, 2, 3, 4, 8]) + rng.integers(0, num_ranks))
    lengths = rng.integers(1, 5000, n)
    rng.integers(0, 3)
    return lengths, rng.integers(0, 100, n).astype(float), num_ranks


@pytest.mark.parametrize("scale", SCALES)
def test_probe27_rescaled_costs_plan_alike(scale):
    lengths, costs, num_ranks = probe27_instance()
    plain, scaled = balance(lengths, num_ranks, costs=costs), balance(lengths, num_ranks, costs=costs * scale)
    assert (plain.makespan, str(plain.status)) == (141.0, "optimal")
    assert np.array_equal(scaled.assignment, plain.assignment) and scaled.makespan == 141.0 * scale


@st.composite
def small_integer_costs(draw):
    num_ranks = draw(st.integers(3, 6))
    count = draw(st.integers(2 * num_ranks, 4 * num_ranks))  # 2-4 items a rank: the pair and triple search
    costs = draw(st.lists(st.integers(0, 99), min_size=count, max_size=count))
    lengths = draw(st.lists(st.integers(1, 99), min_size=count, max_size=count))
    return np.array(lengths), np.array(costs, dtype=float), num_ranks


@settings(max_examples=15, deadline=None)
@given(small_integer_costs(), st.sampled_from(SCALES))
def test_power_of_two_rescales_keep_the_plan(instance, scale):
    lengths, costs, num_ranks = instance
    plain, scaled = balance(lengths, num_ranks, costs=costs), balance(lengths, num_ranks, costs=costs * scale)
    assert np.array_equal(scaled.assignment, plain.assignment) and scaled.makespan == plain.makespan * scale



def test_regression_a_rescaled_plan_kept_its_status():
    """The certificate rounded its bound up for integer costs only: on 114 of 300 random instances (D 2-8, integer
    costs 1-99) x0.5 or x1024 read `feasible` where x1 read `optimal`; the bound now rounds up to the costs' unit."""
    for seed in (0, 4, 5):
        rng = np.random.default_rng(seed)
        num_ranks = int(rng.integers(2, 9))
        n = int(rng.integers(num_ranks, 5 * num_ranks))
        costs = rng.integers(1, 100, n).astype(float)
        plans = [balance(np.ones(n, dtype=np.int64), num_ranks, costs=costs * scale) for scale in (1.0, 0.5, 1024.0)]
        assert len({str(plan.status) for plan in plans}) == 1, [(plan.status, plan.lower_bound) for plan in plans]
        ratio = plans[0].lower_bound / plans[0].makespan
        assert [plan.lower_bound / plan.makespan for plan in plans[1:]] == [ratio] * 2

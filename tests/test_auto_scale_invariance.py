"""`balance`'s default 'auto' plans the same assignment when every cost is rescaled by a power of two (exact in
float64): its searches work in the costs' unit (`plan.cost_unit`), not in integers.  (The plan's certificate still
rounds its bound up for integer costs only: x0.5 or x1024 may read `feasible` where x1 reads `optimal`.)

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


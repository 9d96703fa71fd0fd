"""MULTIFIT's packing probe (`kernels.multifit.pack`) refuses a capacity as soon as the room no item can
use exceeds the slack: the same answer as packing to the end, far sooner on near-equal items."""

import math
from bisect import bisect_left

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.kernels import multifit
from orchmllm.benchmarks.pcmax_families import make_instance


def packed_to_the_end(costs, num_ranks, capacity):
    """`pack` with its early refusal switched off (a margin no dead room exceeds)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multifit, "DEAD_ROOM_MARGIN", math.inf)
        return multifit.pack(costs, num_ranks, capacity)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=1, max_size=60), st.integers(1, 8), st.floats(0.8, 1.3),
       st.booleans())
def test_property_the_early_refusal_answers_as_packing_to_the_end(lengths, num_ranks, slack, fractional):
    """Capacities around the mean load (the bisection's probes), integer and fractional costs."""
    costs = np.array(lengths, dtype=float) * (1.37 if fractional else 1.0)
    capacity = max(float(costs.max()), float(costs.sum()) / num_ranks * slack)
    expected = packed_to_the_end(costs, num_ranks, capacity)
    packed = multifit.pack(costs, num_ranks, capacity)
    if expected is None:
        assert packed is None
    else:
        np.testing.assert_array_equal(packed, expected)


def test_regression_a_capacity_too_small_was_packed_to_the_last_items():
    """Regression: every probe below the optimum packed all but the last items before finding no room;
    on near-equal items (`near_mean` at D = 512 x 8) MULTIFIT's 12 failing probes took ~27 ms, most of
    `balance`'s time and `balance_microbatches` M = 1 at T = 8k 10-12x the default mix (issue 24).  The
    dead room (bins left below the least item) passes the slack after ~50 items: the refusing probe
    searches the room list for a few dozen items, the probe that packs for every item."""
    costs = make_instance("near_mean", 512, 8).times.astype(float)
    feasible = float(costs.sum()) / 512 * 1.2
    infeasible = float(costs.sum()) / 512  # the mean: near-equal items leave room in every bin
    assert packed_to_the_end(costs, 512, infeasible) is None and multifit.pack(costs, 512, feasible) is not None
    searches = {}
    for name, capacity in (("feasible", feasible), ("infeasible", infeasible)):
        calls = []
        with pytest.MonkeyPatch.context() as patch:  # count the probe's room searches (its work per item)
            patch.setattr(multifit, "bisect_left", lambda *args: calls.append(1) or bisect_left(*args))
            multifit.pack(costs, 512, capacity)
        searches[name] = len(calls)
    assert multifit.pack(costs, 512, infeasible) is None
    assert searches["infeasible"] < 0.05 * searches["feasible"]

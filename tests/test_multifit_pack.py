"""MULTIFIT's packing probe (`kernels.multifit.pack`) is best-fit decreasing with its tie rules (items by
(cost, index), among bins of equal room the one that got its room last): the same bins as the textbook loop
below, the room list kept without the bins no item fits (issue 24: `balance`'s auto at 512 x 8 items)."""

from bisect import bisect_left

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.kernels import lpt, multifit
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload


def textbook_best_fit(costs, num_ranks, capacity):
    """Best-fit decreasing as written first: every bin in one list of rooms, ascending (a bin popped and
    inserted again before the rooms equal to its new one); packed to the end, None when an item finds no room."""
    assignment = np.empty(costs.size, dtype=np.int64)
    rooms, bins, opened = [], [], 0
    order = lpt.sorted_order(costs)
    for item, cost in zip(order.tolist(), costs[order].tolist()):
        slot = bisect_left(rooms, cost)
        if slot < len(rooms):
            room, rank = rooms.pop(slot) - cost, bins.pop(slot)
        elif opened < num_ranks and cost <= capacity:
            room, rank = capacity - cost, opened
            opened += 1
        else:
            return None
        assignment[item] = rank
        slot = bisect_left(rooms, room)
        rooms.insert(slot, room)
        bins.insert(slot, rank)
    return assignment


@settings(max_examples=400, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=80), st.integers(1, 10), st.floats(0.9, 1.4),
       st.sampled_from([1.0, 1.37, 0.1]), st.booleans())
def test_property_pack_is_the_textbook_best_fit(lengths, num_ranks, slack, scale, integral_capacity):
    """Small integer costs (many ties in costs and rooms), fractional ones, capacities around the mean load."""
    costs = np.array(lengths, dtype=float) * scale
    capacity = max(float(costs.max()), float(costs.sum()) / num_ranks * slack)
    if integral_capacity:
        capacity = float(np.ceil(capacity))
    expected = textbook_best_fit(costs, num_ranks, capacity)
    packed = multifit.pack(costs, num_ranks, capacity)
    if expected is None:
        assert packed is None
    else:
        np.testing.assert_array_equal(packed, expected)


def test_regression_best_fit_kept_every_bin_in_its_room_list():
    """Regression: each item popped its bin out of the room list and inserted it again, and the bins no item
    fits stayed in it: MULTIFIT's 12 probes took 32-37 ms of `balance`'s 40-49 ms at 512 x 8 (audio_qa, T 8k)
    and `balance_microbatches` with one micro-batch 11-21x the default mix (issue 24).  A bin that stays in
    its place is written over, a dead one leaves: 0.65-0.8x the textbook loop (about 1x before; timed in
    `bench_microbatch.py -k one_micro_batch`, the room lists it searches are asserted here)."""
    lengths = sample_workload("audio_qa", 512, 8, seed=7).sample_llm_length
    costs = MODELS["84b"].llm.cost(causal=True).item_costs(lengths)
    capacity = float(np.floor(costs.sum() / 512 * 1.0026))  # a probe that packs, near the bisection's last
    np.testing.assert_array_equal(multifit.pack(costs, 512, capacity), textbook_best_fit(costs, 512, capacity))
    searched = []  # the length of the room list each search reads (all 512 bins before; ~30 % of them now)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multifit, "bisect_left",
                      lambda rooms, *args: searched.append(len(rooms)) or bisect_left(rooms, *args))
        multifit.pack(costs, 512, capacity)
    assert max(searched) < 512 and sum(searched) < 0.5 * 512 * len(searched)


def test_regression_each_item_of_a_run_of_equal_costs_searched_the_room_list():
    """Regression: every item searched the room list for its bin and for its bin's new place, though an item
    of the same cost as the last goes where the last went while that bin's room lasts (its room is still the
    least that fits): 7717 searches for 4096 items of 579 lengths (audio_qa 512 x 8), MULTIFIT's 12 probes 20
    of `balance`'s 31 ms there and `balance_microbatches` with one micro-batch 9.6-10.8x the default mix (issue
    24).  A run is placed bin by bin now: 2203 searches, the same bins as the textbook loop."""
    lengths = sample_workload("audio_qa", 512, 8, seed=7).sample_llm_length
    costs = MODELS["84b"].llm.cost(causal=True).item_costs(lengths)
    capacity = float(np.floor(costs.sum() / 512 * 1.0026))  # a probe that packs, near the bisection's last
    searched = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(multifit, "bisect_left", lambda rooms, *args: searched.append(1) or bisect_left(rooms, *args))
        packed = multifit.pack(costs, 512, capacity)
    np.testing.assert_array_equal(packed, textbook_best_fit(costs, 512, capacity))
    assert len(searched) < 0.7 * costs.size

"""The split layout's shortcuts (`placement.py`) against laying out item by item with numpy scans.

A run of items that each open a group is put on the free blocks at once (`Placement.open_run`), and an overflow's
search is decided by the least-loaded candidate where that one surely has token room (`Placement._scan`); one
degree to weigh is not sorted by floors (`Placement._overflow`).  The reference lays out every item through `place`
and scans every candidate with numpy for each item (`Placement._candidates`): the same layouts."""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel import placement, planner
from orchmllm.balancers.context_parallel.pairing import packable_degrees
from orchmllm.balancers.context_parallel.split import allot, allowed_degrees
from orchmllm.balancers.problem import make_problem
from orchmllm.study.models import MODELS

COST = MODELS["84b"].llm.cost(causal=True)
GPUS = 8


def _inputs(lengths, num_ranks, cap, step):
    """`place_groups`' arguments as `planner.layout` makes them at the ladder's step `step` above the bound."""
    problem = replace(make_problem(np.asarray(lengths), num_ranks, cost=COST), max_tokens_per_rank=cap)
    spec = ContextParallel(gpus_per_node=GPUS)
    allotment = allot(problem, spec, allowed_degrees(spec, num_ranks, GPUS), GPUS, cap)
    bound = allotment.bound()
    target = bound * (1 + step * planner.LADDER_STEP)
    long = np.flatnonzero((allotment.degrees_at(bound) > 1) | (problem.item_costs > planner.LAYOUT_SHARE * bound))
    times = planner.TimeTable(problem, spec, GPUS, long)
    degree = packable_degrees(times, problem.lengths, allotment.degrees_at(target), target,
                              math.inf if cap is None else cap, num_ranks, spec.degrees)
    return problem, spec, GPUS, times, degree, long, target


class _OneByOne(placement.Placement):
    """The reference: every item through `place`, every search a numpy scan of all candidates, an overflow's at
    every degree its own and above."""

    def open_run(self, items, times, needs):
        return 0

    def _quick(self, degree, time, need):
        return None

    def _search(self, degree, time, need, fullest):
        return None

    def _floor(self, degree, time, need):
        return -math.inf, degree


@st.composite
def _giant_mixes(draw):
    """Giants that split, long items laid out with them, short ones; budgets from none to tight; ladder steps."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    num_ranks = draw(st.sampled_from([8, 16, 32, 64]))
    giants = rng.integers(60_000, 320_000, draw(st.integers(1, num_ranks // 2)))
    longs = rng.integers(8_000, 60_000, draw(st.integers(0, 4 * num_ranks)))
    short = rng.integers(100, 4_000, draw(st.integers(0, 4 * num_ranks)))
    lengths = np.concatenate((giants, longs, short))
    tight = max(-(-int(lengths.max()) // GPUS), -(-int(lengths.sum()) // num_ranks))
    cap = draw(st.sampled_from([None, tight + 2_000, 2 * tight]))
    return lengths, num_ranks, cap, draw(st.sampled_from([0, 3, 7]))


@settings(max_examples=200, deadline=None)
@given(case=_giant_mixes())
def test_place_groups_equals_laying_out_item_by_item_with_numpy_scans(case):
    inputs = _inputs(*case)
    found = placement.place_groups(*inputs)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(placement, "Placement", _OneByOne)
        expected = placement.place_groups(*inputs)
    assert (found is None) == (expected is None)
    if found is not None:
        assert found[2] == expected[2]
        np.testing.assert_array_equal(found[0], expected[0])
        np.testing.assert_array_equal(found[1], expected[1])


def test_regression_items_that_each_open_a_group_were_placed_one_by_one(monkeypatch):
    """Six giants at degree 8 on 64 ranks: each opens a group on the next free block.  Each went through `place`
    (a search of the keys, then the block) where the opening run is read off their times at once (the long
    workload's T = 16k step: 9.5k of its 36k items at degree 8)."""
    places, place = [], placement.Placement.place
    monkeypatch.setattr(placement.Placement, "place", lambda self, *a: places.append(a) or place(self, *a))
    inputs = _inputs([300_000] * 6 + [2_000] * 40, 64, None, 0)
    start, degree, overflowed = placement.place_groups(*inputs)
    assert not overflowed and (degree[:6] == GPUS).all() and sorted(start[:6].tolist()) == list(range(0, 48, 8))
    assert [a for a in places if a[1] > 1] == []


def test_regression_an_overflows_search_walked_runs_where_the_least_loaded_candidate_decides(monkeypatch):
    """Without a token budget the least-loaded candidate of an overflow's search always has room: it is the
    answer unless another load rounds to its peak.  Each such search walked the keys' runs (`_least_fitting`)."""
    walks, scanning, least_fitting, scan = [], [], placement.Placement._least_fitting, placement.Placement._scan

    def scanned(self, degree, time, need, fullest):
        scanning.append(fullest)
        return scan(self, degree, time, need, fullest)

    monkeypatch.setattr(placement.Placement, "_scan", scanned)
    monkeypatch.setattr(placement.Placement, "_least_fitting",
                        lambda self, *a: walks.append(scanning[-1]) or least_fitting(self, *a))
    inputs = _inputs([200_000, 150_000] + [50_000] * 30 + [2_000] * 40, 16, None, 0)
    assert placement.place_groups(*inputs)[2]  # some item overflowed
    assert False in scanning and False not in walks

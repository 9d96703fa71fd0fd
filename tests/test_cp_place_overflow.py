"""Overflows of the split layout (`overflow.py`) and the parked candidates' rooms (`Placement.parked_holds`,
`Placement._park_short`): the layouts of every overflowing item through `place`, with the parked rooms as filed, and
of candidates parked one by one; fewer calls."""

import heapq

import numpy as np
import pytest
from hypothesis import given, settings

from orchmllm.balancers.context_parallel import placement
from orchmllm.tests.test_cp_layout_structures import GPUS, _same_layout, giant_mixes, layout_inputs


class _Reference(placement.Placement):
    """Every item of a degree above 1 through `place`, a parked candidate's room as filed when it was parked, and
    the candidates short of tokens parked one by one by the searches' walks."""

    def lay_groups(self, items, times, needs):
        return all(self.place(item, self.degree, time, need) >= 0 for item, time, need in zip(items, times, needs))

    def parked_holds(self, degree, least):
        return -self.parked[degree][0][0] >= least

    def _park_short(self, degree, need):
        return None


def _giants(seed: int, num_ranks: int, count: int):
    """`count` giants of 66-130k tokens on `num_ranks` ranks with a budget of 32k tokens a rank (each splits, onto
    4 or 8 ranks), at a ladder step by the seed."""
    rng = np.random.default_rng(seed)
    return rng.integers(66_000, 130_000, count), num_ranks, 32_768, [0, 3, 7][seed % 3]


def _layout(case, blocks_class=None):
    if blocks_class is not None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(placement, "Placement", blocks_class)
            return _layout(case)
    problem, spec, times, degree, long, target = layout_inputs(*case)
    return placement.place_groups(problem, spec, GPUS, times, degree, long, target)


@settings(max_examples=30, deadline=None)
@given(case=giant_mixes())
def test_layouts_equal_the_reference_on_giant_mixes(case):
    _same_layout(_layout(case), _layout(case, _Reference))


@pytest.mark.parametrize("case", [(seed, ranks, count) for seed in range(4) for ranks, count in
                                  ((32, 8), (32, 9), (64, 16), (128, 30), (128, 36))])
def test_layouts_equal_the_reference_where_giants_overflow(case):
    _same_layout(_layout(_giants(*case)), _layout(_giants(*case), _Reference))


def _counted(case, monkeypatch, blocks_class=placement.Placement):
    """(the layout, `place` calls at a degree above 1, `_least_fitting` calls of the searches for a least-loaded
    candidate with room)."""
    counts, place, lowest, fitting = [0, 0], blocks_class.place, blocks_class._lowest, blocks_class._least_fitting
    within = []

    def low(self, *args):
        within.append(True)
        try:
            return lowest(self, *args)
        finally:
            within.pop()

    def counted_place(self, item, degree, *args):
        counts[0] += degree > 1
        return place(self, item, degree, *args)

    def counted_fitting(self, *args):
        counts[1] += bool(within)
        return fitting(self, *args)

    monkeypatch.setattr(blocks_class, "place", counted_place)
    monkeypatch.setattr(blocks_class, "_lowest", low)
    monkeypatch.setattr(blocks_class, "_least_fitting", counted_fitting)
    return _layout(_giants(*case), blocks_class), *counts


def test_regression_every_overflowing_item_of_a_group_went_through_place(monkeypatch):
    """Each item of a degree above 1 that found no free block went through `place`: a best fit over its degree's
    groups, then an overflow weighing every degree's floor (allgiant, D = 512 x 16: 7.1k such items in 8.8k
    overflows).  Where one degree's least-loaded group decides, `lay_groups` puts the item there at once (and where
    `Placement._quick` decides a best fit or the next free block, too)."""
    found, overflows, _ = _counted((0, 128, 30), monkeypatch)
    expected, every, _ = _counted((0, 128, 30), monkeypatch, _Reference)
    _same_layout(found, expected)
    assert found[2] and (overflows, every) == (0, 14)  # 8 items overflowed, 6 fit a group or opened one: no `place`


def test_regression_short_candidates_parked_one_by_one(monkeypatch):
    """A search for the least-loaded candidate with room walked every candidate short of the item's tokens and
    parked them one by one (allgiant, D = 512 x 16: searches parking all 512 ranks, ~8 ms each); they are parked at
    once, so the walks check fewer."""
    found, _, walked = _counted((6, 128, 36), monkeypatch)
    expected, _, every = _counted((6, 128, 36), monkeypatch, _Reference)
    _same_layout(found, expected)
    assert (walked, every) == (0, 19)  # runs of equal loads walked: none, all of them parked at once


def test_parked_rooms_are_brought_up_to_date_at_the_top():
    """Filed rooms only shrink: the top is refreshed while its filed room is enough, until it holds; the others keep
    their filed rooms."""
    problem, spec, times, degree, long, target = layout_inputs(*_giants(0, 32, 8))
    blocks = placement.Placement(problem, spec, GPUS, times, target)
    blocks.open(1)
    blocks.cap, blocks.tokens[:3] = 100, [60, 10, 30]
    blocks.parked[1] = [(-90, 1), (-80, 0), (-70, 2)]  # filed rooms; now 90, 40 and 70
    heapq.heapify(blocks.parked[1])
    assert blocks.parked_holds(1, 90) and not blocks.parked_holds(1, 91)
    blocks.tokens[1] = 50  # room 50: below rank 2's 70
    assert not blocks.parked_holds(1, 90) and sorted(blocks.parked[1]) == [(-80, 0), (-70, 2), (-50, 1)]
    assert blocks.parked_holds(1, 60) and sorted(blocks.parked[1]) == [(-70, 2), (-50, 1), (-40, 0)]

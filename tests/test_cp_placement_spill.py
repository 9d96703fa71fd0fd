"""Degree 1's items that spill onto groups in runs (`spill.py`): the layouts of every item through `place`, fewer
calls; the ranks' accounts caught up before any item that `place` lays out."""

import numpy as np
import pytest

from orchmllm.balancers.context_parallel import placement
from orchmllm.balancers.context_parallel.spill import SpillRun
from orchmllm.tests.test_cp_layout_structures import GPUS, _same_layout, layout_inputs


class _EveryItemPlaced(placement.Placement):
    """The reference: every item of degree 1 through `place` (no spill runs)."""

    def spill_run(self):
        return None


def _mix(seed, num_ranks, cap_mode):
    """Giants that split, many long items that stay whole, short ones; no budget, or one near the tightest."""
    rng = np.random.default_rng(seed)
    giants = rng.integers(60_000, 320_000, rng.integers(1, num_ranks // 2 + 1))
    longs = rng.integers(8_000, 60_000, rng.integers(num_ranks, 6 * num_ranks))
    short = rng.integers(100, 4_000, rng.integers(0, 4 * num_ranks))
    lengths = np.concatenate((giants, longs, short))
    tight = max(-(-int(lengths.max()) // GPUS), -(-int(lengths.sum()) // num_ranks))
    return lengths, num_ranks, [None, tight + 2_000, tight + 200][cap_mode], [0, 3, 7][seed % 3]


def _layouts(case, monkeypatch):
    """(the layout with spill runs, the reference's)."""
    problem, spec, times, degree, long, target = layout_inputs(*case)
    found = placement.place_groups(problem, spec, GPUS, times, degree, long, target)
    monkeypatch.setattr(placement, "Placement", _EveryItemPlaced)
    return found, placement.place_groups(problem, spec, GPUS, times, degree, long, target)


def test_spill_runs_lay_out_what_place_does_with_parked_ranks_and_groups_taking_several_items(monkeypatch):
    """Seeded mixes where spills meet ranks parked short of tokens (their keys absent) and groups that take more than
    one item before the accounts catch up; each case's layout equals the reference's."""
    runs = []  # per catch-up: (groups touched, items spilled since the last, whether a rank was parked)
    spilled, spill, catch_up = [], SpillRun.spill, SpillRun.catch_up
    monkeypatch.setattr(SpillRun, "spill", lambda self, *a: spill(self, *a) and not spilled.append(a))
    monkeypatch.setattr(SpillRun, "catch_up", lambda self: runs.append(
        (len(self.touched), len(spilled), bool(self.blocks.parked[1]))) or spilled.clear() or catch_up(self))
    for case in (_mix(14, 32, 1), _mix(27, 16, 1), _mix(48, 64, 1), _mix(12, 64, 2), _mix(5, 32, 0)):
        with pytest.MonkeyPatch.context() as patch:
            _same_layout(*_layouts(case, patch))
    assert any(touched and parked for touched, _, parked in runs)
    assert any(0 < touched < items for touched, items, _ in runs)


def test_regression_every_item_of_degree_1_went_through_place(monkeypatch):
    """Each long unsplit item went through `place`: a best fit over every rank's keys, an overflow over every degree's
    floors, then its group's 8 ranks' keys moved one item at a time (the long workload's T = 16k step: 14.8k of its
    15.4k such items spill onto a group, ~15 us each).  A spill run puts them where `place` would, and moves a group's
    ranks' keys once a run (T = 16k, the captured `place_groups` calls' degree 1: 248 -> 159 ms CPU)."""
    places, place = [], placement.Placement.place
    monkeypatch.setattr(placement.Placement, "place", lambda self, *a: places.append(a[1]) or place(self, *a))
    problem, spec, times, degree, long, target = layout_inputs(*_mix(48, 64, 1))
    found = placement.place_groups(problem, spec, GPUS, times, degree, long, target)
    spilling = places.count(1)
    monkeypatch.setattr(placement, "Placement", _EveryItemPlaced)
    _same_layout(found, placement.place_groups(problem, spec, GPUS, times, degree, long, target))
    every = places.count(1) - spilling  # each item of degree 1
    assert found[2] and every == 60 and spilling == every - 28 - 27  # 28 spilled onto groups, 27 in a fresh run


def test_fresh_runs_lay_out_what_place_does(monkeypatch):
    """Items of degree 1 that each take the next of the least-loaded ranks, no other rank within the target with them
    (`SpillRun.fresh_run`), laid out at once: each layout equals the reference's (every item through `place`), on mixes
    where a run stops at a rank short of tokens (seeds 48 and 3) or at one of a group (seed 12), and runs lay out items
    (the long workload's T = 32k step, seed 23: 5.1k of its 8.5k items of degree 1, 1262M -> 1122M instructions for
    its captured `place_groups` calls).  A run is tried only where `spill` answered None: never with a rank of
    degree 1 parked (half_giant, D = 512 x 16, seed 11: 5.7k calls that laid nothing out, +3.4 % instructions)."""
    laid, parked, fresh_run = [], [], SpillRun.fresh_run

    def recorded(self, *args):
        parked.append(bool(self.blocks.parked[1]))
        laid.append(fresh_run(self, *args))
        return laid[-1]

    monkeypatch.setattr(SpillRun, "fresh_run", recorded)
    for case in (_mix(48, 64, 2), _mix(3, 16, 1), _mix(12, 16, 1), _mix(5, 32, 0), _mix(27, 64, 0)):
        with pytest.MonkeyPatch.context() as patch:
            _same_layout(*_layouts(case, patch))
    assert sum(laid) >= 50 and not any(parked)  # 79 of the 5 mixes' items

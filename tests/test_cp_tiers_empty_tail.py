"""Two tiers' deal (`context_parallel.tiers._deal`) with empty items: those holding no tokens come last in its order
(least time at the widest degree) and each takes the least-loaded group of all, parked ones included, unchecked
(zeros_giants, D = 2560 x 16: 6 in 10 dealt items were empty, each checked for token room and its group's bounds
updated).  A deal whose items hold more tokens than its groups' ranks is not made.  The layouts equal the
rank-by-rank reference (`test_cp_layout_structures`)."""

from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel import planner, tiers
from orchmllm.balancers.problem import make_problem
from orchmllm.tests.test_cp_layout_structures import COST, GPUS, _reference_two_tiers, _same_layout


def _record_dealt(monkeypatch, dealt) -> None:
    """Call `dealt(j)` for every item j that joins a group's token rooms in `tiers._deal` (its pending items,
    whether `_Rooms.add` or the deal's inline fast path put it there): the items dealt, not calls to one method."""
    class Pending(list):
        def append(self, j):
            dealt(j)
            super().append(j)

    class Groups(dict):
        def __setitem__(self, s, items):
            super().__setitem__(s, Pending(items))

    init = tiers._Rooms.__init__

    def recording_init(self, *args):
        init(self, *args)
        self.pending = Groups({s: Pending(items) for s, items in self.pending.items()})
    monkeypatch.setattr(tiers._Rooms, "__init__", recording_init)


def _giants_short_and_empty_items(seed: int, cap: int | None):
    """4 giants, 900 short items and 600 empty ones on 64 ranks, shuffled."""
    rng = np.random.default_rng(seed)
    lengths = rng.permutation(np.concatenate([rng.integers(6000, 8000, 4), rng.integers(30, 60, 900),
                                              np.zeros(600, dtype=np.int64)]))
    problem = replace(make_problem(lengths, 64, cost=COST), max_tokens_per_rank=cap)
    spec, long = ContextParallel(gpus_per_node=GPUS), np.arange(lengths.size)
    return problem, spec, planner.TimeTable(problem, spec, GPUS, long), long


@pytest.mark.parametrize("seed, cap", [(0, 1100), (1, 1250), (3, 1400), (4, None)])
def test_regression_empty_items_were_checked_for_token_room(seed, cap, monkeypatch):
    """Budgets at which groups fill by tokens at different points of the deal (the first three leave 4 of the 8
    groups parked when the empty items come), and none."""
    problem, spec, times, long = _giants_short_and_empty_items(seed, cap)
    reference = _reference_two_tiers(problem, spec, times, long, 0.0, planner.water_level)
    added, deals, deal = [], [], tiers._deal
    _record_dealt(monkeypatch, added.append)
    monkeypatch.setattr(tiers, "_deal", lambda *args: deals.append(args[6]) or deal(*args))
    found = tiers.two_tiers(problem, spec, GPUS, times, long, 0.0, planner.water_level)
    _same_layout(found, reference)
    assert found is not None and len(added) <= 904 * len(deals)  # the items with tokens only (before: 1504 a deal)


def test_regression_deals_over_the_groups_tokens_were_made():
    """allgiant-like: 24 items of 20-130k tokens on 64 ranks, 32k tokens a rank.  With 3, 9 and 12 items alone, the
    items dealt hold more tokens than the groups left (before: 12, 9 and 6 items dealt before one found no room)."""
    rng = np.random.default_rng(4)
    problem = replace(make_problem(rng.integers(20_000, 130_000, 24), 64, cost=COST), max_tokens_per_rank=32_768)
    spec, long = ContextParallel(gpus_per_node=GPUS), np.arange(24)
    times = planner.TimeTable(problem, spec, GPUS, long)
    added, deal = {}, tiers._deal  # alone items (k) -> items dealt in that deal

    def counted_deal(*args):
        added[args[6]] = 0
        return deal(*args)

    def counted(j):
        added[next(reversed(added))] += 1  # the deal being made

    with pytest.MonkeyPatch.context() as monkeypatch:
        _record_dealt(monkeypatch, counted)
        monkeypatch.setattr(tiers, "_deal", counted_deal)
        found = tiers.two_tiers(problem, spec, GPUS, times, long, 0.0, planner.water_level)
    assert found is None and _reference_two_tiers(problem, spec, times, long, 0.0, planner.water_level) is None
    assert added[3] == added[9] == added[12] == 0 and added[6] > 0

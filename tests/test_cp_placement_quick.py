"""Best fits that `Placement._quick` decides without a search: a run of equal peaks (a group's ranks share its load,
so degree 1's best fit often ties) goes to its first candidate, the least position, where that one has token room;
the layouts equal the one-by-one numpy reference's, with no search left at degree 1."""

import numpy as np
import pytest

from orchmllm.balancers.context_parallel import placement
from orchmllm.tests.test_cp_layout_structures import GPUS, _OneByOne, _same_layout, layout_inputs


def _mix(seed: int):
    """Three giants (split, groups of equal loads), 60 long unsplit items laid out at degree 1 and 40 short ones on
    32 ranks, no budget, at the bound."""
    rng = np.random.default_rng(seed)
    lengths = np.concatenate((rng.integers(60_000, 320_000, 3), rng.integers(8_000, 60_000, 60),
                              rng.integers(100, 4_000, 40)))
    return lengths, 32, None, 0


def _layout(case, blocks_class, monkeypatch):
    """(the layout, `_search` calls per degree)."""
    searches, search = {}, blocks_class._search

    def counted(self, degree, *args, **kwargs):
        searches[degree] = searches.get(degree, 0) + 1
        return search(self, degree, *args, **kwargs)

    monkeypatch.setattr(blocks_class, "_search", counted)
    monkeypatch.setattr(placement, "Placement", blocks_class)
    problem, spec, times, degree, long, target = layout_inputs(*case)
    return placement.place_groups(problem, spec, GPUS, times, degree, long, target), searches


@pytest.mark.parametrize("seed", [0, 5, 9])
def test_regression_runs_of_equal_peaks_were_searched(seed, monkeypatch):
    """Degree 1's best fit on ranks of equal loads (a group's) went through `_search`; `_quick` decides them (0ce4af0),
    and the layout is the reference's.  0ce4af0's regression test (rev50 F6): it fails on 0ce4af0's parent fb5959d
    (14-22 searches at degree 1 on these mixes), not on 7b1b927's, the commit that added it."""
    with pytest.MonkeyPatch.context() as patch:
        found, searches = _layout(_mix(seed), placement.Placement, patch)
    with pytest.MonkeyPatch.context() as patch:
        expected, _ = _layout(_mix(seed), _OneByOne, patch)
    _same_layout(found, expected)
    assert searches.get(1, 0) == 0

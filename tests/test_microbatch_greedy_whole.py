"""The unpadded joint greedy's fit passes taking whole loads at once (`greedy_sweep._take_whole`): where a pass's
next cells each take one item, in turn, they are placed a slice of the row at a time; the cells stay the plain
scan's (`_scan_greedy`), float rounding included (sums tied by rounding refuse the slice: the loop takes them)."""

from types import SimpleNamespace

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.microbatch import greedy_sweep
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.tests.test_microbatch_greedy_fit_runs import assert_scans_choices
from orchmllm.tests.test_microbatch_greedy_sweeps import rounding_tie_problem


def _counted_whole(monkeypatch) -> list:
    """[cells placed whole, slices refused], counted over `_take_whole`'s calls."""
    counts, take_whole = [0, 0], greedy_sweep._take_whole

    def counted(*args):
        placed = take_whole(*args)
        counts[0], counts[1] = counts[0] + placed, counts[1] + (placed == 0)
        return placed

    monkeypatch.setattr(greedy_sweep, "_take_whole", counted)
    return counts


def test_whole_loads_place_many_fits_at_once(monkeypatch):
    """Capped Pareto lengths (issue 24's greedy row, 128 x 32, M 3): 926 of the 4096 items go in slices of whole
    loads (at 2560 x 32, 53k of 82k, ~5 % less CPU than the loop alone); the scan's cells for each M."""
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 128 * 32) * 200).astype(np.int64) + 1, 16384)
    counts = _counted_whole(monkeypatch)
    assert_scans_choices(make_microbatch_problem(lengths, 128, max_tokens_per_microbatch=16384,
                                                 cost=CostModel(linear=1.0, quadratic=1e-4)))
    assert counts[0] > 0.2 * lengths.size


@pytest.mark.parametrize("seed", [6, 18, 33, 39])
def test_whole_loads_refuse_sums_tied_by_rounding(monkeypatch, seed):
    """Every slice tried (`WHOLE` 1) on loads of items costing 1 + 1e-9 l, of tenths and of near-equal costs: these
    seeds hold slices whose unequal loads' sums tie in floats; they are refused, and the cells are the scan's."""
    monkeypatch.setattr(greedy_sweep, "WHOLE", 1)
    counts = _counted_whole(monkeypatch)
    assert_scans_choices(rounding_tie_problem(np.random.default_rng(seed), seed % 3))
    assert counts[1] > 0


@pytest.mark.parametrize("cost, placed", [(1.0, 0), (2.0, 2), (3.0, 2)])
def test_whole_loads_refuse_ties_to_even_in_one_binade(cost, placed):
    """Loads 2^53 + 2 and 2^53 + 4 (floats 2 apart) and their sums share a binade, where a sum is its load shifted by
    one amount unless the cost lies half-way between two floats: with cost 1 both sums round to 2^53 + 4 (ties to
    even), so the slice is refused (the loop takes it); costs 2 and 3 keep the sums apart, the highest load first."""
    state = SimpleNamespace(loads=[0.0, 0.0], tokens=[0, 0], cap=10, waiting=[], chosen=[])
    row = [(2.0**53 + 2, 0), (2.0**53 + 4, 1)]
    assert greedy_sweep._take_whole(state, row, 0, 2, 2.0**53 + 8, cost, 1, []) == placed
    assert state.chosen == [1, 0][:placed]


def test_whole_loads_refuse_sums_tied_one_binade_up():
    """Loads 1 - 2^-52 and 1 - 2^-53 just below a binade, cost 3: both sums round to 4.0 one binade up, so the
    one-set shortcut (loads and sums on one grid) must not apply and the slice is refused (rev51 F7: only the
    half-way clause was pinned)."""
    state = SimpleNamespace(loads=[0.0, 0.0], tokens=[0, 0], cap=10, waiting=[], chosen=[])
    assert greedy_sweep._take_whole(state, [(1 - 2**-52, 0), (1 - 2**-53, 1)], 0, 2, 4.0, 3.0, 1, []) == 0
    assert state.chosen == []

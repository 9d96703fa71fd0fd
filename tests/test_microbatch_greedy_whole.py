"""The unpadded joint greedy's fit passes taking whole loads at once (`greedy_sweep._take_whole`): where a pass's
next cells each take one item, in turn, they are placed a slice of the row at a time; the cells stay the plain
scan's (`_scan_greedy`), float rounding included (sums tied by rounding refuse the slice: the loop takes them)."""

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

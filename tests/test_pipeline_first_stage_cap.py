"""A cell's first-stage part is at most its cost (fix55's note on probe53 N9): the search's rows of what is left after
an item leaves (`candidates.without_each`, `CellSearch._known_moves`, `CellSearch._move`) cap the parts at the
costs, whose float sums crossed them by ~2.2e-16 of the rows' max, and `Pipeline.stage_times` refuses a part above
its cell's cost (it ran a negative time on the other stages)."""

import numpy as np
import pytest

from orchmllm import Pipeline, balance_microbatches
from orchmllm.balancers.pipeline import spec
from orchmllm.balancers.pipeline.candidates import without


def test_stage_times_refuses_a_first_stage_part_above_its_cell_cost():
    with pytest.raises(ValueError, match=r"`first_stage` must be at most `cell_costs` .*; got 1\.5 > 1\.0 at \(0, 1\)"):
        Pipeline(stages=2).stage_times(np.array([[2.0, 1.0]]), np.array([[2.0, 1.5]]))


def test_without_each_caps_the_first_stage_parts_at_the_costs():
    """A cell all first-stage (e = c) losing an item whose part is one ulp below its cost: c - v rounds below e - p."""
    from orchmllm.balancers.pipeline.candidates import without_each  # new: the other tests run on the parent

    cost, values = np.array([[0.6369616873214543, 1.0]]), np.array([0.2697867137638703, 0.5])
    first, parts = cost.copy(), values * np.array([1 - 2**-52, 1.0])
    at = (np.array([0]), np.array([0]), np.array([0]))
    assert without(first, parts, *at)[0, 0] > without(cost, values, *at)[0, 0]  # apart, they cross
    left, left_first = without_each(((cost, values), (first, parts)), *at)
    np.testing.assert_array_equal(left_first, left)
    assert without_each(((cost, values), (None, None)), *at)[1] is None


def _fuzz_instance():
    """The first instance of fix55's fuzz (/tmp/fix55_scripts/fix55_fuzz.py, default_rng(5)): 56 items of costs
    across 1e-12..1e9, first-stage parts 0, 0.3, 0.999999999 or 1 of them, 4 replicas, GPipe over 2 stages."""
    rng = np.random.default_rng(5)
    n, d = int(rng.integers(8, 80)), int(rng.integers(1, 5))
    lengths = rng.integers(1, 100, n)
    costs = rng.random(n) * rng.choice([1e-12, 1e-3, 1.0, 1e3, 1e9], n) + 0.1 * rng.random(n)
    return lengths, d, costs, costs * rng.choice([0.0, 0.3, 0.999999999, 1.0], n)


def test_regression_the_search_timed_first_stage_parts_above_their_cells(monkeypatch):
    """Cause: the search subtracted a leaving item's cost and its first-stage part from their cells apart, so the
    parts' float sums crossed the costs' (5 cells of the rows timed on this instance before the cap)."""
    lengths, d, costs, first = _fuzz_instance()
    timed, crossed = spec.Pipeline.stage_times, []

    def checked(pipeline, cell_costs, first_stage=None):
        if first_stage is not None:
            crossed.append(int(np.count_nonzero(np.asarray(first_stage) > np.asarray(cell_costs))))
        return timed(pipeline, cell_costs, first_stage)
    monkeypatch.setattr(spec.Pipeline, "stage_times", checked)
    plan = balance_microbatches(lengths, d, costs=costs, max_tokens_per_microbatch=200, pipeline=Pipeline(stages=2),
                                first_stage_costs=first)
    assert crossed and sum(crossed) == 0
    assert plan.pipeline.lower_bound <= plan.pipeline.step_time

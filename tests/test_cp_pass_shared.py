"""Work one split-planner pass shares instead of making again gives the same arrays (issues 24 / 26, speed only): the
plan's item times read from the layout's table for the local search, a micro-batch's allotment and bound made
once for its bound and its plan, and the step's item times made once per item for every set's allotment and pieces."""

from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel
from orchmllm.balancers.context_parallel import microbatch, planner, split
from orchmllm.balancers.context_parallel.packing_bound import Pieces
from orchmllm.balancers.context_parallel.plan import split_times
from orchmllm.balancers.context_parallel.split import allot, allowed_degrees
from orchmllm.balancers.context_parallel.step_times import StepTimes
from orchmllm.balancers.problem import make_problem

COST = CostModel(linear=6e9, quadratic=4e5)


@pytest.mark.parametrize("gpus, inter, seed", [(8, False, 3), (8, False, 4), (6, True, 5), (8, True, 6)])
def test_laid_out_item_times_are_the_split_times(gpus, inter, seed):
    """On nodes of 6 with groups across nodes allowed, a block of 4 may straddle two: there the table does not hold
    its time (None, the search computes them), else its times are `split_times`' floats."""
    rng = np.random.default_rng(seed)
    lengths = np.concatenate((rng.integers(0, 4000, 400), rng.integers(40_000, 200_000, 10 + seed)))
    degrees = (1, 2, 4, 8, 16) if inter else (1, 2, 4, 8)
    spec = ContextParallel(degrees=degrees, gpus_per_node=gpus, allow_inter_node=inter)
    problem = replace(make_problem(lengths, 48, cost=COST), max_tokens_per_rank=65_536)
    allotment = allot(problem, spec, allowed_degrees(spec, 48, gpus), gpus, 65_536)
    start, degree, item_time = planner.laid_out(problem, spec, gpus, allotment, allotment.bound())
    if item_time is not None:
        assert item_time.tobytes() == split_times(problem, spec, start, degree, gpus).tobytes()
    else:
        assert inter and gpus == 6


def test_pass_allotment_and_bound_made_once_per_set(monkeypatch):
    """A set's bound asked before its plan (a fill's deferral), and again: one `allot`, one bound, and the same plan
    as a pass that makes its own."""
    rng = np.random.default_rng(11)
    lengths = rng.integers(20_000, 130_000, 64)
    spec = ContextParallel()
    made, bounds = [], []
    monkeypatch.setattr(split, "allot", lambda *args, **kwargs: made.append(1) or allot(*args, **kwargs))
    bound = split.Allotment._bound
    monkeypatch.setattr(split.Allotment, "_bound", lambda self: bounds.append(1) or bound(self))
    plans = microbatch._PassPlans(lengths, 128, spec, COST, 32_768)
    items = np.arange(40)
    first = plans.bound(items)
    plan = plans(items)
    assert plans.bound(items) == first and plan is plans(items)
    assert len(made) == 1 and len(bounds) == 1
    alone = microbatch._plan_pass(lengths, items, 128, spec, COST, 32_768)
    assert plan.assignment.tobytes() == alone.assignment.tobytes() and plan.degree.tobytes() == alone.degree.tobytes()
    assert plan.loads.tobytes() == alone.loads.tobytes() and plan.lower_bound == alone.lower_bound


def test_pass_without_allotment_is_none_unplanned():
    """Items over the ranks' tokens: no allotment, no plan (as `balance_split` refused them), bound 0."""
    spec, items = ContextParallel(degrees=(1, 2, 4), gpus_per_node=4), np.arange(8)
    plans = microbatch._PassPlans(np.full(8, 30_000), 4, spec, COST, 32_768)
    assert plans.certified_none(items) and plans(items) is None
    plans = microbatch._PassPlans(np.full(8, 30_000), 4, spec, COST, 32_768)
    assert plans.allotment(items) is None and plans.bound(items) == 0.0 and plans(items) is None


def test_bound_kept_once_made_and_a_copy_starts_without():
    spec = ContextParallel()
    problem = make_problem(np.random.default_rng(2).integers(1000, 130_000, 200), 64, cost=COST)
    allotment = allot(problem, spec, allowed_degrees(spec, 64, 8), 8, 32_768, one_pass=False)
    assert allotment.bound() == allotment._bound() and allotment.found == [allotment.bound()]
    copy = replace(allotment, times=allotment.times * 2)
    assert copy.found == [] and copy.bound() != allotment.bound()


@pytest.mark.parametrize("spec", [ContextParallel(), ContextParallel(degrees=(1, 2, 4, 8, 16), allow_inter_node=True)])
def test_step_rows_are_the_times_each_set_makes(spec):
    """A micro-batch's allotment and packing pieces from the step's rows, made for other sets first, equal those
    made from its own items (bit for bit)."""
    lengths = np.random.default_rng(3).integers(0, 130_000, 600)
    times = StepTimes(lengths, spec, COST)
    times.rows(np.arange(0, 600, 3))
    for items in (np.arange(100, 400), np.flatnonzero(lengths > 60_000), np.arange(599, -1, -7)):
        read = split.pass_allotment(lengths[items], 512, spec, COST, 65_536, times.reader(items))
        made = split.pass_allotment(lengths[items], 512, spec, COST, 65_536)
        assert read.times.tobytes() == made.times.tobytes() and read.bound() == made.bound()
        pieces = Pieces(lengths[items], 512, spec, COST, 65_536, times.rows(items))
        assert pieces.times.tobytes() == Pieces(lengths[items], 512, spec, COST, 65_536).times.tobytes()


def test_step_rows_with_a_float_error_are_made_by_the_set_as_before():
    """Times whose intermediate products overflow (attention time inf, `test_planning_size_limits`): no row kept
    (None), and the allotment refuses them as it did."""
    cost, spec = CostModel.from_transformer(num_layers=32, hidden_size=4096), ContextParallel(seconds_per_cost=1e308)
    lengths = np.array([200_000, 150_000, 3])
    times = StepTimes(lengths, spec, cost)
    assert times.rows(np.arange(3)) is None and not times.known.any()
    with pytest.raises(ValueError, match="split times overflow float64"):
        split.pass_allotment(lengths, 8, spec, cost, 50_000, times.reader(np.arange(3)))


def test_times_inside_and_across_in_one_call_are_the_two_calls():
    """`search._stuck` asks for a rank's items' times inside a node and across in one `item_times` call (stacked):
    the same floats as one call each."""
    spec, degrees = ContextParallel(degrees=(1, 2, 4, 8, 16), allow_inter_node=True), np.array([1, 2, 4, 8, 16])
    lengths = np.random.default_rng(4).integers(0, 300_000, 50)
    shape = (lengths.size, degrees.size)
    both = spec.item_times(COST, np.broadcast_to(lengths[:, None], (2, *shape)), np.broadcast_to(degrees, (2, *shape)),
                           np.broadcast_to(np.array([True, False])[:, None, None], (2, *shape)))
    for index, inside in enumerate((True, False)):
        one = spec.item_times(COST, np.broadcast_to(lengths[:, None], shape), np.broadcast_to(degrees, shape),
                              np.full(shape, inside))
        assert both[index].tobytes() == one.tobytes()

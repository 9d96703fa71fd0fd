"""Empty items in the split layout: where every item is laid out, `place_groups` places one of the items with no
tokens and no time, and the others go where it went (`planner._free_riders`): the same layout, fewer placements."""

import math
from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel, balance, balance_microbatches
from orchmllm.balancers.context_parallel import placement, planner
from orchmllm.balancers.context_parallel.split import allot, allowed_degrees
from orchmllm.balancers.problem import make_problem
from orchmllm.balancers.cost import CostModel
from orchmllm.study.models import MODELS

COST = MODELS["84b"].llm.cost(causal=True)
GPUS = 8


def _lengths(seed: int, num_ranks: int) -> np.ndarray:
    """Giants that split, long and short unsplit items, and as many empty items as all of them (zeros_giants)."""
    rng = np.random.default_rng(seed)
    full = np.concatenate((rng.integers(40_000, 200_000, num_ranks // 2), rng.integers(8_000, 40_000, num_ranks),
                           rng.integers(100, 4_000, 2 * num_ranks)))
    return rng.permutation(np.concatenate((full, np.zeros(4 * num_ranks, dtype=np.int64))))


def _every_item_laid_out(lengths, num_ranks, cap, cost, monkeypatch, riders: bool):
    """`layout` of every item (as `planner.laid_out` after a deal found no token room), and the items placed one by
    one; without `riders`, every empty item placed as any other (the layout before `_free_riders`)."""
    problem = replace(make_problem(lengths, num_ranks, cost=cost), max_tokens_per_rank=cap)
    spec = ContextParallel(gpus_per_node=GPUS)
    allotment = allot(problem, spec, allowed_degrees(spec, num_ranks, GPUS), GPUS, cap)
    placed, place = [], placement.Placement.place
    with monkeypatch.context() as patch:
        patch.setattr(placement.Placement, "place", lambda self, item, *a: placed.append(item) or place(self, item, *a))
        if not riders:
            patch.setattr(planner, "_free_riders", lambda problem, spec, times, long: long[:0], raising=False)
        found = planner.layout(problem, spec, GPUS, allotment, allotment.bound(), np.arange(problem.num_items))
    return found, placed


def _same(found, expected):
    assert (found is None) == (expected is None)
    if found is not None:
        assert np.array_equal(found[0], expected[0]) and np.array_equal(found[1], expected[1])
        assert found[2] == expected[2]
        assert all(np.array_equal(a, b) for a, b in zip(found[3], expected[3]))


@pytest.mark.parametrize("seed, num_ranks, slack", [(3, 16, None), (4, 32, 2_000), (5, 16, 500)])
def test_regression_every_empty_item_was_placed_one_by_one(seed, num_ranks, slack, monkeypatch):
    """zeros_giants, D = 2560 x 16 (90 % of the items empty): ~70 % of a plan's CPU went to placing empty items,
    one `place` each in every layout of all items.  Now one of them is placed a layout, the layout unchanged."""
    lengths = _lengths(seed, num_ranks)
    tight = max(-(-int(lengths.max()) // GPUS), -(-int(lengths.sum()) // num_ranks))
    cap = None if slack is None else tight + slack
    found, placed = _every_item_laid_out(lengths, num_ranks, cap, COST, monkeypatch, riders=True)
    expected, placed_before = _every_item_laid_out(lengths, num_ranks, cap, COST, monkeypatch, riders=False)
    _same(found, expected)
    empty = set(np.flatnonzero(lengths == 0).tolist())
    assert len(empty & set(placed_before)) >= len(empty)  # every empty item was placed, at every target tried
    targets = len(placed_before) - len([item for item in placed_before if item not in empty])
    assert sum(item in empty for item in placed) <= math.ceil(targets / len(empty))  # one a target


def test_empty_items_overflowing_every_rank_join_the_least_loaded_one(monkeypatch):
    """Seed 3: at some target the empty items come when every rank is above it (the giants' groups overflowed),
    so each goes to the least-loaded rank (`Placement._overflow`), as each would alone."""
    lengths, overflowed, overflow = _lengths(3, 16), [], placement.Placement._overflow
    monkeypatch.setattr(placement.Placement, "_overflow",
                        lambda self, item, *a: overflowed.append(item) or overflow(self, item, *a))
    found, _ = _every_item_laid_out(lengths, 16, None, COST, monkeypatch, riders=True)
    assert any(lengths[item] == 0 for item in overflowed)
    expected, _ = _every_item_laid_out(lengths, 16, None, COST, monkeypatch, riders=False)
    _same(found, expected)


def test_empty_items_with_a_per_item_cost_are_placed_each():
    """An empty item that costs its per-item term adds load: it is no free rider."""
    problem = make_problem(np.array([0, 0, 5]), 2, cost=CostModel(per_item=1.0))
    spec = ContextParallel(gpus_per_node=GPUS)
    times = planner.TimeTable(problem, spec, GPUS, np.arange(3))
    assert planner._free_riders(problem, spec, times, np.arange(3)).size == 0
    assert planner._free_riders(replace(problem, cost=COST, item_costs=COST.item_costs(problem.lengths)), spec,
                                planner.TimeTable(replace(problem, cost=COST), spec, GPUS, np.arange(3)),
                                np.arange(3)).tolist() == [0, 1]


@pytest.mark.filterwarnings("ignore:`degrees`")
def test_regression_empty_items_without_degree_1_split_like_any_other():
    """Degrees (2, 4, 8) split every item, empty ones too: no item is a free rider (90aa7ae asked their time at
    degree 1, which the table does not hold: KeyError)."""
    lengths = np.concatenate((np.zeros(20, dtype=np.int64), np.full(6, 50_000), np.full(10, 3_000)))
    spec = ContextParallel(degrees=(2, 4, 8), gpus_per_node=GPUS)
    plan = balance(lengths, 16, cost=COST, context_parallel=spec)
    assert plan.degree.min() >= 2 and plan.makespan >= plan.lower_bound
    step = balance_microbatches(lengths, 16, cost=COST, max_tokens_per_microbatch=32_768, context_parallel=spec)
    assert step.degree.min() >= 2 and step.step_cost >= step.lower_bound

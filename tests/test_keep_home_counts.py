"""`keep_home` of items of one cost with exact sums and no cap (a micro-batch of one video size's frames): its rounds
in counts per rank (`deal._kept_in_counts`) keep the items and reach the loads of the rounds on the keys (home,
index), and build no keys."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.locality import deal
from orchmllm.balancers.locality.deal import keep_home
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.problem import make_problem

COSTS = (CostModel(linear=1.0), CostModel(linear=33177600000.0, quadratic=1728000.0), CostModel(linear=0.5))


def _instance(seed: int):
    """Items of one length in runs of one source (a sample's frames, a source's runs spread out), a target a whole
    number of costs (the margin makes a rank's next item miss), one float either side of it, or the mean's 1.002;
    all items, a run of them (the fill's) or some."""
    rng = np.random.default_rng(seed)
    num_ranks = int(rng.integers(1, 40))
    size, length, runs = int(rng.integers(1, 2000)), int(rng.choice([1, 576, 1000])), int(rng.integers(1, 60))
    cuts = np.diff(np.sort(np.r_[0, rng.integers(0, size, runs - 1), size]))
    sources = np.repeat(rng.integers(0, num_ranks, runs), cuts)
    problem = make_problem(np.full(size, length), num_ranks, cost=COSTS[seed % 3])
    cost = float(problem.item_costs[0])
    whole = int(rng.integers(1, 2 * size // num_ranks + 3)) * cost
    target = (whole, np.nextafter(whole, np.inf), np.nextafter(whole, 0.0), size * cost / num_ranks * 1.002)[seed % 4]
    items = (None, np.arange(size // 3, size), np.flatnonzero(rng.random(size) < 0.7))[seed % 3]
    return problem, float(target), sources, items


def _kept(problem, target, sources, items, counted, monkeypatch):
    state = PartialPlan(problem, target)
    assert state.exact_cost is not None and state.cap == np.inf
    state.loads += np.floor(np.random.default_rng(problem.num_items).random(problem.num_ranks) * 3) * state.exact_cost
    if not counted:
        monkeypatch.setattr(deal, "_kept_in_counts", lambda *args: False)  # the rounds on the keys
    keep_home(state, sources, items)
    monkeypatch.undo()
    return state.destinations.tolist(), state.loads.tolist()


@pytest.mark.parametrize("seed", range(120))
def test_counted_keep_home_keeps_what_the_rounds_on_the_keys_keep(seed, monkeypatch):
    problem, target, sources, items = _instance(seed)
    assert (_kept(problem, target, sources, items, True, monkeypatch)
            == _kept(problem, target, sources, items, False, monkeypatch))


def test_regression_keep_home_sorted_the_keys_of_one_cost(monkeypatch):
    """Cause of part of issue 26's uniform micro-batches' cost (the long workload's frames, 144k-360k items of one
    cost at D 2560): `keep_home` built and sorted the keys (home, index) of every item no rank kept whole, and
    summed the kept costs by a bincount each round.  With one cost and exact sums a round is counts per rank and
    the kept items are the first of each rank's: read off the runs of equal homes, no keys."""
    rng = np.random.default_rng(5)
    sources = np.repeat(rng.integers(0, 64, 60), rng.integers(20, 80, 60))
    problem = make_problem(np.full(sources.size, 576), 64)
    keyed = []
    by_segment = deal._by_segment
    monkeypatch.setattr(deal, "_by_segment", lambda *args: keyed.append(args[2].size) or by_segment(*args))
    state = PartialPlan(problem, float(problem.item_costs.sum()) / 64 * 1.002)
    keep_home(state, sources)
    assert keyed == []
    placed = state.destinations >= 0
    assert (state.destinations[placed] == sources[placed]).all() and state.loads.max() <= state.target
    assert 0 < placed.sum() < sources.size

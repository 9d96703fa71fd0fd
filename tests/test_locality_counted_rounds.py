"""A micro-batch of one video size's frames (every item one cost, exact sums): `take_in_node`'s rounds in counts
(`deal._counted_rounds`, O(g) a node a round) make the item-by-item rounds' deal and deal no window of items;
`keep_home` reads a run of items (the fill's, but its filler) as views (`deal.selection`), keeping the same."""

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.locality import balance as locality_balance
from orchmllm.balancers.locality import deal
from orchmllm.balancers.locality.deal import keep_home, take_in_node
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.origins import Origins
from orchmllm.balancers.problem import make_problem, rank_loads

COSTS = (CostModel(linear=1.0), CostModel(linear=33177600000.0, quadratic=1728000.0), CostModel(linear=0.5))


def _instance(seed: int):
    """Items of one length in runs of one source (a sample's frames), D = g · nodes; a target a whole number of
    costs (the margin makes the least-loaded rank's first item miss: the stuck items), one float either side
    of it, or the mean's 1.002."""
    rng = np.random.default_rng(seed)
    gpus_per_node = int(rng.choice([1, 2, 3, 4, 8]))
    num_ranks = gpus_per_node * int(rng.integers(1, 10))
    size, length, runs = int(rng.integers(1, 1500)), int(rng.choice([1, 576, 1000])), int(rng.integers(1, 30))
    sources = np.repeat(rng.integers(0, num_ranks, runs), np.diff(np.sort(np.r_[0, rng.integers(0, size, runs - 1),
                                                                                size])))
    problem = make_problem(np.full(size, length), num_ranks, cost=COSTS[seed % 3])
    cost = float(problem.item_costs[0])
    whole = int(rng.integers(1, 2 * size // num_ranks + 3)) * cost
    target = (whole, np.nextafter(whole, np.inf), np.nextafter(whole, 0.0), size * cost / num_ranks * 1.002)[seed % 4]
    return problem, float(target), sources, gpus_per_node, bool(seed % 5)


def _dealt(problem, target, sources, gpus_per_node, home_first, counted):
    state = PartialPlan(problem, target)
    assert state.exact_cost is not None
    if home_first:
        keep_home(state, sources)
    if not counted:
        state.exact_cost = None  # take_in_node's item-by-item rounds (keep_home has read it)
    left = take_in_node(state, sources, gpus_per_node)
    return state.destinations.tolist(), state.loads.tolist(), left.tolist()


@pytest.mark.parametrize("seed", range(80))
def test_counted_rounds_make_the_item_rounds_deal(seed):
    problem, target, sources, gpus_per_node, home_first = _instance(seed)
    assert (_dealt(problem, target, sources, gpus_per_node, home_first, counted=True)
            == _dealt(problem, target, sources, gpus_per_node, home_first, counted=False))


def test_regression_take_in_node_dealt_a_window_of_frames_a_node_a_round(monkeypatch):
    """Cause of issue 26's uniform micro-batches' cost (the long workload's video frames, 360k items of one cost
    at D 2560: take_in_node 18 ms of 22 rounds): every round dealt DEAL_WINDOW · g items a node (gathers, running
    sums, a bincount over the ranks).  With one cost and exact sums a round is counts per rank, and the items'
    destinations are written once."""
    rng = np.random.default_rng(3)
    sources = np.repeat(rng.integers(0, 64, 40), 50)
    problem = make_problem(np.full(sources.size, 576), 64)
    windows = []
    dealt_by_window = deal._round_robin
    monkeypatch.setattr(deal, "_round_robin", lambda *args: windows.append(args[1]) or dealt_by_window(*args))
    state = PartialPlan(problem, float(problem.item_costs.sum()) / 64 * 1.002)
    keep_home(state, sources)
    left = take_in_node(state, sources, 8)
    assert windows == []
    placed = state.destinations >= 0
    assert placed.sum() + left.size == sources.size and state.loads.max() <= state.target
    assert (state.destinations[placed] // 8 == sources[placed] // 8).all()


class _Gathered(np.ndarray):
    """An item array that records the size of every gather (an index array) taken from it."""

    gathers: list = []

    def __getitem__(self, key):
        if isinstance(key, np.ndarray) and key.dtype != bool:
            _Gathered.gathers.append(key.size)
        return np.asarray(self)[key]


class _Ranked(_Gathered):
    """A cost-order array (items, costs) that records its gathers apart."""

    gathers: list = []

    def __getitem__(self, key):
        if isinstance(key, np.ndarray) and key.dtype != bool:
            _Ranked.gathers.append(key.size)
        return np.asarray(self)[key]


@pytest.mark.parametrize("seed", range(30))
def test_keep_home_reads_a_run_of_items_as_the_indices(monkeypatch, seed):
    """`keep_home` of items that are one run of indices (the fill's items but its filler) keeps what it keeps of
    the same items read one by one (`deal.selection` returning the indices: the gathers)."""
    rng = np.random.default_rng(seed)
    size, num_ranks = int(rng.integers(2, 800)), int(rng.choice([2, 8, 16]))
    lengths = rng.integers(1, 40, size) if seed % 2 else np.full(size, 7)
    problem = make_problem(lengths, num_ranks, max_tokens_per_rank=None if seed % 3 else int(lengths.sum()))
    sources, first = rng.integers(0, num_ranks, size), int(rng.integers(0, size // 2))
    items = np.arange(first, int(rng.integers(first + 1, size + 1)))
    target = float(problem.item_costs.sum()) / num_ranks * float(rng.choice([0.5, 1.0, 1.3]))
    kept = []
    for by_run in (True, False):
        if not by_run:
            monkeypatch.setattr(deal, "selection", lambda given: slice(None) if given is None else given)
        state = PartialPlan(problem, target)
        keep_home(state, sources, items)
        kept.append((state.destinations.tolist(), state.loads.tolist(), state.tokens.tolist()))
    assert kept[0] == kept[1]


def test_regression_keep_home_gathered_a_run_of_items():
    """`keep_home` gathered the sources (and costs, tokens) of its items one by one where they are a run of
    indices (the fill's items: every item but the filler, a micro-batch of one video size's 360k frames), and the
    items and costs of the runs it keeps through the cost order, which is the index order of one cost; now views,
    no gather as large as the items, and none through the cost order."""
    rng = np.random.default_rng(5)
    sources = rng.integers(0, 64, 5000)
    problem = make_problem(np.full(5000, 576), 64)
    state = PartialPlan(problem, float(problem.item_costs.sum()) / 64 * 1.002)
    state.item_of_rank, state.sorted_costs = state.item_of_rank.view(_Ranked), state.sorted_costs.view(_Ranked)
    _Gathered.gathers, _Ranked.gathers = [], []
    keep_home(state, sources.view(_Gathered), np.arange(4900))
    assert 4900 not in _Gathered.gathers and max(_Ranked.gathers, default=0) < 100
    assert (state.destinations[:4900][state.destinations[:4900] >= 0] == sources[:4900][
        state.destinations[:4900] >= 0]).all()


@pytest.mark.parametrize("fill", [None, "on_miss"])
def test_regression_deal_locally_summed_the_loads_of_one_cost_again(monkeypatch, fill):
    """`deal_locally` checked its plan against the target by summing every item's cost again (`rank_loads`); where
    every item costs the same and sums are exact the deal's own loads are those sums, in any order: read as they
    are, and the same plan."""
    rng = np.random.default_rng(7)
    sources = np.repeat(rng.integers(0, 64, 60), 40)
    problem = make_problem(np.full(sources.size, 576), 64)
    origins = Origins(sources, np.full(sources.size, 144.0), 8)
    target = float(problem.item_costs.sum()) / 64 * 1.05
    expected = locality_balance.deal_locally(problem, target, origins, fill)
    summed = []
    monkeypatch.setattr(locality_balance, "rank_loads", lambda *args: summed.append(1) or rank_loads(*args))
    found = locality_balance.deal_locally(problem, target, origins, fill)
    assert summed == [] and found is not None and found.tolist() == expected.tolist()
    assert rank_loads(problem, found).max() <= target

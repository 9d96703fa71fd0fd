"""Two tiers' deal (`context_parallel.tiers._deal`) parks the groups surely short of an item's shards out of its
LPT heap until an item with fewer tokens comes: before, every item whose least-loaded groups were full by tokens
popped them all again and pushed them back (4 giants beside 900 short items on 64 ranks: 538 pops, now 18).
The layouts equal the rank-by-rank reference (`test_cp_layout_structures`)."""

import heapq
import types
from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel import planner, tiers
from orchmllm.balancers.problem import make_problem
from orchmllm.tests.test_cp_layout_structures import COST, GPUS, _reference_two_tiers, _same_layout


def _giants_beside_short_items(seed: int, cap: int):
    rng = np.random.default_rng(seed)
    lengths = np.concatenate([rng.integers(6000, 8000, 4), rng.integers(30, 60, 900)])
    problem = replace(make_problem(lengths, 64, cost=COST), max_tokens_per_rank=cap)
    spec, long = ContextParallel(gpus_per_node=GPUS), np.arange(lengths.size)
    return problem, spec, planner.TimeTable(problem, spec, GPUS, long), long


def test_regression_groups_short_of_tokens_were_popped_again_for_every_item(monkeypatch):
    problem, spec, times, long = _giants_beside_short_items(2, 1400)
    reference = _reference_two_tiers(problem, spec, times, long, 0.0, planner.water_level)
    pops = []
    monkeypatch.setattr(tiers, "heapq", types.SimpleNamespace(
        heappop=lambda heap: pops.append(1) or heapq.heappop(heap), heappush=heapq.heappush,
        heapreplace=heapq.heapreplace))
    found = tiers.two_tiers(problem, spec, GPUS, times, long, 0.0, planner.water_level)
    assert found is not None and len(pops) <= 32
    _same_layout(found, reference)


@pytest.mark.parametrize("seed, cap", [(0, 1100), (1, 1250), (3, 1400), (4, 1600), (5, 1000)])
def test_parked_deal_equals_rank_by_rank_reference(seed, cap):
    """Budgets at which groups fill by tokens at different points of the deal, some with no room at all."""
    problem, spec, times, long = _giants_beside_short_items(seed, cap)
    found = tiers.two_tiers(problem, spec, GPUS, times, long, 0.0, planner.water_level)
    _same_layout(found, _reference_two_tiers(problem, spec, times, long, 0.0, planner.water_level))


class _CountedLists(np.ndarray):
    """A shard table that counts how often a whole table of its rows is made a list."""

    listed = 0

    def tolist(self):
        if self.ndim == 2 and self.shape[0] > 1:
            _CountedLists.listed += 1
        return super().tolist()


def test_regression_the_deal_listed_every_items_shards_at_the_widest_degree():
    """The deal reads an item's shards only where the bounds on a group's fullest rank leave its room open, so the
    shards at the widest degree are no longer made a list of every item's (before: once per `two_tiers` call, 59 in a
    T 16k step of the long workload at D = 2560 x 16)."""
    problem, spec, times, long = _giants_beside_short_items(3, 1400)
    reference = _reference_two_tiers(problem, spec, times, long, 0.0, planner.water_level)
    times.shards[8] = times.shards[8].view(_CountedLists)
    _CountedLists.listed = 0
    found = tiers.two_tiers(problem, spec, GPUS, times, long, 0.0, planner.water_level)
    assert _CountedLists.listed == 0
    _same_layout(found, reference)

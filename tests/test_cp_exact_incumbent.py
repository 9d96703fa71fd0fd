"""The exact split search of a tiny pass starts from the best plan already found (probe25 P25-05, issue 24): it
prunes at that peak from the first node, finds the same plan where it finishes, and its options' times are
computed once per degree."""

from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel, balance
from orchmllm.balancers.context_parallel import exact
from orchmllm.balancers.context_parallel.layout import shard_tokens
from orchmllm.balancers.problem import make_problem

T = 32768
COST_84B = CostModel(linear=426233561088.0, quadratic=3932160.0)  # study.models MODELS['84b'].llm, causal


def _problem(lengths, num_ranks, cost, cap):
    return replace(make_problem(np.asarray(lengths), num_ranks, cost=cost), max_tokens_per_rank=cap)


def test_regression_the_exact_search_of_a_pass_started_without_the_plans_found(monkeypatch):
    """P25-05's pass of seed 3 (8 items of 51-60 % of the budget on 8 ranks): the search took 5271 nodes from an
    infinite incumbent; from the best of the split planner's and today's plans it takes ~1000, with the same
    proven optimum."""
    nodes = []
    run = exact._Search.run

    def counted(self, item, total):
        nodes.append(item)
        return run(self, item, total)

    monkeypatch.setattr(exact._Search, "run", counted)
    lengths = np.random.default_rng(3).integers(int(T * 0.51), int(T * 0.6), 8)
    plan = balance(lengths, 8, cost=COST_84B, context_parallel=ContextParallel(), max_tokens_per_rank=T)
    assert len(nodes) <= 2000
    monkeypatch.setattr(exact._Search, "run", run)
    search = exact._Search(_problem(lengths, 8, COST_84B, T), ContextParallel(), 8, np.inf)
    search.run(0, 0.0)
    assert search.nodes <= exact.EXACT_NODES and plan.makespan == search.best and plan.status.value == "optimal"


def test_regression_each_items_options_computed_the_times_again(monkeypatch):
    """The search's options called `item_times` once per item and degree (8 items: 32 calls); now once per degree, with
    the times and shards `ContextParallel.time` and `shard_tokens` give one by one."""
    calls = []
    item_times = ContextParallel.item_times

    def counted(self, *args):
        calls.append(args)
        return item_times(self, *args)

    spec = ContextParallel(gpus_per_node=4, allow_inter_node=True)
    lengths = np.random.default_rng(7).integers(1000, 40000, 8)
    problem = _problem(lengths, 8, COST_84B, T)
    monkeypatch.setattr(ContextParallel, "item_times", counted)
    options = exact._Search(problem, spec, 4, np.inf).options
    assert len(calls) == len(spec.degrees)
    monkeypatch.setattr(ContextParallel, "item_times", item_times)
    for item, found in enumerate(options):
        expected = [(s, c) for c in spec.degrees for s in range(0, 8, c) if -(-lengths[item] // c) <= T]
        assert [(s, c) for s, c, _, _ in found] == expected
        for s, c, time, shard in found:
            assert time == spec.time(COST_84B, [lengths[item]], c, s // 4 == (s + c - 1) // 4)[0]
            assert shard == tuple(shard_tokens([lengths[item]], c)[0].tolist())


@pytest.mark.parametrize("seed", range(12))
def test_an_incumbent_keeps_the_plan_below_it(seed):
    """Where the search from no incumbent finishes at optimum v: from v it finds nothing and finishes (v is
    proven), and from just above v it returns the same plan (the first leaf at v in the same order)."""
    rng = np.random.default_rng(seed)
    num_ranks = int(rng.choice([2, 4, 8]))
    lengths = rng.integers(1, 60, int(rng.integers(1, 8)))
    cap = None if seed % 2 else int(lengths.max()) // 2 + 1 + int(rng.integers(0, 20))
    spec = ContextParallel(degrees=tuple(c for c in (1, 2, 4, 8) if c <= num_ranks), latency_s=float(seed % 3) / 2,
                           kv_bytes_per_token=0.0, half_efficiency_tokens=4.0, seconds_per_cost=1.0)
    problem = _problem(lengths, num_ranks, CostModel(linear=1, quadratic=0.05), cap)
    free = exact.exact_split(problem, spec, 8)
    assert free[2] and free[0] is not None  # every seed here has a proven layout to compare with
    search = exact._Search(problem, spec, 8, np.inf)
    search.run(0, 0.0)
    assert exact.exact_split(problem, spec, 8, search.best) == (None, None, True)
    start, degree, finished = exact.exact_split(problem, spec, 8, np.nextafter(search.best, np.inf))
    assert finished and start.tolist() == free[0].tolist() and degree.tolist() == free[1].tolist()

"""The packing bound of one micro-batch (`packing_bound.py`): no layout has every rank at or below a level it
refuses (checked against the exact search's optimum and the split planner's plans), it sees what the canonical
bound misses on long items (every rank holds a few shards of one size), and the later fills' deferrals of the split
micro-batch planner use it to plan no micro-batch where they planned many (issues 24/26, the allbig family)."""

from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel, Topology, balance_microbatches
from orchmllm.balancers.context_parallel import microbatch
from orchmllm.balancers.context_parallel.exact import exact_split
from orchmllm.balancers.context_parallel.packing_bound import Pieces, raised_floors
from orchmllm.balancers.context_parallel.split import allot, allowed_degrees, balance_split
from orchmllm.balancers.problem import InfeasibleError, make_problem
from orchmllm.study.models import MODELS
from orchmllm.tests.test_cp_repair_certificates import allbig

COST = MODELS["84b"].stages()[-1].cost
BUDGET = 32768


def _canonical(lengths, num_ranks, spec, budget) -> float:
    problem = make_problem(lengths, num_ranks, cost=COST)
    return allot(problem, spec, allowed_degrees(spec, num_ranks, spec.gpus_per_node), spec.gpus_per_node,
                 budget).bound()


def _exact_peak(lengths, num_ranks, spec, budget):
    """The peak of the best layout of a tiny instance the exact search (proven optimal where it finished) or the
    split planner found: a level some layout meets (None where neither found one)."""
    problem = replace(make_problem(lengths, num_ranks, cost=COST), max_tokens_per_rank=budget)
    start, degree, _ = exact_split(problem, spec, spec.gpus_per_node)
    try:
        plan = balance_split(lengths, num_ranks, spec, cost=COST, algorithm="lpt", max_tokens_per_rank=budget,
                             time_limit=None, topology=None, unsupported={}, warn=False)
    except InfeasibleError:
        plan = None
    if start is None:
        return None if plan is None else float(plan.loads.max())
    times = spec.time(COST, lengths, degree)
    loads = np.zeros(num_ranks)
    for item in range(lengths.size):
        loads[start[item]:start[item] + degree[item]] += times[item]
    return float(loads.max()) if plan is None else min(float(loads.max()), float(plan.loads.max()))


@pytest.mark.parametrize("seed", range(40))
def test_no_layout_is_refused_at_its_own_peak(seed):
    """Tiny instances (up to 7 items, 4 or 8 ranks, long and short items, budgets near their shards): at the peak
    of the best layout found (the proven optimum's where the exact search finished, 37 of the 40) the bound
    refuses nothing.  Where neither found a layout (3 of the 40: the exact search's budget ran out, the planner
    refused) the budget is raised by a quarter until one is found, so every seed asserts."""
    rng = np.random.default_rng(seed)
    num_ranks = int(rng.choice([4, 8]))
    spec = ContextParallel(degrees=(1, 2, 4) if num_ranks == 4 else (1, 2, 4, 8), gpus_per_node=num_ranks)
    lengths = np.concatenate((rng.integers(20000, 70000, rng.integers(1, 5)),
                              rng.integers(500, 9000, rng.integers(0, 4)))).astype(np.int64)
    budget = int(rng.integers(int(lengths.max()) // (num_ranks // 2) + 1, 40000)) if seed % 2 else BUDGET
    budget = max(budget, -(-int(lengths.max()) // spec.degrees[-1]), -(-int(lengths.sum()) // num_ranks))  # fits
    peak = _exact_peak(lengths, num_ranks, spec, budget)
    while peak is None:  # ends: at a budget of all the tokens one rank holds every item
        budget += budget // 4
        peak = _exact_peak(lengths, num_ranks, spec, budget)
    assert not Pieces(lengths, num_ranks, spec, COST, budget).exceeds(peak)


def test_every_rank_holding_four_shards_of_one_size():
    """25 items of about 65k tokens on 64 ranks, T = 32k: below the least time at degree 2, an item runs at degree 4
    (a shard of ~16k; two on a rank run past that time, so one) or 8 (~8k; three on a rank), so it needs at least
    8 / 3 ranks: 25 need 67 > 64.  The canonical bound (work) is ~20 % below that level; the packing bound refuses
    it, and never the planner's peak."""
    spec = ContextParallel().on(Topology(num_nodes=8, gpus_per_node=8))
    lengths = np.random.default_rng(5).integers(65000, 65536, 25)
    plan = balance_split(lengths, 64, spec, cost=COST, algorithm="lpt", max_tokens_per_rank=BUDGET, time_limit=None,
                         topology=None, unsupported={}, warn=False)
    level, pieces = 0.99 * float(spec.time(COST, lengths, 2).min()), Pieces(lengths, 64, spec, COST, BUDGET)
    assert _canonical(lengths, 64, spec, BUDGET) < 0.85 * level
    assert pieces.exceeds(level) and not pieces.exceeds(float(plan.loads.max()))


def test_the_planners_plans_are_above_every_level_refused():
    """The split planner's plans of allbig micro-batches (D = 64, every item 32-64k, T = 32k) and of short items
    beside giants: the bound never refuses their peak."""
    spec = ContextParallel().on(Topology(num_nodes=8, gpus_per_node=8))
    rng = np.random.default_rng(11)
    for lengths in (np.sort(allbig(64, 12))[::-1][k * 28:(k + 1) * 28] for k in range(0, 70, 10)):
        plan = balance_split(lengths, 64, spec, cost=COST, algorithm="lpt", max_tokens_per_rank=BUDGET,
                             time_limit=None, topology=None, unsupported={}, warn=False)
        assert not Pieces(lengths, 64, spec, COST, BUDGET).exceeds(float(plan.loads.max()))
    mixed = np.concatenate((rng.integers(65536, 131072, 6), rng.integers(500, 7000, 200)))
    plan = balance_split(mixed, 64, spec, cost=COST, algorithm="lpt", max_tokens_per_rank=BUDGET, time_limit=None,
                         topology=None, unsupported={}, warn=False)
    assert not Pieces(mixed, 64, spec, COST, BUDGET).exceeds(float(plan.loads.max()))


def test_raised_floors_keep_what_is_not_proven():
    """A group the bound cannot raise keeps its floor; the others rise by one share until the sum reaches the goal."""

    class Above:
        def __init__(self, most):
            self.most = most

        def exceeds(self, level):
            return level < self.most

    floors = raised_floors([10.0, 20.0], [1.0, 1.0], 1.0, 4.0, lambda most: Above(most))
    assert floors[0] == floors[1] > 1.0 and sum(floors) + 1.0 >= 4.0
    assert raised_floors([1.5, 20.0], [1.0, 1.0], 1.0, 4.0, lambda most: Above(most))[0] == 1.0


def test_regression_later_fills_planned_micro_batches_that_could_not_beat_the_best(monkeypatch):
    """allbig, 128 x 8, T = 32k, seed 4: the fill after the first planned 13 micro-batches in its deferral until the
    peaks found passed the repaired plan's step (the pass bounds were up to 22 % below the peaks); with the packing
    bound it plans none, and the plan is the same."""
    lengths = allbig(128, 4)
    topology = Topology(num_nodes=16, gpus_per_node=8)
    before = balance_microbatches(lengths, 128, max_tokens_per_microbatch=BUDGET, cost=COST,
                                  context_parallel=ContextParallel(), topology=topology)
    counts, deferred, plan_pass = [], microbatch._deferred, microbatch._plan_pass

    def counted_deferred(*args, **kwargs):
        later = (args[5] if len(args) > 5 else kwargs.get("times")) is not None
        counts.append(0)
        monkeypatch.setattr(microbatch, "_plan_pass", counted_pass if later else plan_pass)
        try:
            return deferred(*args, **kwargs)
        finally:
            monkeypatch.setattr(microbatch, "_plan_pass", plan_pass)

    def counted_pass(*args, **kwargs):
        counts[-1] += 1
        return plan_pass(*args, **kwargs)

    monkeypatch.setattr(microbatch, "_deferred", counted_deferred)
    plan = balance_microbatches(lengths, 128, max_tokens_per_microbatch=BUDGET, cost=COST,
                                context_parallel=ContextParallel(), topology=topology)
    assert plan.digest() == before.digest()
    assert len(counts) >= 2 and not any(counts[1:])  # 2 deferrals before the grouping's free M (grouping_free)

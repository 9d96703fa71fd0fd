"""The canonical-allotment bound (`context_parallel.bound.Allotment.bound`) sums the canonical work exactly once per
time it asks (its interval search often confirms at the starting time again: 285 of 815 sums over 362 bounds of the
issue 24 families, D = 512 x 16, seed 11); the bound is the same."""

import numpy as np

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel import bound
from orchmllm.balancers.context_parallel.split import allot
from orchmllm.balancers.problem import make_problem
from orchmllm.tests.test_cp_layout_structures import COST, GPUS


def test_the_bound_sums_the_work_once_per_time(monkeypatch):
    spec, asked, work = ContextParallel(gpus_per_node=GPUS), [], bound.Allotment._work
    monkeypatch.setattr(bound.Allotment, "_work", lambda self, least, others, target:
                        asked.append(target) or work(self, least, others, target))
    for seed in range(12):
        rng = np.random.default_rng(seed)
        lengths = np.concatenate((rng.integers(20_000, 130_000, rng.integers(1, 40)), rng.integers(0, 3_000, 100)))
        problem = make_problem(lengths, 64, cost=COST)
        allotment = allot(problem, spec, np.array(spec.degrees), GPUS, 32_768, one_pass=False)
        asked.clear()
        found = allotment.bound()
        assert len(asked) == len(set(asked)) and found == _reference(allotment)


def _reference(allotment: bound.Allotment) -> float:
    """T* by its definition, on exact sums at every candidate time: the least of max(time, W(time) / D) over the
    times where every item fits a degree."""
    least = bound.least_work(allotment.times, allotment.degrees, allotment.allowed)
    others = bound._Unsplit.of(np.delete(allotment.costs, allotment.candidates))
    points = np.unique(np.concatenate((allotment.times[allotment.allowed], [others.costs.max(initial=0.0)])))
    best = np.inf
    for point in points.tolist():
        work = allotment._work(least, others, point)
        if work < np.inf and point >= others.costs.max(initial=0.0):
            best = min(best, max(point, work / allotment.num_ranks))
    return best

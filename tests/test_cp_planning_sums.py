"""Speed-only shortcuts of the split planner give the same floats as the sums they replace (issue 26's planning time):
the bound's exact work sums from the unsplit items' total kept once, the layout's accounts of its laid-out items
alone, and the local search returning a plan at the bound without building its state."""

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel
from orchmllm.balancers.context_parallel import bound, planner, search
from orchmllm.balancers.context_parallel.plan import rank_accounts
from orchmllm.balancers.problem import exact_sum, make_problem

COST = CostModel(linear=6e9, quadratic=4e5)
SPEC = ContextParallel()


@pytest.mark.parametrize("kind", ["integers", "fractions", "mixed", "huge", "empty"])
def test_exact_total_is_the_exact_sum_of_both(kind):
    rng = np.random.default_rng(3)
    others = {"integers": rng.integers(0, 2**50, 5000).astype(np.float64),
              "fractions": rng.random(5000) * 1e9, "mixed": np.floor(rng.random(5000) * 1e15),
              "huge": np.full(3, 2.0**62), "empty": np.zeros(0)}[kind]
    kept = bound._Unsplit.of(others)
    for values in (rng.integers(0, 2**52, 7).astype(np.float64), rng.random(7) * 1e12, np.full(2, 2.0**63),
                   np.zeros(0)):
        assert kept.sum_with(values) == exact_sum(np.concatenate((others, values)))


def test_laid_accounts_are_the_accounts_with_the_rest_left_out():
    rng = np.random.default_rng(5)
    lengths = np.concatenate((rng.integers(1, 4000, 500), rng.integers(40000, 200000, 12)))
    problem = make_problem(lengths, 64, cost=COST)
    start = np.full(lengths.size, -1)
    degree = np.ones(lengths.size, dtype=np.int64)
    laid = rng.choice(lengths.size, 80, replace=False)
    degree[laid] = rng.choice([1, 2, 4, 8], laid.size)
    start[laid] = rng.integers(0, 8, laid.size) * 8
    loads, tokens = planner.laid_accounts(problem, SPEC, 8, start, degree)
    every = rank_accounts(problem, SPEC, 8, np.maximum(start, 0), np.where(start >= 0, degree, 0))
    assert loads.tobytes() == every[0].tobytes() and np.array_equal(tokens, every[1])


def test_a_plan_at_the_bound_leaves_the_search_at_once(monkeypatch):
    lengths = np.array([1000, 1000, 1000, 1000])
    problem = make_problem(lengths, 4, cost=COST)
    start, degree = np.arange(4), np.ones(4, dtype=np.int64)
    monkeypatch.setattr(search, "_State", None)  # not built: the plan is at its bound
    found, degrees, accounts = search.improve(problem, SPEC, 8, start, degree, float(problem.item_costs[0]))
    assert np.array_equal(found, start) and np.array_equal(degrees, degree)
    expected = rank_accounts(problem, SPEC, 8, start, degree)
    assert all(np.array_equal(a, b) for a, b in zip(accounts, expected))

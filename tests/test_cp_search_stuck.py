"""The split plan's local search (`search.improve`) returns a plan at once where no move can lower its makespan rank
(`search._stuck`): the same plan as the search, without building its tables."""

import numpy as np
import pytest

from orchmllm import ContextParallel, balance, balance_microbatches
from orchmllm.balancers.context_parallel import search, split
from orchmllm.balancers.context_parallel.plan import rank_accounts
from orchmllm.study.models import MODELS

COST = MODELS["84b"].llm.cost(causal=True)


def giants(num_ranks: int, per_rank: int, seed: int) -> np.ndarray:
    """Issue 24's allgiant family: every item 20-130k tokens (T = 32k: most split)."""
    return np.random.default_rng(seed).integers(20000, 130000, num_ranks * per_rank)


def mixed(num_ranks: int, per_rank: int, seed: int) -> np.ndarray:
    """Short items with a few giants of 30-200k tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(16, 4000, num_ranks * per_rank)
    big = rng.random(lengths.size) < 0.05
    lengths[big] = rng.integers(30000, 200000, int(big.sum()))
    return lengths


@pytest.mark.parametrize("spec", [ContextParallel(), ContextParallel(degrees=(1, 2), gpus_per_node=4),
                                  ContextParallel(degrees=(2, 4), allow_inter_node=True, gpus_per_node=2)])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_plan_the_shortcut_returns_is_the_one_the_search_returns(monkeypatch, spec, seed):
    """Every search of the split planner on giant mixes: where `_stuck` holds, the search without it makes no move."""
    searched, improve, stuck = [0, 0], split.improve, search._stuck

    def checked(problem, spec, gpus, start, degree, bound, item_time=None):
        accounts = rank_accounts(problem, spec, gpus, start, degree)
        if float(accounts[0].max()) > bound and stuck(problem, spec, start, degree, accounts):
            monkeypatch.setattr(search, "_stuck", lambda *args: False)
            found = improve(problem, spec, gpus, start, degree, bound)
            monkeypatch.setattr(search, "_stuck", stuck)
            assert np.array_equal(found[0], start) and np.array_equal(found[1], degree)
            searched[1] += 1
        searched[0] += 1
        return improve(problem, spec, gpus, start, degree, bound, item_time)

    monkeypatch.setattr(split, "improve", checked)
    for lengths, num_ranks in ((giants(16, 8, seed), 16), (mixed(16, 16, seed), 16), (giants(8, 4, seed), 8)):
        budget = max(32768, -(-int(lengths.max()) // max(spec.degrees)))
        balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget, cost=COST, context_parallel=spec)
        balance(lengths, num_ranks, cost=COST, context_parallel=spec)
    assert searched[0] > searched[1] > 0


def test_regression_searches_that_made_no_move_built_their_tables(monkeypatch):
    """allgiant, D = 32 x 16, T = 32k, seed 3: 385 searches built the search's tables (most to find no move), 42 with
    the shortcut, the same plan (since the free M's grouping, `tests/test_cp_grouping_free.py`: 49 without it, 5)."""
    built, state = [], search._State.__init__

    def counted(self, *args, **kwargs):
        built.append(1)
        state(self, *args, **kwargs)

    monkeypatch.setattr(search._State, "__init__", counted)
    plan = balance_microbatches(giants(32, 16, 3), 32, max_tokens_per_microbatch=32768, cost=COST,
                                context_parallel=ContextParallel())
    assert plan.digest().startswith("a1d1e3e519b1") and len(built) <= 10

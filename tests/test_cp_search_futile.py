"""The split plan's local search stops where its moves left cannot lower the makespan by MAKESPAN_SLACK."""

from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel import search
from orchmllm.balancers.problem import make_problem
from orchmllm.tests.test_cp_layout_structures import COST, GPUS


def _tied_plan(loaded: int, per_rank: int, seed: int):
    """The same `per_rank` short items on each of `loaded` ranks (every one at the makespan), as many ranks empty
    beside them; no rank in a group."""
    lengths = np.tile(np.random.default_rng(seed).integers(200, 3_000, per_rank), loaded)
    start = np.repeat(np.arange(loaded), per_rank)
    problem = replace(make_problem(lengths, 2 * loaded, cost=COST), max_tokens_per_rank=64_000)
    return problem, ContextParallel(gpus_per_node=GPUS), start, np.ones(lengths.size, dtype=np.int64)


def _moves(monkeypatch) -> list:
    """Record the moves the search applies (the real `apply` runs)."""
    moves, apply = [], search._State.apply

    def recorded(self, *args):
        moves.append(args)
        return apply(self, *args)

    monkeypatch.setattr(search._State, "apply", recorded)
    return moves


def test_regression_the_search_made_its_moves_where_they_could_not_lower_the_makespan(monkeypatch):
    """More ranks at the makespan than moves left: every one of them must fall for the makespan to, one move each,
    so no sequence of MAX_MOVES moves lowers it.  The search made them all anyway, each an item to an empty rank
    (the long workload's token-tight passes at D = 2560: 64 moves lowering it by 0.008 %); now none, the same
    makespan."""
    problem, spec, start, degree = _tied_plan(2 * search.MAX_MOVES, 6, seed=3)
    moves = _moves(monkeypatch)
    stopped = search.improve(problem, spec, GPUS, start, degree, 0.0)
    assert not moves
    monkeypatch.setattr(search._State, "blocks_near", lambda self, level: 0)  # the search without the stop
    full = search.improve(problem, spec, GPUS, start, degree, 0.0)
    assert len(moves) == search.MAX_MOVES and full[2][0].max() == stopped[2][0].max()


@pytest.mark.parametrize("seed", range(4))
def test_the_stopped_search_is_within_makespan_slack_of_the_full_one(monkeypatch, seed):
    """Giants on degree-2 groups and short items piled on a few ranks (D = 16), the search from there: where it stops
    early its makespan is within MAKESPAN_SLACK of the search without the stop, and never above where it started."""
    rng = np.random.default_rng(seed)
    short = rng.integers(500, 3_000, 60)
    lengths = np.concatenate(([150_000, 120_000, 90_000], short))
    start = np.concatenate(([8, 10, 12], rng.integers(0, 6, short.size)))
    degree = np.concatenate(([2, 2, 2], np.ones(short.size, dtype=np.int64)))
    problem = replace(make_problem(lengths, 16, cost=COST), max_tokens_per_rank=200_000)
    spec = ContextParallel(gpus_per_node=GPUS)
    first = search._State(problem, spec, GPUS, start, degree, 0.0).loads.max()
    stopped = search.improve(problem, spec, GPUS, start, degree, 0.0)[2][0].max()
    monkeypatch.setattr(search._State, "blocks_near", lambda self, level: 0)
    full = search.improve(problem, spec, GPUS, start, degree, 0.0)[2][0].max()
    assert stopped * (1 - search.MAKESPAN_SLACK) <= full <= stopped <= first  # the stop ends a prefix of its moves

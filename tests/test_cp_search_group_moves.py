"""The split plan's local search weighs the moves of a group's items all at once (issues 24/26: `improve` was a
large share of the CP planners' time, a `blocks` call per item of the makespan rank's group).

The moves at once are checked bit for bit against the item-by-item reference (`blocks` on copies of the accounts,
the search's code before), here on groups of several items under budgets where a block's fit turns on the shards,
and where every load ties."""

from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel import search
from orchmllm.balancers.problem import make_problem
from orchmllm.tests.test_cp_layout_structures import COST, GPUS


def _group_moves_one_by_one(state, rank):
    """The reference of `_group_moves`' item moves: each item of `rank`'s group taken out on copies of the accounts,
    its blocks by `blocks`, its own block left free where it is the group's only item."""
    members = np.flatnonzero((state.degree > 1) & (state.start <= rank) & (rank < state.start + state.degree))
    s, c = int(state.start[members[0]]), int(state.degree[members[0]])
    group, out = np.arange(s, s + c), []
    for item in members.tolist():
        after, after_tokens = state.loads.copy(), state.tokens.copy()
        after[group] -= state.times[item]
        after_tokens[group] -= state.shard(item, c)
        peak, new_s, new_c = state.blocks(item, after, after_tokens, (s, c) if members.size == 1 else None)
        out.append((max(peak, after[group].max()), item, new_s, new_c))
    return out


def _grouped_plan(cap=None, lengths=None):
    """D = 16 (nodes of 8): four giants on the group (0, 4), two on (8, 2), one alone on (12, 4), short items on
    ranks 4-7 and 10-11."""
    rng = np.random.default_rng(3)
    short = rng.integers(500, 6_000, 24)
    if lengths is None:
        lengths = np.concatenate(([90_000, 70_000, 50_001, 40_003, 60_000, 45_001, 120_000], short))
    start = np.concatenate(([0, 0, 0, 0, 8, 8, 12], rng.choice([4, 5, 6, 7, 10, 11], short.size)))
    degree = np.concatenate(([4, 4, 4, 4, 2, 2, 4], np.ones(short.size, dtype=np.int64)))
    problem = replace(make_problem(np.asarray(lengths), 16, cost=COST), max_tokens_per_rank=cap)
    return problem, ContextParallel(gpus_per_node=GPUS), start, degree


def _same_group_moves(problem, spec, start, degree):
    """Every grouped rank's item moves, all at once, against the item-by-item reference, bit for bit."""
    state = search._State(problem, spec, GPUS, start, degree, 0.0)
    for rank in np.flatnonzero(state.in_group).tolist():
        expected = _group_moves_one_by_one(state, rank)
        assert state._group_moves(rank)[:len(expected)] == expected


def test_regression_a_groups_items_were_weighed_one_by_one(monkeypatch):
    """The makespan rank in the group of four: its moves weighed in one batch (before: four `blocks` calls, one
    per item); a group of one item still weighs its own block by `blocks`."""
    problem, spec, start, degree = _grouped_plan()
    state = search._State(problem, spec, GPUS, start, degree, 0.0)
    calls, real = [], search._State.blocks

    def counted(self, item, *args):
        calls.append(item)
        return real(self, item, *args)

    monkeypatch.setattr(search._State, "blocks", counted)
    assert int(np.argmax(state.loads)) in range(4)
    state.candidates(int(np.argmax(state.loads)))
    state._group_moves(8)
    assert calls == []
    state._group_moves(12)
    assert calls == [6]


@pytest.mark.parametrize("slack", [-4, -1, 0, 1, 2, 5, None])
def test_group_moves_at_once_are_the_item_by_item_ones(slack):
    """Budgets a few tokens around the fullest rank's: blocks fit some items' smaller shards and not their larger."""
    problem, spec, start, degree = _grouped_plan()
    state = search._State(problem, spec, GPUS, start, degree, 0.0)
    cap = None if slack is None else int(state.tokens.max()) + slack
    _same_group_moves(*_grouped_plan(cap))


@pytest.mark.parametrize("cap", [None, 45_000, 45_001])
def test_group_moves_never_put_items_back_onto_their_own_group(cap):
    """D = 8: three giants on the group (0, 4) (45,001 tokens on rank 0: the 40,001's larger shard), 40 short items
    on ranks 4-7 (less load, 60,000 tokens): back on its own group a giant reads the group's load, or a hair below
    it (`test_cp_search_noop.py`), which is no move; each one's best block is (4, 4), and none under 45,000 or
    45,001 tokens."""
    lengths = np.array([80_000, 60_000, 40_001] + [6_000] * 40)
    start = np.array([0, 0, 0] + [4 + k % 4 for k in range(40)])
    degree = np.array([4, 4, 4] + [1] * 40)
    problem = replace(make_problem(lengths, 8, cost=COST), max_tokens_per_rank=cap)
    state = search._State(problem, ContextParallel(gpus_per_node=GPUS), GPUS, start, degree, 0.0)
    moves = state._group_moves(0)
    assert moves[:3] == _group_moves_one_by_one(state, 0)
    assert [move[2:] for move in moves[:3]] == [(4, 4) if cap is None else (-1, 0)] * 3


def test_group_moves_at_once_break_ties_as_argmin():
    """Equal giants on the groups and equal short items: loads tie everywhere; the first of equal peaks wins."""
    lengths = [64_000] * 7 + [2_000] * 24
    _same_group_moves(*_grouped_plan(None, lengths))
    _same_group_moves(*_grouped_plan(int(np.max(lengths)), lengths))

"""The split plan's local search (`search.py`) makes its moves in place: fewer operations, the same moves.

A move changes the blocks of one or two groups and the accounts of their ranks, so the search keeps its arrays and
updates them (no copies per move), updates the ranks' groups where one opens or empties (no rebuild from every
item), and reads shards of lengths its `Problem` has checked without checking them again.  The moves themselves are
checked against the item-by-item reference in `test_cp_layout_structures.py` (`_same_unsplit_moves`), here on
budgets where a block's fit turns on which of its ranks takes an item's larger shard."""

from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel import layout, search
from orchmllm.balancers.context_parallel.layout import shard_tokens
from orchmllm.balancers.problem import make_problem
from orchmllm.tests.test_cp_layout_structures import COST, GPUS, _checked_search, _moves_one_by_one, _same_unsplit_moves


def _searched_plan():
    """A plan whose search moves short items off a full rank, opens groups and empties them (D = 16): two giants
    split on degree-2 groups, short items piled on ranks 0-3."""
    rng = np.random.default_rng(5)
    short = rng.integers(500, 3_000, 40)
    lengths = np.concatenate(([150_000, 120_000, 90_000], short))
    start = np.concatenate(([8, 10, 12], rng.integers(0, 4, short.size)))
    degree = np.concatenate(([2, 2, 2], np.ones(short.size, dtype=np.int64)))
    problem = replace(make_problem(lengths, 16, cost=COST), max_tokens_per_rank=200_000)
    return problem, ContextParallel(gpus_per_node=GPUS), start, degree


def _counted(monkeypatch, owner, name) -> list:
    """Count the calls to `owner.name` (the real one runs)."""
    calls, real = [], getattr(owner, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counting)
    return calls


def test_search_updates_the_groups_it_changes_without_finding_them_again(monkeypatch):
    """The groups are found from every item once, when the search starts (before: after every move)."""
    problem, spec, start, degree = _searched_plan()
    refreshes, moves = _counted(monkeypatch, search._State, "refresh"), _counted(monkeypatch, search._State, "apply")
    search.improve(problem, spec, GPUS, start, degree, 0.0)
    assert len(moves) >= 5 and len(refreshes) == 1


def test_updated_groups_are_the_ones_found_again(monkeypatch):
    """After every move, the ranks' groups, their items and the blocks of every degree equal those found again
    from the plan (`refresh`), on plans whose moves open groups, empty them and widen them."""
    apply, opened, emptied = search._State.apply, [], []

    def checked_apply(self, item, start, degree, rank):
        groups = set(self.group_sizes)
        apply(self, item, start, degree, rank)
        opened.append(bool(set(self.group_sizes) - groups))
        emptied.append(bool(groups - set(self.group_sizes)))
        kept = (self.in_group.copy(), dict(self.group_sizes), dict(self.group_starts),
                {c: self._starts(c, None) for c in self.split_degrees})
        self.refresh()
        assert np.array_equal(kept[0], self.in_group) and kept[1] == self.group_sizes
        assert all(np.array_equal(kept[2][c], self.group_starts[c]) for c in self.split_degrees)
        for c in self.split_degrees:
            for found, expected in zip(kept[3][c], self._starts(c, None)):
                assert (found is None and expected is None) or np.array_equal(found, expected)

    monkeypatch.setattr(search._State, "apply", checked_apply)
    problem, spec, start, degree = _searched_plan()
    search.improve(problem, spec, GPUS, start, degree, 0.0)
    lengths = np.array([300_000, 250_000, 2_000, 2_000, 1_500, 1_000])  # opens (8, 8), then (0, 8) emptying (2, 2)
    search.improve(make_problem(lengths, 16, cost=COST), spec, GPUS, np.array([0, 2, 4, 4, 5, 6]),
                   np.array([1, 2, 1, 1, 1, 1]), 0.0)
    widened = _checked_search(monkeypatch, spec)  # plans of the accounts' test that widen groups
    for seed in range(6):
        rng = np.random.default_rng(seed)
        lengths = np.concatenate((rng.integers(20_000, 200_000, 3), [300_000], rng.integers(100, 2_000, 4)))
        search.improve(make_problem(lengths, 8, cost=COST), spec, GPUS, np.array([0, 0, 0, 4, 2, 2, 3, 3]),
                       np.array([2, 2, 2, 4, 1, 1, 1, 1]), 0.0)
    assert any(widened) and any(opened) and any(emptied) and not all(opened)


def test_search_moves_in_place(monkeypatch):
    """A move updates the search's arrays (blocks, item times, rank tokens and loads); before, every move copied
    the first four."""
    apply, held = search._State.apply, []

    def watched_apply(self, item, start, degree, rank):
        arrays = (self.start, self.degree, self.times, self.tokens, self.loads)
        apply(self, item, start, degree, rank)
        held.append(all(a is b for a, b in zip(arrays, (self.start, self.degree, self.times, self.tokens,
                                                           self.loads))))

    monkeypatch.setattr(search._State, "apply", watched_apply)
    problem, spec, start, degree = _searched_plan()
    search.improve(problem, spec, GPUS, start, degree, 0.0)
    assert len(held) >= 5 and all(held)


def test_search_checks_no_lengths_again(monkeypatch):
    """Shards are read from the problem's checked lengths: lengths are checked at most once when the search
    starts, not per move (before: at every move and weighing)."""
    problem, spec, start, degree = _searched_plan()
    checks, moves = _counted(monkeypatch, layout, "_as_lengths"), _counted(monkeypatch, search._State, "apply")
    search.improve(problem, spec, GPUS, start, degree, 0.0)
    assert len(moves) >= 5 and len(checks) <= 1


def test_unchecked_shards_are_shard_tokens():
    lengths = np.arange(0, 70, dtype=np.int64)
    for c in (1, 2, 3, 4, 8):
        assert np.array_equal(layout.shards_of(lengths, c), shard_tokens(lengths, c))


def _ambiguous(state, rank, items) -> int:
    """Pairs (item, block) of `rank`'s moves where the block's most tokens fit the item's least shard but not its
    largest: the fit then turns on which rank takes which shard."""
    count = 0
    for c in state.split_degrees:
        _, ranks, _ = state._starts(c, None)
        most = state.tokens[ranks].max(axis=1)
        shards = layout.shards_of(state.problem.lengths[items], c)
        count += int(((most[None, :] + shards.min(axis=1)[:, None] <= state.cap)
                      & (most[None, :] + shards.max(axis=1)[:, None] > state.cap)).sum())
    return count


@pytest.mark.parametrize("seed", range(4))
def test_block_moves_settle_fits_that_turn_on_the_shards(seed):
    """Short items of odd lengths on 8 ranks under budgets a few tokens around the ranks' tokens: many blocks fit an
    item's smaller shards and not its larger; the moves at once equal the item-by-item ones."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, 48)
    start, degree = rng.integers(0, 8, lengths.size), np.ones(lengths.size, dtype=np.int64)
    spec, seen = ContextParallel(gpus_per_node=GPUS), 0
    tokens = np.bincount(start, weights=lengths, minlength=8)
    for cap in range(int(tokens.max()) - 2, int(tokens.max()) + 10):
        problem = replace(make_problem(lengths, 8, cost=COST), max_tokens_per_rank=cap)
        state = search._State(problem, spec, GPUS, start, degree, 0.0)
        seen += sum(_ambiguous(state, rank, np.flatnonzero(start == rank)) for rank in range(8))
        _same_unsplit_moves(problem, spec, start, degree)
    assert seen > 0


def test_block_moves_weigh_the_shards_rank_by_rank():
    """Ranks full to a budget of 5,000 tokens but for blocks (2, 3) of 4,999 and 4,998 tokens and (6, 7) of 4,998 and
    4,999: an item of 3 tokens leaving rank 0 has shards of 1 and 2 at degree 2, so it fits (2, 3) and not (6, 7),
    whose ranks hold tokens of length 1 (less load: the least peak where it fit)."""
    cap, sevens, ones = 5_000, [7] * 714, [1] * 4_998
    lengths = np.array([3, cap - 3, cap, cap, cap, 1, *sevens, *sevens, *ones, *ones, 1])
    start = np.array([0, 0, 1, 4, 5, 2, *[2] * 714, *[3] * 714, *[6] * 4_998, *[7] * 4_999])
    problem = replace(make_problem(lengths, 8, cost=COST), max_tokens_per_rank=cap)
    state = search._State(problem, ContextParallel(gpus_per_node=GPUS), GPUS, start, np.ones_like(start), 0.0)
    assert state.tokens.tolist() == [cap, cap, cap - 1, cap - 2, cap, cap, cap - 2, cap - 1]
    moves = state._unsplit_moves(0, np.array([0]))
    assert moves == _moves_one_by_one(state, 0, np.array([0])) and moves[1][2:] == (2, 2)


def test_widening_reads_the_other_half_of_the_wide_block(monkeypatch):
    """Whether a group may widen is read off the other half of the aligned block of twice its degree (its ranks in
    no group), not from a set difference of the block's ranks and the group's (before: one per group weighed)."""
    differences = _counted(monkeypatch, np, "setdiff1d")
    widened = _checked_search(monkeypatch, ContextParallel(gpus_per_node=GPUS))
    for seed in range(6):
        rng = np.random.default_rng(seed)
        lengths = np.concatenate((rng.integers(20_000, 200_000, 3), [300_000], rng.integers(100, 2_000, 4)))
        search.improve(make_problem(lengths, 8, cost=COST), ContextParallel(gpus_per_node=GPUS), GPUS,
                       np.array([0, 0, 0, 4, 2, 2, 3, 3]), np.array([2, 2, 2, 4, 1, 1, 1, 1]), 0.0)
    assert any(widened) and not differences

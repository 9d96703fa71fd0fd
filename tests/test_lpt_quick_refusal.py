"""The capped LPT's quick refusal: a certificate that the items left cannot fit, checked where the
greedy leaves its uncapped plan, spares the micro-batch cells the greedy's long failing pass."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers import InfeasibleError, balance, make_problem
from orchmllm.balancers.kernels import lpt, lpt_capped
from orchmllm.balancers.microbatch import cells
from orchmllm.balancers.microbatch.api import make_microbatch_problem


def fits_somehow(lengths, tokens, cap) -> bool:
    """Brute force: some placement of `lengths` on the ranks keeps every rank within `cap`."""
    for ranks in itertools.product(range(len(tokens)), repeat=len(lengths)):
        held = list(tokens)
        for rank, length in zip(ranks, lengths):
            held[rank] += length
        if max(held) <= cap:
            return True
    return False


@settings(max_examples=150, deadline=None)
@given(cap=st.integers(1, 12), data=st.data())
def test_cannot_finish_is_a_certificate(cap, data):
    tokens = data.draw(st.lists(st.integers(0, cap), min_size=1, max_size=3))
    lengths = data.draw(st.lists(st.integers(0, cap), min_size=1, max_size=6))
    if lpt_capped.cannot_finish(np.array(lengths), np.array(tokens), cap):
        assert not fits_somehow(lengths, tokens, cap)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(1, 9), min_size=2, max_size=40), num_ranks=st.integers(2, 6),
       slack=st.integers(0, 6))
def test_quick_refusal_refuses_only_where_the_greedy_fails(lengths, num_ranks, slack):
    cap = max(max(lengths), -(-sum(lengths) // num_ranks)) + slack
    problem = make_problem(lengths, num_ranks, max_tokens_per_rank=cap)
    try:
        plain = lpt.solve(problem).assignment
    except InfeasibleError:
        plain = None
    try:
        quick = lpt.solve(problem, quick_refusal=True).assignment
    except InfeasibleError:
        quick = None
    if plain is None:
        assert quick is None
    else:
        np.testing.assert_array_equal(quick, plain)


def hopeless_cells_problem(num_ranks: int = 8):
    """One micro-batch of num_ranks cells of 10 tokens: items of 6 fill a cell each, then the 5s
    overflow them (the uncapped plan's first overflow) and cannot fit in the 4 left."""
    return make_microbatch_problem([6] * num_ranks + [5] * (num_ranks - 2), num_ranks, max_tokens_per_microbatch=10)


def test_microbatch_cells_skip_the_capped_loop_that_cannot_finish(monkeypatch):
    # Cause of code_context's 51-60 ms at T = 8k: the capped LPT over 20 480 cells ran until no
    # cell had room (99.92 % fill, ~37 ms) although the items left at its first overflow could
    # not fit in any way; the cells then took the tight packing anyway.
    rounds = []
    for name in ("_merged_round", "_heap_run", "_tree_round"):
        step = getattr(lpt_capped, name)
        monkeypatch.setattr(lpt_capped, name, lambda *args, step=step: rounds.append(1) or step(*args))
    assert cells.lpt_cells(hopeless_cells_problem(), 1) is None
    assert rounds == []


def test_public_lpt_error_still_names_the_item_without_room():
    with pytest.raises(InfeasibleError, match=r"^`lpt` found no rank with room for item 4 \(16 tokens\) under "
                                              r"max_tokens_per_rank=52; lpt fits under a cap of 54"):
        balance([28, 2, 20, 18, 16, 18], 2, algorithm="lpt", max_tokens_per_rank=52)  # {28, 2, 20} {18, 16, 18}
    with pytest.raises(InfeasibleError, match=r"^no plan fits max_tokens_per_rank=10 on 8 ranks: of the 9 longest "
                                              r"items some rank holds 2, at least 11 tokens"):  # proven: not "try ilp"
        balance([6] * 8 + [5] * 6, 8, algorithm="lpt", max_tokens_per_rank=10)
    with pytest.raises(InfeasibleError, match=r"`lpt` cannot place the items from item 8 on .* under "
                                              r"max_tokens_per_rank=10: .*; lpt fits under a cap of 11"):
        lpt.solve(make_problem([6] * 8 + [5] * 6, 8, max_tokens_per_rank=10), quick_refusal=True)


@pytest.mark.parametrize("algorithm", ["karmarkar_karp", "slack"])
def test_regression_a_fallback_s_refusal_named_lpt_not_the_algorithm_chosen(algorithm):
    """probe20 P20-02: karmarkar_karp and slack, whose plans overflow cap 52, fall back to the capped LPT,
    which finds no room (a plan fits: {28, 2, 20} and {18, 16, 18}); the refusal read "`lpt` found no rank",
    an algorithm the user did not choose, and pointed only at 'ilp'.  It now names the algorithm chosen and
    its fallback, and points at 'auto' (which finds the plan)."""
    lengths = [28, 2, 20, 18, 16, 18]
    with pytest.raises(InfeasibleError, match=rf"^algorithm '{algorithm}' falls back to lpt under a cap its own plan "
                                              r"overflows, and `lpt` found no rank .*algorithm='auto' "
                                              r"searches further$"):
        balance(lengths, 2, max_tokens_per_rank=52, algorithm=algorithm)
    assert balance(lengths, 2, max_tokens_per_rank=52).tokens.max() <= 52
    with pytest.raises(InfeasibleError, match=r"^`lpt` found no rank"):  # lpt's own refusal is unchanged
        balance(lengths, 2, max_tokens_per_rank=52, algorithm="lpt")

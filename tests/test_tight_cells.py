"""Best-fit decreasing over the micro-batch cells (`microbatch_cells.tight_cells`, `microbatch.best_fit`):
the classes matched in numpy and the runs of one length placed at once make exactly the item-by-item
loop's choices, fast on real traces."""

import dataclasses
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers import balance
from orchmllm.balancers.kernels.reference import best_fit_cells
from orchmllm.balancers.microbatch import best_fit
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.microbatch import cells as cells_module
from orchmllm.balancers.microbatch.cells import tight_cells
from orchmllm.study.workloads import sample_workload, trace_table


def assert_matches_the_loop(problem, num_microbatches):
    expected = best_fit_cells(problem.lengths, num_microbatches * problem.num_ranks, problem.max_tokens_per_microbatch)
    cells = tight_cells(problem, num_microbatches)
    if expected is None:
        assert cells is None
    else:
        np.testing.assert_array_equal(cells, expected)


@st.composite
def packings(draw):
    """Lengths from a few values (long runs of ties) in [0, T]: zeros, T itself, divisors of
    rooms; a budget T and a number of micro-batches from too few (None) to plenty."""
    budget = draw(st.integers(1, 30))
    palette = draw(st.lists(st.integers(0, budget), min_size=1, max_size=6))
    lengths = draw(st.lists(st.sampled_from(palette + [0, budget, budget // 2]), min_size=1, max_size=60))
    return lengths, budget, draw(st.integers(1, 4)), draw(st.integers(1, 6))


@pytest.mark.background
@settings(max_examples=300, deadline=None)
@given(packings())
def test_property_runs_make_the_loops_choices(packing):
    lengths, budget, num_ranks, num_microbatches = packing
    assert_matches_the_loop(make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget),
                            num_microbatches)


@pytest.mark.background
@settings(max_examples=200, deadline=None)
@given(packings(), st.lists(st.integers(1, 8), min_size=2, max_size=5))
def test_property_the_packing_kept_for_one_m_makes_the_loops_choices_for_every_other(packing, counts):
    """One problem asked for several M in any order (as `balance_microbatches` asks M, M + 1, ...):
    each answer is the item-by-item loop's over that many cells."""
    lengths, budget, num_ranks, _ = packing
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget)
    for num_microbatches in counts:
        assert_matches_the_loop(problem, num_microbatches)


@settings(max_examples=100, deadline=None)
@given(packings())
def test_property_the_packing_is_of_the_problem_s_own_lengths_and_budget(packing):
    """A problem built from another by `dataclasses.replace` shares its kept packings: one of other
    lengths or another budget must not be answered from them."""
    lengths, budget, num_ranks, num_microbatches = packing
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget)
    tight_cells(problem, num_microbatches)
    longer = np.minimum(np.asarray(lengths) + 1, budget + 1)
    for other in (dataclasses.replace(problem, max_tokens_per_microbatch=budget + 1),
                  dataclasses.replace(problem, lengths=longer, max_tokens_per_microbatch=budget + 1)):
        assert_matches_the_loop(other, num_microbatches)


@st.composite
def long_and_middle(draw):
    """Mostly items in (T/3, T/2], which a cell takes one of (an untouched cell two), beside items over T/2
    and a few shorter ones; ties both among lengths and among the rooms they leave."""
    budget = draw(st.integers(6, 60))
    middle = st.integers(budget // 3 + 1, budget // 2)
    longer = st.integers(budget // 2 + 1, budget)
    shorter = st.integers(0, budget // 3)
    lengths = draw(st.lists(st.one_of(middle, middle, longer, shorter), min_size=1, max_size=80))
    return lengths, budget, draw(st.integers(1, 4)), draw(st.integers(1, 30))


@pytest.mark.background
@settings(max_examples=300, deadline=None)
@given(long_and_middle())
def test_property_items_over_a_third_of_the_budget_make_the_loops_choices(packing):
    lengths, budget, num_ranks, num_microbatches = packing
    assert_matches_the_loop(make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget),
                            num_microbatches)


@st.composite
def classes(draw):
    """Items over T/9 from a few values and any (ties among lengths and the rooms they leave), so that the
    classes T/(k+1) < l <= T/k hold rooms of sure and unsure counts, cells opened in every class."""
    budget = draw(st.integers(7, 400))
    palette = draw(st.lists(st.integers(budget // 9, budget), min_size=1, max_size=8))
    lengths = draw(st.lists(st.one_of(st.sampled_from(palette), st.integers(0, budget)), min_size=1, max_size=150))
    return lengths, budget, draw(st.integers(1, 4)), draw(st.integers(1, 40))


@pytest.mark.background
@pytest.mark.parametrize("matched, rounds, unsure",
                         [(0, 8, 16), (2, 8, 16), (6, 8, 16), (6, 1, 16), (6, 8, 0), (12, 3, 4)],
                         ids=["runs only", "two classes", "default", "one window", "sure counts only",
                              "twelve classes"])
@settings(max_examples=150, deadline=None)
@given(packing=classes())
def test_property_classes_matched_by_depth_make_the_loops_choices(packing, matched, rounds, unsure):
    """However many classes go to the matching, windows a class may take, and rooms of unsure count a
    window checks, the rest going by runs."""
    lengths, budget, num_ranks, num_microbatches = packing
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(best_fit, "CLASSES", matched)
        patch.setattr(best_fit, "MAX_ROUNDS", rounds)
        patch.setattr(best_fit, "MAX_UNSURE", unsure)
        assert_matches_the_loop(make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=budget),
                                num_microbatches)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=200), st.integers(1000, 3000), st.integers(1, 8))
def test_property_distinct_lengths_make_the_loops_choices(lengths, budget, num_cells):
    """Few ties: rooms of one cell each, runs of one item."""
    assert_matches_the_loop(make_microbatch_problem(lengths, num_cells, max_tokens_per_microbatch=budget), 1)


def test_zero_lengths_go_to_the_least_room_and_no_cell_is_none():
    problem = make_microbatch_problem([0, 7, 3, 0, 9, 0], 1, max_tokens_per_microbatch=10)
    assert tight_cells(problem, 3).tolist() == [1, 1, 1, 1, 0, 1]  # 9 leaves cell 0 room 1, 7 and 3 cell 1 none
    assert_matches_the_loop(problem, 3)
    assert tight_cells(problem, 1) is None


def test_real_trace_context_lengths_make_the_loops_choices():
    """The coding trace's context tokens alone fill 99.8 % of the cells at T = 8k: thousands of
    runs, rooms shared by many cells and by one."""
    problem = make_microbatch_problem(np.random.default_rng(0).choice(trace_table("code")[:, 0], 512 * 32), 512,
                                      max_tokens_per_microbatch=8192)
    assert [tight_cells(problem, m) is None for m in (7, 8, 9)] == [True, False, False]
    for num_microbatches in (7, 8, 9):
        assert_matches_the_loop(problem, num_microbatches)


def test_best_fit_does_not_shift_the_room_list_for_every_item():
    """Regression: best fit kept one sorted list of (room, cell) and popped and inserted one entry per
    item, O(M·D) memory moves each; on the coding trace's context tokens at D = 2560 × 32, T = 8k
    (82k items into 20k cells) it took ~60× a plain step's LPT (0.37 s) and `balance_microbatches`
    27× the default mix; now ~3× the plain step."""
    lengths = np.random.default_rng(0).choice(trace_table("code")[:, 0], 2560 * 32)
    problem = make_microbatch_problem(lengths, 2560, max_tokens_per_microbatch=8192)
    start = time.process_time()
    balance(lengths, 2560, algorithm="lpt")
    plain_seconds = time.process_time() - start
    start = time.process_time()
    cells = tight_cells(problem, 8)
    seconds = time.process_time() - start
    assert np.bincount(cells, weights=lengths, minlength=8 * 2560).max() <= 8192
    assert seconds < 15 * max(plain_seconds, 1e-3)


def test_regression_the_tight_packing_was_found_again_for_every_number_of_micro_batches():
    """Regression: `balance_microbatches` asks the cells' kernel for M, M + 1, M + 2, and each call ran best
    fit afresh (video lengths at D = 2560 x 32, T = 8k: three packings, half the planning time, 11x the
    default mix).  Best fit opens an untouched cell only where none other has room, so one packing answers
    every M: asking again costs nothing."""
    lengths = sample_workload("video", 512, 32, seed=7).sample_llm_length
    problem = make_microbatch_problem(lengths, 512, max_tokens_per_microbatch=8192)
    calls = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cells_module, "best_fit", lambda *args: calls.append(1) or best_fit.best_fit(*args))
        first = tight_cells(problem, 13)
        again = [tight_cells(problem, m) for m in (14, 15)]
    for packed in again:
        np.testing.assert_array_equal(packed, first)
    assert len(calls) == 1


def _best_cpu_seconds(run, repeats=3):
    seconds = []
    for _ in range(repeats):
        start = time.process_time()
        run()
        seconds.append(time.process_time() - start)
    return min(seconds)


def test_regression_best_fit_stepped_once_per_length_and_room():
    """Regression: best fit placed each run of one length in Python, a step per room it used; on the video
    mix's lengths at D = 512 x 32, T = 8k (thousands of runs of a few items) it took 10-11x a plain LPT of
    the same items, and `balance_microbatches` 17x the default mix (issue 24).  The classes over T/7 are
    matched in numpy: 2.5-3.2x."""
    lengths = sample_workload("video", 512, 32, seed=7).sample_llm_length
    plain = _best_cpu_seconds(lambda: balance(lengths, 512, algorithm="lpt"))
    problems = iter([make_microbatch_problem(lengths, 512, max_tokens_per_microbatch=8192) for _ in range(3)])
    seconds = _best_cpu_seconds(lambda: tight_cells(next(problems), 13))
    assert seconds < 6 * plain

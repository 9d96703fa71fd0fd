"""With one micro-batch (M = 1) `balance_microbatches` plans `balance`'s plain step and the cells' own plan and
keeps the cheaper (issue 24): the cells' search stops where it provably cannot win (`microbatch_search.ends_above`);
and the search step (any M) evaluates every item of the most loaded cell at once, against only the partners that
can lower the step: the same plans as searching every step to the end, item by item, against every partner."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.kernels import reference
from orchmllm.balancers.microbatch import auto as microbatch_auto, cells as microbatch_cells
from orchmllm.balancers.microbatch import search as microbatch_search
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.microbatch.plan import cell_loads
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload

COST = MODELS["84b"].llm.cost(causal=True)


@st.composite
def cell_plans(draw, max_items=60, max_microbatches=3):
    """Items with ties in costs (small integers) or fractional costs, over M micro-batches of 1-12 cells, a cell
    per item and a cap every cell keeps; the problem, the cells and M."""
    num_ranks, num_microbatches = draw(st.integers(1, 12)), draw(st.integers(1, max_microbatches))
    num_cells = num_ranks * num_microbatches
    lengths = np.array(draw(st.lists(st.integers(1, 30), min_size=1, max_size=max_items)), dtype=np.int64)
    costs = lengths * draw(st.sampled_from([1.0, 1.37, 0.1])) + draw(st.sampled_from([0.0, 2.5]))
    cell_of = np.array(draw(st.lists(st.integers(0, num_cells - 1), min_size=lengths.size, max_size=lengths.size)))
    cap = int(np.bincount(cell_of, weights=lengths, minlength=num_cells).max()) + draw(st.integers(0, 20))
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=cap, costs=costs)
    return problem, cell_of, num_microbatches


def one_microbatch_plans(max_items=60):
    return cell_plans(max_items, max_microbatches=1).map(lambda plan: plan[:2])


@pytest.mark.background
@settings(max_examples=400, deadline=None)
@given(cell_plans(), st.integers(0, 35), st.sampled_from([1 << 18, 1, 40]))
def test_property_the_search_step_is_the_textbook_best_change(plan, cell, row_chunk):
    """Out of any cell (the most loaded of its micro-batch in a search), every item at once (and in rows of
    ROW_CHUNK values), against the partners that can lower the step only: the same change, item, target and
    partner as the loop over every item and every partner, with one micro-batch and with several."""
    problem, cell_of, num_microbatches = plan
    cell = cell % (problem.num_ranks * num_microbatches)
    if not np.any(cell_of == cell):
        return
    search = microbatch_search._Search(problem, cell_of, num_microbatches)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(microbatch_search, "ROW_CHUNK", row_chunk)
        found = search.best_change(cell)
    assert found == reference.cell_best_change(problem.item_costs, problem.lengths, cell_of, problem.num_ranks,
                                               num_microbatches, problem.max_tokens_per_microbatch, cell)


@pytest.mark.background
@settings(max_examples=200, deadline=None)
@given(one_microbatch_plans(max_items=40), st.integers(1, 400_000), st.floats(0.9, 1.1))
def test_property_a_search_proven_to_end_above_a_cost_does(plan, budget, scale):
    """`ends_above`'s proof holds: the search given that budget ends above the cost, and `improve` told to stop
    there returns either the full search's plan or one above the cost too (a caller drops both alike)."""
    problem, cell_of = plan
    problem = dataclasses.replace(problem, work_limit=budget)
    loads = cell_loads(problem, cell_of, problem.num_ranks)
    above = float(np.sort(loads)[problem.num_ranks // 2]) * scale
    full = microbatch_search.improve(problem, cell_of, 1)
    cost = cell_loads(problem, full, problem.num_ranks).max()
    if microbatch_search.ends_above(problem, loads, budget, above):
        assert cost > above
    stopped = microbatch_search.improve(problem, cell_of, 1, above)
    if not np.array_equal(stopped, full):
        assert cell_loads(problem, stopped, problem.num_ranks).max() > above and cost > above


def plan_as_before(problem):
    """`solve_with_plain_step` at M = 1 as it was: the cells' plan searched to the end, then the plain step's,
    the cells' kept on ties."""
    result, plain = microbatch_auto.solve(problem, 1), microbatch_auto.plain_step(problem)
    if plain is None or (result is not None and microbatch_auto.plan_cost(problem, result, 1)
                         <= microbatch_auto.plan_cost(problem, plain, 1)):
        return result
    return plain


@pytest.mark.background
@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["image_qa", "audio_qa", "asr", "speech"]), st.integers(16, 64), st.integers(4, 8),
       st.integers(0, 3), st.integers(150_000, 1_000_000))
def test_property_one_micro_batch_plans_as_before(workload, num_ranks, per_rank, seed, budget):
    """The plain step first, the cells' search stopped where it cannot win: the same plan as before, on work
    budgets from the fewest that search to the default (the smaller, the sooner the proof)."""
    lengths = sample_workload(workload, num_ranks, per_rank, seed=seed).sample_llm_length
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=8192, cost=COST)
    problem = dataclasses.replace(problem, work_limit=budget)
    expected, found = plan_as_before(problem), microbatch_auto.solve_with_plain_step(problem, 1)
    np.testing.assert_array_equal(found.rank, expected.rank)
    np.testing.assert_array_equal(found.microbatch, expected.microbatch)


def test_regression_the_cells_plan_was_searched_where_the_plain_step_had_won():
    """Regression: with one micro-batch the cells' LPT plan was searched to its work budget (17 steps, 11 of
    `balance_microbatches`' 54 ms on image_qa at 512 x 8, T 8k: 13.8x the default mix, issue 24) before the plain
    step, 1.7 % cheaper, took its place.  Now the plain step comes first and the cells' search stops at once:
    its 512 - 2 · 38 least loaded cells, which 38 steps (the budget's most) cannot reach, stay above it."""
    lengths = sample_workload("image_qa", 512, 8, seed=7).sample_llm_length
    problem = make_microbatch_problem(lengths, 512, max_tokens_per_microbatch=8192, cost=COST)
    steps, improve = [], microbatch_cells.improve
    step = microbatch_search._Search.step

    def counted(*args):
        counting = []
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(microbatch_search._Search, "step", lambda self: counting.append(1) or step(self))
            cell_of = improve(*args)
        steps.append(len(counting))
        return cell_of

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(microbatch_cells, "improve", counted)
        result = microbatch_auto.solve_with_plain_step(problem, 1)
    assert steps == [0]
    expected = plan_as_before(problem)
    np.testing.assert_array_equal(result.rank, expected.rank)

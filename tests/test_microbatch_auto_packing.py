"""`auto` at a fixed M where its heuristics find no packing but the exhaustive search does (probe23 P23-10).

A user lowers `max_tokens_per_microbatch` to the largest cell auto's own plan filled; at the same M auto's cell LPT
and joint greedy then found no room, and the refusal said "found no packing ... though one exists (exhaustive
search)": the packing the library had just found was not returned.  Now it is the plan (`auto.from_packing`)."""

import numpy as np
import pytest

from orchmllm import InfeasibleError, balance_microbatches
from orchmllm.balancers.microbatch import exact as microbatch_exact
from orchmllm.balancers.microbatch.api import make_microbatch_problem

# probe23 cases/c25: auto at T = 6627 plans M = 2 with its largest cell 6197 tokens
LENGTHS = [2871, 520, 3971, 934, 3799, 1400, 2811, 1557, 831, 3335, 2745, 1327, 2312, 3512, 2993, 548, 1313, 583,
           1643, 3276, 3873, 1441, 1342, 389]


def test_auto_returns_the_packing_its_exhaustive_search_found():
    """Before: InfeasibleError "... found no packing of the items into 2 × 4 cells of 6197 tokens, though one
    exists (exhaustive search): try algorithm='exact'"."""
    first = balance_microbatches(LENGTHS, 4, max_tokens_per_microbatch=6627)
    budget = int(first.cell_tokens.max())
    assert (first.num_microbatches, budget) == (2, 6197)
    plan = balance_microbatches(LENGTHS, 4, max_tokens_per_microbatch=budget, num_microbatches=2)
    assert plan.num_microbatches == 2 and int(plan.cell_tokens.max()) <= budget
    assert plan.step_cost == pytest.approx(float(plan.cell_loads.max(axis=1).sum()))
    assert plan.step_cost <= first.step_cost * 1.01  # the packing improved as a kernel's start is


def test_a_named_heuristic_still_refuses_naming_exact():
    """The packing is the default algorithm's: 'greedy' asked by name keeps its own answer (none) and the hint."""
    with pytest.raises(InfeasibleError, match="though one exists .*algorithm='exact'"):
        balance_microbatches(LENGTHS, 4, max_tokens_per_microbatch=6197, num_microbatches=2, algorithm="greedy")


def test_packing_holds_every_item_within_the_budget():
    problem = make_microbatch_problem(LENGTHS, 4, max_tokens_per_microbatch=6197)
    cell_of = microbatch_exact.packing(problem, 2)
    assert cell_of.shape == (len(LENGTHS),) and cell_of.min() >= 0 and cell_of.max() < 8
    assert np.bincount(cell_of, weights=LENGTHS, minlength=8).max() <= 6197
    assert microbatch_exact.packing(problem, 1) is False  # 6 items of > 3000 tokens need 6 cells

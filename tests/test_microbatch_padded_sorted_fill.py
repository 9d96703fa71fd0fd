"""Padded `auto` also plans the sorted runs (`cells.sorted_fill`) and keeps the cheaper plan (probe23 P23-04).

On the default LLM-stage mix at D = 64 × 32, T 16k, every built-in planned padded cells 8 % above a 15-line sorted-fill
plugin, with one micro-batch more, and refused num_microbatches=4, which the sorted runs pack."""

import numpy as np
import pytest

from orchmllm import balance_microbatches
from orchmllm.balancers.microbatch import cells as microbatch_cells
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.microbatch.auto import plan_cost
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import llm_stage_lengths

COST = MODELS["84b"].stages()[-1].cost
BUDGET = 16384


@pytest.mark.parametrize("seed", [0, 1])
def test_padded_auto_packs_the_fewest_micro_batches_the_sorted_runs_pack(seed):
    """Before: InfeasibleError "`num_microbatches`=4: algorithm 'auto' found no packing ..."."""
    lengths = llm_stage_lengths(64, 32, seed)[0]
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=BUDGET, cost=COST, padded=True,
                                num_microbatches=4)
    assert plan.num_microbatches == 4 and int(plan.cell_tokens.max()) <= BUDGET


@pytest.mark.parametrize("fixed", [None, 8])
def test_padded_auto_is_never_above_the_sorted_runs(fixed):
    """Before: M free, auto M = 5 at 1.309x the bound against the sorted runs' M = 4 at 1.212x (8 % slower)."""
    lengths = llm_stage_lengths(64, 32, 0)[0]
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=BUDGET, cost=COST, padded=True,
                                num_microbatches=fixed)
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=BUDGET, cost=COST, padded=True)
    runs = microbatch_cells.sorted_fill(problem, plan.num_microbatches)
    assert plan.step_cost <= plan_cost(problem, runs, plan.num_microbatches)
    assert plan.num_microbatches == (fixed or 4)


def test_sorted_fill_cells_hold_the_budget_and_refuse_too_few():
    lengths = np.array([9, 2, 8, 3, 3, 0, 0])
    problem = make_microbatch_problem(lengths, 2, max_tokens_per_microbatch=10, padded=True)
    result = microbatch_cells.sorted_fill(problem, 2)
    cell = result.microbatch * 2 + result.rank
    for c in np.unique(cell):
        assert np.count_nonzero(cell == c) * lengths[cell == c].max() <= 10
    assert microbatch_cells.sorted_fill(problem, 1) is None  # 4 runs: [9] [8] [3 3 2] [0 0]

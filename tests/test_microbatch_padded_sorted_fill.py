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


def _runs_one_by_one(lengths, budget):
    """The textbook sorted runs: longest first, each run's first item holding budget // its length (all the rest
    for no tokens); the runs' first positions."""
    lengths, starts, start = np.sort(lengths)[::-1], [], 0
    while start < lengths.size:
        starts.append(start)
        start += budget // int(lengths[start]) if lengths[start] else lengths.size
    return starts


@pytest.mark.parametrize("seed", range(6))
def test_the_runs_found_a_length_at_a_time_are_the_textbooks(seed):
    """Lengths with ties, zeros (one run holds all the rest) and lengths of the whole budget."""
    rng = np.random.default_rng(seed)
    budget = int(rng.integers(1, 50))
    lengths = rng.choice([0, 1, budget, budget // 2 + 1, int(rng.integers(0, budget + 1))], int(rng.integers(1, 80)))
    problem = make_microbatch_problem(lengths, 2, max_tokens_per_microbatch=budget, padded=True)
    assert microbatch_cells._run_starts(problem) == _runs_one_by_one(lengths, budget)


def test_regression_the_sorted_runs_were_found_afresh_item_by_item_for_every_m():
    """Padded `auto` at 2560 × 32, T 8k, walked the 13.9k runs one Python step each for each of the four M it tried
    (15 ms of its ~170); the runs are the same for every M: found once, kept on the problem, read by the next M (here
    a kept single run lets one micro-batch of 2 cells hold 5 runs of a whole budget each)."""
    problem = make_microbatch_problem(np.full(5, 10), 2, max_tokens_per_microbatch=10, padded=True)
    assert microbatch_cells.sorted_fill(problem, 3) is not None and microbatch_cells.sorted_fill(problem, 2) is None
    problem.packings[("sorted_fill", 10)] = (problem.lengths, [0])
    assert microbatch_cells.sorted_fill(problem, 1) is not None

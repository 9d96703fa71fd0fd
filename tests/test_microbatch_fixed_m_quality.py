"""`auto` at a fixed M above the fewest micro-batches any plan needs (probe22 P22-12).

At about one item a cell (M = items per rank, Megatron's micro-batch of one sample) the cell LPT over M·D cells
balanced badly: at D = 64 × 16, M = 16 auto read 5.8 % above the bound where the joint greedy, which fills a few
micro-batches and leaves the rest empty, read 0.2 %.  `auto` now keeps the plan of the fewest micro-batches too
(`microbatch_auto._fewest_plan`), the cheaper of the two."""

import numpy as np
import pytest

from orchmllm import balance_microbatches
from orchmllm.balancers.microbatch import auto as microbatch_auto
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import llm_stage_lengths, sample_workload

COST = MODELS["84b"].stages()[-1].cost
BUDGET = 16384


def one_item_per_cell(seed: int) -> np.ndarray:
    """64 ranks × 16 LLM-stage lengths: M = 16 gives about one item a cell; the fewest micro-batches are 2."""
    return llm_stage_lengths(64, 16, seed)[0]


@pytest.mark.parametrize("seed", [1, 4])
def test_auto_keeps_up_with_the_joint_greedy_at_one_item_per_cell(seed):
    """Before: auto (the cell LPT alone above GREEDY_MAX_WORK) 5.8 % above greedy's step at seed 1."""
    lengths = one_item_per_cell(seed)
    auto, greedy = (balance_microbatches(lengths, 64, max_tokens_per_microbatch=BUDGET, cost=COST, num_microbatches=16,
                                         algorithm=algorithm) for algorithm in ("auto", "greedy"))
    assert auto.step_cost <= greedy.step_cost * 1.01


@pytest.mark.parametrize("num_microbatches", [4, 16])
def test_more_microbatches_never_cost_auto_more_than_their_overhead(num_microbatches):
    """A plan of the fewest M' micro-batches is one of M >= M' (the rest empty): auto's step at M is at most its
    step at M' plus the overhead of the M - M' more micro-batches."""
    lengths, overhead = one_item_per_cell(1), 1e13
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=BUDGET, cost=COST)
    fewest = problem.min_microbatches
    plans = {m: balance_microbatches(lengths, 64, max_tokens_per_microbatch=BUDGET, cost=COST, num_microbatches=m,
                                     microbatch_overhead=overhead) for m in (fewest, num_microbatches)}
    assert fewest < num_microbatches
    limit = plans[fewest].step_cost + (num_microbatches - fewest) * overhead
    assert plans[num_microbatches].step_cost <= limit * (1 + 1e-12)


def test_a_free_m_solves_the_fewest_once(monkeypatch):
    """With M free, `auto` tries M = 2, 3, 4 here (the long workload's gap leaves room); the fewest's plan, kept
    on the problem, is solved once, not again for every M after it."""
    lengths = np.asarray(sample_workload("long", 64, 32, seed=11).sample_llm_length)
    solved = []
    solve = microbatch_auto._solve

    def counted(problem, num_microbatches, above=None):
        solved.append(num_microbatches)
        return solve(problem, num_microbatches, above)

    monkeypatch.setattr(microbatch_auto, "_solve", counted)
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=131072, cost=COST)
    assert plan.num_microbatches == 2 and solved == [2, 3, 4]


def test_regression_a_plan_at_the_bound_skips_the_fewest_plan(monkeypatch):
    """rev15 R15-06: auto at a fixed M paid for the fewest micro-batches' plan even where M's own plan met the
    bound, which no plan beats (4.1x the CPU for the same step at 512 x 32, M 8)."""
    fewest = []
    original = microbatch_auto._fewest_plan
    monkeypatch.setattr(microbatch_auto, "_fewest_plan", lambda *args: fewest.append(1) or original(*args))
    plan = balance_microbatches([5] * 64, 8, max_tokens_per_microbatch=20, num_microbatches=4)  # 2 a cell: at bound
    assert plan.step_cost == plan.lower_bound and fewest == []

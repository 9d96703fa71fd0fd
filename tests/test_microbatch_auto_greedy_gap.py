"""`auto` runs the joint greedy beyond GREEDY_MAX_WORK where the cell LPT's plan is far from the bound and the greedy
costs about as much (probe23 P23-03).

At D = 64 × 32 (n · M · D > GREEDY_MAX_WORK) auto ran the cell LPT alone; on bimodal lengths (short texts and long
documents) its plan read 8.1 % above the bound where the joint greedy's read 4.4 %, at the same M, the greedy
costing about the same CPU (~25 ms).  Now `auto._greedy_pays` runs the greedy there too and keeps the cheaper plan;
on the default mix the cell LPT's plan is within GREEDY_GAP and nothing changes."""

import numpy as np
import pytest

from orchmllm import balance_microbatches
from orchmllm.balancers import Pipeline
from orchmllm.balancers.microbatch import auto as microbatch_auto, greedy as microbatch_greedy
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import llm_stage_lengths, sample_workload

COST = MODELS["84b"].stages()[-1].cost
BUDGET = 16384


def bimodal(num_ranks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = num_ranks * 32
    return np.where(rng.random(n) < 0.5, rng.integers(16, 300, n), rng.integers(5000, 8000, n))


@pytest.mark.parametrize("settings", [dict(microbatch_overhead=COST(4000)), dict(num_microbatches=8)])
def test_auto_keeps_up_with_its_own_greedy_on_bimodal_lengths(settings):
    """Before: auto 3.56 % (M free, with overhead) and 1.9 % (M = 8) above greedy's step at the same M."""
    lengths = bimodal(64, 2)
    auto, greedy = (balance_microbatches(lengths, 64, max_tokens_per_microbatch=BUDGET, cost=COST,
                                         algorithm=algorithm, **settings) for algorithm in ("auto", "greedy"))
    assert auto.num_microbatches == greedy.num_microbatches
    assert auto.step_cost <= greedy.step_cost * (1 + 1e-9)


def test_the_default_mix_runs_the_cell_lpt_alone(monkeypatch):
    """The greedy runs only where the cell LPT's plan is GREEDY_GAP above the bound: not on the default mix at
    64 × 32, so its planning time is unchanged."""
    calls = []
    solve = microbatch_greedy.solve
    monkeypatch.setattr(microbatch_greedy, "solve", lambda *args: calls.append(args[1]) or solve(*args))
    lengths = llm_stage_lengths(64, 32, 7)[0]
    for fixed in (None, 8):
        balance_microbatches(lengths, 64, max_tokens_per_microbatch=BUDGET, cost=COST, num_microbatches=fixed)
    assert calls == []
    assert lengths.size * 8 <= microbatch_auto.GREEDY_MAX_PAIRS  # the size would allow it: the gap rules it out


def test_regression_the_pipeline_start_keeps_the_cells_planned_without_the_extra_greedy():
    """rev16 R16-11: the joint greedy `_greedy_pays` adds changed the cells a pipeline's search starts from (and its
    PP-unaware baseline): 5 of 180 held-out pipeline rows ended 1.2-6.1 % slower, none faster (the R15-05 pattern);
    the pipeline's start (`auto.solve_each`) keeps the cells planned without it (e.g. speech, D 64, M 16, GPipe
    P 4 with first-stage parts: step 4.713e15 with it, 4.443e15 without)."""
    cost = MODELS["84b"].llm.cost(causal=True)
    lengths = sample_workload("speech", 64, 32, 601).sample_llm_length
    first = np.asarray(cost.item_costs(lengths), float) * np.random.default_rng(665).uniform(0, 0.8, lengths.size)
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=16384, cost=cost, num_microbatches=16,
                                pipeline=Pipeline(stages=4, schedule="gpipe"), first_stage_costs=first)
    assert plan.pipeline.step_time < 4.5e15

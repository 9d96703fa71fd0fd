"""The pipeline planner's shaped starts where more than D items overflow a cell alone: the first (offsets alone) is
shown the slower from its LPT's first M·D choices (`shaped.first_from_below`, `lpt.greedy_prefix`) without its LPT
over every item; the plain cells' reordering is made on the rows that hold its step alone until it is searched."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from orchmllm import balance_microbatches
from orchmllm.balancers import Pipeline
from orchmllm.balancers.kernels.lpt import greedy_from, greedy_prefix
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload

COST = MODELS["84b"].llm.cost(causal=True)


def _same(new, old):
    assert new.digest() == old.digest() and new.pipeline.step_time == old.pipeline.step_time
    assert np.array_equal(new.rank, old.rank) and np.array_equal(new.microbatch, old.microbatch)
    assert new.pipeline.unaware_step_time == old.pipeline.unaware_step_time
    assert np.array_equal(new.pipeline.replica_times, old.pipeline.replica_times)


@pytest.mark.parametrize("schedule, virtual", [("1f1b", 1), ("interleaved", 2)])
def test_regression_the_slower_shaped_start_ran_its_lpt_over_every_item(monkeypatch, fewer_start_off, schedule,
                                                                        virtual):
    """Regression (planning time at D = 2560 x 32, M = 16, issue 28): two shaped starts are made where more than D
    items overflow, and 1F1B and interleaved search only the faster, yet both ran LPT over all 81 920 items (~3 ms
    each at D = 2560).  The first's first M·D choices (half the items here) bound its cells from below, and on its
    probe replicas already run longer than the second's step: it is not made (one `lpt_shaped` call, not two), and
    the plan, its replica times and the PP-unaware step are those of making both.  The speech mix: its D largest
    items hold PINNED_SHARE of the work or more (on the default mix, `shaped.second_alone`: no bound is made)."""
    fewer_start_off()
    from orchmllm.balancers.pipeline import planner

    lengths = sample_workload("speech", 512, 32, seed=7).sample_llm_length
    pipeline = Pipeline(8, schedule, virtual)
    made, shaped = [], planner.lpt_shaped
    monkeypatch.setattr(planner, "lpt_shaped", lambda *args: made.append(args[-1]) or shaped(*args))
    plans, calls = [], []
    for below in (planner.first_from_below, lambda *args: None):  # None: no bound, both made as before
        monkeypatch.setattr(planner, "first_from_below", below)
        made.clear()
        plans.append(balance_microbatches(lengths, 512, max_tokens_per_microbatch=max(16384, int(lengths.max())),
                                          cost=COST, num_microbatches=16, pipeline=pipeline))
        calls.append(list(made))
    assert calls == [[True], [False, True]]  # most=True: the second (the D largest pinned)
    _same(*plans)


def _instance(case: str):
    """A problem of D = 64-256, 32 items a replica (default mix), or (tight) 400 items of cost 1000 and 1500 of cost
    1-7 holding 100 (cheap) or 250 tokens each under a budget of 1000: LPT from the offsets overflows it uncapped, so
    the first start is the capped LPT's (`lpt_cells`); the first M·D items fit it with 100 tokens, not with 250."""
    if case in ("cheap", "long"):
        lengths = np.concatenate([np.ones(400, dtype=np.int64), np.full(1500, 100 if case == "cheap" else 250)])
        costs = np.concatenate([np.full(400, 1000.0), np.arange(1500) % 7 + 1.0])
        return make_microbatch_problem(lengths, 64, costs=costs, max_tokens_per_microbatch=1000)
    ranks = int(case)
    lengths = sample_workload("default", ranks, 32, seed=ranks).sample_llm_length
    return make_microbatch_problem(lengths, ranks, costs=COST.item_costs(lengths), max_tokens_per_microbatch=16384)


@pytest.mark.parametrize("case", ["64", "256", "cheap", "long"])
def test_the_first_shaped_start_from_below_is_at_most_its_cells(case):
    """`first_from_below` is at most the first shaped start's cells in every cell, where its LPT keeps the uncapped
    cells and where they overflow the budget and the capped LPT's are its cells (`lpt_cells`: it takes the first M·D
    items alike while they fit); where they do not fit ("long"), no bound; where there are no more items than
    cells, from the first FEW_PREFIX of them (D = 2560 x 32, M = 32: the whole LPT's cost was spent to bound it)."""
    from orchmllm.balancers.pipeline.planner import cell_costs
    from orchmllm.balancers.pipeline.shaped import first_from_below, lpt_shaped, overflowing

    problem, pipeline, m = _instance(case), Pipeline(8, "1f1b"), 16
    ranks = problem.num_ranks
    mean = float(problem.item_costs.sum()) / ranks + m * problem.microbatch_overhead
    assert overflowing(problem, pipeline, m, mean) > ranks  # two shaped starts: the first is the offsets' alone
    below, (replica, slot, accounts) = first_from_below(problem, m, pipeline, mean), lpt_shaped(problem, m, pipeline,
                                                                                               mean)
    assert (accounts is None) == (case in ("cheap", "long"))  # the capped LPT's cells
    assert (below is None) == (case == "long")
    if below is not None:
        assert np.all(below <= cell_costs(problem, replica, slot, m, accounts)[0])
    few = make_microbatch_problem(problem.lengths[:m * ranks], ranks, costs=problem.item_costs[:m * ranks],
                                  max_tokens_per_microbatch=problem.max_tokens_per_microbatch)
    below = first_from_below(few, m, pipeline, mean)  # no more items than cells: from the first FEW_PREFIX of them
    if case != "long":
        replica, slot, accounts = lpt_shaped(few, m, pipeline, mean)
        assert np.all(below <= cell_costs(few, replica, slot, m, accounts)[0])
    else:  # the capped LPT's cells over the budget: no bound
        assert below is None


@pytest.mark.parametrize("case", ["cheap", "long"])
def test_the_capped_first_shaped_start_plans_alike(monkeypatch, case):
    """Where the first shaped start is the capped LPT's, the plan is the one made with and without its bound."""
    from orchmllm.balancers.pipeline import planner

    problem = _instance(case)
    plans = []
    for below in (planner.first_from_below, lambda *args: None):
        monkeypatch.setattr(planner, "first_from_below", below)
        plans.append(balance_microbatches(problem.lengths, 64, max_tokens_per_microbatch=1000,
                                          costs=problem.item_costs, num_microbatches=16, pipeline=Pipeline(8, "1f1b")))
    _same(*plans)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(32, 80), st.integers(1, 400), st.integers(0, 3))
def test_greedy_prefix_is_the_first_choices_of_greedy_from(seed, ranks, count, scale):
    """`greedy_prefix`: the first `count` choices of `greedy_from` from the same start loads, and each rank's load after
    them exact; None where the raised LPT would not sum exactly (a raise of 2**60)."""
    rng = np.random.default_rng(seed)
    costs = np.sort(rng.integers(0, 10**scale * 50, 400).astype(float))[::-1]
    start = rng.integers(0, 10**scale * 100, ranks).astype(float)
    order = np.arange(costs.size)
    assignment, _, _ = greedy_from(costs, ranks, order, start, np.ones(costs.size))
    ranks_of, loads = greedy_prefix(costs, ranks, start, count, 2.0 * costs[0])
    assert np.array_equal(ranks_of, assignment[:count])
    assert np.array_equal(loads, np.bincount(ranks_of, weights=costs[:count], minlength=ranks))
    assert greedy_prefix(costs, ranks, start, count, 2.0**60) is None


def test_regression_the_reordered_plain_cells_were_made_on_every_replica(monkeypatch):
    """Regression (issue 28): 1F1B reads the reordered plain cells' step, and at large D their search mostly stalls
    at once above the step found (then skipped), yet every replica's cells were reordered (`order.mountain` over
    (1024, 8) at D = 1024, M 8).  The plain cells' STALL_ROWS rows of largest sums hold the reordering's step too (a
    row at most another in every cell stays so, both sorted alike), so those 64 rows alone are reordered where the
    search is skipped, every row where it runs; the plan is the same."""
    from orchmllm.balancers.pipeline import planner

    lengths = sample_workload("default", 1024, 32, seed=7).sample_llm_length
    shapes, reorder = [], planner.mountain
    monkeypatch.setattr(planner, "mountain", lambda cost: shapes.append(cost.shape) or reorder(cost))
    plans = []
    for proven in (planner.PROVEN_FROM, 10**9):  # 10**9: every start timed and made whole
        monkeypatch.setattr(planner, "PROVEN_FROM", proven)
        shapes.clear()
        plans.append(balance_microbatches(lengths, 1024, max_tokens_per_microbatch=16384, cost=COST,
                                          num_microbatches=8, pipeline=Pipeline(8, "1f1b")))
        if proven < 10**9:
            assert shapes == [(planner.STALL_ROWS, 8)]
    assert shapes == [(1024, 8)]
    _same(*plans)


def test_the_reordered_plain_cells_are_made_whole_where_searched(monkeypatch):
    """Where the reordered start's search runs (no stall at once), its cells are made on every replica first and the
    plan is the one made from them whole (PROVEN_FROM above D)."""
    from orchmllm.balancers.pipeline import planner

    lengths = sample_workload("long", 512, 32, seed=11).sample_llm_length
    searched, search = [], planner.CellSearch
    monkeypatch.setattr(planner, "CellSearch", lambda *args: searched.append(args[4].shape) or search(*args))
    plans = []
    for proven in (planner.PROVEN_FROM, 10**9):
        monkeypatch.setattr(planner, "PROVEN_FROM", proven)
        searched.clear()
        plans.append(balance_microbatches(lengths, 512, max_tokens_per_microbatch=max(16384, int(lengths.max())),
                                          cost=COST, num_microbatches=8, pipeline=Pipeline(4, "1f1b")))
        assert all(shape == (512, 8) for shape in searched)
    _same(*plans)

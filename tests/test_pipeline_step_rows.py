"""The pipeline planner times a start on the replicas that hold its step (`schedules.step_rows`) where only its step
is read, and skips a search that provably ends where it starts above the step found (`search.stalls_at_once`)."""

import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra.numpy import arrays

from orchmllm import balance_microbatches
from orchmllm.balancers import Pipeline
from orchmllm.balancers.pipeline.schedules import replica_times, step_rows
from orchmllm.balancers.pipeline.behind import stalls_at_once
from orchmllm.balancers.pipeline.search import CellSearch
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload

PIPELINES = [Pipeline(4, "1f1b"), Pipeline(4, "interleaved", 2), Pipeline(3, "gpipe")]


@pytest.mark.parametrize("schedule, virtual", [("1f1b", 1), ("interleaved", 2)])
def test_regression_the_plain_and_reordered_starts_were_timed_on_every_replica(monkeypatch, schedule, virtual):
    """Regression (planning time at D = 2560 x 32, a fixed M, issue 28): 1F1B and interleaved read only the step of
    the plain cells (their reordering is searched) and, where the reordered start's search stalls at once above the
    step found (most of D = 2560), only that step; yet both were timed on every replica (here [2048, 1024] rows at
    D = 1024, M 8).  The plain cells' replica holding the largest cell of every micro-batch runs longest (a time
    never falls where a cell's cost rises), so the plain cells are timed with the shaped start on their STALL_ROWS
    of largest sums (64), which hold that one, and the reordered cells on the same rows, which hold their step too and
    show the stall, in the same walk; the plan, its replica times and the PP-unaware step are those that timing every
    replica gives."""
    from orchmllm.balancers.pipeline import planner

    lengths = sample_workload("default", 1024, 32, seed=7).sample_llm_length
    cost, pipeline = MODELS["84b"].llm.cost(causal=True), Pipeline(8, schedule, virtual)
    calls, timed = [], planner.replica_times
    monkeypatch.setattr(planner, "replica_times", lambda p, f, b: calls.append(len(f)) or timed(p, f, b))
    plans, walks = [], []
    for proven in (planner.PROVEN_FROM, 10**9):  # 10**9: every start timed on every replica
        monkeypatch.setattr(planner, "PROVEN_FROM", proven)
        calls.clear()
        plans.append(balance_microbatches(lengths, 1024, max_tokens_per_microbatch=16384, cost=cost,
                                          num_microbatches=8, pipeline=pipeline))
        walks.append(list(calls))
    # the shaped start's 1024 rows, the plain cells' STALL_ROWS step rows and those reordered in one walk (until
    # 916f228 the plain cells on 1 row, the reordered rows walked alone after the starts: [1025, 64])
    assert walks[0][0] == 1024 + 2 * planner.STALL_ROWS and walks[1][0] == 2 * 1024
    if schedule == "1f1b":  # interleaved: the shaped start meets the bound, no search
        assert walks == [[1024 + 2 * planner.STALL_ROWS], [2048, 1024]]
    (new, old) = plans
    assert new.digest() == old.digest() and new.pipeline.step_time == old.pipeline.step_time
    assert new.pipeline.unaware_step_time == old.pipeline.unaware_step_time
    assert np.array_equal(new.pipeline.replica_times, old.pipeline.replica_times)


@st.composite
def cell_rows(draw):
    """(rows, M) cell costs: random ones, or rows below one row in every cell (as the plain planner's), with ties."""
    m, rows = draw(st.integers(1, 6)), draw(st.integers(1, 40))
    grid = draw(arrays(np.float64, (rows, m), elements=st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 7.25, 1e6])))
    if draw(st.booleans()):
        grid = np.minimum(grid, grid[draw(st.integers(0, rows - 1))])
    return grid


@given(cell_rows(), st.integers(1, 8), st.sampled_from(PIPELINES))
def test_step_rows_hold_the_step(grid, count, pipeline):
    """The times of `step_rows`' rows hold the step exactly (float walks included) and their `count` largest sums."""
    m = grid.shape[1] if pipeline.schedule != "interleaved" else pipeline.stages
    grid = np.resize(grid, (grid.shape[0], m)) if grid.shape[1] != m else grid
    rows = step_rows(grid, count)
    times = replica_times(pipeline, *pipeline.stage_times(grid))
    assert float(times[rows].max()) == float(times.max())
    assert np.all(np.diff(rows) > 0) and np.sort(grid.sum(axis=1))[-min(count, grid.shape[0])] <= \
        grid.sum(axis=1)[rows].max()


@given(st.integers(8, 60), st.integers(2, 5), st.integers(0, 2**31), st.sampled_from([0.0, 1e-9, 1e-6, 1e-3, 0.1]))
def test_a_search_that_stalls_at_once_changes_nothing(ranks, microbatches, seed, noise):
    """`stalls_at_once` of replica times (or of any part holding their max) means a search from them ends unchanged:
    `rounds` then `run` make no move or swap."""
    rng = np.random.default_rng(seed)
    cost = (1.0 + noise * rng.random((ranks, microbatches))) * rng.permutation(np.arange(1.0, microbatches + 1))
    pipeline = Pipeline(2, "1f1b")
    times = replica_times(pipeline, *pipeline.stage_times(cost))
    part = np.union1d(rng.choice(ranks, ranks // 2, replace=False), [int(np.argmax(times))])
    if stalls_at_once(times[part], ranks, False):
        assert stalls_at_once(times, ranks, False)
    if not stalls_at_once(times, ranks, False):
        return
    replica, slot = np.repeat(np.arange(ranks), microbatches), np.tile(np.arange(microbatches), ranks)
    search = CellSearch(pipeline, cost.ravel(), np.ones(cost.size, dtype=np.int64), False, cost.copy(),
                        np.ones((ranks, microbatches), dtype=np.int64), replica, slot, 10, 10**9, times)
    search.rounds()
    search.run()
    assert not search.moved and np.array_equal(search.times, times) and np.array_equal(search.cost, cost)


@pytest.mark.parametrize("extra, m, blocks", [(1, 8, 1), (1280, 8, 1), (2560, 8, 2), (512, 16, 1), (512, 32, 2)])
def test_regression_a_walk_of_a_few_rows_more_than_a_block_ran_two_blocks(monkeypatch, extra, m, blocks):
    """Regression (planning time at D = 2560 x 32, issue 28): the starts' walk at D = 2560 holds a few probed rows
    more than BLOCK_ROWS (2561 at M 8, 1F1B), and any row past a block's made a second block (1.2-1.3x one walk's
    time, a walk's own cost paid twice); blocks now hold about BLOCK_ROWS rows each, the same floats as each row
    timed alone; fewer at M 32 (one block beats two there up to ~10 000 rows since the walk reuses its registers:
    `schedules.BLOCK_ROWS`)."""
    from orchmllm.balancers.pipeline import schedules

    pipeline = Pipeline(8, "1f1b")
    cost = np.random.default_rng(5).random((schedules.BLOCK_ROWS + extra, m))
    calls, walk = [], schedules.replica_times
    monkeypatch.setattr(schedules, "replica_times", lambda p, f, b: calls.append(len(f)) or walk(p, f, b))
    times = walk(pipeline, *pipeline.stage_times(cost))
    assert len(calls) == (blocks if blocks > 1 else 0)
    alone = np.concatenate([walk(pipeline, *pipeline.stage_times(cost[row:row + 1]))
                            for row in range(0, len(cost), 97)])
    assert np.array_equal(times[::97], alone)

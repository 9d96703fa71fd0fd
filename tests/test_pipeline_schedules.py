"""Pipeline schedules: the planner's recurrence against the event-simulation oracle, the closed
form, the best shape's certified bound, and the spec's errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.pipeline import Pipeline, replica_times
from orchmllm.balancers.pipeline.profile import best_profile
from orchmllm.balancers.pipeline.schedules import BLOCK_ROWS, gpipe_time, programs
from orchmllm.testing.pipeline import replica_step, simulate_pipeline


@st.composite
def pipelines(draw, most_stages=5):
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved"]))
    stages = draw(st.integers(2 if schedule == "interleaved" else 1, most_stages))
    virtual = draw(st.integers(2, 3)) if schedule == "interleaved" else 1
    groups = draw(st.integers(1, 3))
    microbatches = stages * groups if schedule == "interleaved" else draw(st.integers(1, 8))
    return Pipeline(stages=stages, schedule=schedule, virtual_stages=virtual), microbatches


@settings(max_examples=150, deadline=None)
@given(pipelines(), st.data())
def test_recurrence_equals_event_simulation(case, data):
    """Per-stage times (narrow integers force ties): the planner's times equal the oracle's exactly."""
    pipeline, m = case
    shape = (pipeline.stages, m)
    forward = np.array(data.draw(st.lists(st.integers(0, 4), min_size=shape[0] * m, max_size=shape[0] * m)),
                       dtype=float).reshape(shape)
    backward = forward * 2 + np.array(data.draw(st.lists(st.integers(0, 2), min_size=shape[0] * m,
                                                         max_size=shape[0] * m))).reshape(shape)
    ours = replica_times(pipeline, forward[None], backward[None])[0]
    assert ours == simulate_pipeline(pipeline, forward, backward).step_time


@settings(max_examples=60, deadline=None)
@given(pipelines(), st.data())
def test_gpipe_closed_form_and_order_free(case, data):
    pipeline, m = case
    pipeline = Pipeline(stages=pipeline.stages)
    costs = np.array(data.draw(st.lists(st.floats(0, 100), min_size=m, max_size=m)))
    f, b = pipeline.stage_times(costs[None])
    gpipe = Pipeline(stages=pipeline.stages, schedule="gpipe")
    closed = gpipe_time(f, b, pipeline.stages)[0]
    assert replica_times(gpipe, f, b)[0] == pytest.approx(closed, rel=1e-12)
    assert replica_times(gpipe, f[:, ::-1], b[:, ::-1])[0] == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (2048, 16), (7, 33)])
def test_gpipe_closed_form_takes_each_rows_max_exactly(shape):
    """`gpipe_time` reads each row's max over the columns of a transposed copy (the search's GPipe rows: numpy's
    max along short rows cost 131 µs of 2048 x 16, 3/4 of the closed form); the same floats as the row-wise
    formula, ties and zeros included, so the search's choices stay the same."""
    rng = np.random.default_rng(sum(shape))
    forward = np.round(rng.random(shape) * 8) / 8  # ties within rows, zeros
    backward = 2.0 * forward
    rowwise = forward.sum(axis=1) + 3 * forward.max(axis=1) + backward.sum(axis=1) + 3 * backward.max(axis=1)
    assert gpipe_time(forward, backward, 4).tobytes() == rowwise.tobytes()


def test_uniform_bubbles_are_the_textbook_ones():
    """Equal micro-batches: GPipe and 1F1B take (M + P - 1)·(f + b), interleaved (M + (P - 1)/v)·(f + b)."""
    f, b = np.ones((1, 8)), np.full((1, 8), 2.0)
    for schedule, virtual, expected in (("gpipe", 1, 11 * 3), ("1f1b", 1, 11 * 3), ("interleaved", 2, 8 * 3 + 4.5)):
        assert replica_times(Pipeline(stages=4, schedule=schedule, virtual_stages=virtual), f, b)[0] == expected


@settings(max_examples=40, deadline=None)
@given(pipelines(most_stages=4), st.data())
def test_best_profile_bounds_every_shape(case, data):
    """τ · Σ x never exceeds the time of any cells x, and the best shape it returns reaches τ."""
    pipeline, m = case
    tau, shape = best_profile(pipeline, m)
    costs = np.array(data.draw(st.lists(st.floats(0, 50), min_size=m, max_size=m)))
    assert tau * costs.sum() <= replica_step(pipeline, costs) * (1 + 1e-12)
    assert replica_step(pipeline, shape) == pytest.approx(tau, rel=1e-6)


def test_one_f_one_b_best_shape_is_light_at_both_ends():
    """1F1B's fill and drain make light first and last micro-batches pay: 8 % below flat at P = 8, M = 16."""
    pipeline = Pipeline(stages=8)
    tau, shape = best_profile(pipeline, 16)
    flat = replica_step(pipeline, np.full(16, 1 / 16))
    assert tau < 0.93 * flat
    assert shape[0] < shape[8] > shape[-1]


def test_orders_cover_every_operation_once():
    pipeline = Pipeline(stages=4, schedule="interleaved", virtual_stages=3)
    stage, slot, backward, _, _ = programs(pipeline, 8)
    assert stage.size == 2 * 4 * 3 * 8
    assert len(set(zip(stage.tolist(), slot.tolist(), backward.tolist()))) == 2 * 4 * 8


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(stages=0), ValueError, r"`stages` must be >= 1; got 0"),
    (dict(stages=2.0), TypeError, r"`stages` must be an int"),
    (dict(stages=2, schedule="zb"), ValueError, r"`schedule` must be one of \['gpipe', '1f1b', 'interleaved'\]"),
    (dict(stages=2, schedule="interleaved"), ValueError, r"`virtual_stages` must be >= 2 for the interleaved"),
    (dict(stages=2, virtual_stages=2), ValueError, r"`virtual_stages`=2 needs schedule='interleaved'"),
    (dict(stages=2, backward_factor=0), ValueError, r"`backward_factor` must be finite and > 0"),
])
def test_pipeline_spec_errors_name_the_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        Pipeline(**kwargs)


@pytest.mark.parametrize("factor", [1e7, 1e308])
def test_regression_a_backward_factor_that_swallows_the_forward_share_is_refused(factor):
    """Cause: `backward_factor` was only asked to be finite: at 1e308 the forward share 1 / (P (1 + k))
    was 0, every operation took 0 s and the planner certified a step of 0.0 as optimal (probe6 P6-05)."""
    with pytest.raises(ValueError, match=r"`backward_factor` must be at most MAX_BACKWARD_FACTOR = 1e\+06"):
        Pipeline(stages=2, backward_factor=factor)
    assert Pipeline(stages=2, backward_factor=1e6).forward_share > 0


def test_interleaved_needs_whole_groups():
    with pytest.raises(ValueError, match=r"`num_microbatches`=6 must be a multiple of the pipeline's `stages`=4 "
                                         r".*try 8"):
        Pipeline(stages=4, schedule="interleaved", virtual_stages=2).check_microbatches(6)


@pytest.mark.parametrize("stages, schedule, virtual, first", [(8, "1f1b", 1, False), (4, "interleaved", 2, True)])
def test_replica_times_of_many_rows_equal_each_row_alone(stages, schedule, virtual, first):
    """Rows timed together (each operation one vector operation over them): every row as timed alone."""
    pipeline = Pipeline(stages=stages, schedule=schedule, virtual_stages=virtual)
    rng = np.random.default_rng(5)
    costs = rng.random((2 * BLOCK_ROWS + 5, 4))  # more than one block of rows
    forward, backward = pipeline.stage_times(costs, 0.5 * costs if first else None)
    times = replica_times(pipeline, forward, backward)
    assert times.shape == (costs.shape[0],)
    bounds = np.cumsum([len(block) for block in np.array_split(costs, -(-costs.shape[0] * 16 // (20 * BLOCK_ROWS)))])
    assert bounds.size > 1  # the blocks' first and last rows (`replica_times`' split), and others
    for row in sorted({0, 1023, 1024, costs.shape[0] - 1, *bounds[:-1] - 1, *bounds[:-1]}):
        assert times[row] == replica_times(pipeline, forward[row:row + 1], backward[row:row + 1])[0]


def test_regression_the_best_shape_at_many_micro_batches_took_cutting_planes_18_seconds_short_of_it():
    """Cause: Kelley's cutting planes over paths solved up to 400 LPs of up to 800 cuts and stopped at
    MAX_CUTS 1.3e-4 above the optimum at P = 8, M = 66 (18 s on the first call of a 2560-GPU step, issue 24
    P4-22); the program over the operations' end times is solved once, and its dual flow certifies it."""
    pipeline = Pipeline(stages=8)
    tau, shape = best_profile(pipeline, 66)
    assert replica_step(pipeline, shape) <= tau * (1 + 1e-5)
    rng = np.random.default_rng(66)
    for cells in rng.dirichlet(np.ones(66), size=20):
        assert tau <= replica_step(pipeline, cells) * (1 + 1e-12)


def test_regression_replica_times_held_every_operations_end_times():
    """Regression (planning time at D = 2560: the timing of two starts' 5120 rows took 1 ms of the planning call,
    0.4 ms alone): every operation's row of end times stayed alive to the end (P = 8, M = 16: 256 rows of 4096
    floats, 8 MiB, out of cache); now an end no later operation reads is dropped, its memory reused."""
    import tracemalloc

    pipeline, rng = Pipeline(stages=8), np.random.default_rng(3)
    forward = rng.random((4096, 16))
    backward = 2 * forward
    expected = [replica_times(pipeline, forward[row:row + 1], backward[row:row + 1])[0] for row in (0, 4095)]
    tracemalloc.start()
    try:
        times = replica_times(pipeline, forward, backward)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [times[0], times[4095]] == expected
    assert peak < 96 * 4096 * 8, peak  # the durations (32 rows) and a few rows of end times (53 in all; 300 before)


@pytest.mark.parametrize("schedule, virtual", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_zero_durations_end_at_zero(schedule, virtual):
    """The walk adds an operation's duration to 0.0 where it has no predecessor (speed: no max with zeros):
    zero seconds, -0.0 too, end at +0.0 as the event simulation's do, staged or uniform."""
    pipeline = Pipeline(stages=4, schedule=schedule, virtual_stages=virtual)
    for shape in ((3, 8), (3, 4, 8)):
        times = replica_times(pipeline, np.full(shape, -0.0), np.full(shape, -0.0))
        assert times.tolist() == [0.0] * 3 and not np.signbit(times).any()


def test_moves_made_together_are_the_moves_made_one_by_one():
    """The search's rounds make their moves in one call (`CellSearch._move` over arrays): the cells' costs are
    float sums, so several items leaving one cell must leave it in the order of one move after another (0.7 - 0.1
    - 0.2 and 0.7 - 0.2 - 0.1 differ); every cell, token count, item place and replica's items as one by one."""
    from orchmllm.balancers.pipeline.search import CellSearch

    costs = np.array([0.1, 0.2, 0.4, 0.3, 0.5, 0.6])  # items 0-2 in cell (0, 0), 3 in (0, 1), 4 in (1, 0), 5 in (2, 1)
    replica, slot = np.array([0, 0, 0, 0, 1, 2]), np.array([0, 0, 0, 1, 0, 1])
    cost = np.zeros((4, 2))
    np.add.at(cost, (replica, slot), costs)
    tokens = np.zeros((4, 2), dtype=np.int64)
    np.add.at(tokens, (replica, slot), np.arange(1, 7))
    pipeline = Pipeline(stages=2)
    searches = [CellSearch(pipeline, costs, np.arange(1, 7), False, cost, tokens, replica, slot, 100, 10**6,
                           replica_times(pipeline, *pipeline.stage_times(cost))) for _ in range(2)]
    for search in searches:
        search._items(0), search._items(3)  # replicas whose items are kept (the others are found on use)
    moves = [(0, 1, 3, 0, 1.0, 2.0), (0, 0, 3, 1, 3.0, 4.0), (0, 3, 1, 1, 5.0, 6.0), (2, 5, 1, 0, 7.0, 8.0)]
    for move in moves:
        searches[0]._move(*move)
    searches[1]._move(*(np.array(column) for column in zip(*moves)))
    one, together = searches
    assert one.cost.tobytes() == together.cost.tobytes() and np.array_equal(one.tokens, together.tokens)
    assert np.array_equal(one.replica, together.replica) and np.array_equal(one.slot, together.slot)
    assert one.members.keys() == together.members.keys()
    assert all(np.array_equal(one.members[r], together.members[r]) for r in one.members)
    assert one.moved == together.moved == {0, 1, 2, 3} and one.times.tolist() == together.times.tolist()


def test_regression_an_emptied_cell_kept_a_negative_cost():
    """Review R11-08: the search keeps its cells' costs by float differences, so emptying a cell of 0.03 +
    0.8200000000000001 + 0.92 (summed in item order) left -1.1e-16, a negative duration for `replica_times` (whose
    end times assume durations >= 0), and a row without its last item read the same.  Both are clamped at 0 now."""
    from orchmllm.balancers.pipeline.candidates import without
    from orchmllm.balancers.pipeline.search import CellSearch

    costs = np.array([0.03, 0.82 + 1e-16, 0.92, 1.0])  # items 0-2 in cell (0, 0), item 3 in cell (1, 0)
    cost = np.array([[np.bincount(np.zeros(3, dtype=np.int64), weights=costs[:3])[0], 0.0], [1.0, 0.0]])
    tokens, replica, slot = np.array([[3, 0], [1, 0]]), np.array([0, 0, 0, 1]), np.zeros(4, dtype=np.int64)
    pipeline = Pipeline(stages=2)
    search = CellSearch(pipeline, costs, np.ones(4, dtype=np.int64), False, cost, tokens, replica, slot, 100, 10**6,
                        replica_times(pipeline, *pipeline.stage_times(cost)))
    search._move(0, 0, 1, 1, 0.0, 0.0)
    search._move(0, 1, 1, 1, 0.0, 0.0)
    assert without(search.cost, costs, search.replica, search.slot, np.array([2]))[0, 0] == 0.0
    search._move(0, 2, 1, 1, 0.0, 0.0)
    assert search.cost[0, 0] == 0.0 and search.tokens[0, 0] == 0


def test_a_search_behind_a_found_step_stops_where_its_rate_cannot_reach_it():
    """A search given `rival`, a step already found (`planner.arrange`: the best start's or an earlier search's),
    stops at a window's end where its gain over that window, kept up for the budget left, stays above it: at
    D = 2560 x 32, M = 16, GPipe the second shaped start's search spent its whole budget (66 120 rows, ~40 % of the
    planner's time) to end 15 % behind the first's.  Here 40 unit items on replica 0 of 8 leave one a step: without
    a rival the budget moves 18, behind a rival of 6 (a window's rate reaches ~10) the first window ends it."""
    from orchmllm.balancers.pipeline.search import CellSearch

    costs, replica, slot = np.ones(40), np.zeros(40, dtype=np.int64), np.arange(40) % 2
    cost, tokens = np.zeros((8, 2)), np.zeros((8, 2), dtype=np.int64)
    np.add.at(cost, (replica, slot), costs)
    np.add.at(tokens, (replica, slot), 1)
    pipeline = Pipeline(stages=2)
    searches = {rival: CellSearch(pipeline, costs, np.ones(40, dtype=np.int64), False, cost, tokens, replica, slot,
                                  100, 40_000, replica_times(pipeline, *pipeline.stage_times(cost)), rival=rival)
                for rival in (np.inf, 6.0)}
    for search in searches.values():
        search.run()
    assert int((searches[np.inf].replica != 0).sum()) == 18 and searches[np.inf].work <= 0
    assert int((searches[6.0].replica != 0).sum()) == 3 and searches[6.0].times.max() > 6.0


@pytest.mark.parametrize("schedule, virtual", [("1f1b", 1), ("interleaved", 2), ("gpipe", 1)])
def test_a_round_times_one_offer_of_an_item_that_lands_below_its_replica_anyway(monkeypatch, schedule, virtual):
    """A round offered each chosen item to its partner in every slot where it fits (768 rows here, 2048 of a
    round's 3040 at D = 2560 x 32, M = 16).  An item lands at most its cost above its partner's time, so where that
    stays below its replica's time without it every slot ties and the first is taken: that one alone is timed
    now, charged as before, and the plan is the one timing every offer gives (search.SUMS_DRIFT = inf; here 168,
    48 and 393 rows of 768)."""
    from orchmllm.balancers import balance_microbatches
    from orchmllm.balancers.pipeline import search
    from orchmllm.study.models import MODELS
    from orchmllm.study.workloads import sample_workload

    lengths = sample_workload("default", 64, 32, seed=7).sample_llm_length
    cost, pipeline = MODELS["84b"].llm.cost(causal=True), Pipeline(8, schedule, virtual)
    rows, evaluate = [], search.CellSearch.evaluate
    monkeypatch.setattr(search.CellSearch, "evaluate", lambda self, cells: rows.append(len(cells[0])) or
                        evaluate(self, cells))
    plans, offers = [], []
    for drift in (search.SUMS_DRIFT, np.inf):
        monkeypatch.setattr(search, "SUMS_DRIFT", drift)
        rows.clear()
        plans.append(balance_microbatches(lengths, 64, max_tokens_per_microbatch=16384, cost=cost,
                                          num_microbatches=16, pipeline=pipeline))
        offers.append(rows[1])  # the first round's offers
    assert offers[1] == 768 and offers[0] < offers[1]
    assert np.array_equal(plans[0].rank, plans[1].rank) and np.array_equal(plans[0].microbatch, plans[1].microbatch)
    assert plans[0].pipeline.step_time == plans[1].pipeline.step_time

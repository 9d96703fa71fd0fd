"""`balancers.pipeline.search`: what the rounds may leave untimed, and that leaving it so keeps the plan."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers import Pipeline, balance_microbatches
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.pipeline.step import pipeline_step
from orchmllm.balancers.pipeline.schedules import replica_times
from orchmllm.study.workloads import sample_workload

PIPELINES = [Pipeline(3, "gpipe"), Pipeline(3, "1f1b"), Pipeline(2, "interleaved", 2), Pipeline(4, "1f1b")]


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: f"{p.schedule}-P{p.stages}")
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_cells_cost_weighs_at_most_one_in_a_replicas_time(pipeline, data):
    """What `search._may_lead` relies on: lowering one cell's cost by c lowers the replica's time by at most c, and
    never raises it (walked floats, with and without first-stage parts)."""
    m = data.draw(st.sampled_from([2, 4] if pipeline.schedule == "interleaved" else [1, 2, 3, 5]))
    cells = np.array(data.draw(st.lists(st.floats(0, 100), min_size=m, max_size=m)))
    slot = data.draw(st.integers(0, m - 1))
    cut = data.draw(st.floats(0, 1)) * cells[slot]
    lowered = cells.copy()
    lowered[slot] = max(cells[slot] - cut, 0.0)
    firsts = (None, None) if not data.draw(st.booleans()) else (0.5 * cells[None, :], 0.5 * lowered[None, :])
    before = replica_times(pipeline, *pipeline.stage_times(cells[None, :], firsts[0]))[0]
    after = replica_times(pipeline, *pipeline.stage_times(lowered[None, :], firsts[1]))[0]
    assert before * (1 - 1e-12) - cut <= after <= before


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_may_lead_is_its_groups_bar_on_every_item(data):
    """`search._may_lead` against its definition: an item may lead its group where max(time - cost, landing) is at
    most the group's ROUND_ITEMS-th least max(time, landing) (SUMS_DRIFT aside), ties and small groups included."""
    from orchmllm.balancers.pipeline.search import ROUND_ITEMS, SUMS_DRIFT, _least_per_group, _may_lead

    groups = data.draw(st.integers(1, 6))
    group = np.sort(np.array(data.draw(st.lists(st.integers(0, groups - 1), max_size=30)), dtype=np.int64))
    level = np.array(data.draw(st.lists(st.sampled_from([4.0, 6.0, 10.0]), min_size=groups, max_size=groups)))
    partner = np.array(data.draw(st.lists(st.sampled_from([0.0, 3.0, 6.0]), min_size=groups, max_size=groups)))
    costs = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0, 7.0]), min_size=group.size,
                                        max_size=group.size)))
    times, landing = level[group], partner[group] + costs
    most = np.maximum(times * (1 + SUMS_DRIFT), landing)
    chosen = _least_per_group(most, group, groups, ROUND_ITEMS)
    bar = np.full(groups, -np.inf)
    np.maximum.at(bar, group[chosen], most[chosen])
    expected = np.maximum(times * (1 - SUMS_DRIFT) - costs, landing) <= bar[group]
    assert np.array_equal(_may_lead(times, costs, landing, group, groups), expected)


@pytest.mark.parametrize("schedule, virtual, rows", [("1f1b", 1, [183, 365]), ("interleaved", 2, [96, 288])])
def test_regression_a_round_timed_every_item_of_the_slow_replicas(monkeypatch, schedule, virtual, rows):
    """Regression (planning time at D = 2560 x 32, a fixed M, issue 28): a round timed each slow replica without each
    of its items (here 365 rows in the first round, 1F1B; at D = 2560, M = 16 960 a round), though only the
    ROUND_ITEMS of least promise per replica are offered and an item landing above its group's ROUND_ITEMS-th least
    promise cannot be one.  Now those are left untimed (charged to the budget as if timed) and the plan is the one
    timing every item gives (`_may_lead` widened to time all: the second count)."""
    from orchmllm.balancers.pipeline import schedules, search
    from orchmllm.study.models import MODELS

    cost, pipeline = MODELS["84b"].llm.cost(causal=True), Pipeline(8, schedule, virtual)
    lengths = sample_workload("default", 64, 32, seed=7).sample_llm_length
    calls, timed = [], schedules.replica_times
    monkeypatch.setattr(search, "replica_times", lambda p, f, b: calls.append(len(f)) or timed(p, f, b))
    plans = []
    for everything in (False, True):
        if everything:
            monkeypatch.setattr(search, "_may_lead", lambda times, *_: np.ones(times.size, dtype=bool))
        calls.clear()
        plans.append(balance_microbatches(lengths, 64, max_tokens_per_microbatch=16384, cost=cost,
                                          num_microbatches=16, pipeline=pipeline))
        assert calls[0] == rows[everything]  # the first round's rows without an item
    assert np.array_equal(plans[0].rank, plans[1].rank) and np.array_equal(plans[0].microbatch, plans[1].microbatch)
    assert plans[0].pipeline.step_time == plans[1].pipeline.step_time
    problem = make_microbatch_problem(lengths, 64, max_tokens_per_microbatch=16384, cost=cost)
    fresh = pipeline_step(problem, plans[0].rank, plans[0].microbatch, 16, pipeline, 0.0)
    assert plans[0].pipeline.step_time == fresh.step_time < plans[0].pipeline.unaware_step_time


@pytest.mark.parametrize("schedule, microbatches, ranks", [("gpipe", 16, 1280), ("1f1b", 8, 1280), ("1f1b", 16, 160)])
def test_regression_every_search_copied_the_cells_though_most_stall_at_once(monkeypatch, schedule, microbatches,
                                                                           ranks):
    """Regression (planning time at D = 2560 x 32, a fixed M, issue 28): every search copied the start's cells and
    its items' replica and slot (0.3 ms of a 14 ms plan at M = 8, GPipe), though at large D most stop at once (the
    reordered plain cells near-tied on every replica).  A search now reads the caller's arrays until its first swap or
    move copies them: one that changes nothing holds the caller's own (here at D = 1280; GPipe's from its start by
    heights at M 16, where M 8 moves items), and no search writes the caller's."""
    from orchmllm.balancers.pipeline import planner, search
    from orchmllm.study.models import MODELS

    searches = []

    class Recorded(search.CellSearch):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.given = args[4:8]  # the caller's cell costs, tokens, and the items' replica and slot
            self.before = tuple(array.copy() for array in self.given)
            searches.append(self)

    monkeypatch.setattr(planner, "CellSearch", Recorded)
    cost, pipeline = MODELS["84b"].llm.cost(causal=True), Pipeline(8, schedule)
    lengths = sample_workload("default", ranks, 32, seed=7).sample_llm_length
    plan = balance_microbatches(lengths, ranks, max_tokens_per_microbatch=16384, cost=cost,
                                num_microbatches=microbatches, pipeline=pipeline)
    changed = [bool(found.moved) or found.cost is not found.given[0] for found in searches]
    assert (False in changed) == (ranks > 1000)  # searches that change nothing, and (D = 160) only ones that do
    for found, change in zip(searches, changed):
        assert all((array is given) != change for array, given in zip(
            (found.cost, found.tokens, found.replica, found.slot), found.given))
        assert all(np.array_equal(given, before) for given, before in zip(found.given, found.before))
    problem = make_microbatch_problem(lengths, ranks, max_tokens_per_microbatch=16384, cost=cost)
    fresh = pipeline_step(problem, plan.rank, plan.microbatch, microbatches, pipeline, 0.0)
    assert plan.pipeline.step_time == fresh.step_time
    assert np.array_equal(plan.pipeline.replica_times, fresh.replica_times)


@pytest.mark.parametrize("schedule, virtual, walks", [  # then the first step's swaps and r's rows
    ("interleaved", 2, ([96, 60, 140], [96, 48, 12, 140])), ("1f1b", 1, ([183, 172, 8, 145], [183, 168, 12, 145]))])
def test_regression_a_round_timed_the_replicas_several_items_left_in_a_walk_of_their_own(monkeypatch, schedule,
                                                                                         virtual, walks):
    """Regression (planning time at D = 2560 x 32, a fixed M, issue 28): a round timed the replicas that several of
    its items left after the moves, in a walk of the schedule of their own (32 rows, ~0.2 ms for 1F1B at M = 16, a
    fixed cost of its operations, one a round).  A settled offer (its partner stays below the item's replica without
    it) ends at that time, so where a replica's chosen items are all settled or fit nowhere its moves are known before
    the offers are timed, and its time after them is timed with the offers; the plan is the one timing them after the
    moves gives (`_known_moves` made to know none: the second walks)."""
    from orchmllm.balancers.pipeline import schedules, search
    from orchmllm.study.models import MODELS

    cost, pipeline = MODELS["84b"].llm.cost(causal=True), Pipeline(8, schedule, virtual)
    lengths = sample_workload("default", 64, 32, seed=7).sample_llm_length
    calls, timed = [], schedules.replica_times
    monkeypatch.setattr(search, "replica_times", lambda p, f, b: calls.append(len(f)) or timed(p, f, b))
    known = search.CellSearch._known_moves
    plans = []
    for none_known in (False, True):
        if none_known:
            def nothing_known(self, slow, *args):
                leaving, (ahead, rows) = known(self, slow, *args)
                return leaving, (ahead[:0], tuple(None if row is None else row[:0] for row in rows))
            monkeypatch.setattr(search.CellSearch, "_known_moves", nothing_known)
        calls.clear()
        plans.append(balance_microbatches(lengths, 64, max_tokens_per_microbatch=16384, cost=cost,
                                          num_microbatches=16, pipeline=pipeline))
        assert calls[:len(walks[none_known])] == walks[none_known]
    assert np.array_equal(plans[0].rank, plans[1].rank) and np.array_equal(plans[0].microbatch, plans[1].microbatch)
    assert plans[0].pipeline.step_time == plans[1].pipeline.step_time
    assert np.array_equal(plans[0].pipeline.replica_times, plans[1].pipeline.replica_times)


def test_regression_a_round_sorted_every_item_of_the_slow_replicas_to_bound_the_untimed(fewer_start_off):
    """Regression (planning time at D = 2560 x 32, a fixed M, issue 28): to leave items untimed, a round sorted all the
    slow replicas' items (960 at M = 16, 1F1B) for each group's ROUND_ITEMS-th least bound max(time, landing), which is
    the group's time wherever ROUND_ITEMS items land at most there.  Now only groups with fewer are sorted: here none,
    each round sorting its promises and its offers alone (`_least_per_group`); the same items timed."""
    fewer_start_off()
    from orchmllm.balancers.pipeline import search
    from orchmllm.study.models import MODELS

    sizes, least = [], search._least_per_group

    def counted(values, *args):
        sizes.append(values.size)
        return least(values, *args)

    lengths = sample_workload("default", 2560, 32, seed=7).sample_llm_length
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(search, "_least_per_group", counted)
        balance_microbatches(lengths, 2560, max_tokens_per_microbatch=16384, cost=MODELS["84b"].llm.cost(causal=True),
                             num_microbatches=16, pipeline=Pipeline(8, "1f1b"))
    assert sizes and sizes == [960, 128] * (len(sizes) // 2)  # before: [960, 960, 128] a round

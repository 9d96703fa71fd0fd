"""`auto` and its local searches: bounded work and memory on large inputs (issue 11), the SLACK
start and the exact pair/triple search for few items per rank (issue 14)."""

import itertools
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers import CostModel, balance, make_problem
from orchmllm.balancers.bounds import lower_bound
from orchmllm.balancers.kernels import auto, lpt, min_slack, slack
from orchmllm.balancers.problem import rank_loads, rank_tokens
from orchmllm.balancers.search import Improved, group_search, local_search
from orchmllm.benchmarks.pcmax_families import make_instance
from orchmllm.testing import brute_force


def makespan(problem, assignment):
    return float(rank_loads(problem, assignment).max())


def test_exchange_pairs_of_a_rank_with_many_items_are_windowed_not_all_built():
    # The cause of the 10^6-item OOM: every pair of a rank's 15 625 items (122 million) was built.
    many = np.arange(2000)
    _, first, second = local_search._subsets_upto_two(
        many, np.zeros(many.size, dtype=np.int64), None, local_search._pair_offsets(many.size))
    pairs = int(np.count_nonzero(second >= 0))
    assert many.size - 1 <= pairs <= local_search.MAX_PAIRS_PER_RANK + many.size
    assert np.all(first[second >= 0] < second[second >= 0])


def test_exchange_pairs_of_a_rank_with_few_items_are_all_built():
    few = np.arange(128)
    _, _, second = local_search._subsets_upto_two(
        few, np.zeros(few.size, dtype=np.int64), None, local_search._pair_offsets(few.size))
    assert int(np.count_nonzero(second >= 0)) == 128 * 127 // 2


def test_local_search_on_thousands_of_items_per_rank_stays_linear_in_memory():
    # 40 000 items on 4 ranks: all pairs would be 4 x 50 million candidates (gigabytes).
    lengths = np.random.default_rng(11).integers(1, 5000, 40_000)
    problem = make_problem(lengths, 4)
    start = lpt.solve(problem).assignment
    tracemalloc.start()
    try:
        improved = local_search.improve(problem, start).assignment
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20
    assert makespan(problem, improved) <= makespan(problem, start)


def test_work_budget_grows_with_n_and_is_a_count_not_a_clock():
    assert local_search.default_work(10**6) > local_search.default_work(10**5) >= local_search.DEFAULT_WORK
    lengths = np.random.default_rng(5).integers(1, 1000, 60_000)
    problem = make_problem(lengths, 16)
    first, second = auto.solve(problem).assignment, auto.solve(make_problem(lengths.copy(), 16)).assignment
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("seed", range(6))
def test_windowed_pairs_never_worsen_a_start_and_keep_the_cap(monkeypatch, seed):
    # A tiny pair budget puts small instances on the windowed path that large ones take.
    monkeypatch.setattr(local_search, "MAX_PAIRS_PER_RANK", 4)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 200, 90)
    start = rng.integers(0, 5, lengths.size)
    cap = int(rank_tokens(make_problem(lengths, 5), start).max()) + int(rng.integers(0, 50))
    problem = make_problem(lengths, 5, max_tokens_per_rank=cap)
    improved = local_search.improve(problem, start).assignment
    assert makespan(problem, improved) <= makespan(problem, start)
    assert rank_tokens(problem, improved).max() <= cap
    np.testing.assert_array_equal(improved, local_search.improve(problem, start.copy()).assignment)


# ------------------------------------------------- few items per rank (issue 14): SLACK, pair/triple search

def slack_reference(costs, num_ranks):
    """SLACK as the paper states it: LPT order, tuples of D (last padded with zeros), tuples by
    spread descending (stable), list scheduling to the least-loaded rank (ties by rank)."""
    order = sorted(range(len(costs)), key=lambda i: (-costs[i], i))
    tuples = [order[k:k + num_ranks] for k in range(0, len(order), num_ranks)]

    def spread(group):
        smallest = costs[group[-1]] if len(group) == num_ranks else 0.0
        return costs[group[0]] - smallest

    loads, assignment = [0.0] * num_ranks, [0] * len(costs)
    for group in sorted(tuples, key=lambda group: -spread(group)):
        for item in group:
            rank = min(range(num_ranks), key=lambda r: (loads[r], r))
            assignment[item] = rank
            loads[rank] += costs[item]
    return assignment


@given(lengths=st.lists(st.integers(0, 60), min_size=1, max_size=40), num_ranks=st.integers(1, 9))
def test_slack_is_the_papers_tuple_ordered_list_scheduling(lengths, num_ranks):
    problem = make_problem(lengths, num_ranks)
    assert slack.solve(problem).assignment.tolist() == slack_reference(problem.item_costs.tolist(), num_ranks)


@settings(max_examples=30)
@given(lengths=st.lists(st.integers(1, 40), min_size=2, max_size=7), num_ranks=st.integers(2, 3))
def test_slack_is_within_lpts_guarantee_of_the_optimum(lengths, num_ranks):
    problem = make_problem(lengths, num_ranks)
    optimum = brute_force(lengths, num_ranks).makespan
    assert makespan(problem, slack.solve(problem).assignment) <= (4 / 3 - 1 / (3 * num_ranks)) * optimum


@given(lengths=st.lists(st.integers(1, 60), min_size=2, max_size=30), num_ranks=st.integers(2, 8),
       seed=st.integers(0, 2**16), slack_tokens=st.none() | st.integers(0, 40),
       cost=st.sampled_from([CostModel(), CostModel(per_item=0.1, linear=0.3, quadratic=0.01)]))
def test_group_search_never_worsens_a_start_and_keeps_the_cap(lengths, num_ranks, seed, slack_tokens, cost):
    lengths = np.array(lengths)
    start = np.random.default_rng(seed).integers(0, num_ranks, lengths.size)
    cap = (None if slack_tokens is None
           else int(rank_tokens(make_problem(lengths, num_ranks), start).max()) + slack_tokens)
    problem = make_problem(lengths, num_ranks, cost=cost, max_tokens_per_rank=cap)
    improved, _ = group_search.improve(problem, start, 10**6)
    assert makespan(problem, improved) <= makespan(problem, start)
    assert cap is None or rank_tokens(problem, improved).max() <= cap
    np.testing.assert_array_equal(improved, group_search.improve(problem, start.copy(), 10**6)[0])


@settings(max_examples=25)
@given(lengths=st.lists(st.integers(1, 50), min_size=4, max_size=14), num_ranks=st.integers(2, 5),
       seed=st.integers(0, 2**16))
def test_group_search_leaves_no_pair_an_exact_resplit_would_lower(lengths, num_ranks, seed):
    problem = make_problem(lengths, num_ranks)
    start = np.random.default_rng(seed).integers(0, num_ranks, len(lengths))
    improved, spent = group_search.improve(problem, start, 10**9)
    loads = rank_loads(problem, improved)
    for a, b in itertools.combinations(range(num_ranks), 2):
        pool = np.flatnonzero((improved == a) | (improved == b))
        costs = problem.item_costs[pool]
        sums = [costs[list(keep)].sum() for size in range(pool.size + 1)
                for keep in itertools.combinations(range(pool.size), size)]
        best = min(max(s, costs.sum() - s) for s in sums)
        assert best >= max(loads[a], loads[b])


@settings(max_examples=30)
@given(lengths=st.lists(st.integers(1, 50), min_size=3, max_size=20), num_ranks=st.integers(2, 6),
       seed=st.integers(0, 2**16), slack_tokens=st.none() | st.integers(0, 30))
def test_group_search_cached_pair_splits_equal_splits_solved_afresh(lengths, num_ranks, seed, slack_tokens):
    # Pairs no move touched keep their cached re-split; after moves, the answer must be what a
    # fresh state (no cache) computes.
    rng = np.random.default_rng(seed)
    start = rng.integers(0, num_ranks, len(lengths))
    cap = (None if slack_tokens is None
           else int(rank_tokens(make_problem(lengths, num_ranks), start).max()) + slack_tokens)
    problem = make_problem(lengths, num_ranks, max_tokens_per_rank=cap)
    state = group_search._Ranks(problem, start)
    for _ in range(4):
        order = np.argsort(-state.loads, kind="stable")
        cached, _ = group_search._pair_moves(state, state.table()[0], order, group_search.MAX_QUERIES)
        fresh_state = group_search._Ranks(problem, state.assignment)
        fresh, _ = group_search._pair_moves(fresh_state, fresh_state.table()[0], order, group_search.MAX_QUERIES)
        assert (cached is None) == (fresh is None)
        for got, want in zip(cached or (), fresh or ()):
            np.testing.assert_array_equal(got, want)
        item = int(rng.integers(0, len(lengths)))
        source, target = int(state.assignment[item]), int(rng.integers(0, num_ranks))
        state.move((source, target) if source != target else (source,), [item], [target])


@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=16), num_ranks=st.integers(1, 5),
       seed=st.integers(0, 2**16))
def test_group_search_subset_table_holds_each_ranks_sorted_subset_sums(lengths, num_ranks, seed):
    assignment = np.random.default_rng(seed).integers(0, num_ranks, len(lengths))
    problem = make_problem(lengths, num_ranks, max_tokens_per_rank=sum(lengths))
    table, _ = group_search._Ranks(problem, assignment).table()
    for rank in range(num_ranks):
        items = table.items[table.item_start[rank]: table.item_start[rank] + int(table.size[rank]).bit_length() - 1]
        held = np.flatnonzero(assignment == rank)
        assert set(items.tolist()) <= set(held.tolist()) and items.size == min(held.size, group_search.MAX_SUBSET_ITEMS)
        segment = slice(table.start[rank], table.start[rank] + table.size[rank])
        sums = group_search.subset_sums(problem.item_costs[items])
        np.testing.assert_array_equal(table.sums[segment], sums[table.masks[segment]])
        np.testing.assert_array_equal(table.tokens[segment],
                                      group_search.subset_sums(problem.lengths[items])[table.masks[segment]])
        assert np.all(np.diff(table.sums[segment]) >= 0)


@given(segments=st.lists(st.lists(st.integers(0, 20), min_size=1, max_size=9).map(sorted), min_size=1, max_size=6),
       queries=st.lists(st.tuples(st.integers(0, 5), st.integers(-1, 21)), min_size=1, max_size=20))
def test_branch_free_lower_bound_equals_searchsorted_in_each_segment(segments, queries):
    values = np.concatenate([np.array(segment, dtype=float) for segment in segments])
    first = np.cumsum([0] + [len(segment) for segment in segments])[:-1]
    which = np.array([index % len(segments) for index, _ in queries])
    points = np.array([point for _, point in queries], dtype=float)
    got = group_search._lower_bound(values, first[which], np.array([len(segments[k]) for k in which]), points)
    want = [first[k] + np.searchsorted(segments[k], point) for k, point in zip(which, points)]
    assert got.tolist() == want


def test_group_search_charges_every_applied_pair_move_the_cause_of_the_slow_instances(monkeypatch):
    # uniform_1000 m40 n/m 2 (held-out seed 2) took 56 ms against a 50 ms target: the pair steps
    # applied ~200 re-splits (over all starts) whose bookkeeping (and the pair splits they void) was not charged,
    # so the budget bought twice the time it bought elsewhere.  Every step and move is charged now.
    times = make_instance("uniform_1000", 40, 2.0, seed=2).times
    problem = make_problem(times, 40)
    counted = {"steps": 0, "moves": 0}
    pair_moves, apply_pair = group_search._pair_moves, group_search._apply_pair

    def step(*args):
        counted["steps"] += 1
        return pair_moves(*args)

    def move(*args):
        counted["moves"] += 1
        return apply_pair(*args)

    monkeypatch.setattr(group_search, "_pair_moves", step)
    monkeypatch.setattr(group_search, "_apply_pair", move)
    _, spent = group_search.improve(problem, lpt.solve(problem).assignment, 10**9)
    assert counted["moves"] >= 40  # from the LPT start alone
    assert spent >= group_search._STEP_WORK * counted["steps"] + group_search._MOVE_WORK * counted["moves"]


def test_auto_proves_a_hard_family_instance_that_the_exchange_descent_left_one_above():
    # uniform U[1, 100], 60 items on 20 ranks: LPT/KK/MULTIFIT + exchange descent ended at 136;
    # the pair and triple search reaches 135 = ceil(total / D), so the plan is proven optimal.
    times = make_instance("uniform_100", 20, 3.0).times
    plan = balance(times, 20, algorithm="auto")
    assert plan.makespan == 135 == np.ceil(times.sum() / 20)


def test_auto_with_few_items_per_rank_is_bit_identical_across_calls():
    times = make_instance("uniform_10000", 30, 2.5).times
    first = balance(times, 30, algorithm="auto")
    assert first.digest() == balance(times.copy(), 30, algorithm="auto").digest()


@settings(max_examples=40)
@given(lengths=st.lists(st.integers(1, 60), min_size=2, max_size=8), num_ranks=st.integers(2, 4))
def test_lifted_bound_never_passes_the_brute_force_optimum(lengths, num_ranks):
    problem = make_problem(lengths, num_ranks)
    optimum = brute_force(lengths, num_ranks).makespan
    upper = int(makespan(problem, lpt.solve(problem).assignment))
    lower = int(np.ceil(np.sum(lengths) / num_ranks))
    assert lower <= auto.lifted_bound(np.array(lengths), num_ranks, min(lower, upper), upper) <= optimum


def test_auto_stops_at_the_l2_bound_above_the_mean_on_a_hard_family_instance():
    # U[1, 1000], 45 items on 20 ranks: the optimum 1419 is far above ceil(total / D) = 1343;
    # L2 proves 1419, so the search ends where the plan reaches it.
    times = make_instance("uniform_1000", 20, 2.25).times
    lower = int(np.ceil(times.sum() / 20))
    assert lower == 1343
    assert auto.lifted_bound(times, 20, lower, 1500) == 1419
    assert balance(times, 20, algorithm="auto").makespan == 1419


@given(costs=st.lists(st.integers(1, 30), min_size=1, max_size=10).map(sorted), num_ranks=st.integers(1, 4),
       room=st.integers(0, 40))
def test_min_slack_fills_each_rank_with_the_best_subset_beside_the_largest_item_left(costs, num_ranks, room):
    costs = np.array(costs[::-1])
    capacity = int(costs.max()) + room
    assignment = min_slack.pack(costs, num_ranks, capacity)
    assert assignment.shape == costs.shape and 0 <= assignment.min() and assignment.max() < num_ranks
    left = list(range(costs.size))
    for rank in range(num_ranks):  # rank r was filled from the items ranks < r left, or took leftovers only
        if not left:
            break
        first, rest = left[0], left[1:]
        best = max(sum(costs[list(keep)]) for size in range(len(rest) + 1)
                   for keep in itertools.combinations(rest, size) if sum(costs[list(keep)]) <= capacity - costs[first])
        held = [item for item in left if assignment[item] == rank]
        assert first in held
        assert costs[held].sum() >= costs[first] + best  # the fill, plus any leftovers it took later
        left = [item for item in left if assignment[item] != rank]


def test_min_slack_declines_packings_beyond_its_work_limits():
    assert min_slack.pack(np.full(100, 10**7), 10, 10**8) is None  # bitsets of 10^8 bits
    assert min_slack.pack(np.ones(1000, dtype=np.int64), 100, 10) is None  # 10^5 steps
    assert min_slack.pack(np.ones(100, dtype=np.int64), 100, 10) is not None


def test_auto_proves_a_hard_instance_only_the_min_slack_start_leads_to():
    # U[1, 100], 100 items on 40 ranks: from the LPT-like starts the pair and triple search
    # ended at 127; from a minimum-slack packing it reaches 126 = ceil(lower bound): optimal.
    times = make_instance("uniform_100", 40, 2.5).times
    assert np.ceil(lower_bound(make_problem(times, 40))) == 126
    assert balance(times, 40, algorithm="auto").makespan == 126


@pytest.mark.parametrize("improver", [local_search, group_search], ids=["local_search", "group_search"])
def test_the_improvers_share_one_signature_and_result(improver):
    """Issue 25: improve(problem, assignment, work_limit=None, target=-inf) -> Improved(assignment, work)
    for both; a target at the start's own makespan stops the search there."""
    problem = make_problem(np.array([9, 7, 6, 5, 4, 4, 3, 2]), 3)
    start = np.array([0, 0, 0, 1, 1, 1, 2, 2])
    result = improver.improve(problem, start)
    assert isinstance(result, Improved) and result.work > 0
    assert rank_loads(problem, result.assignment).max() < rank_loads(problem, start).max()
    stopped = improver.improve(problem, start, None, float(rank_loads(problem, start).max()))
    np.testing.assert_array_equal(stopped.assignment, start)


def test_regression_auto_ran_every_start_past_an_optimum_its_fractional_bound_hid(monkeypatch):
    """Cause (probe12 P12-06): `auto` stopped at a start only when it met the fractional bound Σ / D, so with integer
    costs and D not dividing the sum, an LPT plan at its ceiling (proven optimal, as `make_plan` rounds the bound)
    went on to Karmarkar–Karp and the local search over every item: 42x LPT's time for the same plan."""
    lengths = np.random.default_rng(3).integers(1, 8192, 5000)  # an odd sum: the bound is x.5
    problem = make_problem(lengths, 2)
    first = lpt.solve(problem).assignment
    assert makespan(problem, first) == np.ceil(lower_bound(problem)) > lower_bound(problem)

    def refused(*args, **kwargs):
        raise AssertionError("a start after one at the rounded-up bound ran")

    monkeypatch.setattr(auto.karmarkar_karp, "solve", refused)
    monkeypatch.setattr(auto.local_search, "improve", refused)
    plan = balance(lengths, 2)  # LPT's plan up to equal items (`auto` plans them in its canonical order)
    assert np.array_equal(rank_loads(problem, plan.assignment), rank_loads(problem, first))
    assert str(plan.status) == "optimal"

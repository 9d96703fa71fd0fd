"""Unpadded heuristics against independent references: heap LPT, dense KK, brute force."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers import CostModel, InfeasibleError, Status, balance, make_problem
from orchmllm.balancers.kernels import auto, karmarkar_karp, lpt, multifit
from orchmllm.balancers.kernels.reference import dense_kk, heap_lpt
from orchmllm.balancers.problem import rank_loads, rank_tokens
from orchmllm.balancers.search import group_search, local_search
from orchmllm.testing import brute_force, brute_force_of

COSTS = {
    "linear": CostModel(),
    "per_item_only": CostModel(per_item=1, linear=0),
    "quadratic": CostModel(per_item=3, linear=1, quadratic=0.5),
    "fractional": CostModel(per_item=0.1, linear=0.3, quadratic=0.01),
}
cost_models = st.sampled_from(list(COSTS.values()))
# Narrow ranges force ties between items and between rank loads.
tied_lengths = st.integers(1, 4).flatmap(
    lambda top: st.lists(st.integers(0, top), min_size=1, max_size=80))
any_lengths = st.one_of(tied_lengths, st.lists(st.integers(0, 1000), min_size=1, max_size=60))


def makespan(problem, assignment):
    return float(rank_loads(problem, assignment).max())


@given(lengths=any_lengths, num_ranks=st.integers(1, 12), cost=cost_models, repeat=st.integers(1, 8))
def test_fast_lpt_is_bit_identical_to_the_heap_loop(lengths, num_ranks, cost, repeat):
    """On few ranks (the heap loop itself) and, with `num_ranks + 32`, on the numpy rounds."""
    lengths = np.tile(lengths, repeat)
    num_ranks = num_ranks + (32 if repeat % 2 else 0)
    problem = make_problem(lengths, num_ranks, cost=cost)
    np.testing.assert_array_equal(lpt.greedy_unpadded(problem.item_costs, num_ranks),
                                  heap_lpt(problem.item_costs, num_ranks))


@given(loads=st.lists(st.integers(0, 6), min_size=1, max_size=60), count=st.integers(1, 60),
       scale=st.sampled_from([1.0, 0.1]))
def test_partial_selection_matches_the_full_order_with_ties(loads, count, scale):
    loads = np.array(loads) * scale
    count = min(count, loads.size)
    integer = scale == 1.0
    np.testing.assert_array_equal(lpt.smallest_ranks(loads, count, integer),
                                  lpt.ranks_by_load(loads, integer)[:count])


@pytest.mark.parametrize("zeros", [0, 500], ids=["no_zero_items", "many_zero_items"])
@pytest.mark.parametrize("num_ranks", [7, 33, 64, 300])  # below 32 ranks LPT is the heap loop itself
def test_fast_lpt_matches_the_heap_loop_on_larger_tied_instances(num_ranks, zeros):
    rng = np.random.default_rng(num_ranks + zeros)
    lengths = np.concatenate([rng.integers(1, 6, 20 * num_ranks), np.zeros(zeros, dtype=np.int64)])
    lengths = lengths[rng.permutation(lengths.size)]
    for cost in COSTS.values():
        problem = make_problem(lengths, num_ranks, cost=cost)
        np.testing.assert_array_equal(lpt.greedy_unpadded(problem.item_costs, num_ranks),
                                      heap_lpt(problem.item_costs, num_ranks))


# Large integer costs: FLOP counts and powers of two (int64 keys after dividing out the
# shared power of two), odd costs whose loads stay below 2**51 (keys), near 2**53 (float
# loads, still exact) and above 2**53 (float loads that round), each with and without ties.
LARGE_INTEGER_COSTS = {
    "flops": CostModel(linear=33177600000.0, quadratic=1728000.0),
    "power_of_two": CostModel(linear=2.0**40),
    "odd_below_2**51": CostModel(per_item=2.0**47 + 1, linear=3.0),
    "odd_near_2**53": CostModel(per_item=2.0**49 + 1, linear=3.0),
    "odd_above_2**53": CostModel(per_item=2.0**51 + 1, linear=3.0),
}


@pytest.mark.parametrize("cost", LARGE_INTEGER_COSTS.values(), ids=LARGE_INTEGER_COSTS.keys())
@pytest.mark.parametrize("num_ranks", [1, 3, 32, 33, 300])  # below 32 ranks LPT is the heap loop itself
def test_fast_lpt_matches_the_heap_loop_on_large_integer_costs(num_ranks, cost):
    rng = np.random.default_rng(num_ranks)
    for lengths in (rng.integers(1, 4000, 9 * num_ranks), rng.integers(1, 4, 9 * num_ranks)):
        problem = make_problem(lengths, num_ranks, cost=cost)
        np.testing.assert_array_equal(lpt.greedy_unpadded(problem.item_costs, num_ranks),
                                      heap_lpt(problem.item_costs, num_ranks))


@settings(max_examples=40)
@given(lengths=st.lists(st.integers(1, 30), min_size=1, max_size=7), num_ranks=st.integers(2, 3),
       cost=cost_models)
def test_lpt_is_within_graham_bound_of_the_optimum(lengths, num_ranks, cost):
    problem = make_problem(lengths, num_ranks, cost=cost)
    optimum = brute_force_of(problem).makespan
    ratio = 4 / 3 - 1 / (3 * num_ranks)
    assert makespan(problem, lpt.solve(problem).assignment) <= ratio * optimum * (1 + 1e-12)


@settings(max_examples=40)
@given(lengths=st.lists(st.integers(1, 30), min_size=2, max_size=7), cost=cost_models)
def test_two_way_kk_is_within_seven_sixths_of_the_optimum(lengths, cost):
    # Fischetti & Martello (1987): the differencing method is within 7/6 for two ranks.
    problem = make_problem(lengths, 2, cost=cost)
    optimum = brute_force_of(problem).makespan
    assert makespan(problem, karmarkar_karp.solve(problem).assignment) <= 7 / 6 * optimum * (1 + 1e-12)


@given(lengths=any_lengths, num_ranks=st.integers(2, 9), cost=cost_models)
def test_fast_kk_reaches_the_loads_of_dense_differencing(lengths, num_ranks, cost):
    problem = make_problem(lengths, num_ranks, cost=cost)
    loads = rank_loads(problem, karmarkar_karp.differencing(problem.item_costs, num_ranks))
    np.testing.assert_allclose(np.sort(loads), dense_kk(problem.item_costs, num_ranks), rtol=1e-12)


@pytest.mark.parametrize("num_ranks", [16, 100])
def test_fast_kk_matches_dense_differencing_on_wide_instances(num_ranks):
    rng = np.random.default_rng(num_ranks)
    for lengths in (rng.integers(1, 101, 3 * num_ranks), rng.integers(40, 44, 6 * num_ranks),
                    rng.lognormal(5, 0.3, 8 * num_ranks).astype(np.int64)):
        problem = make_problem(lengths, num_ranks)
        loads = rank_loads(problem, karmarkar_karp.differencing(problem.item_costs, num_ranks))
        np.testing.assert_array_equal(np.sort(loads), dense_kk(problem.item_costs, num_ranks))


@given(lengths=any_lengths, num_ranks=st.integers(1, 9), cost=cost_models)
def test_auto_is_never_worse_than_lpt_or_kk(lengths, num_ranks, cost):
    problem = make_problem(lengths, num_ranks, cost=cost)
    best = min(makespan(problem, lpt.solve(problem).assignment),
               makespan(problem, karmarkar_karp.solve(problem).assignment))
    assert makespan(problem, auto.solve(problem).assignment) <= best


@given(lengths=any_lengths, num_ranks=st.integers(1, 9), cost=cost_models)
def test_multifit_is_never_worse_than_lpt(lengths, num_ranks, cost):
    problem = make_problem(lengths, num_ranks, cost=cost)
    assert makespan(problem, multifit.solve(problem).assignment) <= makespan(problem, lpt.solve(problem).assignment)


@given(lengths=st.lists(st.integers(0, 100), min_size=1, max_size=60), num_ranks=st.integers(1, 9),
       capacity=st.integers(1, 400))
def test_packing_fills_at_most_d_bins_within_the_capacity(lengths, num_ranks, capacity):
    problem = make_problem(lengths, num_ranks)
    packed = multifit.pack(problem.item_costs, num_ranks, float(capacity))
    if sum(lengths) > num_ranks * capacity or max(lengths) > capacity:
        assert packed is None
    if packed is not None:
        assert packed.min() >= 0 and packed.max() < num_ranks
        assert rank_loads(problem, packed).max() <= capacity


def test_multifit_beats_lpt_with_few_items_per_rank():
    # Uniform lengths, 2.5 items per rank: LPT strands the D largest items on separate ranks.
    rng = np.random.default_rng(12)
    problem = make_problem(rng.integers(1, 101, 160), 64)
    assert makespan(problem, multifit.solve(problem).assignment) < makespan(problem, lpt.solve(problem).assignment)


@given(lengths=st.lists(st.integers(1, 60), min_size=2, max_size=40), num_ranks=st.integers(2, 8),
       seed=st.integers(0, 2**16), slack=st.integers(0, 40))
def test_local_search_never_worsens_a_start_and_keeps_the_cap(lengths, num_ranks, seed, slack):
    lengths = np.array(lengths)
    start = np.random.default_rng(seed).integers(0, num_ranks, lengths.size)
    loose = make_problem(lengths, num_ranks)
    cap = int(rank_tokens(loose, start).max()) + slack
    problem = make_problem(lengths, num_ranks, max_tokens_per_rank=cap)
    improved = local_search.improve(problem, start).assignment
    assert improved.shape == start.shape and improved.min() >= 0 and improved.max() < num_ranks
    assert makespan(problem, improved) <= makespan(problem, start)
    assert rank_tokens(problem, improved).max() <= cap
    np.testing.assert_array_equal(improved, local_search.improve(problem, start.copy()).assignment)


@settings(max_examples=30)
@given(costs=st.lists(st.integers(0, 50), min_size=1, max_size=7), ways=st.integers(2, 4),
       slack=st.none() | st.integers(0, 60))
def test_exact_split_matches_brute_force(costs, ways, slack):
    costs = np.array(costs)
    cap = None if slack is None else int(costs.max()) + slack
    optimum = brute_force(costs, ways, max_tokens_per_rank=cap)  # the costs are also the tokens
    value, labels = group_search.exact_split(costs.astype(float), costs, cap, ways)
    if not optimum.feasible:
        assert value == np.inf
        return
    assert value == optimum.makespan
    reached = np.bincount(labels, weights=costs, minlength=ways)
    assert reached.max() == value and (cap is None or reached.max() <= cap)


@pytest.mark.parametrize("name", ["lpt", "karmarkar_karp", "auto"])
def test_scaling_integer_lengths_keeps_the_assignment(name):
    rng = np.random.default_rng(9)
    lengths = rng.integers(1, 100, 60)
    plan = balance(lengths, 7, algorithm=name)
    scaled = balance(13 * lengths, 7, algorithm=name)
    np.testing.assert_array_equal(plan.assignment, scaled.assignment)
    assert scaled.makespan == 13 * plan.makespan


@pytest.mark.parametrize("name", ["lpt", "karmarkar_karp"])
def test_uncapped_plan_is_kept_when_the_cap_does_not_bind(name):
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 500, 90)
    plan = balance(lengths, 6, algorithm=name)
    capped = balance(lengths, 6, algorithm=name, max_tokens_per_rank=int(plan.tokens.max()))
    np.testing.assert_array_equal(plan.assignment, capped.assignment)


def capped_lpt_reference(problem, cap):
    """Largest cost first onto the least-loaded rank with room (ties by rank), by scanning."""
    loads = np.zeros(problem.num_ranks)
    tokens = np.zeros(problem.num_ranks, dtype=np.int64)
    assignment = np.empty(problem.num_items, dtype=np.int64)
    for item in sorted(range(problem.num_items), key=lambda i: (-problem.item_costs[i], i)):
        room = np.flatnonzero(tokens + problem.lengths[item] <= cap)
        if room.size == 0:
            return None
        rank = int(room[np.argmin(loads[room])])
        assignment[item] = rank
        loads[rank] += problem.item_costs[item]
        tokens[rank] += problem.lengths[item]
    return assignment


def padded_lpt_reference(problem, cap):
    """Longest first onto the rank whose padded cost grows least (ties by rank), by scanning."""
    counts = np.zeros(problem.num_ranks, dtype=np.int64)
    longest = np.zeros(problem.num_ranks, dtype=np.int64)
    assignment = np.empty(problem.num_items, dtype=np.int64)
    for item in sorted(range(problem.num_items), key=lambda i: (-problem.lengths[i], i)):
        new_longest = np.maximum(longest, problem.lengths[item])
        new_loads = (counts + 1) * problem.cost.item_costs(new_longest)
        fits = np.ones(problem.num_ranks, bool) if cap is None else (counts + 1) * new_longest <= cap
        if not fits.any():
            return None
        rank = int(np.argmin(np.where(fits, new_loads, np.inf)))
        assignment[item] = rank
        counts[rank] += 1
        longest[rank] = new_longest[rank]
    return assignment


@given(lengths=any_lengths, num_ranks=st.integers(1, 8), cost=cost_models, padded=st.booleans(),
       slack=st.integers(0, 200))
def test_capped_and_padded_lpt_match_scanning_references(lengths, num_ranks, cost, padded, slack):
    cap = max(1, max(lengths)) + slack
    try:
        problem = make_problem(lengths, num_ranks, cost=cost, padded=padded, max_tokens_per_rank=cap)
    except InfeasibleError:
        return
    reference = (padded_lpt_reference if padded else capped_lpt_reference)(problem, cap)
    if reference is None:
        with pytest.raises(InfeasibleError, match=f"under max_tokens_per_rank={cap}; lpt fits under a cap of"):
            lpt.solve(problem)
        return
    np.testing.assert_array_equal(lpt.solve(problem).assignment, reference)


def test_lpt_infeasible_cap_names_a_cap_at_which_it_fits():
    lengths = [6, 5, 5, 4]  # padded LPT: [6, 4] and [5, 5] hold 12 and 10 tokens
    with pytest.raises(InfeasibleError, match="lpt fits under a cap of 12.*algorithm='padded'") as caught:
        balance(lengths, 2, algorithm="lpt", max_tokens_per_rank=11, padded=True)
    assert caught.value.min_cap == 12
    assert balance(lengths, 2, algorithm="lpt", max_tokens_per_rank=12, padded=True).tokens.max() <= 12


@given(lengths=st.lists(st.integers(1, 50), min_size=2, max_size=40), num_ranks=st.integers(2, 6),
       slack=st.integers(0, 30))
def test_kk_keeps_its_plan_under_the_cap_or_falls_back_to_capped_lpt(lengths, num_ranks, slack):
    loose = make_problem(lengths, num_ranks)
    free = karmarkar_karp.differencing(loose.item_costs, num_ranks)
    cap = max(max(lengths), -(-sum(lengths) // num_ranks)) + slack
    problem = make_problem(lengths, num_ranks, max_tokens_per_rank=cap)
    if rank_tokens(problem, free).max() <= cap:
        np.testing.assert_array_equal(karmarkar_karp.solve(problem).assignment, free)
        return
    try:
        expected = lpt.solve(problem).assignment
    except InfeasibleError:
        with pytest.raises(InfeasibleError, match=f"max_tokens_per_rank={cap}"):
            karmarkar_karp.solve(problem)
        return
    np.testing.assert_array_equal(karmarkar_karp.solve(problem).assignment, expected)


def test_auto_meets_a_cap_that_defeats_both_greedy_starts():
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 500, 90)
    cap = int(balance(lengths, 6, algorithm="auto").tokens.max())
    with pytest.raises(InfeasibleError):
        balance(lengths, 6, algorithm="lpt", max_tokens_per_rank=cap)
    with pytest.raises(InfeasibleError):
        balance(lengths, 6, algorithm="karmarkar_karp", max_tokens_per_rank=cap)
    plan = balance(lengths, 6, algorithm="auto", max_tokens_per_rank=cap)
    assert plan.tokens.max() <= cap


def test_auto_is_exact_for_padded_problems():
    rng = np.random.default_rng(2)
    lengths = rng.integers(1, 200, 300)
    plan = balance(lengths, 9, padded=True, algorithm="auto")
    exact = balance(lengths, 9, padded=True, algorithm="padded")
    assert plan.makespan == exact.makespan and plan.status is Status.OPTIMAL


def test_auto_with_a_time_limit_proves_a_small_hard_instance():
    lengths = [30, 70, 32, 63, 34, 59, 37, 54, 39, 51, 39, 50, 41, 50, 42, 47]
    fast = balance(lengths, 8, algorithm="auto")
    plan = balance(lengths, 8, algorithm="auto", time_limit=30)
    assert plan.status is Status.OPTIMAL and plan.makespan <= fast.makespan


def test_single_item_and_single_rank():
    assert karmarkar_karp.differencing(np.array([5.0]), 3).tolist() == [0]
    plan = balance([4, 2, 9], 1, algorithm="karmarkar_karp")
    assert plan.assignment.tolist() == [0, 0, 0] and plan.status is Status.OPTIMAL


# The cost models whose loads LPT sums as integer keys (`lpt._greedy_by_keys`, where full rounds repeat).
KEYED_COSTS = {name: models[name] for models, names in ((COSTS, ("linear", "per_item_only")),
                                                        (LARGE_INTEGER_COSTS, ("flops", "power_of_two",
                                                                               "odd_below_2**51")))
               for name in names}


@pytest.mark.parametrize("cost", KEYED_COSTS.values(), ids=KEYED_COSTS.keys())
@pytest.mark.parametrize("num_ranks", [32, 33, 300])
def test_fast_lpt_repeats_full_rounds_of_equal_costs_like_the_heap_loop(num_ranks, cost):
    """Runs of equal costs spanning several full rounds (one step for all of them), between
    and after rounds that are not full."""
    rng = np.random.default_rng(num_ranks)
    lengths = np.concatenate([rng.integers(50, 60, num_ranks // 2), np.full(5 * num_ranks + 3, 40),
                              rng.integers(20, 40, num_ranks), np.full(3 * num_ranks, 7), [3, 2, 1]])
    lengths = lengths[rng.permutation(lengths.size)]
    problem = make_problem(lengths, num_ranks, cost=cost)
    np.testing.assert_array_equal(lpt.greedy_unpadded(problem.item_costs, num_ranks),
                                  heap_lpt(problem.item_costs, num_ranks))

"""balance_microbatches: invariants, bounds and optimality against brute force, metamorphic properties, bad input."""

import math

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from orchmllm import CostModel, InfeasibleError, MicroBatchPlan, Topology, balance_microbatches
from orchmllm.balancers import MICROBATCH_ALGORITHMS
from orchmllm.balancers.microbatch.api import PAYING_GAP
from orchmllm.balancers.microbatch.bounds import min_bins, min_microbatches
from orchmllm.study.microbatch_peers import MICROBATCH_PEERS
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload
from orchmllm.testing import brute_force_microbatches, check_microbatch_plan, fewest_microbatches

ALGORITHM_NAMES = sorted(MICROBATCH_ALGORITHMS)


def check_invariants(plan: MicroBatchPlan, lengths, num_ranks, budget, costs, padded=False):
    """`check_microbatch_plan` (certified: every item in one cell, cells exact and within T, step cost
    and status honest) and the global totals: unpadded cells hold every cost and token."""
    check_microbatch_plan(plan, lengths, num_ranks, budget, costs=costs, padded=padded)
    if not padded:
        assert math.isclose(plan.cell_loads.sum(), math.fsum(costs), rel_tol=1e-12)
        assert plan.cell_tokens.sum() == np.sum(lengths)


tiny = st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.lists(st.integers(1, 9), min_size=n, max_size=n), st.integers(1, 2), st.integers(9, 14)))


@pytest.mark.parametrize("algorithm", ALGORITHM_NAMES)
@given(case=tiny, padded=st.booleans())
def test_invariants_and_bound_against_brute_force(algorithm, case, padded):
    lengths, num_ranks, budget = case
    plan = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget, padded=padded,
                                algorithm=algorithm)
    costs = [float(x) for x in lengths]
    check_invariants(plan, lengths, num_ranks, budget, costs, padded)
    fewest = fewest_microbatches(lengths, num_ranks, budget, padded=padded)
    assert min_microbatches(np.array(lengths), num_ranks, budget) <= fewest <= plan.num_microbatches
    optimum = min(brute_force_microbatches(lengths, num_ranks, budget, m, costs=costs, padded=padded).step_cost
                  for m in range(fewest, plan.num_microbatches + 1))
    assert plan.lower_bound <= optimum <= plan.step_cost
    if str(plan.status) == "optimal":
        assert plan.step_cost == optimum


@given(case=tiny, padded=st.booleans(), extra=st.integers(0, 1))
def test_exact_is_optimal_for_a_given_num_microbatches(case, padded, extra):
    lengths, num_ranks, budget = case
    costs = [float(x) ** 2 for x in lengths]
    m = fewest_microbatches(lengths, num_ranks, budget, padded=padded) + extra
    plan = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget, costs=costs, padded=padded,
                                num_microbatches=m, algorithm="exact")
    optimum = brute_force_microbatches(lengths, num_ranks, budget, m, costs=costs, padded=padded)
    check_microbatch_plan(plan, lengths, num_ranks, budget, costs=costs, padded=padded, optimum=optimum)
    assert plan.num_microbatches == m
    assert str(plan.status) == "optimal"
    assert plan.step_cost == optimum.step_cost


@given(case=tiny, overhead=st.sampled_from([0.0, 1.0, 5.0]))
def test_free_num_microbatches_pays_for_the_overhead(case, overhead):
    lengths, num_ranks, budget = case
    plan = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget,
                                microbatch_overhead=overhead, algorithm="auto")
    fewest = fewest_microbatches(lengths, num_ranks, budget)
    totals = [brute_force_microbatches(lengths, num_ranks, budget, m, microbatch_overhead=overhead).step_cost
              for m in range(fewest, fewest + 3)]
    # the fewest micro-batches whose optimum is within PAYING_GAP of the cheapest
    chosen = next(k for k, total in enumerate(totals) if total <= min(totals) * (1 + PAYING_GAP))
    assert (plan.num_microbatches, plan.step_cost) == (fewest + chosen, totals[chosen])
    assert plan.lower_bound <= min(totals)


near_equal_costs = st.lists(st.integers(0, 2), min_size=5, max_size=5)  # 100 + these: ties between counts


@given(case=tiny, costs=near_equal_costs, overhead=st.sampled_from([0.0, 1.0, 5.0]))
@example(case=([2, 3, 6, 9], 2, 11), costs=[1, 2, 2, 1, 0], overhead=0.0)
def test_exact_with_free_num_microbatches_takes_the_least_step_cost(case, costs, overhead):
    lengths, num_ranks, budget = case
    costs = [100.0 + c for c in costs[:len(lengths)]]
    plan = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget, costs=costs,
                                microbatch_overhead=overhead, algorithm="exact")
    fewest = fewest_microbatches(lengths, num_ranks, budget)
    most = max(fewest, -(-len(lengths) // num_ranks))  # one item per cell
    totals = [brute_force_microbatches(lengths, num_ranks, budget, m, costs=costs,
                                       microbatch_overhead=overhead).step_cost for m in range(fewest, most + 1)]
    chosen = totals.index(min(totals))  # the fewest micro-batches on ties
    assert (plan.num_microbatches, plan.step_cost) == (fewest + chosen, totals[chosen])


def test_regression_exact_took_fewer_microbatches_at_a_known_higher_cost():
    """Cause: the PAYING_GAP preference for fewer micro-batches applied in exact mode, at zero
    overhead: T = 11 took M = 1 at 204 over M = 2 at 203, above T = 10's optimum."""
    plans = [balance_microbatches([2, 3, 6, 9], 2, costs=[101., 102., 102., 101.], algorithm="exact",
                                  max_tokens_per_microbatch=budget) for budget in (10, 11)]
    assert [(plan.num_microbatches, plan.step_cost, str(plan.status)) for plan in plans] == [(2, 203.0, "optimal")] * 2


@given(case=tiny, costs=near_equal_costs, raise_by=st.integers(1, 6), overhead=st.sampled_from([0.0, 1.0]))
@example(case=([2, 3, 6, 9], 2, 10), costs=[1, 2, 2, 1, 0], raise_by=1, overhead=0.0)
def test_raising_the_budget_never_raises_the_exact_optimum_over_num_microbatches(case, costs, raise_by, overhead):
    lengths, num_ranks, budget = case
    costs = [100.0 + c for c in costs[:len(lengths)]]
    low, high = (balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=t, costs=costs,
                                      microbatch_overhead=overhead, algorithm="exact")
                 for t in (budget, budget + raise_by))
    assert high.step_cost <= low.step_cost


@given(case=tiny, seed=st.integers(0, 2**16))
def test_permuting_the_items_keeps_the_optimum(case, seed):
    lengths, num_ranks, budget = case
    permuted = np.random.default_rng(seed).permutation(lengths)
    plans = [balance_microbatches(x, num_ranks, max_tokens_per_microbatch=budget, algorithm="exact")
             for x in (lengths, permuted)]
    assert plans[0].step_cost == plans[1].step_cost
    assert plans[0].num_microbatches == plans[1].num_microbatches


@given(case=tiny, raise_by=st.integers(1, 6))
def test_raising_the_budget_never_raises_the_optimum(case, raise_by):
    lengths, num_ranks, budget = case
    low = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget, algorithm="exact")
    high = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget + raise_by,
                                num_microbatches=low.num_microbatches, algorithm="exact")
    assert high.step_cost <= low.step_cost


def test_same_input_gives_the_bit_identical_plan():
    lengths = np.random.default_rng(3).integers(1, 4000, 300)
    plans = [balance_microbatches(lengths, 8, max_tokens_per_microbatch=8192, cost=CostModel(quadratic=1e-3))
             for _ in range(2)]
    assert plans[0].digest() == plans[1].digest()
    first, second = (dict(plan.to_json(), solve_seconds=None) for plan in plans)
    assert first == second


def test_realistic_mix_is_close_to_the_bound():
    lengths = np.random.default_rng(4).lognormal(6.5, 1.0, 512).astype(np.int64).clip(16, 6000)
    cost = CostModel(linear=4.2e11, quadratic=3.9e6)  # an 84B LLM's FLOPs per token and token pair
    plan = balance_microbatches(lengths, 8, max_tokens_per_microbatch=8192, cost=cost)
    check_invariants(plan, lengths, 8, 8192, cost.item_costs(lengths))
    assert plan.gap < 0.005
    assert plan.num_microbatches == min_microbatches(lengths, 8, 8192)


def test_communication_aware_mode_keeps_the_step_cost_and_moves_fewer_bytes():
    rng = np.random.default_rng(5)
    lengths = rng.integers(50, 3000, 256)
    sources = np.repeat(np.arange(16), 16)
    plain = balance_microbatches(lengths, 16, max_tokens_per_microbatch=8192)
    local = balance_microbatches(lengths, 16, max_tokens_per_microbatch=8192, sources=sources,
                                 topology=Topology(2, 8))
    check_invariants(local, lengths, 16, 8192, lengths.astype(float))
    assert local.algorithm == "auto+locality"
    assert local.num_microbatches == plain.num_microbatches
    assert np.all(local.cell_loads.max(axis=1) <= plain.cell_loads.max(axis=1))  # every micro-batch's max kept
    assert local.step_cost <= plain.step_cost
    moved = lambda plan: int(lengths[plan.rank != sources].sum())  # noqa: E731
    assert moved(local) < moved(plain)


def test_min_bins_counts_items_longer_than_half_the_budget():
    assert min_bins(np.array([6, 6, 6, 6, 1]), 10) == 4
    assert min_microbatches(np.array([6, 6, 6, 6, 1]), 2, 10) == 2


@pytest.mark.parametrize("budget, match", [(0, r"`max_tokens_per_microbatch` must be >= 1"),
                                           (-5, r"`max_tokens_per_microbatch` must be >= 1")])
def test_nonpositive_budget_is_rejected(budget, match):
    with pytest.raises(ValueError, match=match):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=budget)


def test_missing_or_non_int_budget_is_rejected():
    with pytest.raises(TypeError, match="`max_tokens_per_microbatch` is required"):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=None)
    with pytest.raises(TypeError, match="`max_tokens_per_microbatch` must be an int"):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=8.0)


def test_item_longer_than_the_budget_names_the_item_and_the_budget_needed():
    with pytest.raises(InfeasibleError, match=r"item 2 has 9000 tokens > max_tokens_per_microbatch=8192.*"
                                              r"at least 9000") as error:
        balance_microbatches([10, 20, 9000, 30], 2, max_tokens_per_microbatch=8192)
    assert error.value.min_cap == 9000


def test_too_few_microbatches_names_the_smallest_feasible_count():
    with pytest.raises(InfeasibleError, match=r"`num_microbatches`=1 is too few.*at least 2 micro-batches") as error:
        balance_microbatches([6, 6, 6, 6, 1], 2, max_tokens_per_microbatch=10, num_microbatches=1)
    assert error.value.min_cap == 2


@pytest.mark.parametrize("value, error, match", [
    (0, ValueError, "`num_microbatches` must be >= 1; got 0"),
    (-1, ValueError, "`num_microbatches` must be >= 1; got -1"),
    (2.0, TypeError, "`num_microbatches` must be an int or None; got float"),
    (True, TypeError, "`num_microbatches` must be an int or None; got bool"),
])
def test_num_microbatches_must_be_a_positive_int(value, error, match):
    with pytest.raises(error, match=match):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=8, num_microbatches=value)


def test_other_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"pass `cost` .* or `costs` .*, not both"):  # make_problem's rule and words
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=8, cost=CostModel(), costs=[1.0, 2.0])
    with pytest.raises(ValueError, match="`costs` must be finite and non-negative; got -1.0 at index 1"):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=8, costs=[1.0, -1.0])
    with pytest.raises(ValueError, match=r"`costs` must hold one cost per item"):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=8, costs=[1.0])
    with pytest.raises(ValueError, match="`microbatch_overhead` must be finite and >= 0"):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=8, microbatch_overhead=-1.0)
    with pytest.raises(ValueError, match="unknown `algorithm`"):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=8, algorithm="nope")
    with pytest.raises(ValueError, match="`topology` needs `sources`"):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=8, topology=Topology(1, 2))
    with pytest.raises(ValueError, match="`lengths` must be non-negative integers; got -3 at index 1"):
        balance_microbatches([1, -3], 2, max_tokens_per_microbatch=8)


def test_regression_overflowing_cost_models_reached_the_microbatch_kernels():
    """Cause: `make_microbatch_problem` took a model's costs unchecked (inf for quadratic 1e300),
    where `balance` rejects them; both now share `check_cost_range`."""
    with pytest.raises(ValueError, match=r"gives item 0 \(length 1000000\) the cost inf; costs must be finite"):
        balance_microbatches([10**6, 2], 2, max_tokens_per_microbatch=10**7, cost=CostModel(quadratic=1e300))
    with pytest.raises(ValueError, match=r"`costs`: the sum of the costs is .* at or beyond 2\*\*1023"):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=8, costs=[1.5e308, 1.5e308])


def test_regression_lpt_cells_found_no_room_at_the_fewest_microbatches():
    """Cause: on a token-tight mix (default workload, D = 64 x 16, T = 8k) the cell LPT and the
    joint greedy both left an item without room at M = 2, so the plan took M = 3 where
    sorted_grid's first-fit rows fit in 2.  The tight token packing (best-fit decreasing)
    now finds the room, and the search rebalances the costs."""
    batch = sample_workload("default", 64, 16, seed=12)
    lengths = batch.sample_llm_length
    cost = MODELS["84b"].llm.cost(causal=True)
    plan = balance_microbatches(lengths, 64, max_tokens_per_microbatch=8192, cost=cost)
    check_invariants(plan, lengths, 64, 8192, cost.item_costs(lengths))
    grid = MICROBATCH_PEERS["sorted_grid"](lengths, 64, max_tokens_per_microbatch=8192, cost=cost,
                                           sources=batch.sample_source)
    assert plan.num_microbatches == min_microbatches(lengths, 64, 8192) == grid.num_microbatches == 2
    assert plan.step_cost < grid.step_cost


def test_more_microbatches_are_taken_only_when_they_pay_more_than_the_paying_gap():
    """Cause: at D = 2560 x 16, T = 8k (vision mix) M = 5 was taken for a step cost 0.12 % below
    M = 4's, one micro-batch more than every peer."""
    batch = sample_workload("vision", 2560, 16, seed=80)
    lengths, cost = batch.sample_llm_length, MODELS["84b"].llm.cost(causal=True)
    plan = balance_microbatches(lengths, 2560, max_tokens_per_microbatch=8192, cost=cost)
    more = balance_microbatches(lengths, 2560, max_tokens_per_microbatch=8192, cost=cost, num_microbatches=5)
    assert plan.num_microbatches == 4 and plan.step_cost * (1 - PAYING_GAP) <= more.step_cost < plan.step_cost


def test_regression_pipeline_replica_times_with_sources_were_not_in_rank_order():
    """Cause (probe16 P16-08): with `sources`, the planned pipeline replicas are placed on ranks after their
    times were taken, and `replica_times` kept the planning order: entry r was not rank r's replica (24 of 149
    fuzzed plans).  Entry r is now the event simulation of the cells the plan puts on rank r."""
    from orchmllm import Pipeline
    from orchmllm.testing.pipeline import replica_step

    pipeline, moved = Pipeline(stages=2), 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        lengths = rng.integers(1, 3000, 32)
        lengths[:2] *= 6
        plan = balance_microbatches(lengths, 4, max_tokens_per_microbatch=20000, pipeline=pipeline,
                                    sources=np.repeat(np.arange(4), 8), item_bytes=lengths * 10,
                                    topology=Topology(2, 2))
        cells = np.asarray(plan.cell_loads)  # (M, D)
        simulated = [replica_step(pipeline, cells[:, rank]) for rank in range(4)]
        np.testing.assert_allclose(plan.pipeline.replica_times, simulated, rtol=1e-12)
        moved += not np.allclose(np.sort(simulated), simulated)
    assert moved  # some plans' replica times are not sorted by rank: the check can tell orders apart

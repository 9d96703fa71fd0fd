"""The context-parallel spec, its time model, the canonical bound, and `balance(..., context_parallel=)`'s
identity with today's plans and its errors."""

import math
import warnings
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import orchmllm
from orchmllm import ContextParallel, CostModel, InfeasibleError, Topology, balance, balance_microbatches
from orchmllm.balancers.context_parallel.bound import Allotment, least_work, smallest_fitting
from orchmllm.balancers.problem import exact_sum
from orchmllm.study.workloads import llm_stage_lengths
from orchmllm.testing.context_parallel import check_split_plan

FLOPS = CostModel(linear=4.26e11, quadratic=3.9e6)  # an 84B-sized LLM's FLOPs per sequence


def test_exported_from_the_top_level():
    assert orchmllm.ContextParallel is ContextParallel


@pytest.mark.parametrize("kwargs, error, match", [
    ({"degrees": (1, 3)}, ValueError, r"`degrees` must be powers of two .*got 3"),
    ({"degrees": (0, 1)}, ValueError, r"`degrees` must be powers of two .*got 0"),
    ({"degrees": ()}, ValueError, r"`degrees` must hold at least one degree"),
    ({"degrees": (1, 2, 2)}, ValueError, r"`degrees` must be distinct"),
    ({"degrees": (1, 2.0)}, TypeError, r"`degrees` must hold ints"),
    ({"degrees": 4}, TypeError, r"`degrees` must be a sequence of ints"),
    ({"gpus_per_node": 0}, ValueError, r"`gpus_per_node` must be >= 1"),
    ({"latency_s": -1e-6}, ValueError, r"`latency_s` must be finite and >= 0"),
    ({"kv_bytes_per_token": math.nan}, ValueError, r"`kv_bytes_per_token` must be finite"),
    ({"intra_node_bw_bytes_per_s": math.inf}, ValueError, r"`intra_node_bw_bytes_per_s` must be finite and > 0"),
    ({"seconds_per_cost": 0.0}, ValueError, r"`seconds_per_cost` must be finite and > 0"),
    ({"overlap": 1.5}, ValueError, r"`overlap` must be in \[0, 1\]"),
    ({"inter_node_bw_bytes_per_s": 900e9}, ValueError, r"`inter_node_bw_bytes_per_s` .* must not exceed"),
    ({"allow_inter_node": 1}, TypeError, r"`allow_inter_node` must be a bool"),
    ({"num_layers": 2.5}, TypeError, r"`num_layers` must be an int"),
])
def test_spec_rejects_bad_parameters(kwargs, error, match):
    with pytest.raises(error, match=match):
        ContextParallel(**kwargs)


def test_regression_degrees_without_one_split_every_item_silently():
    """P4-14: `degrees=(2, 4)` split all 128 items (24 % above not splitting) and said nothing: a user listing
    the degrees to split at need not know that leaving out 1 forbids keeping an item whole."""
    with pytest.warns(UserWarning, match=r"`degrees` \(2, 4\) leave out 1: every item will be split.*include 1"):
        spec = ContextParallel(degrees=(4, 2))
    assert spec.degrees == (2, 4)  # still allowed: static context parallelism, when meant
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert spec.on(Topology(1, 4)).degrees == (2, 4)  # once: not again when put on a topology


def test_spec_is_frozen_and_canonical():
    spec = ContextParallel(degrees=[8, 1, 2])
    assert spec.degrees == (1, 2, 8)
    with pytest.raises(AttributeError):
        spec.degrees = (1,)


def test_time_of_degree_one_is_the_unsplit_cost_exactly():
    lengths = np.array([0, 1, 17, 4096, 262144])
    assert np.array_equal(ContextParallel().time(FLOPS, lengths, 1), FLOPS.item_costs(lengths))


def test_time_is_vectorised_over_degrees_and_placement():
    spec = ContextParallel()
    times = spec.time(FLOPS, [32768, 32768, 32768], [2, 4, 8], within_node=[True, True, False])
    single = [spec.time(FLOPS, [32768], c, within_node=w)[0] for c, w in ((2, True), (4, True), (8, False))]
    assert times.tolist() == single
    assert spec.time(FLOPS, [32768], 8, within_node=False)[0] >= spec.time(FLOPS, [32768], 8)[0]


@pytest.mark.parametrize("degree, error, match", [(0, ValueError, r"`degree` must be at least 1"),
                                                  (2.0, TypeError, r"`degree` must be a positive int")])
def test_time_rejects_bad_degrees(degree, error, match):
    with pytest.raises(error, match=match):
        ContextParallel().time(FLOPS, [10], degree)


@given(lengths=st.lists(st.integers(0, 2**20), min_size=1, max_size=8),
       quadratic=st.sampled_from([0.0, 1.0, 3.9e6]), overlap=st.floats(0, 1),
       half=st.floats(0, 4096), latency=st.floats(0, 1e-3), kv=st.floats(0, 1e6), inside=st.booleans())
def test_work_never_falls_with_the_degree(lengths, quadratic, overlap, half, latency, kv, inside):
    """c · t(c) is non-decreasing in c (the bound's premise), for every length and parameter."""
    spec = ContextParallel(degrees=(1, 2, 4, 8, 16, 32), overlap=overlap, half_efficiency_tokens=half,
                           latency_s=latency, kv_bytes_per_token=kv)
    cost = CostModel(linear=4.26e11, quadratic=quadratic)
    degrees = np.array(spec.degrees)
    work = spec.time(cost, np.repeat(lengths, degrees.size), np.tile(degrees, len(lengths)),
                     within_node=inside).reshape(len(lengths), -1) * degrees
    assert np.all(np.diff(work, axis=1) >= -1e-12 * work[:, 1:])


def _naive_bound(costs, candidates, times, degrees, allowed, num_ranks):
    """The bound by its definition: the least feasible max(b, W(b) / D) over every item time b."""
    least = least_work(times, degrees, allowed)
    others = np.delete(costs, candidates)
    best = math.inf
    for point in sorted(set(times[allowed].tolist()) | set(others.tolist())):
        index = smallest_fitting(times, allowed, point)
        if index.min(initial=0) < 0 or others.max(initial=0.0) > point:
            continue
        value = max(point, math.fsum(np.concatenate((others, least[np.arange(index.size), index]))) / num_ranks)
        index = smallest_fitting(times, allowed, value)
        work = math.fsum(np.concatenate((others, least[np.arange(index.size), index])))
        if work <= num_ranks * value * (1 + 1e-12):
            best = min(best, value)
    return best


@given(data=st.data(), num_ranks=st.integers(1, 9), columns=st.integers(1, 4))
def test_bound_is_the_least_feasible_target(data, num_ranks, columns):
    costs = np.array(data.draw(st.lists(st.integers(1, 60), min_size=1, max_size=8)), dtype=np.float64)
    candidates = np.flatnonzero(costs > costs.sum() / num_ranks)
    degrees = 2 ** np.arange(columns)
    shrink = np.array(data.draw(st.lists(st.floats(1.0, 1.6), min_size=candidates.size * columns,
                                         max_size=candidates.size * columns))).reshape(-1, columns)
    times = costs[candidates][:, None] / degrees * shrink
    times[:, 0] = costs[candidates]
    allowed = np.ones(times.shape, dtype=bool)
    bound = Allotment(costs, degrees, candidates, times, allowed, num_ranks).bound()
    assert bound == pytest.approx(_naive_bound(costs, candidates, times, degrees, allowed, num_ranks), rel=1e-12)


@given(costs=st.lists(st.floats(0, 1e17), min_size=1, max_size=30), num_ranks=st.integers(1, 64))
def test_bound_without_splitting_is_todays_exactly(costs, num_ranks):
    costs = np.array(costs)
    candidates = np.flatnonzero(costs > exact_sum(costs) / num_ranks)
    allotment = Allotment(costs, np.array([1]), candidates, costs[candidates][:, None],
                          np.ones((candidates.size, 1), dtype=bool), num_ranks)
    assert allotment.bound() == max(exact_sum(costs) / num_ranks, costs.max())


def _plans(lengths, num_ranks, **kwargs):
    return balance(lengths, num_ranks, **kwargs), balance(lengths, num_ranks, context_parallel=ContextParallel(
        degrees=(1,)), **kwargs)


@pytest.mark.parametrize("algorithm", ["auto", "lpt", "karmarkar_karp", "identity"])
@pytest.mark.parametrize("num_ranks, per_rank", [(8, 4), (64, 16), (256, 8)])
def test_degree_one_is_todays_plan_bit_for_bit(algorithm, num_ranks, per_rank):
    lengths, _ = llm_stage_lengths(num_ranks, per_rank, seed=num_ranks)
    plain, split = _plans(lengths, num_ranks, cost=FLOPS, algorithm=algorithm)
    assert split.digest() == plain.digest()
    assert np.array_equal(split.loads, plain.loads) and np.array_equal(split.tokens, plain.tokens)
    assert (split.makespan, split.lower_bound, split.status, split.algorithm) == \
        (plain.makespan, plain.lower_bound, plain.status, plain.algorithm)
    assert split.degree.tolist() == [1] * lengths.size and np.array_equal(split.item_time, FLOPS.item_costs(lengths))


@pytest.mark.parametrize("num_ranks, per_rank, seed", [(16, 8, 0), (64, 16, 1), (512, 8, 2), (512, 32, 3)])
def test_without_giants_the_plan_is_todays(num_ranks, per_rank, seed):
    lengths, _ = llm_stage_lengths(num_ranks, per_rank, seed=seed)
    plan = balance(lengths, num_ranks, cost=FLOPS, context_parallel=ContextParallel())
    plain = balance(lengths, num_ranks, cost=FLOPS)
    assert plan.digest() == plain.digest() and not plan.split_items.size
    assert plan.lower_bound <= plain.lower_bound  # valid for plans that may split: never above today's


def test_a_giant_is_split_and_the_plan_certified():
    lengths = np.array([131072] + [2048] * 255)
    plan = balance(lengths, 64, cost=FLOPS, context_parallel=ContextParallel())
    plain = balance(lengths, 64, cost=FLOPS)
    assert plan.degree[0] > 1 and plan.split_items.tolist() == [0]
    assert plan.makespan < 0.5 * plain.makespan and plan.lower_bound <= plan.makespan
    ranks = plan.item_ranks(0)
    assert ranks.tolist() == list(range(ranks[0], ranks[0] + plan.degree[0])) and ranks[0] % plan.degree[0] == 0
    assert all(0 in plan.items_of(int(rank)).tolist() for rank in ranks)
    assert plan.loads.sum() == pytest.approx(plan.degree @ plan.item_time)
    assert plan.digest() != plain.digest() and plan.digest() == balance(
        lengths, 64, cost=FLOPS, context_parallel=ContextParallel()).digest()


def test_token_budget_no_degree_meets_names_the_item_and_what_works():
    with pytest.raises(InfeasibleError, match=r"item 1 \(100000 tokens\) fits max_tokens_per_rank=20000 at no "
                                              r"allowed degree \(1, 2, 4\): degree 4 puts 25000 tokens on a rank; "
                                              r"it needs degree 8 or a budget of at least 25000") as error:
        balance([10, 100000, 10], 8, context_parallel=ContextParallel(degrees=(1, 2, 4)), max_tokens_per_rank=20000)
    assert error.value.min_cap == 25000


def test_token_budget_below_the_total_is_refused():
    with pytest.raises(InfeasibleError, match=r"8 ranks = 80 tokens < 800 tokens in total; a cap of at least 100"):
        balance([400, 400], 8, context_parallel=ContextParallel(), max_tokens_per_rank=10)


def test_a_budget_only_splitting_meets_is_met_by_splitting():
    plan = balance([60000, 1000, 1000], 8, cost=FLOPS, context_parallel=ContextParallel(), max_tokens_per_rank=16000)
    assert plan.degree[0] >= 4 and plan.tokens.max() <= 16000


@pytest.mark.parametrize("degrees, kwargs, match", [
    ((1, 2, 4, 8), {}, r"`context_parallel.degrees` \(1, 2, 4, 8\), the default, holds 8 > num_ranks 4"),
    ((1, 2, 4), {"gpus_per_node": 2}, r"holds 4 > 2 gpus per node; groups stay inside a node unless "
                                      r"`allow_inter_node=True`"),
])
def test_degrees_the_ranks_cannot_hold_are_refused(degrees, kwargs, match):
    with pytest.raises(ValueError, match=match):
        balance([1, 2, 3], 4, context_parallel=ContextParallel(degrees=degrees, **kwargs))


@pytest.mark.parametrize("call", [
    lambda spec: balance([60000] + [900] * 20, 4, cost=FLOPS, context_parallel=spec),
    lambda spec: balance([60000] + [900] * 20, 16, cost=FLOPS, context_parallel=spec,
                         topology=Topology(num_nodes=4, gpus_per_node=4)),
    lambda spec: balance_microbatches([60000] + [900] * 20, 4, cost=FLOPS, max_tokens_per_microbatch=60000,
                                      context_parallel=spec),
])
def test_the_default_degrees_refused_by_a_small_job_are_named_with_the_degrees_that_fit(call):
    """probe18 P18-11: `ContextParallel()` on 4 ranks (or 4 GPUs a node) blamed `degrees` the user never set; the
    refusal now says they are the default and what to pass, and what it suggests plans the job."""
    with pytest.raises(ValueError, match=r"`context_parallel.degrees` \(1, 2, 4, 8\), the default, holds 8 > .*; "
                                         r"pass degrees=\(1, 2, 4\) for this job, keeping the spec.s other settings$"):
        call(ContextParallel())
    assert call(ContextParallel(degrees=(1, 2, 4))).degree.max() == 4
    with pytest.raises(ValueError, match=r"`context_parallel.degrees` holds 4 > num_ranks 2: .*; pass "
                                         r"degrees=\(1, 2\) for this job, keeping the spec.s other settings$"):
        balance([1, 2, 3], 2, context_parallel=ContextParallel(degrees=(1, 2, 4)))  # explicit: no word of a default


@pytest.mark.parametrize("gpus_per_node, num_ranks", [(3, 6), (5, 10), (6, 12)])
def test_a_degree_that_does_not_divide_the_node_keeps_its_groups_inside_nodes(gpus_per_node, num_ranks):
    """probe15 P15-03: nodes of 3 or 5 GPUs took degree 2, and aligned blocks of 2 straddle two nodes there;
    the plan then failed the planner's own certificate ("put a group across nodes", a RuntimeError).  Such
    degrees were then refused (P15-03's fix); since probe20 P20-14 they plan on the blocks inside nodes."""
    lengths = [900, 800, 700, 600, 500, 450] + [20] * (4 * num_ranks)
    on_topology = ContextParallel(degrees=(1, 2, 4) if gpus_per_node > 3 else (1, 2), half_efficiency_tokens=1,
                                  kv_bytes_per_token=0, seconds_per_cost=1.0)  # 4 is wider than 3
    spec = replace(on_topology, gpus_per_node=gpus_per_node, latency_s=0)
    plan = balance(lengths, num_ranks, context_parallel=spec)
    check_split_plan(plan, lengths, num_ranks, spec)
    assert plan.degree.max() > 1
    micro = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=500, context_parallel=spec)
    for m, laid in enumerate(micro.passes or ()):
        items = np.flatnonzero(micro.microbatch == m)
        check_split_plan(laid, np.array(lengths)[items], num_ranks, spec, max_tokens_per_rank=500)
    topology = Topology(num_nodes=num_ranks // gpus_per_node, gpus_per_node=gpus_per_node)
    plan = balance(lengths, num_ranks, context_parallel=on_topology, topology=topology)
    assert plan.context_parallel.gpus_per_node == gpus_per_node  # and the topology's links
    check_split_plan(plan, lengths, num_ranks, plan.context_parallel)
    crossing = ContextParallel(degrees=(1, 2, 4), gpus_per_node=gpus_per_node, allow_inter_node=True,
                               half_efficiency_tokens=1, latency_s=0, kv_bytes_per_token=0, seconds_per_cost=1.0)
    assert balance(lengths, num_ranks, context_parallel=crossing).degree.max() > 1  # P15-18: the flag lifts the rule
    assert balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=500,
                                context_parallel=crossing).degree.max() > 1
    one_node = replace(crossing, degrees=(1, 2), allow_inter_node=False)  # one node: no block of 2 straddles two
    assert balance([5000] + [10] * gpus_per_node, gpus_per_node, context_parallel=one_node).degree[0] == 2


@pytest.mark.parametrize("option", [{"costs": [1.0, 2.0]}, {"padded": True}, {"equal_counts": True},
                                    {"groups": [0, 0]}, {"sources": [0, 1]}])
def test_options_splitting_cannot_combine_with_are_refused(option):
    with pytest.raises(ValueError, match=f"`{next(iter(option))}` cannot be combined with `context_parallel`"):
        balance([3, 4], 2, context_parallel=ContextParallel(degrees=(1, 2)), **option)


def test_context_parallel_must_be_a_spec():
    with pytest.raises(TypeError, match=r"`context_parallel` must be a ContextParallel; got tuple"):
        balance([3, 4], 2, context_parallel=(1, 2))


def test_topology_gives_the_node_size_and_links():
    from orchmllm import Topology
    lengths = [65536] + [512] * 63
    plan = balance(lengths, 16, cost=FLOPS, context_parallel=ContextParallel(degrees=(1, 2, 4)),
                   topology=Topology(num_nodes=4, gpus_per_node=4, intra_node_bw_bytes_per_s=100e9))
    assert plan.context_parallel.gpus_per_node == 4 and plan.context_parallel.intra_node_bw_bytes_per_s == 100e9
    with pytest.raises(ValueError, match=r"4 nodes × 4 gpus = 16 != num_ranks 8"):
        balance(lengths, 8, cost=FLOPS, context_parallel=ContextParallel(degrees=(1, 2, 4)),
                topology=Topology(num_nodes=4, gpus_per_node=4))


def _quiet_spec(**options):
    return ContextParallel(half_efficiency_tokens=1, latency_s=0, kv_bytes_per_token=0, seconds_per_cost=1.0, **options)


@pytest.mark.parametrize("rank_of_group", [[1, 0, 2, 3], [3, 2, 1, 0]])
def test_regression_on_ranks_moved_a_split_item_s_first_rank_alone(rank_of_group):
    """`on_ranks` mapped each item's first rank and permuted loads as if no item were split: item 0 of group
    [0, 1] landed on [3, 4] of 4 ranks, or on the misaligned [1, 2] with loads on ranks holding none of it."""
    plan = balance([40, 5, 5, 6], 4, context_parallel=_quiet_spec(degrees=(1, 2), gpus_per_node=4))
    assert plan.item_ranks(0).tolist() == [0, 1]
    with pytest.raises(ValueError, match=r"`rank_of_group` would move split item 0's group \[0, 1\] onto ranks"):
        plan.on_ranks(rank_of_group)


def test_on_ranks_of_a_split_plan_moves_whole_groups():
    plan = balance([40, 5, 5, 6], 4, context_parallel=_quiet_spec(degrees=(1, 2), gpus_per_node=4))
    moved = plan.on_ranks([2, 3, 0, 1])
    assert moved.item_ranks(0).tolist() == [2, 3] and moved.loads.tolist() == plan.loads[[2, 3, 0, 1]].tolist()
    for rank in range(4):
        assert all(rank in moved.item_ranks(item) for item in moved.items_of(rank))


def test_regression_items_of_a_split_microbatch_plan_left_out_shards_on_the_group_s_other_ranks():
    """`SplitMicroBatchPlan` inherited `MicroBatchPlan.items_of` (rank == r: the group's first rank only), so
    rank 1 skipped its shards of items 0 and 3 (README's gradient accumulation loop selects work with it)."""
    plan = balance_microbatches([40, 5, 5, 4], 2, max_tokens_per_microbatch=30,
                                context_parallel=_quiet_spec(degrees=(1, 2)))
    assert plan.split_items.size
    for m in range(plan.num_microbatches):
        for rank in range(2):
            held = [item for item in range(plan.num_items)
                    if plan.microbatch[item] == m and rank in plan.item_ranks(item)]
            assert plan.items_of(rank, m).tolist() == held

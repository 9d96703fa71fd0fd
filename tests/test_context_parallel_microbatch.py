"""The split micro-batch planner's bound against brute force on tiny instances, its regressions, and
giant-heavy micro-batches against it."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from orchmllm import ContextParallel, CostModel, InfeasibleError, balance_microbatches
from orchmllm.balancers import Status
from orchmllm.balancers.context_parallel.microbatch import split_bound
from orchmllm.balancers.context_parallel.pairing import packable_degrees
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import llm_stage_lengths
from orchmllm.testing.context_parallel import brute_force_split_microbatches


@st.composite
def tiny_microbatches(draw):
    """(lengths, D, spec, cost, budget, overhead): up to 3 items on 1, 2 or 4 ranks, budgets from the
    longest shard up, splitting from free to dear."""
    num_ranks = draw(st.sampled_from([1, 2, 4]))
    degrees = [1] + [c for c in (2, 4) if c <= num_ranks and draw(st.booleans())]
    spec = ContextParallel(degrees=degrees, gpus_per_node=4, seconds_per_cost=1.0, kv_bytes_per_token=0.0,
                           latency_s=draw(st.sampled_from([0.0, 1e-3])),
                           half_efficiency_tokens=draw(st.sampled_from([0.0, 4.0])))
    lengths = draw(st.lists(st.one_of(st.integers(1, 12), st.integers(20, 90)), min_size=1, max_size=3))
    budget = draw(st.integers(-(-max(lengths) // degrees[-1]), max(1, sum(lengths))))
    cost = CostModel(linear=1.0, quadratic=draw(st.sampled_from([0.0, 0.05])))
    return np.array(lengths), num_ranks, spec, cost, budget, draw(st.sampled_from([0.0, 5.0]))


@settings(max_examples=100, deadline=None)
@given(case=tiny_microbatches())
def test_bound_is_at_most_the_brute_force_optimum(case):
    lengths, num_ranks, spec, cost, budget, overhead = case
    bound = split_bound(lengths, num_ranks, spec, cost, budget, overhead, None)[0]
    optimum = brute_force_split_microbatches(lengths, num_ranks, spec, max_tokens_per_microbatch=budget,
                                             num_microbatches=range(1, lengths.size + 1), cost=cost,
                                             microbatch_overhead=overhead)
    assert optimum.makespan is not None and bound <= optimum.makespan * (1 + 1e-12)


@st.composite
def shared_group_microbatches(draw):
    """(lengths, D, spec, cost, budget, overhead, M): 3-4 items on 4 or 8 ranks, most longer than the budget
    (they must split), the first up to the widest degree's budget: room for the longest item's group and a
    block that split items share beside it, which `tiny_microbatches` cannot hold (review7 R7-05)."""
    num_ranks = draw(st.sampled_from([4, 8]))
    degrees = [1] + [c for c in (2, 4, 8) if c <= num_ranks and draw(st.booleans())]
    spec = ContextParallel(degrees=degrees, gpus_per_node=8, seconds_per_cost=1.0, kv_bytes_per_token=0.0,
                           latency_s=draw(st.sampled_from([0.0, 1e-3])),
                           half_efficiency_tokens=draw(st.sampled_from([0.0, 4.0])))
    budget = draw(st.integers(6, 15))
    rest = draw(st.lists(st.one_of(st.integers(budget + 1, 3 * budget - 1), st.integers(1, budget)),
                         min_size=2, max_size=3))
    first = draw(st.integers(2 * budget, max(2 * budget, degrees[-1] * budget)))
    lengths = np.array([first, *rest])
    assume(all(-(-length // degrees[-1]) <= budget for length in lengths))
    cost = CostModel(linear=1.0, quadratic=draw(st.sampled_from([0.0, 0.05])))
    return lengths, num_ranks, spec, cost, budget, draw(st.sampled_from([0.0, 5.0])), draw(st.integers(1, 2))


@settings(max_examples=40, deadline=None)
@given(case=shared_group_microbatches())
def test_bound_is_at_most_the_optimum_where_split_items_share_a_group(case):
    lengths, num_ranks, spec, cost, budget, overhead, count = case
    bound = split_bound(lengths, num_ranks, spec, cost, budget, overhead, count)[0]
    try:
        optimum = brute_force_split_microbatches(lengths, num_ranks, spec, max_tokens_per_microbatch=budget,
                                                 num_microbatches=count, cost=cost, microbatch_overhead=overhead)
    except ValueError:  # no plan in `count` micro-batches
        assume(False)
    assume(optimum.makespan is not None)
    assert bound <= optimum.makespan * (1 + 1e-12)


def test_regression_the_bound_was_above_the_optimum_where_split_items_share_a_group():
    """review7 R7-05 (3abbec9): 3.875 against the optimum 3.5, all three items split in 4 in one micro-batch on 8
    ranks.  The property above was written for it but, with today's Hypothesis (6.155), reaches it only at its
    79th example (its shrunk counterexample is this instance): this pins it."""
    spec = ContextParallel(degrees=(1, 4), gpus_per_node=8, seconds_per_cost=1.0, kv_bytes_per_token=0.0,
                           latency_s=0.0, half_efficiency_tokens=0.0)
    lengths = np.array([12, 7, 7])
    bound = split_bound(lengths, 8, spec, CostModel(linear=1.0), 6, 0.0, 1)[0]
    optimum = brute_force_split_microbatches(lengths, 8, spec, max_tokens_per_microbatch=6, num_microbatches=1,
                                             cost=CostModel(linear=1.0))
    assert optimum.makespan == 3.5 and bound <= optimum.makespan * (1 + 1e-12), bound


def test_bound_counts_shards_that_hold_a_rank_alone():
    """Three items that fit the budget only split in two, every shard over half the budget: six ranks
    held alone, so two micro-batches each costing one of them at least (the bound was 141.5 before,
    from the work and the tokens alone; the optimum is 191.1)."""
    spec = ContextParallel(degrees=(1, 2), gpus_per_node=4, seconds_per_cost=1.0, latency_s=0.0,
                           half_efficiency_tokens=4.0, kv_bytes_per_token=0.0)
    cost = CostModel(linear=1.0, quadratic=0.05)
    lengths = np.array([53, 43, 47])
    bound = split_bound(lengths, 4, spec, cost, 37, 0.0, None)[0]
    optimum = brute_force_split_microbatches(lengths, 4, spec, max_tokens_per_microbatch=37,
                                             num_microbatches=range(1, 4), cost=cost)
    assert bound == pytest.approx(optimum.makespan, rel=1e-12)


def test_regression_the_bound_gave_the_longest_items_ranks_to_other_work_in_its_micro_batch():
    """The longest item (10 tokens, the whole budget of one rank unsplit) costs 15 on its rank or 13.5 on
    both split; the four others (5 tokens each) fit beside it only on the other rank.  The bound counted
    its micro-batch as holding D · T tokens of the densest work (20.0), though at its cost its own ranks
    take nothing else: the leader term t_g(c) + (W − w_g − K_c) / D makes it the optimum, 21.25, proven."""
    spec = ContextParallel(degrees=(1, 2), gpus_per_node=2, seconds_per_cost=1.0, latency_s=0.0,
                           half_efficiency_tokens=4.0, kv_bytes_per_token=0.0)
    cost = CostModel(linear=1.0, quadratic=0.05)
    lengths = np.array([10, 5, 5, 5, 5])
    optimum = brute_force_split_microbatches(lengths, 2, spec, max_tokens_per_microbatch=10,
                                             num_microbatches=range(1, 4), cost=cost)
    plan = balance_microbatches(lengths, 2, cost=cost, max_tokens_per_microbatch=10, context_parallel=spec)
    assert split_bound(lengths, 2, spec, cost, 10, 0.0, None)[0] == pytest.approx(optimum.makespan, rel=1e-12)
    assert plan.step_cost == pytest.approx(optimum.makespan, rel=1e-12) and plan.status is Status.OPTIMAL


def test_regression_a_bound_gave_items_longer_than_t_ranks_of_their_own_though_split_items_share_a_group():
    """Several split items may share one group (an aligned block): the three items of 11 tokens, longer than T
    = 10, run at degree 4 together on ranks 4-7 (9 tokens a rank) beside the longest on ranks 0-3, one
    micro-batch of cost 30.  A leader bound that let each of them take 4 ranks of its own read 34.26 (3abbec9,
    reverted): every bound must stay at most this plan, proven by brute force."""
    spec = ContextParallel(degrees=(1, 4), gpus_per_node=8, seconds_per_cost=1.0, latency_s=0.0,
                           half_efficiency_tokens=0.0, kv_bytes_per_token=0.0)
    cost = CostModel(linear=1.0, quadratic=0.05)
    lengths = np.array([40, 11, 11, 11])
    one = brute_force_split_microbatches(lengths, 8, spec, max_tokens_per_microbatch=10, num_microbatches=1, cost=cost)
    assert one.makespan == pytest.approx(30.0, rel=1e-12)
    assert split_bound(lengths, 8, spec, cost, 10, 0.0, None)[0] <= one.makespan * (1 + 1e-12)


def test_giants_over_half_a_microbatch_level_get_a_block_each():
    """Videos of 16k-131k tokens (2 % of 64 ranks x 32 items, T = 32k): at a micro-batch's level most
    run at degree 8 with more than half the level each, so one 8-rank block holds one of them.  The
    grouping counted only shards over half the budget as holding ranks alone, put 76 such giants in
    one micro-batch of 64 blocks and stacked them (step / bound 1.168 before)."""
    lengths, _ = llm_stage_lengths(64, 32, 1)
    rng = np.random.default_rng(1_000_003 + 7)
    count = round(0.02 * lengths.size)
    videos = 256 * rng.integers(64, 513, count) + rng.integers(32, 257, count)
    lengths[rng.choice(lengths.size, count, replace=False)] = videos
    plan = balance_microbatches(lengths, 64, cost=MODELS["84b"].llm.cost(causal=True),
                                max_tokens_per_microbatch=32768, context_parallel=ContextParallel())
    assert plan.split_items.size and plan.step_cost <= 1.05 * plan.lower_bound


def test_fills_between_the_coarse_ones_are_tried():
    """Long documents (32k-256k tokens, 2 % of 64 ranks x 32 items, T = 32k): micro-batches filled to 95 %, 85 %,
    70 % or 50 % of their tokens all left the step 14 % above the bound (1.144); with 90 % and 80 % tried too it is
    within 10 %."""
    lengths, _ = llm_stage_lengths(64, 32, 100)
    rng = np.random.default_rng(1_000_003 * 100 + 7)
    count = round(0.02 * lengths.size)
    documents = np.exp(rng.uniform(np.log(32768), np.log(262144), count)).astype(np.int64)
    lengths[rng.choice(lengths.size, count, replace=False)] = documents
    plan = balance_microbatches(lengths, 64, cost=MODELS["84b"].llm.cost(causal=True),
                                max_tokens_per_microbatch=32768, context_parallel=ContextParallel())
    assert plan.split_items.size and plan.step_cost <= 1.10 * plan.lower_bound


def test_lone_items_move_up_only_while_the_blocks_are_short():
    times = {2: np.array([6.0, 6.0, 6.0]), 4: np.array([3.2, 3.2, 3.2])}

    def lookup(items, degree):
        return times[degree][items]

    lengths, degree = np.array([10, 10, 10]), np.array([2, 2, 2])
    assert packable_degrees(lookup, lengths, degree, 10.0, math.inf, 6, (1, 2, 4)).tolist() == [2, 2, 2]
    assert packable_degrees(lookup, lengths, degree, 10.0, math.inf, 4, (1, 2, 4)).tolist() == [4, 4, 4]
    # Short items share a block, unless their shards hold more than half the token budget (5 > 8 / 2).
    short = {2: np.array([1.0, 1.0, 1.0]), 4: np.array([0.6, 0.6, 0.6])}
    assert packable_degrees(lambda items, c: short[c][items], lengths, degree, 10.0, math.inf, 4,
                            (1, 2, 4)).tolist() == [2, 2, 2]
    assert packable_degrees(lambda items, c: short[c][items], lengths, degree, 10.0, 8, 4,
                            (1, 2, 4)).tolist() == [4, 4, 4]


def _counted_layouts(monkeypatch) -> dict:
    """Per layout pass (one per array of laid-out items), whether each target of its ladder found token room."""
    from orchmllm.balancers.context_parallel import planner

    passes, place_groups = {}, planner.place_groups

    def counted(*args):
        placed = place_groups(*args)
        passes.setdefault(id(args[5]), (args[5], []))[1].append(placed is not None)
        return placed

    monkeypatch.setattr(planner, "place_groups", counted)
    return passes


def test_regression_a_layout_without_token_room_at_its_first_target_tried_the_next_seven(monkeypatch):
    """Where the ladder's first target leaves the groups no token room, wider targets pack them fuller: the
    layout tried LADDER_STEPS targets before the two tiers (the long workload's dense micro-batches at
    D = 2560 x 16, T = 32k: 8 failed layouts of 7-17 ms each per micro-batch); now one."""
    from orchmllm.study.workloads import sample_workload

    passes = _counted_layouts(monkeypatch)
    lengths = sample_workload("long", 64, 16, seed=7).sample_llm_length
    balance_microbatches(lengths, 64, cost=MODELS["84b"].llm.cost(causal=True), max_tokens_per_microbatch=32768,
                         context_parallel=ContextParallel())
    hopeless = [found for _, found in passes.values() if not found[0]]
    assert hopeless and all(found == [False] for found in hopeless)


def test_regression_every_fill_was_planned_after_one_needing_more_microbatches_lost(monkeypatch):
    """The long workload at 64 x 16, T = 32k: fills of 95 % and 90 % give 3 micro-batches (step / bound 1.089,
    1.064), 85 % needs 4 and gives 1.101; 80 %, 70 % and 50 % (4 to 6 micro-batches) were planned too, for no
    gain here (at D = 2560 x 16: 1.0 s of 3.4).  Fills stop at the first one that needs more micro-batches than
    the best and loses to it."""
    from orchmllm.balancers.context_parallel import microbatch
    from orchmllm.study.workloads import sample_workload

    steps, split_cells = [], microbatch._split_cells

    def counted(*args, **kwargs):
        found, repaired = split_cells(*args, **kwargs)  # a deferred first fill: its step is at least its floor
        steps.append((found.num_microbatches, getattr(found, "step_cost", getattr(found, "floor", None))))
        return found, repaired

    monkeypatch.setattr(microbatch, "_split_cells", counted)
    lengths = sample_workload("long", 64, 16, seed=7).sample_llm_length
    plan = balance_microbatches(lengths, 64, cost=MODELS["84b"].llm.cost(causal=True),
                                max_tokens_per_microbatch=32768, context_parallel=ContextParallel())
    (m0, step0), (m1, step1), (m2, step2) = steps
    assert m0 == m1 == 3 and step1 < step0 and m2 == 4 and step2 > step1
    assert plan.step_cost <= step1 and plan.step_cost <= 1.05 * plan.lower_bound


def recorded_fills(monkeypatch) -> tuple[list, list]:
    """(the item sets the split micro-batch planner plans, the fills' groupings), recorded from now on."""
    from orchmllm.balancers.context_parallel import microbatch

    planned, groupings, plan_pass, grouped = [], [], microbatch._plan_pass, microbatch.group_microbatches
    monkeypatch.setattr(microbatch, "_plan_pass", lambda lengths, items, *args: (
        planned.append(items.tobytes()), plan_pass(lengths, items, *args))[1])
    monkeypatch.setattr(microbatch, "group_microbatches", lambda *args: (groupings.append(grouped(*args)),
                                                                         groupings[-1])[1])
    return planned, groupings


def largest_microbatch(grouping: np.ndarray) -> np.ndarray:
    """The items of a grouping's micro-batch of most items (empty micro-batches dropped, as the fills do)."""
    used = np.unique(grouping, return_inverse=True)[1]
    return np.flatnonzero(used == np.argmax(np.bincount(used)))


def long_workload_planned_both_ways(monkeypatch):
    """(the long workload's plan at 64 x 16, seed 7, T = 32k, the fills' groupings, the item sets planned);
    the plan equals the one planning every micro-batch of every fill gives."""
    from orchmllm.balancers.context_parallel import microbatch
    from orchmllm.study.workloads import sample_workload

    lengths = sample_workload("long", 64, 16, seed=7).sample_llm_length
    options = dict(cost=MODELS["84b"].llm.cost(causal=True), max_tokens_per_microbatch=32768,
                   context_parallel=ContextParallel())
    planned, groupings = recorded_fills(monkeypatch)
    plan = balance_microbatches(lengths, 64, **options)
    fills = (plan, groupings[:3], list(planned))
    monkeypatch.setattr(microbatch, "_deferred", lambda *args: None)  # every micro-batch of every fill planned
    assert balance_microbatches(lengths, 64, **options).digest() == plan.digest()
    return fills


def test_regression_the_first_fill_planned_its_largest_micro_batch_though_the_next_fill_beat_it(monkeypatch):
    """The long workload at 64 x 16, seed 7, T = 32k: the 95 % fill's micro-batch of most items was planned (at
    D = 2560 x 16 the 95 %-full one: 0.3 s of a 1.1 s 3-stage step), though its other micro-batches' peaks and its
    pass bound sum above the goal and above the 90 % fill's step, which beats it whatever its plan.  It is left
    unplanned now, and the plan is the one planning it gives."""
    plan, (first, _, _), planned = long_workload_planned_both_ways(monkeypatch)
    assert largest_microbatch(first).tobytes() not in planned and plan.step_cost <= 1.05 * plan.lower_bound


def test_regression_a_fill_needing_more_micro_batches_planned_its_largest_though_it_had_lost(monkeypatch):
    """The same instance: the 85 % fill (4 micro-batches, the best 3) planned its micro-batch of most items
    (at D = 2560 x 16: 37.7k items, 0.03 s) though its other three's peaks and its pass bound already sum above
    the best step, so it could not win and the fills stop there.  It is left unplanned now, same plan."""
    _, (_, best, third), planned = long_workload_planned_both_ways(monkeypatch)
    assert np.unique(third).size > np.unique(best).size
    assert largest_microbatch(third).tobytes() not in planned and largest_microbatch(best).tobytes() in planned


def test_regression_a_losing_fill_planned_every_micro_batch_beside_its_largest(monkeypatch):
    """The same instance: the 85 % fill planned the three micro-batches beside its largest, though after its
    first two the peaks found, the third's pass bound (below its peak) and the largest's already summed above
    the best step.  Planning stops once that sum passes the best now (at D = 2560 x 16, T = 16k: 5 plans of 6
    and 3 of 7), the same plan."""
    _, (_, _, third), planned = long_workload_planned_both_ways(monkeypatch)
    used = np.unique(third, return_inverse=True)[1]
    largest = np.argmax(np.bincount(used))
    others = [np.flatnonzero(used == m).tobytes() for m in range(used.max() + 1) if m != largest]
    assert 0 < sum(items in planned for items in others) < len(others)


def test_regression_a_losing_fill_planned_first_the_micro_batch_whose_bound_its_longest_item_sets():
    """A later fill's deferral plans the micro-batches beside its largest in index order, so micro-batch 0 (pass
    bound 10 set by its longest item, peak 10.5) was planned before micro-batch 1 (bound 10 set by its work, its
    longest item 2, peak 13), which alone lifts the floor above the best step 27: those whose bound is furthest
    above their longest item are planned first now (the long workload at D = 2560 x 16, T = 32k: 2 plans of 3)."""
    from types import SimpleNamespace

    from orchmllm.balancers.context_parallel import microbatch

    microbatch_of = np.array([0, 0, 1, 1, 2, 2, 2, 2])
    bounds, peaks, planned = {0: 10.0, 1: 10.0, 2: 5.0}, {0: 10.5, 1: 13.0}, []

    class Passes:
        def __call__(self, items):
            planned.append(int(microbatch_of[items[0]]))
            return SimpleNamespace(loads=np.array([peaks[planned[-1]]]))

        def bound(self, items):
            return bounds[int(microbatch_of[items[0]])]

    times = np.array([10.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    found = microbatch._deferred(microbatch_of, 3, 0.0, Passes(), 27.0, times)
    assert planned == [1] and found.floor == pytest.approx(28.0)


@settings(max_examples=300, deadline=None)
@given(times=st.lists(st.lists(st.sampled_from([0.5, 1.0, 1.5, 3.0, 6.0, 1e308, math.inf]), min_size=3, max_size=3),
                      min_size=1, max_size=6),
       lengths=st.lists(st.integers(0, 90), min_size=6, max_size=6), budget=st.integers(1, 40),
       level=st.sampled_from([0.5, 1.0, 3.0, 6.0, 12.0, 1e308, math.inf]))
def test_alone_degrees_made_once_per_fill_match_their_definition(times, lengths, budget, level):
    """`alone_degrees` over each item's `share_times` (made once per planning call, then read at every level)
    against its definition item by item: 0 where some degree's time is within level / 2 and its shards within
    T / 2, else the smallest degree whose time fits (the largest where none does)."""
    from orchmllm.balancers.context_parallel.grouping import alone_degrees, share_times

    table, degrees = np.array(times), np.array([1, 2, 4])
    lengths = np.array(lengths[:table.shape[0]])
    expected = []
    for row, length in zip(table.tolist(), lengths.tolist()):
        shares = any(2 * t <= level and 2 * -(-length // c) <= budget for t, c in zip(row, degrees))
        fits = [c for t, c in zip(row, degrees) if t <= level]
        expected.append(0 if shares else (fits[0] if fits else degrees[-1]))
    with np.errstate(over="ignore"):
        assert alone_degrees(table, degrees, share_times(table, degrees, lengths, budget), level).tolist() == expected


IDEAL_SPLIT = dict(seconds_per_cost=1.0, latency_s=0.0, kv_bytes_per_token=0.0, half_efficiency_tokens=0.0)


@pytest.mark.parametrize("lengths, num_ranks, budget", [([76, 7], 4, 21), ([12, 15], 4, 7)])
def test_regression_a_fixed_m_below_every_fills_count_was_never_planned(lengths, num_ranks, budget):
    """P4-15: each fill of a micro-batch's D · T tokens (95 % down) needed 2 micro-batches, so at
    num_microbatches=1 no grouping was tried and InfeasibleError read 'no plan'; both items at degree 4 fit."""
    spec = ContextParallel(degrees=(1, 4), **IDEAL_SPLIT)
    plan = balance_microbatches(lengths, num_ranks, max_tokens_per_microbatch=budget, num_microbatches=1,
                                context_parallel=spec)
    optimum = brute_force_split_microbatches(lengths, num_ranks, spec, max_tokens_per_microbatch=budget,
                                             num_microbatches=1)
    assert plan.num_microbatches == 1 and plan.cell_tokens.max() <= budget
    assert plan.degree.tolist() == [4, 4] and plan.step_cost == optimum.makespan


def test_regression_the_budget_error_suggested_a_degree_wider_than_the_ranks():
    """P4-15: on 2 ranks the error said 'it needs degree 4 or a budget of at least 20'."""
    with pytest.raises(InfeasibleError, match=r"degree 2 puts 20 tokens on a rank; degree 4 would span more than the "
                                              r"2 ranks a group may: it needs a budget of at least 20"):
        balance_microbatches([40, 5, 5, 4], 2, max_tokens_per_microbatch=19,
                             context_parallel=ContextParallel(degrees=(1, 2), **IDEAL_SPLIT))


def test_regression_fills_planned_the_same_micro_batch_again(monkeypatch):
    """The long workload at 64 x 16, T = 64k: fills of 95 % to 80 % group the items alike, so 15 micro-batch
    plans held 9 sets of items (at D = 2560 x 16, 14 plans of 8).  Each set is planned once now, and the plan
    is the one planning every time gives."""
    from orchmllm.balancers.context_parallel import microbatch
    from orchmllm.study.workloads import sample_workload

    lengths = sample_workload("long", 64, 16, seed=7).sample_llm_length
    options = dict(cost=MODELS["84b"].llm.cost(causal=True), max_tokens_per_microbatch=65536,
                   context_parallel=ContextParallel())
    planned, plan_pass = [], microbatch._plan_pass

    def counted(lengths, items, *args):
        planned.append(items.tobytes())
        return plan_pass(lengths, items, *args)

    monkeypatch.setattr(microbatch, "_plan_pass", counted)
    once = balance_microbatches(lengths, 64, **options)
    assert len(planned) == len(set(planned)) >= 4
    monkeypatch.setattr(microbatch._PassPlans, "__call__", lambda self, items: plan_pass(self.lengths, items,
                                                                                         *self.context))
    assert once.digest() == balance_microbatches(lengths, 64, **options).digest()


def test_regression_one_micro_batch_without_layout_lowered_every_micro_batchs_fill(monkeypatch):
    """Documents, 16 x 8, 10 % giants, seed 1, T = 32k: the fills' first micro-batch (the giants on their
    blocks beside items over T whose shards find no room) had no layout, so every micro-batch's fill was
    lowered: step / bound 1.159.  Only that micro-batch spills now (`repair.py`): 1.033, and never above the
    plan the fills alone give (without the fixed counts tried above that, `_more_counts`).  Since the free M's
    grouping (`tests/test_cp_grouping_free.py`) that instance's first fill lays out; 20 % giants, seed 9: the fills
    alone 1.091, repaired 1.043."""
    from orchmllm.balancers.context_parallel import microbatch
    from orchmllm.benchmarks.bench_context_parallel import COST, giant_mix

    lengths = giant_mix("documents", 16, 8, 0.2, 9)
    options = dict(cost=COST, max_tokens_per_microbatch=32768, context_parallel=ContextParallel())
    plan = balance_microbatches(lengths, 16, **options)
    assert plan.cell_tokens.max() <= 32768 and plan.step_cost <= 1.05 * plan.lower_bound
    monkeypatch.setattr(microbatch, "repaired_grouping", lambda *args: None)
    monkeypatch.setattr(microbatch, "_more_counts", lambda best, *args: best)  # no fixed count planned either
    fills_alone = balance_microbatches(lengths, 16, **options)
    assert fills_alone.step_cost > 1.08 * fills_alone.lower_bound and plan.step_cost < fills_alone.step_cost


def test_the_search_skips_the_plan_its_first_search_beat(monkeypatch):
    """Videos, 64 x 16, 5 % giants, seed 7, T = 32k: the fills' best and the repaired plan both lay out.  The
    micro-batch search runs on the lower step first and on the other only where its step is below the first's
    searched step (not here: it once searched both, 0.5-0.8 s of the long workload's 2.2-4.3 s at D = 2560 x 16,
    T = 16k, for a step never lower there); the plan is the first's search."""
    from orchmllm.balancers.context_parallel import microbatch
    from orchmllm.benchmarks.bench_context_parallel import COST, giant_mix

    lengths = giant_mix("videos", 64, 16, 0.05, 7)
    given, searched = [], []
    search, choose = microbatch._regrouped, microbatch._searched
    monkeypatch.setattr(microbatch, "_regrouped",
                        lambda plan, *args: searched.append(search(plan, *args)) or searched[-1])
    monkeypatch.setattr(microbatch, "_searched", lambda plans, *args: given.append(plans) or choose(plans, *args))
    plan = balance_microbatches(lengths, 64, cost=COST, max_tokens_per_microbatch=32768,
                                context_parallel=ContextParallel())
    (best, repaired), = given
    first, second = sorted((best, repaired), key=lambda candidate: candidate.step_cost)
    assert len(searched) == 1 and searched[0].step_cost <= first.step_cost <= second.step_cost
    assert second.step_cost >= searched[0].step_cost and plan.digest() == searched[0].digest()


@pytest.mark.parametrize("lengths", [[61, 53, 27, 50, 52], [69, 49, 9, 56, 50, 9, 58, 44, 19],
                                     [100, 6, 50, 50, 27, 22, 58, 57, 40]])
def test_regression_a_free_m_refused_what_more_micro_batches_lay_out_on_an_odd_node(lengths):
    """Cause (review10 R10-11): one node of 3 ranks with degrees (1, 2): every fill's grouping left a micro-batch
    without a layout, and a free M raised InfeasibleError ("found no micro-batches") where a fixed M of 3-6
    planned.  With M free, more micro-batches are tried before refusing; every pass is a certified split plan of
    its items and the bound is the free M's."""
    from orchmllm.testing.context_parallel import check_split_plan

    lengths = np.array(lengths)
    spec = ContextParallel(degrees=(1, 2), gpus_per_node=3, half_efficiency_tokens=1, latency_s=0,
                           kv_bytes_per_token=0, seconds_per_cost=1.0)
    plan = balance_microbatches(lengths, 3, max_tokens_per_microbatch=60, context_parallel=spec)
    assert sorted(np.concatenate([np.flatnonzero(plan.microbatch == m) for m in range(plan.num_microbatches)])) \
        == list(range(lengths.size))
    for m, planned in enumerate(plan.passes):
        items = np.flatnonzero(plan.microbatch == m)
        if planned is not None:
            check_split_plan(planned, lengths[items], 3, spec, max_tokens_per_rank=60)
    free = split_bound(lengths, 3, spec, CostModel(), 60, 0.0, None)[0]
    assert plan.lower_bound == min(free, plan.step_cost)
    assert (str(plan.status) == "optimal") == (plan.lower_bound == plan.step_cost)


def _longest_roomless_run(found: list[bool]) -> int:
    """The most targets in a row without token room after one that had it."""
    longest, run, laid = 0, 0, False
    for has_room in found:
        laid, run = laid or has_room, 0 if has_room else run + laid
        longest = max(longest, run)
    return longest


def test_regression_the_ladder_went_on_to_its_end_without_token_room(monkeypatch):
    """The split layout's ladder stops after NO_ROOM_RUN targets in a row without token room (`planner.layout`):
    the issue 24 probe's zeros_giants family (90 % empty items, the rest 10-100k tokens) at D = 16 x 16, seed 19,
    T = 32k: a layout whose first target laid out went on through 7 wider targets without token room, to the
    ladder's end (bimodal at D = 512, seed 11: 39 of them, 0.12 s of 0.5 s); now NO_ROOM_RUN, the same plans."""
    from orchmllm.balancers.context_parallel import planner
    from orchmllm.benchmarks.bench_context_parallel import COST, SPEC, issue24_families

    passes = _counted_layouts(monkeypatch)
    lengths = issue24_families(16, 16, 19)["zeros_giants"]
    plan = balance_microbatches(lengths, 16, max_tokens_per_microbatch=32768, cost=COST, context_parallel=SPEC)
    runs = [_longest_roomless_run(found) for _, found in passes.values()]
    assert plan.step_cost <= 1.1 * plan.lower_bound
    assert max(runs) == planner.NO_ROOM_RUN

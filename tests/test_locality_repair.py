"""The repair's certificate of failure (`ranks_left_over`): a true lower bound, and it changes no plan."""

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import Orchestrator
from orchmllm.balancers import CostModel, balance
from orchmllm.balancers.locality import repair as locality_repair
from orchmllm.balancers.locality import windows
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.locality.repair import (ACROSS_CANDIDATES, ranks_left_over, repair, repair_across_nodes,
                                                 repair_in_node)
from orchmllm.balancers.problem import make_problem
from orchmllm.benchmarks.pcmax_families import make_instance
from orchmllm.study.models import MODELS
from orchmllm.study.simulator import cluster
from orchmllm.study.workloads import sample_workload


def _random_state(seed: int, placed: float = 1.0) -> tuple[PartialPlan, int]:
    """Items (each with probability `placed`) dealt at random under a target a little above the mean load
    (some ranks above it), small integer costs (ties common), a token cap on half the instances."""
    rng = np.random.default_rng(seed)
    gpus_per_node = int(rng.choice([1, 2, 4, 8]))
    num_ranks = gpus_per_node * int(rng.integers(1, 8))
    lengths = rng.integers(1, int(rng.choice([5, 50, 500])), int(rng.integers(num_ranks, 10 * num_ranks)))
    cap = int(lengths.sum() / num_ranks * 1.2) + int(lengths.max()) if rng.random() < 0.5 else None
    problem = make_problem(lengths, num_ranks, cost=CostModel(per_item=1.0, linear=1.0), max_tokens_per_rank=cap)
    state = PartialPlan(problem, float(problem.item_costs.sum()) / num_ranks * float(rng.uniform(1.0, 1.15)))
    ranks = rng.integers(0, num_ranks, lengths.size)
    items = np.arange(lengths.size) if placed == 1.0 else np.flatnonzero(rng.random(lengths.size) < placed)
    state.put_runs(items, ranks[items])
    return state, gpus_per_node


def test_ranks_left_over_bounds_the_ranks_every_full_fix_leaves_above_the_target():
    """However many candidates the full-fix rounds try (up to every item), at least `ranks_left_over`
    ranks stay above the target; the bound is reached on some instances and the rounds fix every rank on
    others, so the test sees both sides."""
    reached = fixed = 0
    for seed in range(150):
        state, gpus_per_node = _random_state(seed)
        bound = ranks_left_over(state)
        repair_in_node(state, gpus_per_node)
        for candidates in (16, 256, state.costs.size):
            repair_across_nodes(state, candidates)
        left = int(np.count_nonzero(state.loads > state.target))
        assert left >= bound, seed
        reached += bound == left > 0
        fixed += left == 0
    assert reached >= 10 and fixed >= 10


def test_a_repair_the_certificate_skips_fails_when_run_to_the_end(monkeypatch):
    """Whenever `ranks_left_over` exceeds the searches allowed (before any pass), the repair run without
    it (its rounds and searches to the end) leaves a rank above the target, and where either succeeds
    both end in the same plan: skipping changes no plan.  Few searches make the certificate fire on many
    instances; some repairs succeed."""
    fired = succeeded = 0
    bound = locality_repair.ranks_left_over
    for seed in range(200):
        searches = (0, 1, 3, 128)[seed % 4]
        monkeypatch.setattr(locality_repair, "REPAIR_SEARCHES", searches)
        ends = []
        for certified in (bound, lambda state: 0):
            state, gpus_per_node = _random_state(seed)
            calls = []
            monkeypatch.setattr(locality_repair, "ranks_left_over", lambda state, check=certified: (
                calls.append(check(state) > min(4 * state.loads.size, searches)), check(state))[1])
            repair(state, np.arange(state.costs.size) % state.loads.size, np.ones(state.costs.size), gpus_per_node)
            ends.append((state.loads.max() <= state.target, state.destinations.tolist(), any(calls)))
        (ok, plan, skipped), (ok_to_end, plan_to_end, _) = ends
        assert ok == ok_to_end and (plan == plan_to_end or not ok), seed
        fired += skipped
        succeeded += ok
    assert fired >= 40 and succeeded >= 10


def test_regression_repair_ran_its_rounds_where_no_full_fixes_could_bring_enough_ranks_down(monkeypatch):
    """Cause: `repair` ran its full-fix rounds (most of a micro-batched step's time on the code trace at
    D = 2560 × 32, T = 16k: every cells deal and per-micro-batch deal ended in a failing repair) before
    finding more ranks above the target than its searches could bring down.  Now it returns at once
    where `ranks_left_over` proves it (rooms as bins, excesses as items), leaving the state as it was; and the
    rounds are skipped where it proves that no full fix applies at all."""
    calls = []
    monkeypatch.setattr(locality_repair, "repair_in_node", lambda *args: calls.append(args))
    state = PartialPlan(make_problem(np.full(8, 10), 4, cost=CostModel(linear=1.0)), 15.0)
    state.put_runs(np.arange(8), np.array([0, 0, 1, 1, 2, 2, 3, 3]))  # every rank 5 above the target, no room
    monkeypatch.setattr(locality_repair, "REPAIR_SEARCHES", 3)
    assert ranks_left_over(state) == 4
    repair(state, np.zeros(8, dtype=np.int64), np.ones(8), 2)
    assert not calls and state.destinations.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    monkeypatch.setattr(locality_repair, "REPAIR_SEARCHES", 4)  # four searches might, but no full fix applies
    repair(state, np.zeros(8, dtype=np.int64), np.ones(8), 2)  # (as many ranks out of reach as above the target)
    assert not calls
    fixable = PartialPlan(make_problem(np.array([10, 10, 10, 10, 10, 4, 1]), 4, cost=CostModel(linear=1.0)), 15.0)
    fixable.put_runs(np.arange(7), np.array([0, 0, 1, 1, 2, 2, 3]))  # ranks 0 and 1 5 above the target, 3 roomy
    repair(fixable, np.zeros(7, dtype=np.int64), np.ones(7), 2)
    assert calls  # a full fix applies: the rounds run


@pytest.mark.parametrize("workload,budget", [("code", 16384), ("long_tail", 8192), ("chat", 8192)])
def test_the_certificate_changes_no_micro_batched_plan(monkeypatch, workload, budget):
    """With few searches allowed the certificate fires in most deals; the step's plans are those of the
    repair without it (run to the end), as the bound is a proof."""
    monkeypatch.setattr(locality_repair, "REPAIR_SEARCHES", 2)
    batch = sample_workload(workload, 64, 32, seed=3)
    orchestrator = Orchestrator(MODELS["84b"].stages(), cluster(64), max_tokens_per_microbatch=budget)
    fired = []
    bound = locality_repair.ranks_left_over
    monkeypatch.setattr(locality_repair, "ranks_left_over",
                        lambda state: (fired.append(bound(state) > 2), bound(state))[1])
    certified = orchestrator.plan(batch).digest()
    assert any(fired)
    monkeypatch.setattr(locality_repair, "ranks_left_over", lambda state: 0)
    assert orchestrator.plan(batch).digest() == certified


class _Unread(np.ndarray):
    """Lengths that no code may read (any indexing raises)."""

    def __getitem__(self, key):
        raise AssertionError("the repair read the items' lengths without a token cap")


def test_regression_a_repair_without_a_cap_gathered_every_candidates_length():
    """Cause of a planning-time regression (issue 25: the default mix's micro-batched step at D = 2560 × 32,
    T = 8k, 1.04-1.07x 34d55f1, its encoder stages uncapped): the across-node passes gathered the lengths
    of the whole cost order and a window of lengths per candidate, and the in-node pass copied every length
    per round, where no test reads them (lengths count under a cap only).  The passes of a state whose
    lengths cannot be read end as those of readable ones."""
    for seed in range(40):
        rng = np.random.default_rng(seed)
        gpus_per_node, num_ranks = 4, 4 * int(rng.integers(1, 6))
        lengths = rng.integers(1, 500, int(rng.integers(num_ranks, 10 * num_ranks)))
        problem = make_problem(lengths, num_ranks, cost=CostModel(per_item=1.0, linear=1.0))
        target = float(problem.item_costs.sum()) / num_ranks * float(rng.uniform(1.0, 1.1))
        ranks = rng.integers(0, num_ranks, lengths.size)
        ends = []
        for readable in (True, False):
            state = PartialPlan(problem, target)
            state.put_runs(np.arange(lengths.size), ranks)
            if not readable:
                state.lengths = state.lengths.view(_Unread)
            repair_in_node(state, gpus_per_node)
            for candidates in ACROSS_CANDIDATES:
                repair_across_nodes(state, candidates)
            ends.append(state.destinations.tolist())
        assert ends[0] == ends[1], seed


def test_regression_an_across_node_pass_with_no_rank_above_the_target_copied_the_cost_order():
    """Cause of planning time lost where the in-node pass left no rank above the target (issue 25, T 8k step):
    each across-node pass first copied the whole largest-first order, its costs and lengths (padded for its
    windows), then found nothing to fix.  Now the windows are built at a pass's first round only: a pass
    with nothing to do allocates less than one float per item."""
    lengths = np.arange(1, 100_001)
    problem = make_problem(lengths, 64, cost=CostModel(linear=1.0), max_tokens_per_rank=int(lengths.sum()))
    state = PartialPlan(problem, float(problem.item_costs.sum()))  # one rank could hold everything
    state.put_runs(np.arange(lengths.size), np.arange(lengths.size) % 64)
    tracemalloc.start()
    try:
        for candidates in ACROSS_CANDIDATES:
            repair_across_nodes(state, candidates)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * lengths.size, peak


def test_the_passes_change_nothing_once_every_rank_above_the_target_is_out_of_reach():
    """`repair` skips its full-fix passes when `ranks_left_over` equals the ranks above the target (a full
    fix would leave one fewer): on such states every pass, run anyway with every item a candidate, leaves
    the plan as it was, so the skip changes no plan."""
    seen = 0
    for seed in range(300):
        state, gpus_per_node = _random_state(seed)
        over = int(np.count_nonzero(state.loads > state.target))
        if over == 0 or ranks_left_over(state) != over:
            continue
        seen += 1
        before = state.destinations.tolist()
        repair_in_node(state, gpus_per_node)
        for candidates in (*ACROSS_CANDIDATES, state.costs.size):
            repair_across_nodes(state, candidates)
        assert state.destinations.tolist() == before, seed
    assert seen >= 10


def _family(family: str, num_ranks: int, per_rank: int, seed: int = 0):
    """`balance`'s arguments for a P||Cmax family (few_large: 98 % small items, 2 % large), home ranks,
    16 KiB a token, 84B costs, auto+locality."""
    lengths = make_instance(family, num_ranks, per_rank, seed).times
    return dict(lengths=lengths, num_ranks=num_ranks, cost=MODELS["84b"].llm.cost(causal=True), algorithm="auto",
                sources=np.repeat(np.arange(num_ranks), per_rank), item_bytes=lengths * 16384.0,
                topology=cluster(num_ranks))


def test_regression_repair_searched_every_rank_while_partial_fixes_passed_a_large_item_from_rank_to_rank(
        monkeypatch):
    """Cause of issue 24's 18-120x on the P||Cmax families (auto+locality): with a few large items no
    full fix reaches any rank above the target; each search weighed every item of every rank and its
    partial fix passed a large item to the roomiest rank, which went above the target in its place, until
    more ranks were above it than the searches left (309 searches at 128 x 24, 0.9 s), and the placed plain
    plan was returned.  Now the searches stop after IDLE_SEARCH_WORK pairs bring no rank within reach of a
    full fix (and the passes are skipped: none could apply): the same plan, a few searches."""
    pairs = []
    best_fix = locality_repair.best_fix
    monkeypatch.setattr(locality_repair, "best_fix", lambda state, members, rank, pool, *rest: (
        pairs.append(members[rank].size * (sum(members[p].size for p in pool.tolist()) + pool.size)),
        best_fix(state, members, rank, pool, *rest))[1])
    passes = []
    across = locality_repair.repair_across_nodes
    monkeypatch.setattr(locality_repair, "repair_across_nodes", lambda *args: (passes.append(1), across(*args)))
    plan = balance(**_family("few_large", 128, 24))
    searched = sum(pairs)
    assert not passes and 0 < searched <= 2 * locality_repair.idle_search_work(128 * 24)
    monkeypatch.setattr(locality_repair, "IDLE_SEARCH_WORK", 2**62)
    monkeypatch.setattr(locality_repair, "SEARCH_WORK", (2**62, 0))
    pairs.clear()
    unbounded = balance(**_family("few_large", 128, 24))
    assert sum(pairs) > 4 * searched
    np.testing.assert_array_equal(plan.assignment, unbounded.assignment)


def test_regression_idle_stop_was_one_size_for_all_so_small_repairs_that_idled_before_succeeding_were_dropped(
        monkeypatch):
    """After the idle stop (2**18 pairs at every size), nonuniform 32 x 24's repair stopped in an idle stretch
    (0.67 M pairs) that its unbounded search ended with full fixes, within 10x the default mix, and the placed
    plain plan moved twice the inter-node bytes.  Now small instances may idle up to what the total budget's
    floor holds over its share per item: the unbounded repair's plan."""
    assert locality_repair.idle_search_work(512 * 32) == 2**18  # the large instances keep the short stop
    plan = balance(**_family("nonuniform", 32, 24))
    monkeypatch.setattr(locality_repair, "IDLE_SEARCH_WORK", 2**62)
    monkeypatch.setattr(locality_repair, "SEARCH_WORK", (2**62, 0))
    unbounded = balance(**_family("nonuniform", 32, 24))
    np.testing.assert_array_equal(plan.assignment, unbounded.assignment)


def test_regression_repair_searches_had_no_budget_where_each_weighed_every_rank(monkeypatch):
    """Cause of issue 24's 24x on P||Cmax near_mean at 256 x 32 (auto+locality, after the idle stop): each
    partial fix brought one more rank within reach of a full fix, so the searches never idled, but each weighed
    every item of every rank: 99 searches, 12.5 M (item, partner) pairs, 0.5 s, for a plan of the same makespan.
    Now all searches weigh SEARCH_WORK pairs at most (the larger of a floor and so many per item), and the
    caller places the plain plan within the same target."""
    pairs = []
    best_fix = locality_repair.best_fix
    monkeypatch.setattr(locality_repair, "best_fix", lambda state, members, rank, pool, *rest: (
        pairs.append(members[rank].size * (sum(members[p].size for p in pool.tolist()) + pool.size)),
        best_fix(state, members, rank, pool, *rest))[1])
    arguments = _family("near_mean", 256, 32)
    plan = balance(**arguments)
    assert 0 < sum(pairs) <= locality_repair.search_work(arguments["lengths"].size)
    plain = balance(arguments["lengths"], 256, cost=arguments["cost"], algorithm="auto")
    assert plan.makespan <= plain.makespan * 1.002



@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31), st.floats(0.1, 1.0))
def test_property_ranks_left_over_of_coming_items_holds_after_they_are_placed_anywhere(seed, placed):
    """`ranks_left_over(state, coming)` (the costs of the items still to be placed) is at most
    `ranks_left_over` once those items are on any ranks: placing only grows loads, so no rank it counts
    comes within reach of a full fix."""
    state, _ = _random_state(seed, placed)
    coming = np.flatnonzero(state.destinations < 0)
    bound = ranks_left_over(state, state.costs[coming])
    assert bound <= ranks_left_over(state)
    state.put_runs(coming, np.random.default_rng(seed).integers(0, state.loads.size, coming.size))
    assert bound <= ranks_left_over(state), (seed, bound)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=40), st.integers(1, 40))
def test_window_max_is_the_max_of_every_window(values, width):
    values = np.array(values)
    width = min(width, values.size)
    expected = [values[k:k + width].max() for k in range(values.size - width + 1)]
    assert windows.window_max(values, width).tolist() == expected


def test_the_across_node_passes_build_only_rows_that_can_take_a_fix(monkeypatch):
    """`_near` drops the rows of `repair_across_nodes` whose first delta fits no room of their window and whose
    move the roomiest rank's: the passes with it end in the same plan as without it (every row built), on random
    states (small integer costs: ties and exact fits) and on the micro-batches of long_tail at 512 x 32, T 8k,
    where it drops rows on most wide rounds."""
    near, dropped = locality_repair._near, []

    def counted(state, items, *rest):
        kept = near(state, items, *rest)
        dropped.append(items.size - kept[0].size)
        return kept

    def passes(state, gpus_per_node):
        repair_in_node(state, gpus_per_node)
        for candidates in ACROSS_CANDIDATES:
            repair_across_nodes(state, candidates)
        return state.destinations.tolist(), state.loads.tolist(), state.tokens.tolist()

    lengths = sample_workload("long_tail", 512, 32, seed=3).sample_llm_length
    cost = MODELS["84b"].llm.cost(causal=True)
    for seed in range(60):
        if seed < 50:
            state, gpus_per_node = _random_state(seed)
            again = _random_state(seed)[0]
        else:  # a slice of the trace's items at a target that leaves ranks above it
            rng = np.random.default_rng(seed)
            items = lengths[rng.permutation(lengths.size)[:4096]]
            problem = make_problem(items, 512, cost=cost, max_tokens_per_rank=8192 * 8)
            state, again = (PartialPlan(problem, float(problem.item_costs.sum()) / 512 * 1.001) for _ in range(2))
            ranks, gpus_per_node = rng.integers(0, 512, items.size), 8
            for plan in (state, again):
                plan.put_runs(np.arange(items.size), ranks)
        monkeypatch.setattr(locality_repair, "_near", counted)
        filtered = passes(state, gpus_per_node)
        monkeypatch.setattr(locality_repair, "_near", lambda state, items, start, *rest: (items, start))
        assert passes(again, gpus_per_node) == filtered, seed
    assert sum(dropped) > 0


def test_regression_repair_searches_weighed_every_item_of_every_pool_rank_against_every_row(monkeypatch):
    """Cause of probe20 P20-17 (balance(sources=...) 25-30x the plain plan at 2560 x 32 on long-tailed lengths):
    where no full fix exists (a giant item sets every over-target rank's load) each search widened its pool to every
    rank and `best_fix` built a float matrix of every (item on the rank, partner) pair, several times over: 1.4 s of
    1.5 s.  Now it builds only the partner columns that may leave a peak at or below the one to beat (`_may_beat`):
    on the widest pools less than one such matrix, and the plan of every column built."""
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 512 * 32) * 200).astype(np.int64) + 1, 65536)
    arguments = dict(lengths=lengths, num_ranks=512, cost=CostModel(linear=1.0, quadratic=1e-4),
                     sources=np.repeat(np.arange(512), 32))
    best_fix, calls = locality_repair.best_fix, []

    def traced(state, members, rank, pool, *rest):
        tracemalloc.start()
        try:
            return best_fix(state, members, rank, pool, *rest)
        finally:
            pairs = members[rank].size * (sum(members[p].size for p in pool.tolist()) + pool.size)
            calls.append((pairs, tracemalloc.get_traced_memory()[1]))
            tracemalloc.stop()

    monkeypatch.setattr(locality_repair, "best_fix", traced)
    plan = balance(**arguments)
    widest = max(calls)
    assert len(calls) > 3 and widest[0] > 500_000 and widest[1] < 8 * widest[0]  # bytes: less than one float a pair
    calls.clear()
    monkeypatch.setattr(locality_repair, "_may_beat", lambda state, rank, row_costs, partner_rank, *rest: (
        np.ones(np.shape(partner_rank), dtype=bool)))
    every_column = balance(**arguments)
    assert max(calls)[1] > 8 * max(calls)[0]
    np.testing.assert_array_equal(plan.assignment, every_column.assignment)

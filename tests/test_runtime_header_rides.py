"""A guarded exchange's plan agreement rides in its payload all-to-all (issue 24) where every rank is known to
hold the plan: combine after its agreed dispatch, and dispatch with `check_plan` or where every rank's planner
word, agreed in the metadata all-gather, vouches for it (a plan no word vouches for does not size a collective:
probe24 P24-01; test_runtime_plan_identity), with the guarantees of the header all-reduce kept (a kept
plan, another schema, a rank planning otherwise: one clear error on every rank).

Real gloo groups of 4 ranks; each rank counts its own collectives (`runtime.counting`)."""

import importlib

import numpy as np
import pytest
import torch
import torch.distributed as dist

from orchmllm.balancers import ContextParallel, CostModel
from orchmllm.balancers.problem import KernelResult
from orchmllm.balancers.registry import register_algorithm
from orchmllm.runtime import HierarchicalAllToAll, PlanMismatchError, PostBalancingDispatcher, SchemaMismatchError
from orchmllm.runtime import dispatcher as dispatcher_module
from orchmllm.runtime.counting import CollectiveCounter
from orchmllm.runtime.launch import run_processes

LENGTHS = [[3, 1, 2], [2, 2], [4], [1, 1, 1]]


def _lengths(rank, step):
    return [length + step % 2 for length in LENGTHS[rank]]  # another plan each step


def _batch(rank, step):
    rows = sum(_lengths(rank, step))
    return {"x": torch.arange(2 * rows, dtype=torch.float32).reshape(rows, 2) + 100 * rank + 1000 * step,
            "id": torch.arange(len(LENGTHS[rank])) + 10 * rank}


def _steps(rank, algorithm="lpt", steps=4, odd=None, transport=None, check_plan=False):
    """Plan, dispatch and combine `steps` steps; the collectives of each step's dispatch and combine, and
    what came home (every rank's own rows, unchanged); `odd(rank, step, batch, plan, kept)` may change what
    a rank passes."""
    dispatcher = PostBalancingDispatcher(algorithm=algorithm, cost=CostModel(linear=1), per_item_keys={"id"},
                                         transport=transport, check_plan=check_plan)
    counts, kept = [], None
    for step in range(steps):
        plan = dispatcher.plan(_lengths(rank, step))
        batch = _batch(rank, step)
        given, passed = (batch, plan) if odd is None else odd(rank, step, batch, plan, kept)
        kept = plan
        counter = CollectiveCounter()
        try:
            moved = dispatcher.dispatch(given, passed)
            dispatched = sum(counter.calls.values())
            home = dispatcher.combine({"x": moved["x"] * 2, "id": moved["id"]}, plan)
        finally:
            counter.close()
        assert torch.equal(home["x"], batch["x"] * 2) and torch.equal(home["id"], batch["id"])
        counts.append((dispatched, sum(counter.calls.values()) - dispatched))
    return counts


def _job(rank, size, transport):
    if transport == "flat":
        return _steps(rank), _steps(rank, check_plan=True)
    counts = _steps(rank, transport=HierarchicalAllToAll(2))
    try:
        return counts, _steps(rank, odd=_kept_plan, transport=HierarchicalAllToAll(2))
    except PlanMismatchError as error:
        return counts, str(error)


@pytest.mark.parametrize("transport", ["flat", "nodewise"])
def test_regression_a_guarded_dispatch_and_combine_ran_a_header_collective_of_their_own(transport):
    """Before: every guarded dispatch and combine ran a header all-reduce before its payload all-to-all
    ((2, 2) every step); now both ride in their payloads from the second step, with `check_plan` or without it
    (every rank's planner word is the same).  Node-wise: three all-to-alls a payload, and a kept plan named on
    every rank from the headers."""
    outcomes = run_processes(_job, 4, args=(transport,), timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        if transport == "flat":
            assert o.value == ([(2, 2), (1, 1), (1, 1), (1, 1)], [(2, 2), (1, 1), (1, 1), (1, 1)]), (o.rank, o.value)
        else:
            assert o.value[0] == [(4, 4), (3, 3), (3, 3), (3, 3)], (o.rank, o.value)
            assert "ranks [1] disagree with ranks [0, 2, 3]" in o.value[1], (o.rank, o.value)


def _big_group_job(rank, size):
    importlib.import_module("orchmllm.runtime.exchange").RIDE_MAX_RANKS = 2  # as if the 4 ranks were a large group
    return _steps(rank, check_plan=True)


def test_regression_headers_of_a_large_group_stay_in_their_all_reduce():
    """probe24 P24-06: a riding header goes to every peer, so over many ranks a sparse plan's all-to-all would
    message every peer (16 -> 511 a rank at D = 512): above RIDE_MAX_RANKS the header all-reduce stays."""
    outcomes = run_processes(_big_group_job, 4, timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert all(o.value == [(2, 2)] * 4 for o in outcomes), [o.value for o in outcomes]


def _kept_plan(rank, step, batch, plan, kept):
    return (batch, kept) if rank == 1 and step == 3 else (batch, plan)


def _float64(rank, step, batch, plan, kept):
    return ({**batch, "x": batch["x"].double()} if rank == 1 and step == 3 else batch), plan


def _all_float64(rank, step, batch, plan, kept):
    return ({**batch, "x": batch["x"].double()} if step >= 2 else batch), plan


def _odd_job(rank, size, name):
    odd = {"kept": _kept_plan, "float64": _float64, "all float64": _all_float64}[name]
    try:
        return "ok", _steps(rank, odd=odd)
    except (PlanMismatchError, SchemaMismatchError) as error:
        return type(error).__name__, str(error)


@pytest.mark.parametrize("name, error", [("kept", "PlanMismatchError"), ("float64", "SchemaMismatchError")])
def test_a_rank_deviating_from_a_header_that_rides_in_the_payload_is_named_on_every_rank(name, error):
    outcomes = run_processes(_odd_job, 4, args=(name,), timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message = o.value
        assert kind == error and "ranks [1] disagree with ranks [0, 2, 3]" in message, (o.rank, o.value)


def test_every_rank_changing_dtype_together_moves_its_rows_after_the_expected_exchange():
    """Every rank deviates alike (dispatch and combine): the zeros of the expected pieces move, then the pieces."""
    outcomes = run_processes(_odd_job, 4, args=("all float64",), timeout_s=120)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert o.value == ("ok", [(2, 2), (1, 1), (2, 2), (2, 2)]), (o.rank, o.value)  # rides again at step 4


def _two_dicts_job(rank, size, repeats=1):
    """Each step combines two dicts of different schemas on one plan (the first `repeats` times): per step, the
    second combine's (all-reduce, all-to-all) calls and the bytes it sent."""
    dispatcher = PostBalancingDispatcher(algorithm="lpt", cost=CostModel(linear=1), per_item_keys={"id"})
    seen = []
    for step in range(4):
        plan = dispatcher.plan(_lengths(rank, step))
        moved = dispatcher.dispatch(_batch(rank, step), plan)
        for _ in range(repeats):
            dispatcher.combine({"x": moved["x"], "id": moved["id"]}, plan)
        counter = CollectiveCounter()
        try:
            home = dispatcher.combine({"id": moved["id"]}, plan)
        finally:
            counter.close()
        assert torch.equal(home["id"], _batch(rank, step)["id"])
        seen.append((counter.calls["all_reduce"], counter.calls["all_to_all_single"], counter.sent))
    return seen


def test_regression_a_site_alternating_two_schemas_stops_sending_the_others_zeros():
    """probe24 P24-02: a step combining two dicts of different schemas sent, before each, zeros of the other
    dict's whole payload (the small dict moved 128x its bytes); after the first miss the site checks its headers
    in the all-reduce again, and sends only its own pieces."""
    outcomes = run_processes(_two_dicts_job, 4, timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert o.value[0][:2] == (0, 2) and all(calls[:2] == (1, 1) for calls in o.value[1:]), (o.rank, o.value)
        assert all(calls[2] <= 8 * sum(map(len, LENGTHS)) for calls in o.value[1:]), (o.rank, o.value)  # ids only


def test_regression_a_site_whose_schemas_recur_in_a_longer_period_stops_riding():
    """probe24 P24-08: schemas A, A, B each step: the second A rode again and B sent A's zeros every period; after
    MAX_MISSES misses the site's headers stay in the all-reduce."""
    outcomes = run_processes(_two_dicts_job, 4, args=(2,), timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert all(calls[:2] == (1, 1) and calls[2] <= 8 * sum(map(len, LENGTHS)) for calls in o.value[2:]), o.value


def _rank_dependent_job(rank, size):
    def solve(problem):
        assignment = np.arange(problem.num_items) % problem.num_ranks
        if rank == 1:
            assignment[[0, 1]] = assignment[[1, 0]]
        return KernelResult(assignment)

    register_algorithm("rank_dependent_rides", solve)
    try:
        return "ok", _steps(rank, "rank_dependent_rides", steps=2)
    except PlanMismatchError as error:
        return "PlanMismatchError", str(error)


def test_a_plugin_planner_s_plans_are_checked_by_a_header_of_their_own():
    """A plugin may plan per rank: no planner word vouches for its plans, which are never expected, so every rank
    raises, no gloo abort."""
    outcomes = run_processes(_rank_dependent_job, 4, timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert all(o.value[0] == "PlanMismatchError" for o in outcomes), [o.value for o in outcomes]


def _diverging_job(rank, size):
    """Rank 1's planner, replaced at run time, makes another plan from the same metadata at step 2: with the header
    riding in a dispatch sized by each rank's own plan, gloo aborted the process (SIGABRT); no planner word vouches
    for a replaced planner, so the header all-reduce names the rank (another checkout, numpy or host: another
    word, test_runtime_plan_identity)."""
    real = dispatcher_module.balance
    state = {"step": 0}

    def planned(lengths, num_ranks, **options):
        if rank == 1 and state["step"] == 2:
            options = {**options, "algorithm": "identity"}
        return real(lengths, num_ranks, **options)

    dispatcher_module.balance = planned
    dispatcher = PostBalancingDispatcher(algorithm="lpt", cost=CostModel(linear=1), per_item_keys={"id"})
    try:
        for step in range(3):
            state["step"] = step
            plan = dispatcher.plan(_lengths(rank, step))
            batch = _batch(rank, step)
            home = dispatcher.combine(dispatcher.dispatch(batch, plan), plan)
            assert torch.equal(home["x"], batch["x"])
        return "ok", None
    except PlanMismatchError as error:
        return "PlanMismatchError", str(error)
    finally:
        dispatcher_module.balance = real


def test_regression_a_rank_planning_otherwise_is_named_on_every_rank_not_aborted():
    outcomes = run_processes(_diverging_job, 4, timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message = o.value
        assert kind == "PlanMismatchError" and "ranks [1] disagree with ranks [0, 2, 3]" in message, (o.rank, o.value)


CP_SPEC = ContextParallel(degrees=(1, 2, 4), gpus_per_node=4, half_efficiency_tokens=1, latency_s=0,
                          kv_bytes_per_token=0, seconds_per_cost=1.0)
CP_HOMES = ((40, 3, 2), (2, 1), (6, 3), (5,))  # item 0 split over 4 ranks, items 1-3 over 2


def _split_job(rank, size, odd_step):
    """Split items: per-item scores summed home shard by shard, ids kept from group rank 0; from `odd_step`
    on, rank 1's scores are float32 (every other rank's float64)."""
    dispatcher = PostBalancingDispatcher(cost=CostModel(linear=1.0, quadratic=0.05), context_parallel=CP_SPEC,
                                         per_item_keys={"sid", "score"})
    lengths, first = list(CP_HOMES[rank]), sum(len(home) for home in CP_HOMES[:rank])
    positions = torch.cat([torch.arange(length, dtype=torch.float64) for length in lengths])
    sids = torch.arange(first, first + len(lengths))
    counts = []
    try:
        for step in range(3):
            plan = dispatcher.plan(lengths)
            counter = CollectiveCounter()
            try:
                moved = dispatcher.dispatch({"pos": positions, "sid": sids}, plan)
                dispatched = sum(counter.calls.values())
                scores = torch.stack([rows.sum() for rows in moved["pos"].split(plan.local_lengths.tolist())])
                scores = scores.float() if rank == 1 and step >= odd_step else scores
                home = dispatcher.combine({"sid": moved["sid"], "score": scores}, plan, differentiable=False,
                                          split_reduce={"score": "sum", "sid": "first"})
            finally:
                counter.close()
            sums = [float(sum(range(length))) for length in lengths]
            assert home["score"].tolist() == sums and torch.equal(home["sid"], sids), (home, sums)
            counts.append((dispatched, sum(counter.calls.values()) - dispatched))
        return "ok", counts, int(plan.balance.degree.max())
    except SchemaMismatchError as error:
        return "SchemaMismatchError", str(error)


def test_split_items_ride_the_header_in_the_payload_and_a_deviating_combine_is_named_on_every_rank():
    outcomes = run_processes(_split_job, 4, args=(3,), timeout_s=120)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert all(o.value == ("ok", [(2, 2), (1, 1), (1, 1)], 4) for o in outcomes), [o.value for o in outcomes]
    outcomes = run_processes(_split_job, 4, args=(1,), timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message = o.value
        assert kind == "SchemaMismatchError" and "ranks [1] disagree with ranks [0, 2, 3]" in message, o.value

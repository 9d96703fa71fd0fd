"""Issue 24 item 2: the plan identity is agreed in the metadata all-gather every plan makes anyway (each rank's
`routes.planner_word`: the code and environment it plans with, or 0 where no word vouches for its plans), so a
default dispatch (no `check_plan`) whose ranks all sent the same word carries its header in the payload
all-to-all, with no header collective of its own; ranks of other words keep the header all-reduce, and a plan
they make otherwise is named on every rank, never a gloo abort.

Real gloo groups of 4 ranks; each rank counts its own collectives (`runtime.counting`).  The guarantees of the
riding header (a kept plan, another schema, a plugin or replaced planner) are in test_runtime_header_rides."""


import numpy as np
import pytest
import torch

from orchmllm.balancers import ContextParallel, CostModel
from orchmllm.balancers.problem import KernelResult
from orchmllm.balancers.registry import register_algorithm
from orchmllm.runtime import PlanMismatchError, PostBalancingDispatcher
from orchmllm.runtime import dispatcher as dispatcher_module
from orchmllm.runtime import routes as routes_module
from orchmllm.runtime.agreement import code_word
from orchmllm.runtime.counting import CollectiveCounter
from orchmllm.runtime.launch import run_processes
from orchmllm.runtime.metadata import gather_metadata
from orchmllm.runtime.options import DispatchOptions

LENGTHS = [[3, 1, 2], [2, 2], [4], [1, 1, 1]]
CP_SPEC = ContextParallel(degrees=(1, 2, 4), gpus_per_node=4, half_efficiency_tokens=1, latency_s=0,
                          kv_bytes_per_token=0, seconds_per_cost=1.0)
CONFIGS = {
    "lpt": dict(algorithm="lpt", cost=CostModel(linear=1)),
    "microbatched": dict(cost=CostModel(linear=1), max_tokens_per_microbatch=6),
    "context_parallel": dict(cost=CostModel(linear=1.0, quadratic=0.05), context_parallel=CP_SPEC),
}


def _lengths(rank, step, config="lpt"):
    scale = 10 if config == "context_parallel" and rank == 0 else 1  # a long item, split over a group
    return [scale * length + step % 2 for length in LENGTHS[rank]]


def _steps(rank, config="lpt", steps=4, odd_plan=None, counts=None):
    """Plan, dispatch and combine `steps` steps of a default dispatcher (no `check_plan`): per step, the
    all-reduces and all-to-alls of its dispatch and of its combine (appended to `counts`); every rank's rows
    come home unchanged.  `odd_plan(step, plan)` is the plan this rank dispatches instead of its own."""
    dispatcher = PostBalancingDispatcher(per_item_keys={"id"}, **CONFIGS[config])
    counts = [] if counts is None else counts
    for step in range(steps):
        lengths = _lengths(rank, step, config)
        plan = dispatcher.plan(lengths)
        batch = {"x": torch.arange(2 * sum(lengths), dtype=torch.float32).reshape(-1, 2) + 100 * rank + 1000 * step,
                 "id": torch.arange(len(lengths)) + 10 * rank}
        counter = CollectiveCounter()
        try:
            moved = dispatcher.dispatch(batch, plan if odd_plan is None else odd_plan(step, plan))
            dispatched = (counter.calls["all_reduce"], counter.calls["all_to_all_single"])
            home = dispatcher.combine({"x": moved["x"] * 2, "id": moved["id"]}, plan, differentiable=False,
                                      split_reduce="first", order="local_items")
        finally:
            counter.close()
        assert torch.equal(home["x"], batch["x"] * 2) and torch.equal(home["id"], batch["id"])
        counts.append((dispatched, (counter.calls["all_reduce"] - dispatched[0],
                                    counter.calls["all_to_all_single"] - dispatched[1])))
    return counts, int(plan.num_microbatches), int(plan.sharding.degree.max())


def _count_job(rank, size, config):
    return _steps(rank, config)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_regression_a_default_dispatch_ran_a_header_all_reduce_of_its_own_every_step(config):
    """Before: a plan each rank made alone did not size a collective, so every default dispatch ran a header
    all-reduce before its payload all-to-all ((1, 1) every step); now the ranks' planner words, agreed in the
    metadata all-gather, vouch for the plan, and only each site's first exchange checks in a header of its own."""
    code_word()  # read here, before the ranks fork: a file another process writes meanwhile cannot set them apart
    outcomes = run_processes(_count_job, 4, args=(config,), timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        counts, microbatches, degree = o.value
        assert counts == [((1, 1), (1, 1))] + [((0, 1), (0, 1))] * 3, (o.rank, o.value)
    assert (microbatches > 1) == (config == "microbatched") and (degree > 1) == (config == "context_parallel")


def _other_code_job(rank, size):
    """Rank 1 runs another orchmllm checkout (its code word differs) whose `balance` plans otherwise at step 2
    (the other checkout's own function, so its plans are not refused as a plugin's)."""
    real, calls, counts = dispatcher_module.balance, [], []

    def other_checkout(lengths, num_ranks, **options):
        calls.append(len(calls))
        return real(lengths, num_ranks, **{**options, "algorithm": "identity" if len(calls) == 3 else "lpt"})

    if rank == 1:
        other_checkout.__module__ = real.__module__
        dispatcher_module.balance, routes_module.code_word = other_checkout, lambda: 7
    try:
        return "ok", _steps(rank, counts=counts), counts
    except PlanMismatchError as error:
        return "PlanMismatchError", str(error), counts


def test_ranks_planning_with_other_code_keep_the_header_all_reduce_and_a_plan_made_otherwise_is_named():
    """A rank on another checkout, numpy or host may plan otherwise from the same metadata: its word differs, so
    no dispatch rides (every dispatch runs its header all-reduce) and its other plan is named on every rank
    (the payload sized by unequal plans would abort gloo: probe24 P24-01)."""
    outcomes = run_processes(_other_code_job, 4, timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message, counts = o.value
        assert kind == "PlanMismatchError" and "ranks [1] disagree with ranks [0, 2, 3]" in message, (o.rank, o.value)
        assert "dispatch: the plan" in message and counts == [((1, 1), (1, 1)), ((1, 1), (0, 1))], (o.rank, o.value)


def _foreign_job(rank, size):
    other = PostBalancingDispatcher(algorithm="karmarkar_karp", cost=CostModel(linear=1), per_item_keys={"id"})
    foreign = {}

    def odd_plan(step, plan):
        return foreign[step] if rank == 1 and step == 2 else plan

    for step in range(3):
        foreign[step] = other.plan(_lengths(rank, step))
    try:
        return "ok", _steps(rank, odd_plan=odd_plan)[0]
    except PlanMismatchError as error:
        return "PlanMismatchError", str(error)


def test_a_foreign_plan_dispatched_where_the_default_rides_is_named_on_every_rank():
    """Rank 1 dispatches another dispatcher's plan (other options) of the same step where the header rides:
    it sends zeros of the expected pieces and an invalid word, and every rank raises naming it."""
    outcomes = run_processes(_foreign_job, 4, timeout_s=120, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message = o.value
        assert kind == "PlanMismatchError" and "ranks [1] disagree with ranks [0, 2, 3]" in message, (o.rank, o.value)


def _words_job(rank, size, words):
    return gather_metadata([rank + 1], num_columns=1, fingerprint=bytes(range(32)), planner=words[rank]).planner


@pytest.mark.parametrize("words, agreed", [((5, 5, 5, 5), 5), ((5, 5, 6, 5), 0), ((0, 0, 0, 0), 0)])
def test_the_metadata_all_gather_carries_the_planner_word_every_rank_sent(words, agreed):
    outcomes = run_processes(_words_job, 4, args=(words,), timeout_s=60, collective_timeout_s=20)
    assert [o.value for o in outcomes] == [agreed] * 4, [(o.value, o.error) for o in outcomes]


def _everything_on_rank_0(problem):
    return KernelResult(np.zeros(problem.num_items, np.int64))


@pytest.mark.parametrize("options, planner, vouched", [
    (dict(algorithm="lpt"), dispatcher_module.balance, True),
    (dict(max_tokens_per_microbatch=64), dispatcher_module.plan_microbatches, True),
    (dict(algorithm="lpt", time_limit=1.0), dispatcher_module.balance, False),  # a clock may stop it
    (dict(algorithm="exact"), dispatcher_module.balance, False),
    (dict(max_tokens_per_microbatch=64, microbatch_algorithm="exact"), dispatcher_module.plan_microbatches, False),
    (dict(algorithm="plan_identity_plugin"), dispatcher_module.balance, False),
    (dict(algorithm="lpt"), lambda *args, **kwargs: None, False),  # a planner replaced at run time
], ids=["lpt", "microbatched", "time_limit", "exact", "microbatch_exact", "plugin", "replaced"])
def test_a_planner_word_vouches_only_for_orchmllm_s_own_planners_that_no_clock_stops(options, planner, vouched):
    register_algorithm("plan_identity_plugin", _everything_on_rank_0)
    word = routes_module.planner_word(DispatchOptions(cost=CostModel(linear=1), **options), planner)
    assert word == (code_word() if vouched else 0)


FRESH_IMPORT = "import orchmllm.runtime.agreement as a; print(a.code_word.cache_info().currsize)"
EARLY = {"fresh import": ("-c", FRESH_IMPORT)}  # conftest's `started_early`


@pytest.mark.early("fresh import")
def test_regression_the_planner_word_is_read_at_import_with_the_code_it_describes(started_early):
    """rev17 R17-02: the word was read at the first plan, so a checkout changed between a process's import and its
    first plan gave a process running the old code the new files' word."""
    done = started_early("fresh import")
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr

"""Ranks whose solvers stop at different plans, and plans made on a prefetch thread (issue 24, probe6
P6-01..03): a clear error on every rank or a correct step, never rows moved along two plans."""

import os
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from orchmllm.balancers import ContextParallel, CostModel
from orchmllm.balancers.problem import KernelResult
from orchmllm.balancers.registry import register_algorithm
from orchmllm.orchestrator import Orchestrator, Stage
from orchmllm.orchestrator.samples import Sample
from orchmllm.runtime import MultiStageRuntime, PlanMismatchError, PostBalancingDispatcher, Prefetcher
from orchmllm.runtime.demo import demo_stages
from orchmllm.runtime.demo.data import SyntheticMultimodal
from orchmllm.runtime.demo.model import ModelConfig, TinyMultimodalModel
from orchmllm.runtime.comm import PeerFailureError, collective
from orchmllm.runtime.launch import run_processes
from orchmllm.runtime.sampler import BalancedDistributedSampler

COLLECTIVE_TIMEOUT_S = 20


def register_rank_dependent_solver() -> str:
    """A plugin that plans round robin, with items 0 and 1 swapped on rank 1: the same metadata, another
    plan there (as a solver stopped by a wall-clock limit does under another load)."""

    def solve(problem):
        assignment = np.arange(problem.num_items) % problem.num_ranks
        if dist.get_rank() == 1 and problem.num_items > 1:
            assignment[[0, 1]] = assignment[[1, 0]]
        return KernelResult(assignment)

    register_algorithm("rank_dependent", solve)
    return "rank_dependent"


def outcome(run):
    try:
        return ("ok", run())
    except PlanMismatchError as error:
        return ("PlanMismatchError", str(error))


def dispatcher_job(rank, size):
    """Every item 4 tokens: the two plans send each rank as many rows as the other expects."""
    dispatcher = PostBalancingDispatcher(algorithm=register_rank_dependent_solver(), per_item_keys={"id"})
    plan = dispatcher.plan([4, 4])
    batch = {"id": torch.arange(2) + 10 * rank, "x": torch.ones(8, 2)}
    return outcome(lambda: sorted(dispatcher.dispatch(batch, plan)["id"].tolist()))


def multistage_job(rank, size):
    config = ModelConfig(llm_hidden=16, encoder_hidden=16, vocab=32)
    torch.manual_seed(0)
    model = TinyMultimodalModel(config)
    data = SyntheticMultimodal(config, samples_per_rank=3)
    costs = {m: CostModel(per_item=1, linear=1) for m in ("image", "audio", "llm")}
    runtime = MultiStageRuntime(demo_stages(costs, config, algorithm=register_rank_dependent_solver()))

    def step():
        batch = data.local_batch(0, rank)
        routes = runtime.plan(batch.samples)
        moved = runtime.dispatch(routes, text=batch.text, per_sample=batch.per_sample, inputs=batch.inputs)
        for micro in runtime.microbatches(routes, moved):
            runtime.forward(micro.routes, micro.data, encoders=model.encoders(), text_embedding=model.llm.embed)
        return "trained"

    return outcome(step)


@pytest.mark.parametrize("job", [dispatcher_job, multistage_job], ids=["dispatcher", "multi-stage"])
def test_regression_plans_that_differ_across_ranks_with_the_same_metadata_are_named_on_every_rank(job):
    """Cause: the route's plan word held the configuration and the gathered metadata only, so ranks whose
    solver stopped at other plans (the ILP's default 10 s limit under uneven load) passed the exchange
    header: equal row counts moved rows along two plans silently, others aborted gloo (SIGABRT).  The
    plan's digest now rides in the word."""
    started = time.monotonic()
    outcomes = run_processes(job, 2, timeout_s=90, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message = o.value
        assert kind == "PlanMismatchError", (o.rank, o.value)
        assert "the plan differs across ranks" in message, message
    assert time.monotonic() - started < COLLECTIVE_TIMEOUT_S


def time_limited_job(rank, size):
    """The rank-dependent solver under a `time_limit` (an exact solver the wall clock stops at other plans on other
    ranks): the ids and rows each rank received."""
    dispatcher = PostBalancingDispatcher(algorithm=register_rank_dependent_solver(), time_limit=5.0,
                                         per_item_keys={"id"})
    plan = dispatcher.plan([4, 4])
    moved = dispatcher.dispatch({"id": torch.arange(2) + 10 * rank, "x": torch.arange(8.0) + 100 * rank}, plan)
    return outcome(lambda: (moved["id"].tolist(), moved["x"].tolist(), plan.balance.assignment.tolist()))


def test_regression_time_limited_solvers_stopped_at_different_plans_killed_a_correct_loop():
    """Cause (probe13 P13-17): under a `time_limit` (accepted, documented) an exact solver stopped by the wall clock
    at different plans on different ranks raised PlanMismatchError at a random step of a correct loop, blaming
    "the same solver, version and configuration".  The ranks now follow the plan of the group's rank 0 (one
    broadcast, only where the plan check finds them apart): every row goes where that plan sends it."""
    outcomes = run_processes(time_limited_job, 2, timeout_s=90, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok and o.value[0] == "ok" for o in outcomes), [o.value if o.ok else o.error for o in outcomes]
    (ids0, rows0, plan0), (ids1, rows1, plan1) = (o.value[1] for o in outcomes)
    assert plan0 == plan1 == [0, 1, 0, 1]  # rank 0's round robin, not rank 1's swap
    assert sorted(ids0 + ids1) == [0, 1, 10, 11] and ids0 == [0, 10] and ids1 == [1, 11]
    assert rows0 == [0.0, 1.0, 2.0, 3.0, 100.0, 101.0, 102.0, 103.0], rows0


def prefetch_without_group_job(rank, size):
    """The README's prefetch lambda with `metadata_group=group` left out, training collectives meanwhile."""
    dispatcher = PostBalancingDispatcher(algorithm="lpt", per_item_keys={"id"})
    prefetcher = Prefetcher(lambda lengths, group: dispatcher.plan(lengths))
    received = []
    for step in range(3):
        prefetcher.submit([3 + step + rank, 5])
        for _ in range(20):
            value = torch.ones(1)
            dist.all_reduce(value)
        plan = prefetcher.result(timeout=COLLECTIVE_TIMEOUT_S)
        batch = {"id": torch.arange(2) + 10 * rank, "x": torch.ones(8 + step + rank, 2)}
        received.append(sorted(dispatcher.dispatch(batch, plan)["id"].tolist()))
    prefetcher.close()
    return received


def test_regression_a_plan_on_the_prefetch_thread_without_metadata_group_gathers_on_the_prefetch_group():
    """Cause: `plan(lengths)` on the Prefetcher's thread gathered on the training group, where its
    all-gather paired with the training thread's all-reduces: both ranks hung until the collective
    timeout and blamed a dead peer.  On a Prefetcher's thread the default metadata group is now its own."""
    results = run_processes(prefetch_without_group_job, 2, timeout_s=90, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in results), [o.error for o in results]
    for step in range(3):
        assert sorted(sum((o.value[step] for o in results), [])) == [0, 1, 10, 11]


@pytest.mark.parametrize("algorithm", ["ilp", "exact"])
def test_regression_the_sampler_refuses_exact_solvers_whose_time_limit_lets_ranks_plan_apart(algorithm):
    """Cause: the sampler plans on every rank alone, and the exact solvers stop at a wall-clock limit:
    ranks under other loads stopped at other plans and duplicated or dropped samples."""
    with pytest.raises(ValueError, match=rf"`algorithm` '{algorithm}' is an exact solver, which stops at a "
                                         r"wall-clock time limit"):
        BalancedDistributedSampler(list(range(1, 25)), num_replicas=4, rank=0, global_batch_size=24,
                                   algorithm=algorithm)


SPLITTING = ContextParallel(degrees=(1, 2), gpus_per_node=2, half_efficiency_tokens=1, latency_s=0,
                            kv_bytes_per_token=0, seconds_per_cost=1.0)
FOREIGN = {  # the options of the dispatcher that plans; another without them dispatches its plan
    "context_parallel": dict(context_parallel=SPLITTING),
    "max_tokens_per_microbatch": dict(max_tokens_per_microbatch=42),
}


def foreign_plan_job(rank, size, option):
    lengths = [40, 3] if rank == 0 else [2, 4]
    cost = CostModel(linear=1.0, quadratic=0.05)
    planner = PostBalancingDispatcher(cost=cost, per_item_keys=("sid",), **FOREIGN[option])
    other = PostBalancingDispatcher(cost=cost, per_item_keys=("sid",))
    plan = planner.plan(lengths)
    batch = {"sid": torch.tensor([10 * rank, 10 * rank + 1]), "x": torch.ones(sum(lengths), 2)}
    return outcome(lambda: [micro.lengths.tolist() for micro in other.microbatches(plan, other.dispatch(batch, plan))])


@pytest.mark.parametrize("option", sorted(FOREIGN))
def test_regression_a_plan_dispatched_by_a_dispatcher_of_other_options_is_named_on_every_rank(option):
    """Cause: `dispatch` / `microbatches` / `combine` checked only that a plan was a DispatchPlan: a plan
    that split item 0 over both ranks, taken by a dispatcher without `context_parallel`, came out as
    two whole 20-token sequences with no layout (packed attention within each shard), no error (probe6
    P6-09).  A plan now carries its dispatcher's configuration and another dispatcher refuses it."""
    outcomes = run_processes(foreign_plan_job, 2, args=(option,), timeout_s=90,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message = o.value
        assert kind == "PlanMismatchError", (o.rank, o.value)
        assert "the plan was made by a dispatcher with other options (`" + option in message, message


LAUNCHER = """
import os, sys, time
from orchmllm.runtime.comm import PeerFailureError, collective
from orchmllm.runtime.launch import run_processes

def job(rank, size):
    with open(os.path.join(sys.argv[1], f"rank{rank}"), "w") as file:
        file.write(str(os.getpid()))
    time.sleep(120)

run_processes(job, 2, timeout_s=300)
"""


@pytest.mark.background
def test_regression_ranks_of_a_killed_launcher_end_with_it(tmp_path):
    """Cause: `run_processes` children are daemons, which ends them only on the parent's own exit: a
    parent killed by SIGKILL (a scheduler after its grace period) left its ranks running at 100 % CPU
    for minutes (probe6 P6-08).  Each child now watches its parent and leaves when it is gone."""
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(tmp_path)])
    files = [tmp_path / f"rank{rank}" for rank in range(2)]
    deadline = time.monotonic() + 60
    while not all(file.exists() and file.read_text() for file in files) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(file.read_text()) for file in files]
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie (exited, not yet reaped by init) is gone too
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_regression_the_local_items_and_lengths_a_plan_hands_out_are_read_only():
    """Cause: `plan.local_items` / `plan.local_lengths` were the sharding's own writable arrays: an in-place
    edit (`ids += offset`, a swap) changed what later `microbatches` yielded as `micro.lengths`, silently
    (probe6 P6-13)."""
    dispatcher = PostBalancingDispatcher(per_item_keys={"sid"})
    plan = dispatcher.plan([5, 3])
    for array in (plan.local_items, plan.local_lengths):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 7
    moved = dispatcher.dispatch({"sid": torch.arange(2), "x": torch.ones(8, 2)}, plan)
    assert [micro.lengths.tolist() for micro in dispatcher.microbatches(plan, moved)] == [[5, 3]]


def test_regression_an_exchange_s_type_errors_name_the_key():
    """Cause: the type and shape checks named the piece's number in the sorted key order, which the user
    never saw (probe6 P6-16)."""
    dispatcher = PostBalancingDispatcher(per_item_keys={"sid"})
    plan = dispatcher.plan([5, 3])
    with pytest.raises(TypeError, match=r"piece 0 \(sid\): expected a torch.Tensor; got ndarray"):
        dispatcher.dispatch({"sid": np.arange(2), "x": torch.ones(8, 2)}, plan)
    with pytest.raises(ValueError, match=r"piece 1 \(x\): tensor must have a leading item-row dimension"):
        dispatcher.dispatch({"sid": torch.arange(2), "x": torch.tensor(3.0)}, plan)


TEXT_STAGES = (Stage("vision", "image", CostModel(per_item=1, linear=1)),
               Stage("llm", "llm", CostModel(linear=1.0, quadratic=0.05)))


def self_planned_job(rank, size):
    """Every rank plans its step itself and takes `routes(step)`; rank 1's LLM stage keeps its items home."""
    text = {0: [5, 4, 6, 1], 1: [3, 6, 2, 9]}[rank]
    runtime = MultiStageRuntime(TEXT_STAGES)
    batch = runtime.gather_batch([Sample(t, (), rank, 10 * rank + k) for k, t in enumerate(text)])
    stages = TEXT_STAGES if rank == 0 else (TEXT_STAGES[0], replace(TEXT_STAGES[1], algorithm="identity"))
    routes = runtime.routes(Orchestrator(stages, size).plan(batch))
    ids = torch.cat([torch.full((t,), 10 * rank + k) for k, t in enumerate(text)])
    return outcome(lambda: runtime.dispatch(routes, text={"input_ids": ids}, inputs={"image": torch.zeros(0, 1)}))


def test_regression_routes_of_steps_planned_apart_are_named_on_every_rank():
    """Cause: `routes(step)` with its default plan_id 0 left the step out of every exchange header: ranks
    whose own step plans differed exchanged, and a rank expecting rows its peer never sent read
    uninitialised memory as input ids (probe6 P6-23).  The identity now comes from the step itself."""
    outcomes = run_processes(self_planned_job, 2, timeout_s=90, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert o.value[0] == "PlanMismatchError" and "the plan differs across ranks" in o.value[1], o.value
        assert "the algorithm plans differently in each process" in o.value[1]  # probe59 M1: the other cause named


def test_routes_refuse_what_is_not_a_step_and_a_negative_loss_token_count():
    runtime = MultiStageRuntime(TEXT_STAGES)
    step = Orchestrator(TEXT_STAGES, 1).plan(runtime.gather_batch([Sample(4, (), 0, 0)]))
    with pytest.raises(TypeError, match=r"`step` must be a StepPlan \(`Orchestrator.plan`\); got NoneType"):
        runtime.routes(None)
    with pytest.raises(ValueError, match=r"`num_loss_tokens` must be >= 0; got -1"):
        runtime.routes(step, num_loss_tokens=-1)


def foreign_routes_job(rank, size):
    """Routes of a runtime that splits, iterated by one that does not: item 0 (40 tokens) on both ranks."""
    text = {0: [40, 3], 1: [2, 4]}[rank]
    samples = [Sample(t, (), rank, 10 * rank + k) for k, t in enumerate(text)]
    routes = MultiStageRuntime(TEXT_STAGES, context_parallel=SPLITTING).plan(samples)
    other = MultiStageRuntime(TEXT_STAGES)
    ids = torch.cat([torch.full((t,), 10 * rank + k) for k, t in enumerate(text)])
    moved = other.dispatch(routes, text={"input_ids": ids}, inputs={"image": torch.zeros(0, 1)})
    return [(micro.layout is not None, micro.lengths.tolist()) for micro in other.microbatches(routes, moved)]


def test_regression_routes_that_split_an_item_give_layouts_in_a_runtime_that_does_not_split():
    """Cause: a runtime built micro-batch layouts only where its own `context_parallel` was set: routes of
    one that split item 0 over both ranks, iterated by another, gave its two zigzag shards as whole
    sequences with no layout (packed attention within each shard), silently (probe6 P6-09).  The
    layout now follows the routes' plan."""
    outcomes = run_processes(foreign_routes_job, 2, timeout_s=90, collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert all(layout for o in outcomes for layout, _ in o.value), [o.value for o in outcomes]


def test_regression_a_timed_out_collective_names_two_threads_on_one_group_as_a_cause():
    """Cause: where two threads of a rank ran collectives on one group, only the rank that saw them overlap
    named it; its peer waited out the timeout and blamed a dead peer alone (probe7 P7-09)."""
    with pytest.raises(PeerFailureError, match=r"a peer died or did not reach the call within the process group's "
                                               r"timeout \(or, where no refusal is published \(NCCL\), "
                                               r"two threads of a rank "
                                               r"ran collectives on this group"):
        with collective("dispatch header all-reduce"):
            raise RuntimeError("Timed out waiting")


def prefetch_on_the_training_group_job(rank, size):
    refused = []
    for group in (dist.group.WORLD, dist.new_group(backend="gloo")):
        try:
            Prefetcher(lambda lengths, group: None, group=group, training_group=group)
        except ValueError as error:
            refused.append(str(error))
    return refused


def test_regression_a_prefetcher_on_the_training_group_is_refused():
    """Cause: `Prefetcher(plan_fn, group=<the training group>)` ran the thread's metadata all-gathers on the
    group the training thread exchanged on: both ranks waited out the timeout and blamed a dead peer
    (probe7 P7-05)."""
    outcomes = run_processes(prefetch_on_the_training_group_job, 2, timeout_s=60,
                             collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        assert len(o.value) == 2 and all("`group` is the group the thread's collectives run on, and must be one of "
                                         "its own" in message for message in o.value), o.value


@pytest.mark.parametrize("budget", [None, 64])
def test_regression_padded_with_context_parallel_is_refused_when_the_dispatcher_is_built(budget):
    """Cause: the dispatcher took `padded=True` with `context_parallel` and refused it only at the first
    `plan()`, after the metadata all-gather (probe7 P7-06); options are checked at construction."""
    with pytest.raises(ValueError, match=r"`padded` cannot be combined with `context_parallel`: split items are "
                                         r"costed and laid out unpadded"):
        PostBalancingDispatcher(padded=True, context_parallel=SPLITTING, max_tokens_per_microbatch=budget)


def test_regression_a_step_dispatched_before_the_last_one_was_iterated_is_named_as_such():
    """Cause: `microbatches` of step k after step k + 1's dispatch was refused with "a plan kept from an
    earlier step?", which the program was not (probe7 P7-10): one dispatcher holds one step in flight."""
    dispatcher = PostBalancingDispatcher(per_item_keys={"sid"})
    first, second = dispatcher.plan([5, 3]), dispatcher.plan([4, 4])
    moved = dispatcher.dispatch({"sid": torch.arange(2), "x": torch.ones(8, 2)}, first)
    dispatcher.dispatch({"sid": torch.arange(2), "x": torch.ones(8, 2)}, second)
    with pytest.raises(PlanMismatchError, match=r"or a later step dispatched first\? \(a dispatcher holds one step "
                                                r"in flight; to overlap steps, alternate two dispatchers\)"):
        list(dispatcher.microbatches(first, moved))

"""Faults end in clear errors within bounded time, never in a hang."""

import functools
import math
import multiprocessing
import operator
import os
import time

import pytest
import torch

from orchmllm.balancers import CostModel
from orchmllm.runtime import (MultiStageRuntime, PeerFailureError, PlanMismatchError, PostBalancingDispatcher,
                              all_reduce_gradients, global_count, normalize_loss)
from orchmllm.runtime.metadata import PeerInputError
from orchmllm.runtime.demo.data import SyntheticMultimodal
from orchmllm.runtime.demo import demo_stages
from orchmllm.runtime.launch import SpawnError, run_processes, spawn
from orchmllm.runtime.microbatch import accumulate
from orchmllm.runtime.model_check import ModelContractError
from orchmllm.runtime.demo.model import ModelConfig

LENGTHS = [[9, 1, 7], [12, 3, 2], [2, 15], [4, 4, 8]]


def mismatched_dispatcher_job(rank, size, odd_option):
    options = {"algorithm": "lpt", "cost": CostModel(linear=1)}
    if rank == 1:
        options.update(odd_option)
    dispatcher = PostBalancingDispatcher(check_plan=True, **options)
    try:
        dispatcher.plan(LENGTHS[rank])
    except PlanMismatchError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("odd_option", [{"algorithm": "identity"}, {"cost": CostModel(linear=2)}],
                         ids=["other-algorithm", "same-plan-other-cost"])
def test_a_rank_with_another_solver_config_is_named_on_every_rank(odd_option):
    messages = spawn(mismatched_dispatcher_job, 4, args=(odd_option,), timeout_s=60)
    for message in messages:
        assert "ranks [1] disagree with ranks [0, 2, 3]" in message, message


def mismatched_stages_job(rank, size, where):
    """Rank 2 plans its stages with the identity algorithm: declared in its stages (the
    configuration fingerprint sees it), or swapped in behind the same declaration (as a
    time-limited solver stopping early would differ: only the step-plan digest sees it)."""
    config = ModelConfig()

    def stages(algorithm):
        return demo_stages({m: CostModel(per_item=1, linear=1) for m in ("image", "audio", "llm")}, config,
                           algorithm=algorithm)

    declared = "identity" if rank == 2 and where == "declared" else "lpt"
    runtime = MultiStageRuntime(stages(declared), check_plan=where == "behind the declaration")
    if rank == 2 and where == "behind the declaration":
        runtime.orchestrator = MultiStageRuntime(stages("identity")).orchestrator
    try:
        runtime.plan(SyntheticMultimodal(config, samples_per_rank=4).samples(0, rank))
    except PlanMismatchError as error:
        return str(error)
    return "no error"


def test_a_rank_with_other_stage_algorithms_is_named_by_the_step_plan_check():
    for message in spawn(mismatched_stages_job, 3, args=("behind the declaration",), timeout_s=60):
        assert message.startswith("step plan differs across ranks") and "ranks [2] disagree" in message


def test_a_rank_declaring_other_stage_algorithms_is_named_by_the_config_fingerprint_without_check_plan():
    for message in spawn(mismatched_stages_job, 3, args=("declared",), timeout_s=60):
        assert message.startswith("stage configuration differs across ranks") and "ranks [2] disagree" in message


def failing_step_job(rank, size, fault):
    dispatcher = PostBalancingDispatcher(per_item_keys={"id"})
    plan = dispatcher.plan(LENGTHS[rank])
    batch = {"x": torch.ones(sum(LENGTHS[rank]), 4), "id": torch.arange(len(LENGTHS[rank]))}
    if rank == 2:
        if fault == "raise":
            raise RuntimeError("injected fault on rank 2")
        time.sleep(60)  # alive but silent
    for _ in range(3):
        batch = dispatcher.dispatch(batch, plan)
        batch = dispatcher.combine(batch, plan, differentiable=False)
    return "finished"


@pytest.mark.background
@pytest.mark.parametrize("fault", ["raise", "hang"])
def test_a_failing_rank_makes_the_others_fail_within_the_collective_timeout(fault):
    """The hang waits out its 10 s kill."""
    start = time.monotonic()
    outcomes = run_processes(failing_step_job, 4, args=(fault,), timeout_s=10, collective_timeout_s=3)
    elapsed = time.monotonic() - start
    assert not any(o.ok for o in outcomes)
    if fault == "raise":
        assert "injected fault on rank 2" in outcomes[2].error
        with pytest.raises(SpawnError, match="rank 2"):
            spawn(failing_step_job, 4, args=("raise",), timeout_s=8, collective_timeout_s=3)
    else:
        assert outcomes[2].seconds is None and "killed after the 10 s timeout" in outcomes[2].error
    for outcome in outcomes:
        if outcome.rank != 2:
            assert outcome.seconds is not None and outcome.seconds < 9, outcome
            assert "Traceback" in outcome.error
    assert elapsed < 15


def exchange_without_backward_job(rank, size):
    """A rank that skips backward through an autograd exchange leaves its peers waiting;
    the collective timeout turns that into an error instead of a hang."""
    dispatcher = PostBalancingDispatcher()
    plan = dispatcher.plan(LENGTHS[rank])
    x = torch.ones(sum(LENGTHS[rank]), 2, requires_grad=True)
    y = dispatcher.dispatch({"x": x}, plan, differentiable=True)["x"]
    if rank != 0:
        y.sum().backward()
    return "ok"


def test_skipping_backward_on_one_rank_is_an_error_not_a_hang():
    outcomes = run_processes(exchange_without_backward_job, 3, timeout_s=15, collective_timeout_s=3)
    assert outcomes[0].ok
    assert all(not o.ok and o.seconds is not None for o in outcomes[1:])


def test_invalid_world_size_and_unpicklable_results_are_reported():
    with pytest.raises(ValueError, match="`world_size` must be a positive int"):
        run_processes(mismatched_dispatcher_job, 0)
    start = time.monotonic()
    outcomes = run_processes(lambda rank, size: (lambda: None), 1, timeout_s=20)
    assert time.monotonic() - start < 10
    assert not outcomes[0].ok and "pickle" in outcomes[0].error.lower()


def test_demo_arguments_are_validated():
    from orchmllm.runtime.demo import run_demo

    with pytest.raises(ValueError, match="`ranks` must be an int >= 1"):
        run_demo(ranks=0)
    with pytest.raises(ValueError, match="`dtype` must be one of"):
        run_demo(dtype="float16")
    with pytest.raises(ValueError, match="needs `gpus_per_node` dividing ranks=4"):
        run_demo(transport="hierarchical", gpus_per_node=3)


def tensors_job(rank, size):
    return [torch.full((1000, 100), float(rank)) for _ in range(5)]


def test_regression_a_job_returning_tensors_failed_in_the_parent():
    """Cause: the queue pickled tensors as shared-memory handles, which died with the child: the
    parent got FileNotFoundError, EOFError or ConnectionResetError.  Values now travel by value."""
    for rank, value in enumerate(spawn(tensors_job, 4, timeout_s=60)):
        assert len(value) == 5 and all(torch.equal(t, torch.full((1000, 100), float(rank))) for t in value)


def loader_workers_job(rank, size):
    """A `DataLoader` with a worker process inside a rank (a sampler's usual loader): the sum of its batches."""
    from torch.utils.data import DataLoader
    return sum(int(batch.sum()) for batch in DataLoader(list(range(8)), batch_size=2, num_workers=1))


def test_regression_a_data_loader_with_workers_inside_a_local_rank_died_with_a_raw_assertion():
    """Cause (probe16 P16-01): the local launcher (`spawn`, `run_script` without torchrun) started its ranks as
    daemonic processes, which may not have children: a `DataLoader(num_workers >= 1)` in a rank, as the sampler
    examples' loaders are written, raised multiprocessing's "daemonic processes are not allowed to have children"
    on every rank.  The ranks are plain processes now (`run_processes` joins or kills each before returning, and
    each leaves when its parent is gone): the loader's workers run as under torchrun."""
    assert spawn(loader_workers_job, 2, timeout_s=60) == [28, 28]


def _refuse_to_load():
    raise ImportError("no such class here")


class LoadsOnlyInTheChild:
    def __reduce__(self):
        return _refuse_to_load, ()


def test_a_value_the_parent_cannot_unpickle_is_that_rank_s_error():
    (outcome,) = run_processes(lambda rank, size: LoadsOnlyInTheChild(), 1, timeout_s=20)
    assert not outcome.ok and "could not be unpickled in the parent (ImportError: no such class here)" in outcome.error


def dead_peer_job(rank, size, where):
    """Rank 1 dies (os._exit) before `plan` or before `dispatch`; the others report what they see."""
    dispatcher = PostBalancingDispatcher()
    lengths = [[5, 3], [4, 2, 6], [1]][rank]
    if where == "plan" and rank == 1:
        os._exit(0)
    try:
        plan = dispatcher.plan(lengths)
        if where == "dispatch" and rank == 1:
            os._exit(0)
        dispatcher.dispatch({"tok": torch.zeros(sum(lengths))}, plan)
    except PeerFailureError as error:
        return str(error)
    return "finished"


@pytest.mark.parametrize("where, phase", [("plan", "the metadata all-gather (dispatcher configuration)"),
                                          ("dispatch", "the dispatch header all-reduce")])
def test_regression_a_dead_peer_gave_gloo_text_naming_neither_the_collective_nor_the_group(where, phase):
    """Cause: the dispatcher's metadata all-gather and exchange header raised gloo's bare "Connection reset by
    peer" / "Timed out waiting" when a peer died or stalled; they now say which collective over how many ranks."""
    outcomes = run_processes(dead_peer_job, 3, args=(where,), timeout_s=60, collective_timeout_s=10)
    for o in (outcomes[0], outcomes[2]):
        assert o.ok, o.error
        assert o.value.startswith(f"rank {o.rank}: {phase} over 3 ranks failed; a peer died or did not reach the "
                                  f"call within the process group's timeout"), o.value


def _timed(body) -> tuple[str, str, float]:
    """What `body()` raised (its type's name and message; "no error", "") and the seconds it took."""
    start = time.perf_counter()
    try:
        body()
    except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
        return type(error).__name__, str(error), time.perf_counter() - start
    return "no error", "", time.perf_counter() - start


def plan_ahead_on_a_thread_of_ones_own_job(rank, size):
    """Each rank plans step 0, then plans step 1 on a thread pool of its own (no `metadata_group`, so on the
    training group) while its training thread dispatches step 0.  The two ranks meet the two collectives in the
    two orders one run of probe7's P7-09 saw: rank 0's pool thread enters first, rank 1's training thread.
    Returns what each rank raised and when (seconds from the dispatch, the collective timeout being 20 s)."""
    from concurrent.futures import ThreadPoolExecutor

    dispatcher = PostBalancingDispatcher(per_item_keys=("sid",))
    lengths = LENGTHS[rank]
    plan = dispatcher.plan(lengths)
    batch = {"sid": torch.arange(len(lengths)), "tok": torch.zeros(sum(lengths))}

    def plan_ahead():
        time.sleep(1.0 if rank else 0.0)
        return dispatcher.plan(lengths)

    def step():
        with ThreadPoolExecutor(1, thread_name_prefix="own-prefetch") as pool:
            ahead = pool.submit(plan_ahead)
            time.sleep(0.5 if rank == 0 else 0.0)
            dispatcher.dispatch(batch, plan)
            ahead.result()

    outcome = _timed(step)
    time.sleep(3.0)  # the refusing rank stays (its sockets open) until its peer has read its refusal
    return outcome


def test_regression_two_threads_on_one_group_stopped_one_rank_and_its_peer_waited_out_the_timeout():
    """Cause (probe6 P6-17, probe7 P7-09): the refusal of a second thread's collective on a group was local to
    the rank that saw the threads overlap.  Its peer, whose threads ran one after the other, waited in a
    collective the refusing rank never posted until the group's timeout (30 min by default) and blamed a dead
    peer; the refusing rank waited as long too, joining its thread stuck in the other collective.  Now the
    thread that ran a group's first runtime collective holds it, and every rank refuses another thread's
    collective on it before posting it, whatever the timing."""
    outcomes = run_processes(plan_ahead_on_a_thread_of_ones_own_job, 2, timeout_s=60, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        kind, message, seconds = o.value
        assert kind == "ThreadClashError" and seconds < 5.0, o.value
        assert message.startswith(f"rank {o.rank}: the metadata all-gather (dispatcher configuration) on thread "
                                  f"'own-prefetch_0' while thread 'MainThread', which ran the runtime's first "
                                  f"collective on this process group (the metadata all-gather (dispatcher "
                                  f"configuration)), lives and holds it (a thread that takes over calls "
                                  f"`orchmllm.runtime.take_group(group)` first, at the same point on every rank): two "
                                  f"threads' collectives on one group meet in no set order across ranks"), message
        assert "`metadata_group=` a group of its own" in message, message


def racing_for_the_first_collective_job(rank, size):
    """Rank 0's first collective on the group runs on a thread pool of its own (a plan), and its training thread
    plans meanwhile: refused there (the pool thread's next all-gather too: the group is unusable).  Rank 1 plans
    on its training thread, whose first all-gather meets rank 0's pool thread's; its second waits for one that
    rank 0 will not post."""
    from concurrent.futures import ThreadPoolExecutor, wait

    dispatcher = PostBalancingDispatcher()
    lengths = LENGTHS[rank]
    def steps():
        with ThreadPoolExecutor(1, thread_name_prefix="own-prefetch") as pool:
            if rank == 0:
                ahead = pool.submit(dispatcher.plan, lengths)
                time.sleep(0.5)  # the pool thread's all-gather waits for rank 1's
                try:
                    dispatcher.plan(lengths)
                finally:
                    wait([ahead], timeout=30)
            time.sleep(1.0)
            dispatcher.plan(lengths)

    outcome = _timed(steps)
    time.sleep(4.0)  # the refusing rank stays (its sockets open) until its peer has read its refusal
    return outcome


def test_regression_a_rank_waiting_for_a_collective_its_peer_refused_waited_out_the_timeout():
    """Cause (probe7 P7-09): where two threads raced for a group's first collective, the rank that refused one
    stopped at once, and its peer waited in a collective that rank never posted until the group's timeout.  The
    refusal is now published on the store, and a waiting gloo collective reads it within about a second."""
    outcomes = run_processes(racing_for_the_first_collective_job, 2, timeout_s=60, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    refusal = ("rank 0: the metadata all-gather (dispatcher configuration) on thread 'MainThread' while thread "
               "'own-prefetch_0', which ran the runtime's first collective on this process group (the metadata "
               "all-gather (dispatcher configuration)), lives and holds it (a thread that takes over calls "
               "`orchmllm.runtime.take_group(group)` first, at the same point on every rank): two threads' collectives")
    (kind0, message0, seconds0), (kind1, message1, seconds1) = (o.value for o in outcomes)
    assert kind0 == "ThreadClashError" and message0.startswith(refusal) and seconds0 < 5.0, outcomes[0].value
    assert kind1 == "ThreadClashError" and seconds1 < 5.0, outcomes[1].value
    assert message1.startswith("rank 1: the metadata all-gather (dispatcher configuration) over 2 ranks stopped: a "
                               "rank refused a collective of this group: " + refusal), message1


def backward_on_another_thread_job(rank, size):
    """The training thread plans and dispatches with gradients; the backward runs on another thread, as autograd
    runs it on a device thread of its own on GPUs; the gradients that came home, per item."""
    import threading

    dispatcher = PostBalancingDispatcher()
    lengths = LENGTHS[rank]
    x = torch.ones(sum(lengths), 2, requires_grad=True)
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch({"x": x}, plan, differentiable=True)
    loss = (moved["x"] * (1 + plan.route.rank)).sum()
    outcome = []

    def backward():
        try:
            loss.backward()
            outcome.append("ok")
        except RuntimeError as error:
            outcome.append(str(error))

    worker = threading.Thread(target=backward, name="autograd-like")
    worker.start()
    worker.join(30)
    return (x.grad[:, 0].tolist() if x.grad is not None else None), outcome


def test_the_exchanges_backward_on_another_thread_needs_no_ownership_of_the_group():
    """Autograd runs a CUDA backward on a device thread: the exchange's inverse, on that thread, is not refused as
    a second thread's collective on a group the training thread holds."""
    outcomes = run_processes(backward_on_another_thread_job, 2, timeout_s=60, collective_timeout_s=20)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    for o in outcomes:
        grads, outcome = o.value
        assert outcome == ["ok"] and len(grads) == sum(LENGTHS[o.rank]) and set(grads) <= {1.0, 2.0}, o.value


def prefetcher_on_the_training_subgroup_job(rank, size):
    """The training group is a subgroup of all ranks, given to the Prefetcher as its `group` (its construction
    check knows only the world and `training_group`): the prefetch thread holds it, the training thread's
    dispatch is refused."""
    from orchmllm.runtime import Prefetcher

    group = torch.distributed.new_group(list(range(size)))
    dispatcher = PostBalancingDispatcher(group=group)
    lengths = LENGTHS[rank]
    with Prefetcher(lambda lengths, group: dispatcher.plan(lengths), group=group) as prefetcher:
        prefetcher.submit(lengths)
        plan = prefetcher.result(timeout=30)
        try:
            dispatcher.dispatch({"tok": torch.zeros(sum(lengths))}, plan)
        except RuntimeError as error:
            return type(error).__name__, str(error)
    return "no error", ""


def test_a_prefetcher_given_the_training_group_is_refused_on_every_rank_with_the_prefetchers_fix():
    for rank, (kind, message) in enumerate(spawn(prefetcher_on_the_training_subgroup_job, 2, timeout_s=60)):
        assert kind == "ThreadClashError", (kind, message)
        assert message.startswith(f"rank {rank}: the dispatch header all-reduce on thread 'MainThread' while thread "
                                  f"'orchmllm-prefetch_0', which ran the runtime's first collective"), message
        assert message.endswith("a Prefetcher's `group` is the group its thread gathers on: leave it None (a group "
                                "of its own) or pass one no other thread uses"), message


def handover_job(rank, size, take):
    """Step 0 on the main thread, step 1 on a worker thread while the main thread waits in join(), step 2 on the
    main thread again; `take`: each thread calls `take_group()` before its steps after the first."""
    import threading

    from orchmllm.runtime import take_group

    dispatcher = PostBalancingDispatcher()
    lengths = LENGTHS[rank]
    outcome = []

    def step(handed):
        try:
            if handed and take:
                take_group()
            plan = dispatcher.plan(lengths)
            dispatcher.combine(dispatcher.dispatch({"tok": torch.zeros(sum(lengths))}, plan), plan)
            outcome.append("ok")
        except RuntimeError as error:
            outcome.append(f"{type(error).__name__}: {error}")

    step(False)
    worker = threading.Thread(target=step, args=(True,), name="worker")
    worker.start()
    worker.join(30)
    step(True)
    return outcome


def test_regression_a_dispatcher_handed_to_a_worker_thread_had_no_way_to_be_taken_over():
    """Cause (probe8 P8-13): a training loop moved from the main thread to a worker thread, never concurrently,
    was refused (the main thread, alive, holds the group) and the message gave no way to hand the group over.
    The worker calls `take_group()` first (on every rank alike); without it the refusal names that call."""
    for outcome in spawn(handover_job, 2, args=(True,), timeout_s=60):
        assert outcome == ["ok", "ok", "ok"], outcome
    for rank, outcome in enumerate(spawn(handover_job, 2, args=(False,), timeout_s=60)):
        assert outcome[0] == "ok" and outcome[1].startswith(
            f"ThreadClashError: rank {rank}: the metadata all-gather (dispatcher configuration) on thread 'worker' "
            f"while thread 'MainThread', which ran the runtime's first collective"), outcome
        assert "calls `orchmllm.runtime.take_group(group)` first, at the same point on every rank" in outcome[1]


def destroyed_group_job(rank, size):
    """A runtime collective on a new group, then the group destroyed: whether the thread maps held it, and how
    many groups they hold before and after (a reused worker may hold earlier tests' live groups)."""
    import gc

    import torch.distributed as dist

    from orchmllm.runtime import comm

    held = lambda: len(comm._owners) + len(comm._gloo)  # noqa: E731
    before, group = held(), dist.new_group(list(range(size)))
    with comm.collective("test all-reduce", group):
        comm.finish(dist.all_reduce(torch.ones(1), group=group, async_op=True), group)
    during = held()
    dist.destroy_process_group(group)
    del group
    gc.collect()
    return during - before, held() - before


def test_a_destroyed_group_leaves_the_thread_checks_maps():
    """Review of 5f78571: the maps of the two-thread check held every group (and its thread) for the life of the
    process; they are weak now, so a destroyed group leaves them."""
    for outcome in run_processes(destroyed_group_job, 2, timeout_s=60):
        assert outcome.value == (2, 0), outcome


def global_count_on_another_thread_job(rank, size):
    """The training thread holds the group (a dispatcher's plan); another thread then sums a count on it."""
    import threading

    from orchmllm.runtime import global_count

    PostBalancingDispatcher().plan([3, 5])
    raised = []
    thread = threading.Thread(target=lambda: raised.append(_raised(global_count, 4)), name="logger")
    thread.start()
    thread.join()
    return raised[0]


def _raised(function, *args) -> str:
    try:
        function(*args)
    except Exception as error:  # noqa: BLE001 - the test reads what each rank raised
        return type(error).__name__
    return "no error"


def test_regression_a_count_summed_on_another_thread_was_outside_the_thread_check():
    """Review of 5f78571: `global_count` (and `all_reduce_gradients`, HierarchicalAllToAll's layout check) posted
    their collectives outside the runtime's thread check, so another thread's count on the training group could
    still wait out the group's timeout; refused on every rank now."""
    outcomes = run_processes(global_count_on_another_thread_job, 2, timeout_s=60, collective_timeout_s=20)
    assert [outcome.value for outcome in outcomes] == ["ThreadClashError"] * 2, outcomes


def sampler_on_a_loader_thread_job(rank, size, first, own_group):
    """The usual producer/consumer loader: a thread named 'loader' iterates a BalancedDistributedSampler (its epoch
    agreement all-gather) while the main thread plans with a dispatcher, `first` of them to run a collective; the
    sampler on the world group, or on a group of its own.  What each thread raised."""
    import queue
    import threading

    from orchmllm.runtime.sampler import BalancedDistributedSampler

    group = torch.distributed.new_group(list(range(size))) if own_group else None
    sampler = BalancedDistributedSampler([5, 9, 3, 7, 2, 8, 4, 6], num_replicas=size, rank=rank,
                                         global_batch_size=4, group=group)
    dispatcher, batches, done, outcome = PostBalancingDispatcher(), queue.Queue(), threading.Event(), []

    def load():
        try:
            for batch in sampler:
                batches.put(batch)
                done.wait(30)
        except RuntimeError as error:
            batches.put(error)

    def plan():
        try:
            dispatcher.plan(LENGTHS[rank])
            outcome.append("planned")
        except RuntimeError as error:
            outcome.append(f"{type(error).__name__}: {error}")

    if first == "dispatcher":
        plan()
    loader = threading.Thread(target=load, name="loader")
    loader.start()
    batch = batches.get(timeout=30)
    outcome.append(batch if isinstance(batch, list) else f"{type(batch).__name__}: {batch}")
    if first == "sampler":
        plan()
    done.set()
    loader.join(30)
    return outcome


@pytest.mark.parametrize("first", ["dispatcher", "sampler"])
def test_regression_a_sampler_on_a_loader_thread_beside_the_dispatcher_was_refused_with_anothers_fix(first):
    """Cause (probe10 P10-07): the two-thread refusal of a sampler's epoch agreement (a loader thread beside the
    training thread's dispatcher, both on the world group) gave the dispatcher's fixes (`metadata_group=`, a
    Prefetcher), which the sampler has not.  It names the sampler's: a group of its own, or no agreement check."""
    for rank, outcome in enumerate(spawn(sampler_on_a_loader_thread_job, 2, args=(first, False), timeout_s=60)):
        refused = [line for line in outcome if isinstance(line, str) and line.startswith("ThreadClashError")]
        assert len(refused) == 1, outcome
        assert refused[0].startswith(f"ThreadClashError: rank {rank}: the "), refused
        assert refused[0].endswith("give the sampler a group of its own, `BalancedDistributedSampler(..., group="
                                   "dist.new_group())` (made at the same point on every rank), or pass "
                                   "check_agreement=False"), refused
    for outcome in spawn(sampler_on_a_loader_thread_job, 2, args=(first, True), timeout_s=60):
        assert "planned" in outcome and any(isinstance(line, list) for line in outcome), outcome



@pytest.mark.background
def test_regression_forkserver_ranks_exited_at_once_and_bad_timeouts_went_unchecked():
    """Cause (probe17 P17-03, P17-04): a rank's parent watch compared os.getppid() with the caller's pid, which under
    "forkserver" is the fork server's: every rank exited with code 1 "without reporting".  timeout_s 0 / -1 ran
    nothing, nan and "60" raised from an f-string or a subtraction, collective_timeout_s -1 killed every rank in
    torch's socket code."""
    assert [o.value for o in run_processes(operator.mul, 2, timeout_s=120, start_method="forkserver")] == [0, 2]
    for name, value, error in [("timeout_s", 0, ValueError), ("timeout_s", -1, ValueError),
                               ("timeout_s", math.nan, ValueError), ("timeout_s", "60", TypeError),
                               ("collective_timeout_s", 0, ValueError), ("collective_timeout_s", -1.0, ValueError)]:
        with pytest.raises(error, match=rf"`{name}` must be a (positive finite )?number of seconds"):
            run_processes(operator.mul, 2, **{name: value})
    with pytest.raises(ValueError, match=r"`start_method` must be one of \[.*'fork'.*\]; got 'thread'"):
        run_processes(operator.mul, 2, start_method="thread")


@pytest.mark.background
def test_regression_an_unpicklable_fn_under_spawn_raised_cannot_join_a_process_not_started():
    """Cause (probe18 P18-05): under "spawn" the first child's start raised the PicklingError of a lambda, and the
    clean-up's join of the children never started raised "can only join a started process" over it, naming
    nothing of `fn`.  Now the pickling is tried first and refused naming `fn`; "fork" takes a closure as before."""
    scale = 3
    for method in ("spawn", "forkserver"):
        with pytest.raises(TypeError, match=rf"start_method='{method}' pickles `fn` into every rank.*not a lambda or "
                                            r"a closure\), or use start_method='fork'"):
            run_processes(lambda rank, world: rank * scale, 2, start_method=method)
    with pytest.raises(TypeError, match=r"start_method='spawn' could not pickle `fn` or `args` into rank 0 "
                                        r"\(AttributeError: Can't pickle local object"):
        run_processes(operator.mul, 2, args=(lambda: 0,), start_method="spawn")
    queue = multiprocessing.get_context("spawn").Queue()  # review13 R13-09: a partial over a queue pickles at a start
    tensors = tuple(torch.ones(2) for _ in range(20))  # review13 R13-03: pickled ahead, each leaked an fd a call
    open_files = []
    for _ in range(2):  # what the first call's sharing sets up stays; a leak grows with every call
        outcome = run_processes(functools.partial(put_rank, queue), 1, args=tensors, start_method="spawn")[0]
        assert outcome.value == 20 and queue.get() == 0
        open_files.append(len(os.listdir("/proc/self/fd")))
    assert open_files[0] == open_files[1], open_files
    assert [o.value for o in run_processes(lambda rank, world: rank * scale, 2, timeout_s=60)] == [0, 3]


def put_rank(queue, rank, world, *tensors):
    queue.put(rank)
    return len(tensors)


def exits_without_reporting(rank, world):
    torch.distributed.barrier()  # both ranks past the group's start: rank 0's store must outlive rank 1's connect
    os._exit(1 if rank == 0 else 3)


FILE_LESS_MAIN = """import functools
from orchmllm.runtime.launch import run_processes
def fn(rank, world):
    return rank
class Job:
    def __call__(self, rank, world):
        return rank
def job(scale, rank, world):
    return rank * scale
for target in (fn, Job(), functools.partial(job, 3)):
    try:
        run_processes(target, 2, start_method="spawn", timeout_s=60)
    except TypeError as error:
        print(error)
"""


@pytest.mark.background
def test_regression_a_spawned_rank_exiting_unreported_was_not_said_to_have_its_reason_on_stderr():
    """Cause (probe18 P18-09): a rank that exited without reporting read "exited with code 1 without reporting",
    its cause on the ranks' stderr only.  Under spawn or forkserver it is now said to have its reason on stderr,
    the usual one (a module `fn`'s rank cannot import) named where an import failure's exit code is."""
    outcomes = run_processes(exits_without_reporting, 2, start_method="spawn", timeout_s=60)
    assert [outcome.error for outcome in outcomes] == [  # the import hint where an import failure's code is
        "exited with code 1 without reporting (its stderr says why; under 'spawn' a rank that cannot import `fn`'s "
        "module exits so)", "exited with code 3 without reporting"], outcomes


EARLY = {"file-less main": ("-c", FILE_LESS_MAIN)}  # conftest's started_early


@pytest.mark.early("file-less main")
def test_regression_spawned_ranks_that_cannot_import_fn_said_only_that_they_exited(started_early):
    """Cause (probe18 P18-09): under "spawn" a `fn` of a main module with no file (`python -c`, a script on stdin,
    a notebook) failed to import in every rank, and each outcome read "exited with code 1 without reporting", the
    cause on the ranks' stderr only.  Now refused before any rank starts.  Cause (probe19 P19-05): for a
    functools.partial the check read `fn.__module__`, 'functools'; the partial's function is now named.  The
    three kinds of `fn` (a function, a callable object (R13-01), a partial) in one `python -c` process: each is
    refused before a rank starts, so each refusal's cost is that process's import of torch."""
    done = started_early("file-less main")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"start_method='spawn' imports `fn` in every rank, and {name} is defined in a main module that has no file to "
        f"import (a script on stdin, `python -c`, a notebook): define it in an importable module, or use "
        f"start_method='fork'" for name in ("'fn'", "'Job'", "'job' (the function of the partial `fn`)")], done.stdout


def mismatched_parameters_job(rank, size, case):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    if case == "sparse" and rank == 1:
        model[0] = torch.nn.Embedding(5, 3, sparse=True)
        model[0](torch.tensor([1, 2])).sum().backward()
    else:
        model(torch.ones(2, 3)).sum().backward()
    parameters = list(model.parameters())
    if case == "filtered" and rank == 1:  # the common filter, where rank 1's first layer saw no item
        model[0].weight.grad = None
        parameters = [p for p in parameters if p.grad is not None]
    if case == "shapes":
        parameters = [torch.nn.Parameter(torch.ones((2, 3) if rank == 0 else (3, 2)))]
        parameters[0].grad = torch.ones_like(parameters[0])
    try:
        all_reduce_gradients(parameters, op="sum")
    except (TypeError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return "reduced"


@pytest.mark.parametrize("case", ["filtered", "shapes", "sparse"])
def test_regression_ranks_reducing_other_parameter_lists_aborted_or_summed_mismatched_gradients(case):
    """Cause (probe17 P17-05, P17-06): all_reduce_gradients flattened each rank's gradients into one buffer per dtype,
    unchecked: lists of other lengths killed a rank by SIGABRT (gloo's size check) and told its peer a peer died; a
    (2, 3) and a (3, 2) gradient were summed element-wise; a sparse gradient raised torch's reshape error."""
    outcomes = spawn(mismatched_parameters_job, 2, args=(case,), timeout_s=60, collective_timeout_s=20)
    if case == "sparse":
        assert outcomes[1].startswith("TypeError: all_reduce_gradients reduces dense gradients"), outcomes
        assert outcomes[0].startswith("PeerInputError: ranks [1] passed all_reduce_gradients a parameter"), outcomes
        return
    counts = "ranks [0]: 4 parameters" if case == "filtered" else "ranks [0]: 1 parameters"
    for rank, outcome in enumerate(outcomes):
        assert outcome.startswith(f"ValueError: the parameter list passed to all_reduce_gradients differs across ranks "
                                  f"(seen from rank {rank}): ranks [1] disagree with ranks [0] ({counts}"), outcome


def parameter_forms_job(rank, size):
    """all_reduce_gradients given one Parameter, a Module, and a DDP model (as the module, as its parameters())."""
    torch.manual_seed(0)
    seen = {}
    weight = torch.nn.Parameter(torch.ones(2, 3, dtype=torch.float64))
    (weight * (rank + 1)).sum().backward()
    all_reduce_gradients(weight, op="sum")
    seen["tensor"] = weight.grad.tolist()
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)).double()
    model(torch.full((1, 3), rank + 1.0, dtype=torch.float64)).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    all_reduce_gradients(model, op="mean")
    seen["module"] = [p.grad.tolist() for p in model.parameters()]
    seen["module_local"] = [g.tolist() for g in expected]
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1).double())
    ddp(torch.full((2, 3), rank + 1.0, dtype=torch.float64)).sum().backward()
    holder = torch.nn.ModuleDict({"enc": ddp, "llm": torch.nn.Linear(3, 1)})  # review13 R13-06: named, not dropped
    for form, op in ((ddp, "mean"), (list(ddp.parameters()), "sum"), (holder, "mean")):
        try:
            all_reduce_gradients(form, op=op)
        except (TypeError, ValueError) as error:
            seen.setdefault("ddp", []).append(f"{type(error).__name__}: {error}")
    all_reduce_gradients(ddp.parameters(), op="mean")  # a mean of equal gradients keeps them
    seen["ddp_mean"] = ddp.module.weight.grad.tolist()
    return seen


def test_regression_one_parameter_a_module_or_a_ddp_models_parameters_were_reduced_wrong_or_raised_raw():
    """Cause (probe18 P18-01..03): all_reduce_gradients iterated one Parameter's rows (views with no .grad: zeros
    given them, the Parameter's gradient never reduced, no error), iterated a Module's children (torch's
    AttributeError), and summed a plain DDP loop's already reduced gradients (x world size, no error)."""
    outcomes = spawn(parameter_forms_job, 2, timeout_s=90, collective_timeout_s=30)
    means = [((torch.tensor(a, dtype=torch.float64) + torch.tensor(b, dtype=torch.float64)) / 2).tolist()
             for a, b in zip(*(seen["module_local"] for seen in outcomes))]
    for seen in outcomes:
        assert seen["tensor"] == [[3.0] * 3] * 2
        assert seen["module"] == means
        assert seen["ddp"][0].startswith("TypeError: all_reduce_gradients was given a DistributedDataParallel "
                                         "model, whose gradients DDP all-reduced"), seen["ddp"]
        assert seen["ddp"][1].startswith("ValueError: all_reduce_gradients(op='sum') of gradients that are the same "
                                         "on all 2 ranks (64 values spread over them, bit for bit)"), seen["ddp"]
        assert seen["ddp"][2].startswith("TypeError: all_reduce_gradients was given a module holding "
                                         "DistributedDataParallel 'enc', whose gradients DDP all-reduced at the "
                                         "backward: pass the other parameters only"), seen["ddp"]
        assert seen["ddp_mean"] == [[3.0] * 3]  # (2 rows x (1 + 2) / 2 ranks): DDP's mean, kept by the mean


def scaled_reduction_job(rank, size, op):
    """A plain model reduced by hand, its loss normalised by `normalize_loss` at its default ("mean"), reduced with
    `op` (None: left out)."""
    model = torch.nn.Linear(3, 1, bias=False).double()
    torch.nn.init.ones_(model.weight)
    normalize_loss(model(torch.full((4, 3), rank + 1.0, dtype=torch.float64)).sum(), 4).backward()
    try:
        all_reduce_gradients(model, op=op)
    except TypeError as error:
        return str(error)
    return model.weight.grad.tolist()


def test_regression_normalize_loss_and_all_reduce_gradients_defaults_gave_gradients_times_the_world_size():
    """Cause (probe18 P18-10): normalize_loss scales for "mean" by default (x world size) and all_reduce_gradients
    summed by default: a plain model reduced with both defaults trained on gradients x world size, no error.  `op`
    has no default now: left out, every rank is told which to pass; "mean" gives the reference."""
    assert spawn(scaled_reduction_job, 2, args=(None,), timeout_s=60) == [
        "all_reduce_gradients takes `op`, the gradient_reduction that normalize_loss scaled these parameters' losses "
        "for: op='mean' after normalize_loss(loss, count) (its default), op='sum' after normalize_loss(..., "
        "gradient_reduction='sum') or a loss divided by global_count(count)"] * 2
    assert spawn(scaled_reduction_job, 2, args=("mean",), timeout_s=60) == [[[1.5] * 3]] * 2  # the mean of x (1, 2)


def mispaired_count_job(rank, size, other):
    """Rank 0 sums a count, rank 1 posts another collective of as many bytes (a DDP bucket's, in a real loop)."""
    if rank == 1 and other == "collective":
        torch.distributed.all_reduce(torch.tensor([0.5, 0.25, 2.0, 1.0], dtype=torch.float64))
        return "posted another"
    try:  # probe19 P19-07: another count, under another name, paired with this one
        return int(global_count(4, name="local_count" if rank == 0 else "text_tokens"))
    except PeerInputError as error:
        return str(error)


def test_regression_a_count_all_reduce_paired_with_another_collective_read_its_bytes_as_counts():
    """Cause (probe18 P18-14): ranks normalising differently (a count on one, total_loss_tokens= on another) paired
    global_count's all-reduce with DDP's, and its words were read as "4602678819172646912 rank(s) passed an invalid
    num_loss_tokens" (where the flag word read 0, a garbage count, silently).  A third word, a tag each rank adds,
    tells a mispaired collective (of as many bytes: four words since the fourth carries the gradient reduction)."""
    message, _ = spawn(mispaired_count_job, 2, args=("collective",), timeout_s=60)
    counts = spawn(mispaired_count_job, 2, args=("count",), timeout_s=60)
    assert counts[1].startswith("rank 1: the all-reduce of `text_tokens` was paired with another collective"), counts
    assert message.startswith("rank 0: the all-reduce of `local_count` was paired with another collective on some "
                              "rank") and message.endswith("every rank must normalise the same way at the same point "
                                                           "(all with a count, or all with total_loss_tokens=, or all "
                                                           "with the micro-batch)"), message


def check_differing_job(rank, size, where):
    """A DDP step due the model check (M = 2) whose `accumulate` blocks, or a plain model whose all_reduce_gradients,
    take check=True on rank 0 only: what each rank raised."""
    torch.manual_seed(0)
    if where == "all_reduce_gradients":
        model = torch.nn.Linear(3, 1)
        model(torch.ones(2, 3)).sum().backward()
        try:
            all_reduce_gradients(model, op="sum", check=rank == 0)
        except PeerFailureError as error:
            return str(error)
        return "no error"
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1).double())
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=6)
    plan = dispatcher.plan([5, 3, 4, 2] if rank == 0 else [6, 1, 1, 2])
    x = torch.ones(14 if rank == 0 else 10, 3, dtype=torch.float64)
    try:
        for micro in dispatcher.microbatches(plan, dispatcher.dispatch({"x": x}, plan)):
            with accumulate(model, micro, check=rank == 0 if where == "accumulate" else False):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
    except ModelContractError as error:
        return str(error)
    return "no error"


@pytest.mark.parametrize("where", ["accumulate", "all_reduce_gradients", "every rank unchecked"])
def test_regression_a_check_flag_differing_across_ranks_aborted_a_rank_or_read_as_a_dead_peer(where):
    """Cause (probe18 P18-13): `accumulate(model, micro, check=...)` differing across ranks in a step due the model
    check paired the check's all-reduce with DDP's bucket: gloo aborted one rank (SIGABRT) and reset the other; in
    all_reduce_gradients a rank's digest all-gather met its peer's gradient all-reduce: a dead peer, no word of
    `check`.  A rank with check=False now joins the model check's all-reduce only, and every rank raises naming the
    ranks; all_reduce_gradients' collectives name `check` as the thing to make equal."""
    outcomes = spawn(check_differing_job, 2, args=(where,), timeout_s=90,  # a mispaired collective waits it out
                     collective_timeout_s=4 if where == "all_reduce_gradients" else 30)
    if where == "every rank unchecked":
        assert outcomes == ["no error"] * 2
    elif where == "accumulate":
        for rank, message in enumerate(outcomes):
            assert message.startswith(f"rank {rank}: ranks [1] passed `accumulate(model, micro, check=False)` and the "
                                      f"others check=True in micro-batch 1 of 2, a step due the model check"), message
    else:
        assert all("(every rank passes the same `check`: with it a rank gathers a digest first)" in message
                   for message in outcomes), outcomes


def test_all_reduce_gradients_names_what_is_not_a_parameter():
    weight = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(TypeError, match=r"`parameters` must hold tensors .*; item 1 is a str"):
        all_reduce_gradients([weight, "bias"], op="sum")
    with pytest.raises(TypeError, match=r"`parameters` must hold leaf tensors .*item 0 of shape \(2,\) was computed"):
        all_reduce_gradients([weight * 2], op="sum")
    with pytest.raises(TypeError, match=r"`parameters` must be a model's parameters .*; got a int"):
        all_reduce_gradients(3, op="sum")


def test_a_rank_list_for_group_is_named_by_the_reductions():
    parameter = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(TypeError, match=r"`group` must be a torch.distributed ProcessGroup.*dist.new_group\(ranks\)"):
        all_reduce_gradients([parameter], group=[0, 1], op="sum")
    with pytest.raises(TypeError, match=r"`group` must be a torch.distributed ProcessGroup.*dist.new_group\(ranks\)"):
        normalize_loss(torch.tensor(2.0), 3, group=[0, 1])


def reduced_already_job(rank, size, wrapper):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2).double()
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=4)
    plan = dispatcher.plan([2, 3])
    moved = dispatcher.dispatch({"x": torch.ones(5, 3, dtype=torch.float64)}, plan)
    if wrapper == "fsdp2":
        model = fully_shard(net)
        model(torch.ones(2, 3, dtype=torch.float64)).sum().backward()
    else:
        model = torch.nn.parallel.DistributedDataParallel(net)
        for micro in dispatcher.microbatches(plan, moved):
            with accumulate(model, micro):
                normalize_loss(model(micro.data["x"]).sum(), micro).backward()
    try:
        all_reduce_gradients(net.parameters(), op="sum")
    except TypeError as error:
        return str(error)
    return "reduced again"


@pytest.mark.parametrize("wrapper, what", [("fsdp2", "a DTensor of FSDP2 (fully_shard), which reduces its gradients"),
                                           ("ddp", "a DistributedDataParallel model's, whose last `accumulate` block "
                                                   "reduced its gradients already")])
def test_regression_gradients_reduced_by_ddp_or_fsdp2_were_reduced_again(wrapper, what):
    """Cause (probe17 P17-15, P17-16): a loop that kept its `all_reduce_gradients(model.parameters())` after wrapping
    the model in FSDP2 failed in torch ("no sharding strategy registered", reported as a dead peer); under DDP with
    `accumulate` it summed DDP's averaged gradients again: every gradient x the world size, no error."""
    for message in spawn(reduced_already_job, 2, args=(wrapper,), timeout_s=60):
        assert message.startswith("all_reduce_gradients reduces plain models' gradients; a parameter of shape "), \
            message
        assert what in message and message.endswith("drop this call (a second reduction would multiply them by the "
                                                    "world size with op='sum')"), message
    with pytest.raises(TypeError, match="`check` must be a bool"):
        all_reduce_gradients([], op="sum", check="no")

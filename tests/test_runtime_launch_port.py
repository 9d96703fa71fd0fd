"""`run_processes`' rendezvous and teardown (issue 24): rank 0's TCPStore binds its own port (port 0), so a port
picked free and released before the rendezvous bound it can no longer be taken meanwhile by a concurrent job; the
store serves until every rank is done, while each rank's collectives end with its function."""

import multiprocessing as mp
import queue
import socket
import threading
import time

from orchmllm.runtime import launch
from orchmllm.runtime.launch import run_processes


def summed(rank, world_size, offset):
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(offset + rank)])
    dist.all_reduce(value)
    return float(value)


def test_regression_a_port_taken_between_its_choice_and_the_rendezvous(monkeypatch):
    """Cause: `free_port` bound port 0, released it, and rank 0 bound it again for the rendezvous; a concurrent job
    that took it meanwhile made rank 0 fail (EADDRINUSE) and the others wait for the collective timeout.  Here the
    port is taken for sure (fails before: the port the launch would have used is held by another listener; since
    the fix no port is chosen ahead and `free_port` is gone, so the patch reaches nothing and the launch must
    still meet)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(launch, "free_port", lambda: taken.getsockname()[1], raising=False)
        outcomes = run_processes(summed, 2, args=(0,), timeout_s=30, collective_timeout_s=5)
    assert [(o.ok, o.value) for o in outcomes] == [(True, 1.0), (True, 1.0)], [o.error for o in outcomes]


def test_concurrent_launches_meet_in_their_own_stores():
    """Launches started at once from several threads: every group sums its own ranks' values only."""
    results, threads = {}, []
    for job in range(4):
        def launched(job=job):
            results[job] = [o.value for o in run_processes(summed, 2, args=(10 * job,), timeout_s=60,
                                                           collective_timeout_s=20)]
        threads.append(threading.Thread(target=launched))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {job: [20.0 * job + 1.0] * 2 for job in range(4)}


def late_group(rank, world_size):
    import time

    import torch.distributed as dist

    if rank == 1:  # rank 0 has returned by now: its store must still serve
        time.sleep(1.0)
        dist.new_group([1], use_local_synchronization=True)
    return rank


def test_regression_rank_0_serves_the_store_until_every_rank_is_done():
    """Cause: rank 0, which serves the rendezvous store, returned and exited while rank 1 still used the store
    (`new_group` after rank 0's last collective): rank 1 failed with "Broken pipe"."""
    outcomes = run_processes(late_group, 2, timeout_s=60, collective_timeout_s=20)
    assert [(o.ok, o.value) for o in outcomes] == [(True, 0), (True, 1)], [o.error for o in outcomes]


def rank_0_fails(rank, world_size):
    import torch.distributed as dist

    if rank == 0:
        raise RuntimeError("rank 0 fails")
    dist.new_group([0, 1])
    return rank


def test_a_failed_rank_0_makes_its_peers_store_waits_fail_at_once():
    """rev50 F1: while the parent served the store, a rank waiting in it (`new_group`) waited for the whole
    timeout when rank 0 failed; rank 0's store closes with it."""
    outcomes = run_processes(rank_0_fails, 2, timeout_s=60, collective_timeout_s=40)
    assert not outcomes[0].ok and "rank 0 fails" in outcomes[0].error
    assert not outcomes[1].ok and outcomes[1].seconds < 20, outcomes[1]


def one_collective_more_on_rank_1(rank, world_size):
    import torch
    import torch.distributed as dist

    value = torch.ones(1)
    dist.all_reduce(value)
    if rank == 1:  # a user's bug: a collective rank 0 never calls
        dist.all_reduce(value)
    return rank


def test_regression_a_collective_beyond_rank_0s_last_fails_at_once():
    """rev50 F12: rank 0, waiting to release its store, kept its process group open, so rank 1's extra collective
    waited for the whole collective timeout (30 s) instead of failing on rank 0's closed sockets."""
    outcomes = run_processes(one_collective_more_on_rank_1, 2, timeout_s=60, collective_timeout_s=30)
    assert outcomes[0].ok and not outcomes[1].ok and outcomes[1].seconds < 15, outcomes[1]


class _FirstGetTimesOut:
    """The parent's result queue whose first `get` times out without reading (a busy parent), while the ranks
    report and exit."""

    def __init__(self, results):
        self.results, self.calls = results, 0

    def get(self, timeout=None):
        self.calls += 1
        if self.calls == 1:
            time.sleep(3.0)
            raise queue.Empty
        return self.results.get(timeout=timeout)

    def __getattr__(self, name):
        return getattr(self.results, name)


def test_regression_a_rank_that_reported_then_exited_keeps_its_value(monkeypatch):
    """rev50 F11: a rank whose report came just after the parent's `get` timed out, and which had exited by the
    time the parent looked, was reported "exited with code 0 without reporting" and its value lost (1 in ~100
    launches from 8 threads at once)."""
    context = mp.get_context("fork")
    monkeypatch.setattr(context, "Queue", lambda queue_class=context.Queue: _FirstGetTimesOut(queue_class()))
    monkeypatch.setattr(launch.mp, "get_context", lambda method: context)
    outcomes = run_processes(summed, 2, args=(0,), timeout_s=30, collective_timeout_s=10)
    assert [(o.ok, o.value) for o in outcomes] == [(True, 1.0), (True, 1.0)], [o.error for o in outcomes]

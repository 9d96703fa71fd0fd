"""`run_processes`' rendezvous (issue 24): the parent's TCPStore binds its own port (port 0), so a port picked free
and released before the rendezvous bound it can no longer be taken meanwhile by a concurrent job."""

import socket
import threading

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

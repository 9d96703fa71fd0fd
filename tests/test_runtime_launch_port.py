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
    port is taken for sure (fails before: the port the launch would have used is held by another listener)."""
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

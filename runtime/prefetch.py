"""Plan step k+1 while step k computes: a background thread with its own process group.

    prefetcher = Prefetcher(lambda samples, group: runtime.plan(samples, metadata_group=group))
    prefetcher.submit(next_samples)      # right after step k's plan is taken
    ... step k: exchanges, forward, backward (training thread, training group) ...
    routes = prefetcher.result()         # step k+1's plan, usually ready already

The thread's metadata all-gathers run on a separate gloo group created here (a
collective over the world, at construction), so they never interleave with the training
thread's collectives on the training group.  A plan made on the thread without a
`metadata_group` gathers on that group too: on the training group its all-gather would
pair with the training thread's exchanges and hang both.  `hidden_fraction` reports how much of the
planning time the training thread did not have to wait for.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable

import torch.distributed as dist

from ..balancers.validation import as_real

_THREAD = threading.local()  # `.group`: the group of the Prefetcher whose thread this is, while it plans


def metadata_group_of(metadata_group, training_group):
    """The group a plan's metadata all-gathers run on: `metadata_group` when given, else on a
    `Prefetcher`'s thread its group, else `training_group`."""
    if metadata_group is not None:
        return metadata_group
    prefetching = getattr(_THREAD, "group", None)
    return training_group if prefetching is None else prefetching


class Prefetcher:
    """Run `plan_fn(*args, group)` in a background thread, one request at a time.

    `group`: the process group for the thread's collectives, one of its own (not the world's
    default group nor `training_group`, where the training thread exchanges); default: a new gloo group
    with the ranks of `training_group` (the world when None) when torch.distributed is
    initialised (every rank of it must construct its Prefetcher at the same point), else
    None.
    """

    def __init__(self, plan_fn: Callable, group=None, *, training_group=None):
        if not callable(plan_fn):
            raise TypeError(f"`plan_fn` must be callable; got {type(plan_fn).__name__}")
        if group is not None and (group is dist.group.WORLD or group is training_group):
            raise ValueError("`group` is the group the thread's collectives run on, and must be one of its own: the "
                             "training thread's exchanges on the same group would meet the thread's all-gathers in "
                             "no set order (a deadlock); leave `group` None (a new gloo group of `training_group`'s "
                             "ranks) or pass `dist.new_group(...)`")
        if group is None and dist.is_available() and dist.is_initialized():
            if training_group is None:
                group = dist.new_group(backend="gloo")
            else:
                group = dist.new_group(dist.get_process_group_ranks(training_group), backend="gloo",
                                       use_local_synchronization=True)
        self.plan_fn, self.group = plan_fn, group
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="orchmllm-prefetch")
        self._pending: Future | None = None
        self._lock = threading.Lock()
        self._closed = False
        self.planning_seconds = 0.0  # time spent planning in the thread
        self.wait_seconds = 0.0  # time the caller waited in result()
        self.requests = 0

    def _run(self, args):
        start = time.perf_counter()
        _THREAD.group = self.group
        try:
            return self.plan_fn(*args, self.group)
        finally:
            _THREAD.group = None
            with self._lock:
                self.planning_seconds += time.perf_counter() - start

    def submit(self, *args) -> None:
        """Start planning for `args` (e.g. the next step's local samples)."""
        if self._closed:
            raise RuntimeError("this Prefetcher is closed; make a new one to plan again")
        if self._pending is not None:
            raise RuntimeError("a prefetch is already pending; call result() first")
        self._pending = self._executor.submit(self._run, args)
        self.requests += 1

    def result(self, timeout: float | None = None):
        """The pending plan; waits for it (timed) and re-raises the thread's exception.  A wait that times
        out keeps the request pending (its collectives still pair with the other ranks'): call again."""
        if timeout is not None:
            timeout = as_real(timeout, "timeout")
        if self._pending is None:
            raise RuntimeError("no prefetch pending; call submit() first")
        start, pending = time.perf_counter(), self._pending
        try:
            done, _ = wait([pending], timeout)
        finally:
            self.wait_seconds += time.perf_counter() - start
        if not done:
            raise TimeoutError(f"planning did not finish within {timeout} s; call result() again to wait for it")
        self._pending = None
        return pending.result()

    @property
    def hidden_fraction(self) -> float:
        """Share of planning time the caller did not wait for (1.0: fully hidden)."""
        with self._lock:
            planning = self.planning_seconds
        if planning == 0:
            return 1.0
        return max(0.0, 1.0 - self.wait_seconds / planning)

    def close(self) -> None:
        """Stop the thread (waits for a running plan)."""
        self._closed = True
        self._executor.shutdown(wait=True)

    def __enter__(self) -> "Prefetcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

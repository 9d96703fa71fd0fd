"""Process-group helpers: rank and size of a group, the device its tensors live on.

Every helper accepts `group=None`: without an initialised process group (or with a group
of one rank) the runtime takes the same code path with no communication, so
single-process code and unit tests run the exact functions a cluster runs.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading

import torch
import torch.distributed as dist


def is_distributed(group=None) -> bool:
    """True when `group` (default: the world) spans more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def group_size(group=None) -> int:
    """Number of ranks in `group`; 1 without an initialised process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def group_rank(group=None) -> int:
    """This process's rank inside `group`; 0 without an initialised process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    return dist.get_rank(group)


class PeerFailureError(RuntimeError):
    """A collective failed on this rank: a peer died or did not reach the call within the process group's timeout."""


_running: dict = {}  # process group -> (thread, phase) of the collective a thread of this process runs on it
_running_lock = threading.Lock()


@contextlib.contextmanager
def _one_thread(phase: str, group):
    """Record that this thread runs `phase` on `group`; a RuntimeError, before any collective is posted, when
    another thread of this process runs one on that group now: collectives of a group must be issued in one
    order on every rank, which two threads do not keep (the ranks deadlock, or gloo pairs unlike calls)."""
    key = dist.group.WORLD if group is None else group
    me = threading.current_thread()
    with _running_lock:
        other = _running.get(key)
        if other is not None and other[0] is not me:
            raise RuntimeError(
                f"rank {group_rank(group)}: the {phase} on thread {me.name!r} while thread {other[0].name!r} runs "
                f"the {other[1]} on the same process group: two threads' collectives on one group meet in no set "
                f"order across ranks (they deadlock until the group's timeout); plan on another thread with "
                f"`metadata_group=` a group of its own (`dist.new_group()`), or use `orchmllm.runtime.Prefetcher`")
        _running[key] = (me, phase)
    try:
        yield
    finally:
        with _running_lock:
            if other is None:
                del _running[key]
            else:
                _running[key] = other


@contextlib.contextmanager
def collective(phase: str, group=None):
    """Run the body's collective, re-raising its failure (gloo's closed connection or timeout, NCCL's
    DistBackendError) as `PeerFailureError` naming `phase` and the group's size; refused at once where
    another thread of this process runs a collective on the same group (`_one_thread`)."""
    with _one_thread(phase, group):
        try:
            yield
        except RuntimeError as error:
            raise PeerFailureError(f"rank {group_rank(group)}: the {phase} over {group_size(group)} ranks failed; a "
                                   f"peer died or did not reach the call within the process group's timeout (or "
                                   f"two threads of a rank ran collectives on this group at once: plan on another "
                                   f"thread with `metadata_group=` a group of its own): {error}") from error


def comm_device(group=None) -> torch.device:
    """Device that collectives of `group` take tensors on: the current CUDA device for
    NCCL, the CPU otherwise (gloo)."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_distributed(backend: str | None = None, timeout_s: float = 120.0) -> tuple[int, int]:
    """Initialise the default process group from torchrun's environment variables.

    Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK for the GPU).  The
    backend defaults to NCCL when CUDA is available, else gloo.  `timeout_s` bounds how
    long a collective waits for a peer, so a rank that fails makes the others fail
    instead of hanging.  Returns (rank, world_size).
    """
    missing = [name for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise RuntimeError(f"init_distributed needs torchrun's environment; missing {missing} "
                           f"(launch with `torchrun --nproc-per-node N ...`)")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()

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
import weakref

import torch
import torch.distributed as dist


def checked_group(group):
    """`group` where it is a torch.distributed ProcessGroup, or None (the default group); else a TypeError naming
    the argument `group` (for ranks: how to make their group)."""
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"`group` must be a torch.distributed ProcessGroup, or None for the default group; got "
                        f"{type(group).__name__}" + (" (ranks: make their group with dist.new_group(ranks))" if
                                                     isinstance(group, (list, tuple, range)) else ""))
    return group


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


class ThreadClashError(RuntimeError):
    """Two threads of one process ran the runtime's collectives on one process group.  Refused before the
    collective is posted, on every rank alike once a thread holds the group (`_one_thread`); where threads
    raced for its first collective, the refusing rank publishes the refusal on the store, a collective of
    that group waiting on another rank reads it within `CLASH_POLL` (gloo) and stops too, and the group is
    unusable afterwards (its ranks' collectives no longer pair)."""


CLASH_POLL = datetime.timedelta(seconds=1)  # how often a waiting gloo collective looks for a peer's refusal
_REFUSAL_KEY = "orchmllm/thread-clash/"  # + the group's name: a store key every rank of the world reads

# Keyed weakly by process group, so a destroyed group leaves them:
_owners = weakref.WeakKeyDictionary()  # group -> [thread, phase, confirmed]: the thread that ran the runtime's first
# collective on it, confirmed once that collective completed (its peers ran theirs: the same thread holds it everywhere)
_running = weakref.WeakKeyDictionary()  # group -> (thread, phase) of the collective a thread of this process runs now
_refused = weakref.WeakKeyDictionary()  # group -> the refusal (this rank's or a peer's) that made it unusable
_gloo = weakref.WeakKeyDictionary()  # group -> whether its backend is gloo (`finish` polls only there)
_lock = threading.Lock()


class _Unset:
    """The key of the maps above where no default process group exists (a single process without one)."""


_UNSET = _Unset()


def _key(group):
    """The maps' key of `group` (None: the default group, or `_UNSET` where there is none)."""
    key = dist.group.WORLD if group is None else group
    return _UNSET if key is None else key


def _in_backward() -> bool:
    """Whether this thread runs autograd's backward (the exchange's inverse, a checkpoint's recomputed forward):
    on GPUs autograd runs it on a thread of its own, so such collectives neither take nor need a group's
    ownership (the overlap check still holds)."""
    return torch._C._current_graph_task_id() != -1


def _clash(phase: str, key, me: threading.Thread) -> tuple[str, bool] | None:
    """Why thread `me` may not run `phase` on the group `key` now, and whether every rank refuses alike (a
    confirmed holder: nothing to tell the peers); None when it may (called under `_lock`)."""
    if key in _refused:
        return f"the {phase} on a process group that a refusal made unusable ({_refused[key]})", True
    owner = _owners.get(key)
    if owner is not None and owner[0] is not me and owner[0].is_alive() and not _in_backward():
        return (f"the {phase} on thread {me.name!r} while thread {owner[0].name!r}, which ran the runtime's first "
                f"collective on this process group (the {owner[1]}), lives and holds it (a thread that takes "
                f"over calls `orchmllm.runtime.take_group(group)` first, at the same point on every rank)", owner[2])
    running = _running.get(key)
    if running is not None and running[0] is not me:
        return (f"the {phase} on thread {me.name!r} while thread {running[0].name!r} runs the {running[1]} on the "
                f"same process group", False)
    return None


_FIXES = (  # (what a refusal names, its way out), the first that applies
    ("thread 'orchmllm-prefetch", "a Prefetcher's `group` is the group its thread gathers on: leave it None (a group "
                                  "of its own) or pass one no other thread uses"),
    ("BalancedDistributedSampler", "a sampler iterated on a thread of its own (a loader's) checks its epoch "
                                   "agreement on its `group`: give the sampler a group of its own, "
                                   "`BalancedDistributedSampler(..., group=dist.new_group())` (made at the same point "
                                   "on every rank), or pass check_agreement=False"))
_PLANNING_FIX = ("plan on another thread with `metadata_group=` a group of its own (`dist.new_group()`), or use "
                 "`orchmllm.runtime.Prefetcher`")


def _refuse(why: str, alike: bool, group, key) -> ThreadClashError:
    """The refusal of `why` on this rank; unless every rank refuses `alike`, recorded (the group is unusable)
    and published on the store for the group's other ranks, some of which may wait in a collective this
    rank will not post (the first refusal of a group stays)."""
    fix = next((fix for marker, fix in _FIXES if marker in why), _PLANNING_FIX)
    message = (f"rank {group_rank(group)}: {why}: two threads' collectives on one group meet in no set order "
               f"across ranks (they deadlock until the group's timeout, or pair unlike calls); run a group's "
               f"collectives on one thread: {fix}")
    if not alike:
        _refused.setdefault(key, message)
        with contextlib.suppress(Exception):  # no store (a custom backend): the other ranks time out as before
            dist.distributed_c10d._get_default_store().compare_set(_REFUSAL_KEY + key.group_name, "", message)
    return ThreadClashError(message)


@contextlib.contextmanager
def _one_thread(phase: str, group):
    """Claim `group` for this thread while it runs `phase`; a `ThreadClashError`, before any collective is
    posted, where another thread of this process runs one on it now or holds it (ran its first collective
    and lives; backward excepted): collectives of a group must be issued in one order on every rank, which
    two threads do not keep.  Holding makes the refusal the same on every rank whatever the timing, once the
    holder's first collective completed; before, threads racing for the group's first collective are refused
    where they overlap, and the refusal is published (`_refuse`)."""
    key = _key(group)
    me = threading.current_thread()
    with _lock:
        clash = _clash(phase, key, me)
        if clash is not None:
            raise _refuse(*clash, group, key)
        other = _running.get(key)
        _running[key] = (me, phase)
        owner = _owners.get(key)
        if (owner is None or not owner[0].is_alive()) and not _in_backward():
            owner = _owners[key] = [me, phase, False]
    try:
        yield
        if owner is not None and owner[0] is me:
            owner[2] = True
    finally:
        with _lock:
            if other is None:
                del _running[key]
            else:
                _running[key] = other


def take_group(group=None) -> None:
    """Make the calling thread the one that holds `group` for the runtime's collectives (see `_one_thread`): a
    training loop handed to another thread (a worker after steps on the main thread) calls it there before its
    first collective, at the same point on every rank; a RuntimeError while another thread runs one on it."""
    key = _key(group)
    me = threading.current_thread()
    with _lock:
        running = _running.get(key)
        if running is not None and running[0] is not me:
            raise RuntimeError(f"rank {group_rank(group)}: take_group on thread {me.name!r} while thread "
                               f"{running[0].name!r} runs the {running[1]} on this process group; take it once that "
                               f"thread runs no collective on it")
        _owners[key] = [me, "take_group", True]


def _published_refusal(group) -> str | None:
    """A refusal another rank published for `group` (one store request), or None."""
    key = _key(group)
    store = dist.distributed_c10d._get_default_store()
    name = _REFUSAL_KEY + key.group_name
    if not store.check([name]):
        return None
    refusal = store.get(name).decode()
    with _lock:
        _refused.setdefault(key, refusal)
    return refusal


def finish(work, group=None) -> None:
    """Wait for `work`, an async collective of `group` (or of a subgroup its transport made).  On gloo the
    wait wakes every `CLASH_POLL` to look for a refusal a peer published (`ThreadClashError`): a rank whose
    collective its peer will never post stops within a second or so, not at the group's timeout.  A wait
    that ends sooner costs what the blocking call costs (the same wait on the same condition); other
    backends (NCCL) wait as the blocking call does."""
    key = _key(group)
    gloo = _gloo.get(key)
    if gloo is None:
        gloo = _gloo[key] = dist.get_backend(group) == "gloo"
    if not gloo:
        work.wait()
        return
    while True:
        try:
            work.wait(timeout=CLASH_POLL)
            return
        except RuntimeError:
            if work.is_completed():  # the collective's own failure (a peer died, the group's timeout)
                break
        refusal = _published_refusal(group)
        if refusal is not None:
            raise ThreadClashError(refusal)
    work.wait()


def _stopped(phase: str, group, refusal) -> ThreadClashError:
    """The error of this rank's `phase` on `group`, stopped by another rank's published `refusal`."""
    return ThreadClashError(f"rank {group_rank(group)}: the {phase} over {group_size(group)} ranks stopped: a rank "
                            f"refused a collective of this group: {refusal}")


@contextlib.contextmanager
def collective(phase: str, group=None):
    """Run the body's collective (posted with `async_op=True` and waited with `finish`), re-raising its
    failure (gloo's closed connection or timeout, NCCL's DistBackendError) as `PeerFailureError` naming
    `phase` and the group's size; refused at once where another thread of this process runs a collective
    on the same group or holds it (`_one_thread`), and stopped where a peer published such a refusal."""
    with _one_thread(phase, group):
        try:
            yield
        except ThreadClashError as error:
            raise _stopped(phase, group, error) from None
        except RuntimeError as error:
            refusal = None
            with contextlib.suppress(Exception):  # the store went with its host rank
                refusal = _published_refusal(group)
            if refusal is not None:  # the refusing rank left (its sockets closed) before this one read it
                raise _stopped(phase, group, refusal) from error
            raise PeerFailureError(f"rank {group_rank(group)}: the {phase} over {group_size(group)} ranks failed; a "
                                   f"peer died or did not reach the call within the process group's timeout (or, "
                                   f"where no refusal is published (NCCL), two threads of a rank ran collectives on "
                                   f"this group at once: plan on another thread with `metadata_group=` a group of "
                                   f"its own): {error}") from error


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

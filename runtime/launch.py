"""Run a function on N local processes joined in a gloo group, never hanging.

Used by the tests, the demo and the examples.  Each child gets a fresh process group, meeting in a TCPStore
rank 0 serves on a port it binds itself (`rendezvous_store`) until every rank is done, runs
`fn(rank, world_size, *args)` with one intra-op thread, and reports its return value or traceback through a queue.
A child that raises exits at once, closing its sockets, so its peers' collectives fail instead of waiting; the
process-group timeout bounds the rest, and the parent kills every child that is still running at its own deadline.
Children are always joined or killed before returning.
"""

from __future__ import annotations

import ast
import datetime
import functools
import math
import multiprocessing as mp
import os
import pickle
import queue
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..balancers.validation import is_int, is_real
from .comm import init_distributed


class SpawnError(RuntimeError):
    """At least one rank failed or timed out; the message holds every rank's outcome."""

    def __init__(self, message: str, outcomes: list):
        super().__init__(message)
        self.outcomes = outcomes


@dataclass(frozen=True)
class RankOutcome:
    """What one child did: its return value or its error, and when it finished."""

    rank: int
    ok: bool
    value: object = None
    error: str | None = None
    seconds: float | None = None  # since the parent started the children; None if killed


def rendezvous_store(rank: int, world_size: int, rendezvous: tuple, timeout: datetime.timedelta) -> dist.TCPStore:
    """The group's TCPStore: rank 0 serves it on a port that it binds itself (port 0, read back from the store; torch's
    TCPStore listens on every interface, the ranks reach it on 127.0.0.1) and publishes that port (`rendezvous`: an
    event and a shared int; its third item, an event the parent sets once every rank reported or ended, keeps rank 0
    serving until then), the other ranks join it once published.
    A port picked free and released before the rendezvous bound it could be taken meanwhile by a concurrent job
    (EADDRINUSE, or two jobs' ranks meeting in one store).  Served by the parent instead, its server thread was forked
    with the ranks, or outlived `run_processes` by a few sockets; rank 0 served it before too."""
    ready, port, _ = rendezvous
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        port.value = store.port
        ready.set()
        return store
    if not ready.wait(timeout.total_seconds()):
        raise TimeoutError(f"rank 0's rendezvous store did not start within {timeout.total_seconds():.0f} s")
    return dist.TCPStore("127.0.0.1", port.value, world_size, is_master=False, timeout=timeout)


def _exit_with_parent(parent: int, period_s: float = 1.0) -> None:
    """End this child when its parent is gone: a parent killed by SIGKILL (a scheduler after its grace period)
    left its children running (daemonic ones too, which end only at the parent's own exit).  The process that
    started this one may not be `parent` (under "forkserver" it is the fork server): the watch ends when either
    is gone."""
    started_by = os.getppid()

    def watch():
        while os.getppid() == started_by and _alive(parent):
            time.sleep(period_s)
        os._exit(1)
    threading.Thread(target=watch, name="orchmllm-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's (the pid was reused)
        return True
    return True


def _seconds(value, name: str) -> float:
    """`value` as a positive finite number of seconds, else an error naming `name`."""
    if not is_real(value):
        raise TypeError(f"`{name}` must be a number of seconds; got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a positive finite number of seconds; got {value!r}")
    return float(value)


def _child(fn, rank, world_size, rendezvous, backend, collective_timeout_s, args, results, parent):
    _exit_with_parent(parent)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        timeout = datetime.timedelta(seconds=collective_timeout_s)
        store = rendezvous_store(rank, world_size, rendezvous, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        # Pickled here, by value: the queue would pass tensors as shared-memory handles that die with
        # this process (the parent then failed with FileNotFoundError), and would fail in its thread.
        value = pickle.dumps(fn(rank, world_size, *args))
        results.put((rank, True, value, None))
        dist.destroy_process_group()  # its sockets close now: a peer's collective beyond this rank's fails at once
        if rank == 0:  # its store serves the others until they are done (a late `new_group` failed: broken pipe)
            rendezvous[2].wait()
    except BaseException:  # report everything, then leave so peers see closed sockets
        results.put((rank, False, None, traceback.format_exc()))
        results.close()
        results.join_thread()
        os._exit(1)


def _check_main_defines(name: str, named: str, start_method: str) -> None:
    """TypeError unless the ranks, which run the main module's file as "__mp_main__", define `name` there: a main
    module without a file (`python -c`, stdin, a notebook), or a name bound only under its `if __name__ ==
    "__main__":` (which they skip), leaves them nothing to import."""
    path = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    if not os.path.isfile(path):
        raise TypeError(f"start_method={start_method!r} imports `fn` in every rank, and {name!r}{named} is defined in "
                        f"a main module that has no file to import (a script on stdin, `python -c`, a notebook): "
                        f"define it in an importable module, or use start_method='fork'")
    try:
        statements = ast.parse(Path(path).read_bytes(), path).body
    except (OSError, SyntaxError, ValueError):  # changed since it started: the ranks' import will tell
        return
    guarded, unguarded = set(), set()
    for statement in statements:
        if _is_main_guard(statement):  # its `else:` runs in the ranks
            guarded.update(_bound_names(statement.body))
            unguarded.update(_bound_names(statement.orelse))
        else:
            unguarded.update(_bound_names([statement]))
    top = name.split(".")[0]
    if top in guarded and top not in unguarded:
        raise TypeError(f"start_method={start_method!r} imports `fn` in every rank by its name, and {name!r}{named} "
                        f"is defined under `if __name__ == '__main__':` in {path}, which the ranks skip (they run "
                        f"the script as '__mp_main__'): `fn` must be importable, so define it at the script's top "
                        f"level, outside that block, or use start_method='fork'")


def _is_main_guard(statement: ast.stmt) -> bool:
    """Whether `statement` is `if __name__ == "__main__":` (either way round)."""
    if not isinstance(statement, ast.If) or not isinstance(statement.test, ast.Compare):
        return False
    test = statement.test
    sides = [test.left, *test.comparators]
    return (len(sides) == 2 and isinstance(test.ops[0], ast.Eq)
            and {ast.dump(side) for side in sides} == {ast.dump(ast.Name("__name__", ast.Load())),
                                                       ast.dump(ast.Constant("__main__"))})


def _bound_names(nodes) -> set[str]:
    """The module-level names that `nodes` bind (definitions, assignments, imports; not inside a def or class)."""
    names, pending = set(), list(nodes)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        pending.extend(ast.iter_child_nodes(node))
    return names


def _graph_tensor(value, path: str, seen: set) -> str | None:
    """The path ("args[1][0]") of the first tensor in `value` (through lists, tuples and dicts) that requires grad
    and is an op's output (not a leaf), which torch refuses to pickle into another process; None if none."""
    if isinstance(value, torch.Tensor):
        return path if value.requires_grad and not value.is_leaf else None
    if id(value) in seen or not isinstance(value, (list, tuple, dict)):
        return None
    seen.add(id(value))
    for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
        found = _graph_tensor(item, f"{path}[{key!r}]", seen)
        if found is not None:
            return found
    return None


def _check_start_method(fn, args: tuple, start_method: str) -> None:
    """A ValueError for an unknown `start_method`; under "spawn" and "forkserver", which pickle `fn` into every rank
    by reference to its module, a TypeError for one the ranks could not import or that does not pickle, and for
    `args` holding a tensor of an autograd graph."""
    if start_method not in mp.get_all_start_methods():
        raise ValueError(f"`start_method` must be one of {mp.get_all_start_methods()}; got {start_method!r}")
    if start_method == "fork":
        return
    for index, arg in enumerate(args):
        path = _graph_tensor(arg, f"args[{index}]", set())
        if path is not None:
            raise TypeError(f"`{path}` is a tensor that requires grad and was computed by an op (not a leaf): "
                            f"start_method={start_method!r} pickles `args` into every rank, and an autograd graph "
                            f"cannot cross processes; pass `{path}.detach()` (its values), or use start_method='fork'")
    target, named = fn, ""
    while isinstance(target, functools.partial):  # a partial pickles its function by reference too
        target, named = target.func, " (the function of the partial `fn`)"
    if getattr(target, "__module__", None) == "__main__":
        _check_main_defines(getattr(target, "__qualname__", type(target).__qualname__),  # an object: its class's
                            named, start_method)
    if not isinstance(target, types.FunctionType):  # an object, a partial's args: pickled at the start, which names it
        return
    try:  # a function pickles by reference: a lambda or a closure does not
        pickle.dumps(target)
    except Exception as problem:
        raise TypeError(f"start_method={start_method!r} pickles `fn` into every rank, and {target.__qualname__!r}"
                        f"{named} does not pickle ({type(problem).__name__}: {problem}): pass a function defined at "
                        f"a module's top level (importable by the ranks; not a lambda or a closure), or use "
                        f"start_method='fork'") from problem


def run_processes(fn, world_size: int, *, args: tuple = (), timeout_s: float = 60.0,
                  collective_timeout_s: float = 30.0, backend: str = "gloo",
                  start_method: str = "fork") -> list[RankOutcome]:
    """Run `fn(rank, world_size, *args)` on `world_size` processes; one outcome per rank.

    Never raises for a rank's failure (see `spawn` for that) and never waits longer than
    `timeout_s`: ranks still running then are killed and reported with `seconds=None`.
    `fn`'s return value must be picklable (tensors travel by value, not as shared-memory
    handles that would die with the child).  `start_method="fork"` starts children in
    milliseconds and needs no importable `fn`; use "spawn" (or "forkserver") where fork is unavailable.
    """
    if not is_int(world_size) or world_size < 1:
        raise ValueError(f"`world_size` must be a positive int; got {world_size!r}")
    if not callable(fn) or not isinstance(args, (tuple, list)):  # else every rank reported the TypeError (probe55)
        raise TypeError(f"`fn` must be callable and `args` a tuple (fn(rank, world_size, *args)); got "
                        f"{type(fn).__name__} and {type(args).__name__}")
    timeout_s, collective_timeout_s = _seconds(timeout_s, "timeout_s"), _seconds(collective_timeout_s,
                                                                                  "collective_timeout_s")
    _check_start_method(fn, args, start_method)
    context = mp.get_context(start_method)
    results = context.Queue()
    # rank 0 publishes its store's port, then serves it until the parent releases it: every rank reported or ended
    rendezvous = (context.Event(), context.Value("i", 0, lock=False), context.Event())
    start = time.monotonic()
    children = [context.Process(target=_child, daemon=False,  # a rank may start processes (loader workers)
                                args=(fn, rank, world_size, rendezvous, backend, collective_timeout_s, args, results,
                                      os.getpid()))
                for rank in range(world_size)]
    outcomes: dict[int, RankOutcome] = {}
    exited: set[int] = set()  # ranks seen exited, unreported, when a get last timed out
    unreported = "" if start_method == "fork" else (f" (its stderr says why; under {start_method!r} a rank that "
                                                    f"cannot import `fn`'s module exits so)")
    try:
        for child in children:
            try:
                child.start()
            except (pickle.PicklingError, AttributeError, TypeError, RuntimeError) as problem:  # pickling
                raise TypeError(f"start_method={start_method!r} could not pickle `fn` or `args` into rank "
                                f"{children.index(child)} ({type(problem).__name__}: {problem}): pass picklable "
                                f"`args`, or use start_method='fork'") from problem
        while len(outcomes) < world_size:
            remaining = timeout_s - (time.monotonic() - start)
            if remaining <= 0:
                break
            try:
                rank, ok, value, error = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:  # an exited rank's report, put just before it exited, may come in the next get
                gone = {rank for rank, child in enumerate(children)
                        if rank not in outcomes and child.exitcode is not None}
                for rank in sorted(gone & exited):
                    code = children[rank].exitcode
                    hint = unreported if code == 1 else ""  # a failed import exits 1
                    outcomes[rank] = RankOutcome(rank, False, error=f"exited with code {code} without reporting{hint}",
                                                 seconds=time.monotonic() - start)
                exited = gone
                continue
            if ok:
                try:
                    value = pickle.loads(value)
                except Exception as problem:  # e.g. a class the parent cannot import under "spawn"
                    ok, value, error = False, None, (f"its return value could not be unpickled in the parent "
                                                     f"({type(problem).__name__}: {problem}); `fn` must return "
                                                     f"values the parent can unpickle")
            outcomes[rank] = RankOutcome(rank, ok, value, error, time.monotonic() - start)
    finally:
        rendezvous[2].set()
        started = [child for child in children if child.pid is not None]  # a start that raised left the rest
        for child in started:
            child.join(timeout=max(0.0, min(5.0, timeout_s - (time.monotonic() - start))))
        for child in started:
            if child.is_alive():
                child.kill()
                child.join()
        results.close()
    return [outcomes.get(rank, RankOutcome(rank, False, error=f"killed after the {timeout_s:.0f} s timeout"))
            for rank in range(world_size)]


def spawn(fn, world_size: int, **kwargs) -> list:
    """`run_processes`, returning every rank's value or raising SpawnError with all
    tracebacks, the earliest failure (usually the cause) first."""
    outcomes = run_processes(fn, world_size, **kwargs)
    failed = sorted((o for o in outcomes if not o.ok),
                    key=lambda o: (o.seconds is None, o.seconds or 0.0))  # the first failure first
    if failed:
        detail = "\n".join(f"--- rank {o.rank}: {o.error}" for o in failed)
        raise SpawnError(f"{len(failed)} of {world_size} ranks failed:\n{detail}", outcomes)
    return [o.value for o in outcomes]


def run_script(fn, local_world_size: int, show, *, timeout_s: float = 300.0) -> None:
    """A script's ranks: `fn(rank, world_size)` on every rank, then `show(rank 0's value, world_size)`
    once.  Under torchrun (RANK set) this process is one rank of the launched group, torn down after,
    and shows on rank 0; alone, `local_world_size` local gloo processes run and the parent shows."""
    if "RANK" not in os.environ:
        show(spawn(fn, local_world_size, timeout_s=timeout_s)[0], local_world_size)
        return
    rank, world_size = init_distributed()
    value = fn(rank, world_size)
    if rank == 0:
        show(value, world_size)
    dist.destroy_process_group()

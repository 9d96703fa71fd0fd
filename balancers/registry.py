"""The registry of balancing algorithms: one frozen record per algorithm, asked, never probed.

A record says what the algorithm solves (padded and / or unpadded problems), whether it is
exact, whether `orchmllm compare` runs it by default, its kind (ours, a peer's heuristic
reimplemented, the baseline, or a plugin from another package) and a one-line description.
`balance()`, the orchestrator's stages, the runtime and the CLI all look algorithms up here.

Other packages add algorithms without touching orchmllm's files, either by calling
`register_algorithm(name, kernel, ...)` or by declaring an entry point in the group
``orchmllm.algorithms`` (the entry point's name is the algorithm's, its object an
`Algorithm` record or a kernel).  Entry points are loaded lazily, the first time a name is
not found or the registry is listed.

`ALGORITHMS` is a read-only view name -> `Algorithm`; a record is called like its kernel:

>>> from orchmllm.balancers import ALGORITHMS, make_problem
>>> record = ALGORITHMS["padded"]
>>> record.kind.value, record.exact, record.solves(padded=False)
('ours', True, False)
>>> record(make_problem([4, 3, 3], 2, padded=True)).assignment.tolist()
[0, 1, 1]
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum

from . import auto, equal_counts, exact, identity, ilp, karmarkar_karp, lpt, multifit, padded, slack
from .problem import Kernel, KernelResult, Problem
from .validation import as_bool

ENTRY_POINT_GROUP = "orchmllm.algorithms"


class Kind(str, Enum):
    """Where an algorithm comes from."""

    OURS = "ours"  # orchmllm's own balancers
    PEER = "peer"  # a peer system's heuristic, reimplemented from its public description
    BASELINE = "baseline"  # no balancing: what every plan is compared against
    PLUGIN = "plugin"  # registered by another package

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Algorithm:
    """What one balancing algorithm is and does; called on a `Problem`, it runs its kernel.

    `exact`: its plans are proven optimal (status `optimal`) unless its time limit stops it.
    `default`: `orchmllm compare` runs it when no `--algorithms` are named.
    `equal_counts`: the kernel run under `equal_counts=True` (floor / ceil(n / D) items per
    rank); None when the algorithm refuses that constraint.
    """

    name: str
    kernel: Kernel
    padded: bool = True
    unpadded: bool = True
    exact: bool = False
    default: bool = False
    kind: Kind = Kind.PLUGIN
    description: str = ""
    equal_counts: Kernel | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.replace("_", "a").replace("-", "a").isalnum():
            raise ValueError(f"`name` must be a non-empty str of letters, digits, '_' and '-'; got {self.name!r}")
        for field in ("kernel", "equal_counts"):
            kernel = getattr(self, field)
            if not callable(kernel) and (field == "kernel" or kernel is not None):
                raise TypeError(f"`{field}` of algorithm {self.name!r} must be callable (Problem -> KernelResult); "
                                f"got {type(kernel).__name__}")
        for flag in ("padded", "unpadded", "exact", "default"):
            object.__setattr__(self, flag, as_bool(getattr(self, flag), flag))
        if not (self.padded or self.unpadded):
            raise ValueError(f"algorithm {self.name!r} must solve padded or unpadded problems (or both)")
        if not isinstance(self.kind, Kind):
            try:
                object.__setattr__(self, "kind", Kind(self.kind))
            except ValueError:
                raise ValueError(f"`kind` must be one of {[kind.value for kind in Kind]}; "
                                 f"got {self.kind!r}") from None
        if not isinstance(self.description, str) or "\n" in self.description:
            raise TypeError(f"`description` of algorithm {self.name!r} must be a one-line str")

    def __call__(self, problem: Problem) -> KernelResult:
        return self.kernel(problem)

    def solves(self, padded: bool) -> bool:
        """Whether it balances padded (True) or unpadded (False) problems."""
        return self.padded if padded else self.unpadded

    def why_not(self, padded: bool) -> str:
        """Why it cannot balance a problem of this padding, naming what can ("" when it can)."""
        if self.solves(padded):
            return ""
        kind, cost, flag = (("unpadded", "sum f(l)", "padded=False") if padded
                            else ("padded", "count · f(max l)", "padded=True"))
        others = [record.name for record in algorithms(padded=padded)]
        return (f"algorithm {self.name!r} solves the {kind} cost {cost} only; "
                f"pass {flag}, or choose one of {others}")


_records: dict[str, Algorithm] = {}
_lock = threading.RLock()
_plugins_loaded = False


def _add(record: Algorithm) -> Algorithm:
    with _lock:
        known = _records.get(record.name)
        if known is not None and known != record:
            raise ValueError(f"algorithm {record.name!r} is already registered ({known.kind}: "
                             f"{known.description}); choose another name")
        return _records.setdefault(record.name, record)


def register_algorithm(name: str, kernel: Kernel, *, padded: bool = True, unpadded: bool = True,
                       exact: bool = False, description: str = "", kind: Kind | str = Kind.PLUGIN,
                       default: bool = False, equal_counts: Kernel | None = None) -> Algorithm:
    """Register `kernel` (Problem -> KernelResult) as algorithm `name` and return its record.

    The kernel then runs in `balance()`, the orchestrator's stages, the runtime and
    `orchmllm plan/compare --algorithm name`.  Registering the same record twice is a
    no-op; another algorithm under a taken name is a ValueError.

    >>> import numpy as np
    >>> from orchmllm.balancers import KernelResult, balance, require_within_cap
    >>> def round_robin(problem):
    ...     assignment = np.arange(problem.num_items, dtype=np.int64) % problem.num_ranks
    ...     require_within_cap(problem, assignment, "`round_robin` deals items in turn and")
    ...     return KernelResult(assignment)
    >>> register_algorithm("round_robin_doc", round_robin, description="item i to rank i mod D").kind.value
    'plugin'
    >>> balance([5, 4, 3], 2, algorithm="round_robin_doc").assignment.tolist()
    [0, 1, 0]
    """
    return _add(Algorithm(name, kernel, padded=padded, unpadded=unpadded, exact=exact, default=default,
                          kind=kind, description=description, equal_counts=equal_counts))


def _load_plugins() -> None:
    """Register every entry point of the group `orchmllm.algorithms` (once)."""
    global _plugins_loaded
    with _lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True  # a plugin that lists the registry while loading sees what is there so far
        try:
            for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                target = entry.load()
                if isinstance(target, Algorithm):
                    if target.name != entry.name:
                        raise ValueError(f"entry point {entry.name!r} = {entry.value!r} in group "
                                         f"{ENTRY_POINT_GROUP!r} names algorithm {target.name!r}; the names must agree")
                    _add(target)
                elif callable(target):
                    register_algorithm(entry.name, target)
                else:
                    raise TypeError(f"entry point {entry.name!r} = {entry.value!r} in group {ENTRY_POINT_GROUP!r} "
                                    f"must be an orchmllm Algorithm or a kernel; got {type(target).__name__}")
        except BaseException:
            _plugins_loaded = False
            raise


def _find(name) -> Algorithm | None:
    if not isinstance(name, str):
        raise TypeError(f"`algorithm` must be a str; got {type(name).__name__}")
    record = _records.get(name)
    if record is None:
        _load_plugins()
        record = _records.get(name)
    return record


def get_algorithm(name: str) -> Algorithm:
    """The record of algorithm `name`; ValueError naming the known ones when there is none.

    >>> get_algorithm("lpt").exact, get_algorithm("identity").kind.value
    (False, 'baseline')
    """
    record = _find(name)
    if record is None:
        raise ValueError(f"unknown `algorithm` {name!r}; choose one of {sorted(_records)}")
    return record


def algorithms(*, padded: bool | None = None, kind: Kind | str | None = None,
               default: bool | None = None) -> tuple[Algorithm, ...]:
    """Every registered record in registration order, optionally only those that solve padded
    (or unpadded) problems, of one kind, or run by default.

    >>> [record.name for record in algorithms(kind="ours", padded=True, default=True)]
    ['lpt', 'padded', 'karmarkar_karp', 'auto', 'multifit']
    """
    _load_plugins()
    kind = None if kind is None else Kind(kind)
    return tuple(record for record in list(_records.values())
                 if (padded is None or record.solves(padded)) and (kind is None or record.kind is kind)
                 and (default is None or record.default == default))


class _AlgorithmsView(Mapping):
    """Read-only name -> `Algorithm` view of the registry (add with `register_algorithm`)."""

    def __getitem__(self, name: str) -> Algorithm:
        record = _find(name) if isinstance(name, str) else None
        if record is None:
            raise KeyError(name)
        return record

    def __iter__(self) -> Iterator[str]:
        return iter([record.name for record in algorithms()])

    def __len__(self) -> int:
        return len(algorithms())

    def __setitem__(self, name, kernel):
        raise TypeError("ALGORITHMS is read-only; add a kernel with orchmllm.register_algorithm(name, kernel, ...)")

    def __delitem__(self, name):
        raise TypeError("ALGORITHMS is read-only")

    def __repr__(self) -> str:
        return f"ALGORITHMS({list(self)})"


ALGORITHMS: Mapping[str, Algorithm] = _AlgorithmsView()

for _record in (
    Algorithm("identity", identity.solve, kind=Kind.BASELINE,
              description="no balancing: item i stays on the rank that listed it",
              equal_counts=identity.solve),  # home ranks are contiguous chunks of floor / ceil(n / D) items
    Algorithm("lpt", lpt.solve, default=True, kind=Kind.OURS,
              description="longest processing time first; <= (4/3 - 1/(3D)) x optimum unpadded",
              equal_counts=equal_counts.solve_lpt),
    Algorithm("padded", padded.solve, unpadded=False, exact=True, default=True, kind=Kind.OURS,
              description="exact padded optimum: sorted runs and a parametric search on the makespan",
              equal_counts=equal_counts.solve_padded),
    Algorithm("ilp", ilp.solve, exact=True, kind=Kind.OURS,
              description="exact integer program (CBC), warm-started; stops at its time limit"),
    Algorithm("exact", exact.solve, exact=True, kind=Kind.OURS,
              description="exact P||Cmax: L2 and pattern-LP bounds, bin completion (padded: 'padded'); "
                          "stops at its time limit"),
    Algorithm("karmarkar_karp", karmarkar_karp.solve, default=True, kind=Kind.OURS,
              description="Karmarkar-Karp largest differencing, k-way",
              equal_counts=equal_counts.solve_karmarkar_karp),
    Algorithm("auto", auto.solve, default=True, kind=Kind.OURS,
              description="best of LPT, Karmarkar-Karp, MULTIFIT and SLACK, improved by local search",
              equal_counts=equal_counts.solve),
    Algorithm("multifit", multifit.solve, default=True, kind=Kind.OURS,
              description="MULTIFIT: first-fit-decreasing packing bisected on the makespan"),
    Algorithm("slack", slack.solve, kind=Kind.OURS,
              description="SLACK: LPT on tuples of D items, widest spread first (Della Croce & Scatamacchia)"),
):
    _add(_record)
del _record

"""The registry of balancing algorithms: one frozen record per algorithm, asked, never probed.

A record says what the algorithm solves (padded and / or unpadded problems), whether it is
exact, whether `orchmllm compare` runs it by default, its kind (ours, a peer's heuristic
reimplemented, the baseline, or a plugin from another package) and a one-line description.
`balance()`, the orchestrator's stages, the runtime and the CLI all look algorithms up here.

Other packages add algorithms without touching orchmllm's files, either by calling
`register_algorithm(name, kernel, ...)` or by declaring an entry point in the group
``orchmllm.algorithms`` (the entry point's name is the algorithm's, its object an
`Algorithm` record or a kernel).  Entry points are loaded lazily, the first time a name is
not found or the registry is listed; one that fails to import, or whose name clashes with a
registered algorithm, is skipped with a warning naming its distribution, so it never breaks
another algorithm.  Names are reserved from the start: the built-in algorithms' (of both kinds) and every
entry point's (orchmllm's own, the peers', first), so `register_algorithm` cannot take a name
that an entry point will bring; only the entry point's own module registers under it.

Micro-batch kernels (`balance_microbatches`: a cell (rank, micro-batch) per item) have their own records,
`MicroBatchAlgorithm`, added with `register_microbatch_algorithm` or by an entry point of the same group whose
object is such a record; `MICROBATCH_ALGORITHMS` is their read-only view.

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
import re
import threading
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum

from .microbatch.plan import MicroBatchKernel, MicroBatchProblem, MicroBatchResult
from .kernel_field import KernelField
from .problem import Kernel, KernelResult, Problem
from .validation import as_bool

ENTRY_POINT_GROUP = "orchmllm.algorithms"
DISTRIBUTION = "orchmllm"  # whose entry points (the peers') reserve their names before any other's
BASELINE_LABEL = "none"  # the unbalanced baseline's name in `compare`: no algorithm may take it
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # ASCII ('ＬＰＴ' is not 'LPT'), at most 64 characters


class Kind(str, Enum):
    """Where an algorithm comes from."""

    OURS = "ours"  # orchmllm's own balancers
    PEER = "peer"  # a peer system's heuristic, reimplemented from its public description
    BASELINE = "baseline"  # no balancing: what every plan is compared against
    PLUGIN = "plugin"  # registered by another package

    def __str__(self) -> str:
        return self.value


def certifies(record) -> bool:
    """Whether a record's `lower_bound` and `optimal` count (once checked against its plan's cost): an exact one's,
    or orchmllm's own (built in here, whatever `kind` a plugin gives; the conformance suite checks them)."""
    return record.exact or built_in(record)


def built_in(record) -> bool:
    """Whether `record` is one of orchmllm's own (`_BUILT_INS`), whose kernels write nothing they are handed."""
    return any(record is ours for ours in _BUILT_INS)


def plugin_origin(record) -> str | None:
    """Where a plugin's record comes from (its entry point, or a register_* call), to name it; None for orchmllm's
    own (built in, or its peers' entry points), whose kernels return new arrays and whose failures are its bugs."""
    entry = next((entry for entry in _group_entry_points() if entry.name == record.name), None)
    if built_in(record) or (entry is not None and _distribution(entry) == DISTRIBUTION):
        return None
    return f"algorithm {record.name!r} (registered by a register_* call)" if entry is None else _describe(entry)


@dataclass(frozen=True)
class Algorithm:
    """What one balancing algorithm is and does; called on a `Problem`, it runs its kernel.

    `exact`: its plans are proven optimal (status `optimal`) unless its time limit stops it.  A plugin's word:
    its bound is refused above its own plan's cost or above a plan of orchmllm's 'auto' (`api.cross_examine`),
    and beyond that trusted (`check_conformance` tests it against the exact optimum on small instances).
    `default`: `orchmllm compare` runs it when no `--algorithms` are named.
    `equal_counts`: the kernel run under `equal_counts=True` (floor / ceil(n / D) items per rank); None when the
    algorithm refuses that constraint.
    A kernel may be given as a "module:attr" string: it is imported the first time it is used.
    """

    name: str
    kernel: Kernel | str = KernelField()
    padded: bool = True
    unpadded: bool = True
    exact: bool = False
    default: bool = False
    kind: Kind = Kind.PLUGIN
    description: str = ""
    equal_counts: Kernel | str | None = KernelField(default=None)

    def __post_init__(self):
        _check_record(self, ("kernel", "equal_counts"), "Problem -> KernelResult",
                      ("padded", "unpadded", "exact", "default"))

    def __call__(self, problem: Problem) -> KernelResult:
        return self.kernel(problem)

    def solves(self, padded: bool) -> bool:
        """Whether it balances padded (True) or unpadded (False) problems."""
        return self.padded if padded else self.unpadded

    def why_not(self, padded: bool) -> str:
        """Why it cannot balance a problem of this padding, naming what can ("" when it can)."""
        return _why_not(self, padded, algorithms(padded=padded))


@dataclass(frozen=True)
class MicroBatchAlgorithm:
    """What one micro-batch kernel is and does; called on a `MicroBatchProblem` and a count M of
    micro-batches, it runs its kernel (a cell per item, or None when it finds no packing).

    `exact`: it proves its plans optimal for the M it is given (status `optimal`) within its work budget;
    `balance_microbatches` chooses M around it.

    >>> record = MICROBATCH_ALGORITHMS["cells"]
    >>> record.kind.value, record.exact, record.solves(padded=True)
    ('ours', False, True)
    """

    name: str
    kernel: MicroBatchKernel | str = KernelField()
    padded: bool = True
    unpadded: bool = True
    exact: bool = False
    kind: Kind = Kind.PLUGIN
    description: str = ""

    def __post_init__(self):
        _check_record(self, ("kernel",), "(MicroBatchProblem, M) -> MicroBatchResult | None",
                      ("padded", "unpadded", "exact"))

    def __call__(self, problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
        return self.kernel(problem, num_microbatches)

    def solves(self, padded: bool) -> bool:
        """Whether it plans padded (True) or unpadded (False) cells."""
        return self.padded if padded else self.unpadded

    def why_not(self, padded: bool) -> str:
        """Why it cannot plan cells of this padding, naming what can ("" when it can)."""
        return _why_not(self, padded, microbatch_algorithms(padded=padded))


def _check_record(record, kernels: tuple[str, ...], signature: str, flags: tuple[str, ...]) -> None:
    """Validate a record's fields in place (flags become bools, `kind` a Kind)."""
    name = record.name
    if not (isinstance(name, str) and NAME.fullmatch(name)):
        raise ValueError(f"`name` must be a non-empty str of ASCII letters, digits, '_' and '-', a letter or digit "
                         f"first (the CLI reads '-x' as a flag), at most 64 characters; got {name!r:.80}")
    for field in kernels:
        kernel = vars(type(record))[field].unresolved(record)
        module, colon, attr = kernel.partition(":") if isinstance(kernel, str) else ("", "", "")
        named = colon and attr.isidentifier() and all(part.isidentifier() for part in module.split("."))
        if not (named or callable(kernel) or (field != "kernel" and kernel is None)):
            got = repr(kernel) if isinstance(kernel, str) else type(kernel).__name__
            raise TypeError(f"`{field}` of algorithm {name!r} must be callable ({signature}) or a 'module:attr' str; "
                            f"got {got}")
    for flag in flags:
        object.__setattr__(record, flag, as_bool(getattr(record, flag), flag))
    if not (record.padded or record.unpadded):
        raise ValueError(f"algorithm {name!r} must solve padded or unpadded problems (or both)")
    if not isinstance(record.kind, Kind):
        try:
            object.__setattr__(record, "kind", Kind(record.kind))
        except ValueError:
            raise ValueError(f"`kind` must be one of {[kind.value for kind in Kind]}; got {record.kind!r}") from None
    if not isinstance(record.description, str) or "\n" in record.description:
        raise TypeError(f"`description` of algorithm {name!r} must be a one-line str")


def _why_not(record, padded: bool, able) -> str:
    if record.solves(padded):
        return ""
    kind, cost, flag = (("unpadded", "sum f(l)", "padded=False") if padded
                        else ("padded", "count · f(max l)", "padded=True"))
    return (f"algorithm {record.name!r} solves the {kind} cost {cost} only; "
            f"pass {flag}, or choose one of {[other.name for other in able]}")


_records: dict[str, Algorithm] = {}
_microbatch_records: dict[str, MicroBatchAlgorithm] = {}
_lock = threading.RLock()
_plugins_loaded = False
_entry_points: tuple[importlib.metadata.EntryPoint, ...] | None = None
_loading: importlib.metadata.EntryPoint | None = None  # the entry point being loaded
_skipped: dict[str, str] = {}  # entry point name -> why `_load_plugins` skipped it, told where the name is asked for


def _distribution(entry: importlib.metadata.EntryPoint) -> str:
    return entry.dist.name if entry.dist is not None else "an unknown distribution"


def _describe(entry: importlib.metadata.EntryPoint) -> str:
    return (f"the entry point {entry.name} = {entry.value} of distribution {_distribution(entry)} "
            f"(group {ENTRY_POINT_GROUP!r})")


def _group_entry_points() -> tuple[importlib.metadata.EntryPoint, ...]:
    """The entry points of the group `orchmllm.algorithms`, orchmllm's own first (read once)."""
    global _entry_points
    with _lock:
        if _entry_points is None:
            found = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
            _entry_points = tuple(sorted(found, key=lambda entry: _distribution(entry) != DISTRIBUTION))
        return _entry_points


def _check_reserved(record: Algorithm | MicroBatchAlgorithm) -> None:
    """Refuse `record` when an entry point reserves its name and the record is not that entry
    point's: registered while it loads, or a kernel of the module it names."""
    entry = next((entry for entry in _group_entry_points() if entry.name.lower() == record.name.lower()), None)
    if entry is None or entry is _loading or _kernel_module(record) == entry.module:
        return
    if entry.name != record.name:  # registered first, it would refuse the plugin's own name when that loads
        raise ValueError(f"algorithm name {record.name!r} differs from {entry.name!r}, reserved by {_describe(entry)}, "
                         f"only in case; choose another name")
    if _loading is not None and _distribution(_loading) == _distribution(entry):
        return  # the distribution's own modules, imported by one of its entry points
    raise ValueError(f"algorithm name {record.name!r} is reserved by {_describe(entry)}; choose another name")


def _kernel_module(record: Algorithm | MicroBatchAlgorithm) -> str | None:
    """The module of the record's kernel, read without importing it."""
    kernel = vars(type(record))["kernel"].unresolved(record)
    return kernel.partition(":")[0] if isinstance(kernel, str) else getattr(kernel, "__module__", None)


def _add(record: Algorithm | MicroBatchAlgorithm, reserved: bool = True) -> Algorithm | MicroBatchAlgorithm:
    records = _microbatch_records if isinstance(record, MicroBatchAlgorithm) else _records
    if record.name.lower() == BASELINE_LABEL:  # `compare` would run its baseline in its place (or beside, by case)
        raise ValueError(f"algorithm name {record.name!r} is reserved: it is `orchmllm compare`'s label for the "
                         f"unbalanced baseline (every item on the rank that sampled it), which it would run in "
                         f"the algorithm's place; choose another name")
    with _lock:
        known = records.get(record.name)
        twin = next((name for name in records if name != record.name and name.lower() == record.name.lower()), None)
        if twin is not None:  # `--algorithm` and reports would tell the two apart by case alone
            raise ValueError(f"algorithm name {record.name!r} differs from the registered {twin!r} only in case; "
                             f"choose another name")
        if known is not None and known != record:
            raise ValueError(f"algorithm {record.name!r} is already registered ({known.kind}: "
                             f"{known.description}); choose another name")
        ours = next((ours for ours in _BUILT_INS if reserved and ours.name.lower() == record.name.lower()), None)
        if ours is not None and type(ours) is not type(record):  # one name, one kind of kernel (`check_conformance`)
            raise ValueError(f"algorithm name {record.name!r} is orchmllm's {type(ours).__name__}'s; choose another")
        if known is None and reserved:
            _check_reserved(record)
        return records.setdefault(record.name, record)


def register_algorithm(name: str, kernel: Kernel, *, padded: bool = True, unpadded: bool = True,
                       exact: bool = False, description: str = "", kind: Kind | str = Kind.PLUGIN,
                       default: bool = False, equal_counts: Kernel | None = None) -> Algorithm:
    """Register `kernel` (Problem -> KernelResult) as algorithm `name` and return its record.

    The kernel runs in `balance()`, the orchestrator's stages, the runtime and `orchmllm plan/compare --algorithm
    name`.  Registering the same record twice is a no-op; another algorithm under a taken name is a ValueError.

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


def register_microbatch_algorithm(name: str, kernel: MicroBatchKernel, *, padded: bool = True, unpadded: bool = True,
                                  exact: bool = False, description: str = "",
                                  kind: Kind | str = Kind.PLUGIN) -> MicroBatchAlgorithm:
    """Register `kernel` ((MicroBatchProblem, M) -> MicroBatchResult | None) as micro-batch
    algorithm `name` and return its record; `balance_microbatches(..., algorithm=name)`, the
    orchestrator's and the runtime's `microbatch_algorithm` then run it.  The kernel must
    keep every cell within `problem.max_tokens_per_microbatch` (or return None when it finds no packing).

    >>> import numpy as np
    >>> from orchmllm.balancers import balance_microbatches
    >>> from orchmllm.balancers.microbatch.plan import MicroBatchResult
    >>> def one_per_cell(problem, num_microbatches):  # item i to cell i, if there are enough cells
    ...     if problem.num_items > num_microbatches * problem.num_ranks:
    ...         return None
    ...     cell = np.arange(problem.num_items, dtype=np.int64)
    ...     return MicroBatchResult(cell % problem.num_ranks, cell // problem.num_ranks)
    >>> register_microbatch_algorithm("one_per_cell_doc", one_per_cell, description="item i to cell i").kind.value
    'plugin'
    >>> balance_microbatches([5, 4, 3], 2, max_tokens_per_microbatch=8, algorithm="one_per_cell_doc").num_microbatches
    2
    """
    return _add(MicroBatchAlgorithm(name, kernel, padded=padded, unpadded=unpadded, exact=exact, kind=kind,
                                    description=description))


def _load_entry_point(entry: importlib.metadata.EntryPoint) -> None:
    target = entry.load()
    if isinstance(target, (Algorithm, MicroBatchAlgorithm)):
        if target.name != entry.name:
            raise ValueError(f"it names algorithm {target.name!r}; the names must agree")
        _add(target)
    elif callable(target):
        register_algorithm(entry.name, target)
    else:
        raise TypeError(f"it must be an orchmllm Algorithm, a MicroBatchAlgorithm or a kernel; "
                        f"got {type(target).__name__}")


def _load_plugins() -> None:
    """Register every entry point of the group (once); warn of and skip each that fails or clashes, naming it."""
    global _plugins_loaded, _loading
    with _lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True  # a plugin that lists the registry while loading sees what is there so far
        try:
            for entry in _group_entry_points():
                _loading = entry
                try:
                    _load_entry_point(entry)
                except KeyboardInterrupt:
                    raise
                except BaseException as error:  # a plugin's bug, its SystemExit at import too: never another's
                    _skipped[entry.name] = f"orchmllm skipped {_describe(entry)}: {type(error).__name__}: {error}"
                    warnings.warn(_skipped[entry.name], RuntimeWarning, stacklevel=4)
        except BaseException:  # interrupted: load again next time
            _plugins_loaded = False
            raise
        finally:
            _loading = None


def _find(name, records: dict | None = None, argument: str = "algorithm"):
    records = _records if records is None else records
    if not isinstance(name, str):
        raise TypeError(f"`{argument}` must be a str; got {type(name).__name__}")
    record = records.get(name)
    if record is None:
        _load_plugins()
        record = records.get(name)
    return record


def get_algorithm(name: str, argument: str = "algorithm") -> Algorithm:
    """The record of algorithm `name`, the one check of a name: ValueError naming `argument` and the known ones.

    >>> get_algorithm("lpt").exact, get_algorithm("identity").kind.value
    (False, 'baseline')
    """
    record = _find(name, argument=argument)
    if record is None:
        other = (f" ({name!r} is a micro-batch algorithm: pass it with `max_tokens_per_microbatch`, or to "
                 f"balance_microbatches)" if _find(name, _microbatch_records, argument) is not None else "")
        raise ValueError(skipped_entry(name, argument) or
                         f"unknown `{argument}` {name!r}; choose one of {sorted(_records)}{other}")
    return record


def get_microbatch_algorithm(name: str, argument: str = "algorithm") -> MicroBatchAlgorithm:
    """The micro-batch record `name`; ValueError naming the known ones when there is none, as `get_algorithm`.

    >>> get_microbatch_algorithm("exact").exact
    True
    """
    record = _find(name, _microbatch_records, argument)
    if record is None:
        other = (f" ({name!r} balances a step of one pass per rank; a micro-batch budget takes one of these "
                 f"micro-batch algorithms)" if _find(name, argument=argument) is not None else "")
        raise ValueError(skipped_entry(name, argument) or
                         f"unknown `{argument}` {name!r}; choose one of {sorted(_microbatch_records)}{other}")
    return record


def skipped_entry(name: str, argument: str) -> str | None:
    """Why `name`, an installed entry point's, names no algorithm: its load failed (the warning, once, may
    have been filtered or shown on another rank); None for a name no entry point declares."""
    reason = _skipped.get(name) if isinstance(name, str) else None
    return None if reason is None else f"`{argument}` {name!r} is an installed plugin's, but {reason}"


def algorithms(*, padded: bool | None = None, kind: Kind | str | None = None,
               default: bool | None = None) -> tuple[Algorithm, ...]:
    """Every registered record in registration order, optionally only those of a padding, a kind or the default.

    >>> [record.name for record in algorithms(kind="ours", padded=True, default=True)]
    ['lpt', 'padded', 'karmarkar_karp', 'auto', 'multifit']
    """
    _load_plugins()
    kind = None if kind is None else Kind(kind)
    return tuple(record for record in list(_records.values())
                 if (padded is None or record.solves(padded)) and (kind is None or record.kind is kind)
                 and (default is None or record.default == default))


def microbatch_algorithms(*, padded: bool | None = None, kind: Kind | str | None = None
                          ) -> tuple[MicroBatchAlgorithm, ...]:
    """Every registered micro-batch record in registration order, optionally only those of a padding or a kind.

    >>> [record.name for record in microbatch_algorithms(kind="ours")]
    ['auto', 'greedy', 'cells', 'exact']
    """
    _load_plugins()
    kind = None if kind is None else Kind(kind)
    return tuple(record for record in list(_microbatch_records.values())
                 if (padded is None or record.solves(padded)) and (kind is None or record.kind is kind))


class _View(Mapping):
    """Read-only name -> record view of one table of the registry."""

    def __init__(self, title: str, records: dict, listing, register: str):
        self._title, self._records, self._listing, self._register = title, records, listing, register

    def __getitem__(self, name: str):
        record = _find(name, self._records) if isinstance(name, str) else None
        if record is None:
            raise KeyError(name)
        return record

    def __iter__(self) -> Iterator[str]:
        return iter([record.name for record in self._listing()])

    def __len__(self) -> int:
        return len(self._listing())

    def __setitem__(self, name, kernel):
        raise TypeError(f"{self._title} is read-only; add a kernel with orchmllm.{self._register}(name, kernel, ...)")

    def __delitem__(self, name):
        raise TypeError(f"{self._title} is read-only")

    def __repr__(self) -> str:
        return f"{self._title}({list(self)})"


ALGORITHMS: Mapping[str, Algorithm] = _View("ALGORITHMS", _records, algorithms, "register_algorithm")
MICROBATCH_ALGORITHMS: Mapping[str, MicroBatchAlgorithm] = _View(
    "MICROBATCH_ALGORITHMS", _microbatch_records, microbatch_algorithms, "register_microbatch_algorithm")

_KERNELS = f"{__package__}."  # the built-in kernels' modules, imported on first use
_BUILT_INS = (  # orchmllm's own records: the only heuristic ones whose certificates count (`certifies`)
    # identity under equal counts: home ranks are contiguous chunks of floor / ceil(n / D) items
    Algorithm("identity", _KERNELS + "kernels.identity:solve", kind=Kind.BASELINE,
              description="no balancing: item i stays on the rank that listed it",
              equal_counts=_KERNELS + "kernels.identity:solve"),
    Algorithm("lpt", _KERNELS + "kernels.lpt:solve", default=True, kind=Kind.OURS,
              description="longest processing time first; <= (4/3 - 1/(3D)) x optimum unpadded",
              equal_counts=_KERNELS + "constraints.equal_counts:solve_lpt"),
    Algorithm("padded", _KERNELS + "kernels.padded:solve", unpadded=False, exact=True, default=True, kind=Kind.OURS,
              description="exact padded optimum: sorted runs and a parametric search on the makespan",
              equal_counts=_KERNELS + "constraints.equal_counts:solve_padded"),
    Algorithm("ilp", _KERNELS + "kernels.ilp:solve", exact=True, kind=Kind.OURS,
              description="exact integer program (HiGHS) with a start plan as its cutoff; stops at its time limit",
              equal_counts=_KERNELS + "kernels.ilp:solve"),
    Algorithm("exact", _KERNELS + "kernels.exact:solve", exact=True, kind=Kind.OURS,
              description="exact P||Cmax: L2 and pattern-LP bounds, bin completion (padded: 'padded'; equal "
                          "counts: 'ilp''s model); stops at its time limit",
              equal_counts=_KERNELS + "kernels.exact:solve_equal_counts"),
    Algorithm("karmarkar_karp", _KERNELS + "kernels.karmarkar_karp:solve", default=True, kind=Kind.OURS,
              description="Karmarkar-Karp largest differencing, k-way",
              equal_counts=_KERNELS + "constraints.equal_counts:solve_karmarkar_karp"),
    Algorithm("auto", _KERNELS + "kernels.auto:solve", default=True, kind=Kind.OURS,
              description="best of LPT, Karmarkar-Karp, MULTIFIT and SLACK, improved by local search",
              equal_counts=_KERNELS + "constraints.equal_counts:solve"),
    Algorithm("multifit", _KERNELS + "kernels.multifit:solve", default=True, kind=Kind.OURS,
              description="MULTIFIT: first-fit-decreasing packing bisected on the makespan"),
    Algorithm("slack", _KERNELS + "kernels.slack:solve", kind=Kind.OURS,
              description="SLACK: LPT on tuples of D items, widest spread first (Della Croce & Scatamacchia)"),
    MicroBatchAlgorithm("auto", _KERNELS + "microbatch.auto:solve", kind=Kind.OURS,
                        description="exact search when small, else the better of the joint greedy and the cell LPT"),
    MicroBatchAlgorithm("greedy", _KERNELS + "microbatch.greedy:solve", kind=Kind.OURS,
                        description="joint greedy: each item, largest first, to the cell raising the step cost least"),
    MicroBatchAlgorithm("cells", _KERNELS + "microbatch.cells:solve", kind=Kind.OURS,
                        description="LPT over all M x D cells from water-filling levels, regrouped and searched"),
    MicroBatchAlgorithm("exact", _KERNELS + "microbatch.auto:solve_exact", exact=True, kind=Kind.OURS,
                        description="branch and bound over cells for a given M from auto's plan, within a work budget"),
)
for _record in _BUILT_INS:
    _add(_record, reserved=False)
del _record

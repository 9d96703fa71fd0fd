"""Cross-rank agreement: configuration fingerprints and exchange headers, checked on every rank.

Three things every rank must share before payload bytes are interpreted:

- the configuration (algorithm, cost model, caps, stage declarations): a 32-byte
  fingerprint rides in the metadata all-gather the plan makes anyway
  (`gather_metadata(..., fingerprint=...)`), so a rank planning with other settings is
  named on every rank before any plan is used, with the options that differ;
- the plan an exchange follows: every route carries the identity of its step's plan
  (derived from what the metadata all-gather gathered), so a rank exchanging along an earlier
  step's or another micro-batch's plan is named instead of moving wrong rows;
- the schema of what an exchange moves (per piece: name, dtype, trailing shape, rows per
  item).

A `SchemaGuard` per exchange site checks the last two before any payload is taken.  The payload
all-to-all's segment sizes follow from the plan and the schema, so a rank on another plan would
otherwise send segments of sizes its peers do not expect (gloo aborts every process, or fills
silently).  Where no plan is expected, the check is one all-reduce of six words (the schema
word, the plan word and a fact, each with its complement, so that one maximum gives both the
smallest and the largest value of every rank).  Where every rank knows which plan and schema
every rank was to pass (`exchange.Reference`: the plan every rank followed or made alike, the
schema this site agreed at its latest exchange), and the site's latest exchange followed them,
the header rides in the payload all-to-all itself, ahead of every segment (`settle`): a rank
that passes other pieces sends zeros of the expected ones, so every segment has the size its
peer expects, and every rank decides from every rank's header; ranks that all passed the same
other pieces move them in a second all-to-all, and the site's headers go back to the all-reduce until
one sees the same schema twice (a site alternating between two dicts would otherwise send the other
dict's zeros every time), and for good after MAX_MISSES misses (schemas recurring in longer periods).  A rank whose own
input fails its checks sends
an invalid word, so every rank raises, naming it and why.  Ranks that all change their schema
the same way (a new dtype for all) simply agree.

Every rank sees the same reduced and gathered words, so every rank raises the same error,
naming the ranks that disagree with the majority.

The all-gather that opens an orchmllm call (a plan's metadata, a HierarchicalAllToAll's layout, a
sampler's epoch agreement, the digest and model checks) is one `call_header`: `HEADER_WORDS` int64
words per rank, the first the call's tag (`call_tag`).  Code that branches on the rank can pair
two such calls across ranks; of one shape, they pair cleanly (gloo aborts a process on gathers of
other sizes), and every rank raises a `ConfigMismatchError` naming both calls from their tags.
An all-reduce or all-to-all that opens a call (an exchange's header, `global_count`) is of another kind: paired
with a header all-gather on gloo, every rank waits until the group's timeout (`PeerFailureError`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import platform
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..balancers.validation import is_int
from .comm import collective, comm_device, finish, group_rank, group_size


class PlanMismatchError(RuntimeError):
    """Ranks computed different plans (or planned with different configurations)."""


class ConfigMismatchError(PlanMismatchError):
    """Ranks plan with different configurations (algorithm, cost model, caps, stages)."""


class SchemaMismatchError(ValueError):
    """Ranks passed pieces with different names, dtypes, trailing shapes or row kinds."""


def fingerprint(*parts) -> bytes:
    """SHA-256 over the reprs of `parts` (plan digests, solver configuration); numpy arrays
    by dtype, shape and bytes (a repr elides the middle of a long array).

    >>> len(fingerprint("lpt", 1.0)), fingerprint("lpt") == fingerprint("lpt")
    (32, True)
    >>> fingerprint(np.zeros(2000)) == fingerprint(np.eye(1, 2000).ravel())
    False
    """
    hasher = hashlib.sha256()
    for part in parts:
        if isinstance(part, np.ndarray):
            hasher.update(repr((part.dtype.str, part.shape)).encode())
            hasher.update(np.ascontiguousarray(part).data)
        else:
            hasher.update(repr(part).encode())
        hasher.update(b"\0")
    return hasher.digest()


def canonical(value):
    """An option's value as ranks fingerprint it: integral numbers as Python ints (16, 16.0 and
    np.int64(16) plan alike; 2**53 and 2**53 + 1 stay apart), other numbers as floats, other
    values as given.

    >>> canonical(np.int64(16)) == canonical(16) == canonical(16.0), canonical(0.5), canonical(True), canonical("lpt")
    (True, 0.5, True, 'lpt')
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    return int(value) if float(value).is_integer() else float(value)


def _groups(values: Sequence, show) -> tuple[dict, list[int], str]:
    """Ranks by value (first-seen order), the majority's ranks (ties: the group holding the lowest
    rank) and the groups as a message shows them."""
    groups: dict = {}
    for index, value in enumerate(values):
        groups.setdefault(value, []).append(index)
    majority = max(groups.values(), key=lambda ranks: (len(ranks), -ranks[0]))
    return groups, majority, "; ".join(f"ranks {ranks}: {show(value)}" for value, ranks in groups.items())


def disagreement(values: Sequence, what: str, rank: int, show=str) -> str | None:
    """None when every rank's value is equal; else a message naming the odd ranks.

    The majority (ties: the group holding the lowest rank) is taken as the reference.

    >>> print(disagreement([b"a", b"b", b"a"], "plan", 0, show=bytes.hex))
    plan differs across ranks (seen from rank 0): ranks [1] disagree with ranks [0, 2] (ranks [0, 2]: 61; ranks [1]: 62)
    """
    groups, majority, detail = _groups(values, show)
    if len(groups) == 1:
        return None
    odd = sorted(r for ranks in groups.values() if ranks is not majority for r in ranks)
    return f"{what} differs across ranks (seen from rank {rank}): ranks {odd} disagree with ranks {majority} ({detail})"


def option_table(options: Mapping[str, object]) -> dict[str, object]:
    """Options by name as ranks fingerprint and compare them: canonical values, a tuple of dataclasses (the
    stages) one entry per field, and a dataclass (a `ContextParallel`, a `Pipeline`, a `CostModel`) by its type
    and one entry per field, so a mismatch names the field (probe59 M4: two reprs of ~400 characters were shown).

    >>> from orchmllm.orchestrator.stages import Stage; from orchmllm.balancers import CostModel
    >>> table = option_table({"stages": (Stage("llm", "llm", CostModel()),), "budget": np.int64(16),
    ...                       "cost": CostModel(linear=2.0)})
    >>> table["stages[0].algorithm"], table["budget"], table["cost"], table["cost.linear"]
    ('lpt', 16, 'CostModel', 2)
    """
    table = {}
    for name, value in options.items():
        if isinstance(value, tuple) and value and all(dataclasses.is_dataclass(item) for item in value):
            for index, item in enumerate(value):
                table.update((f"{name}[{index}].{field.name}", canonical(getattr(item, field.name)))
                             for field in dataclasses.fields(item))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            table[name] = type(value).__name__
            table.update((f"{name}.{field.name}", canonical(getattr(value, field.name)))
                         for field in dataclasses.fields(value))
        else:
            table[name] = canonical(value)
    return table


def options_that_differ(shown: Sequence[Mapping[str, str]]) -> str:
    """The options whose shown values differ across ranks (one table per rank), with the ranks of each; a
    dataclass's fields (`option_table`: `name.field`) only where its type is the same on every rank.

    >>> options_that_differ([{"algorithm": "'lpt'", "cap": "8"}, {"algorithm": "'kk'", "cap": "8"}])
    "`algorithm` (ranks [0]: 'lpt'; ranks [1]: 'kk')"
    """
    names = list(dict.fromkeys(name for table in shown for name in table))
    differing, named = [], set()
    for name in names:
        groups, _, detail = _groups([table.get(name, "(absent)") for table in shown], str)
        if len(groups) > 1 and name.split(".")[0] not in named:
            differing.append(f"`{name}` ({detail})")
            named.add(name)
    return ", ".join(differing) or "none in their reprs (another orchmllm version on some ranks?)"


def plan_word(*parts) -> int:
    """A plan's identity as one signed 64-bit word: the first 8 bytes of `fingerprint(*parts)` (the
    configuration's fingerprint and what the metadata all-gather gathered), equal on every rank."""
    return int(words_of(fingerprint(*parts))[0])


def words_of(digest: bytes) -> np.ndarray:
    """A 32-byte digest as four int64 words (to ride in an int64 all-gather)."""
    if len(digest) != 32:
        raise ValueError(f"`fingerprint` must be 32 bytes (SHA-256); got {len(digest)}")
    return np.frombuffer(digest, dtype=np.int64).copy()


PLANNING_CODE = ("balancers", "topology", "orchestrator", "runtime")  # the subpackages a plan and its route run


@functools.cache
def code_word() -> int:
    """The code and environment a plan is made with, as one signed 64-bit word (never 0): the sources of
    PLANNING_CODE, numpy's version and the CPU features its loops dispatch on, Python's version and the machine.
    Ranks of equal words make equal plans from equal metadata with a deterministic planner (a rank on another
    orchmllm checkout, numpy or host may not: float paths).  Read once a process (~15 ms), when this module is
    imported with the planning code (rev17 R17-02: read at the first plan, a checkout changed in between gave a
    process running the old code the new files' word).  It vouches for the files, not for run-time patches of what
    they define (a kernel monkeypatched below the dispatcher's planner, a CostModel subclass).

    >>> code_word() == code_word() != 0
    True
    """
    root = Path(__file__).resolve().parents[1]
    try:  # numpy 2 / numpy 1
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # pragma: no cover
        from numpy.core._multiarray_umath import __cpu_features__ as features
    hasher = hashlib.sha256(repr((np.__version__, sorted(name for name, on in features.items() if on), sys.version,
                                  platform.machine(), sys.byteorder)).encode())
    for path in sorted(path for package in PLANNING_CODE for path in (root / package).rglob("*.py")):
        hasher.update(str(path.relative_to(root)).encode())
        hasher.update(path.read_bytes())
    return int(np.frombuffer(hasher.digest(), dtype=np.int64)[0]) or 1


code_word()  # at import, beside the planning modules it describes


HEADER_WORDS = 9  # a call header: its tag and 8 words of payload (a 64-byte digest)
TAG_MAGIC = 0x6F726368  # "orch": the part of every orchmllm tag word that tells it from other collectives' data
CALLS = {  # a call header's name -> the call a rank in it makes, as a mispairing names it
    "metadata": "a plan's metadata all-gather (PostBalancingDispatcher.plan, MultiStageRuntime.plan)",
    "metadata table": "a metadata all-gather without a configuration fingerprint (gather_metadata called alone)",
    "layout": "a HierarchicalAllToAll's construction (its layout all-gather)",
    "sampler": "a BalancedDistributedSampler's epoch agreement (iterating the sampler)",
    "plan digest": "a plan agreement check (check_agreement, a dispatcher's `check_plan`)",
    "gradient digest": "all_reduce_gradients' digest all-gather (its `check`)",
    "model check": "the model check of `accumulate` (the backward of a micro-batch that reduces gradients)",
    "digest": "a digest all-gather (context-parallel attention's check of `splits`, or gather_digests)",
}
PAIRING_HINTS = {  # a pair of calls -> what makes the ranks pair them
    frozenset({"metadata", "layout"}): "ranks that plan on the flat transport beside ranks that build a "
                                       "HierarchicalAllToAll: every rank of the group must pass the same `transport`",
}


def call_tag(call: str) -> int:
    """The first word of `call`'s header: "orch" in the high half, the CRC-32 of the name in the low.

    >>> hex(call_tag("layout"))[:10]
    '0x6f726368'
    """
    return (TAG_MAGIC << 32) | zlib.crc32(call.encode())


_CALL_OF_TAG = {call_tag(call): call for call in CALLS}


def mispairing(tags: Sequence[int], rank: int) -> str | None:
    """None where every rank's header tag is the same; else which ranks are in which call.

    >>> print(mispairing([call_tag("sampler")] + [call_tag("layout")] * 3, 0))  # doctest: +ELLIPSIS
    orchmllm calls paired across ranks (seen from rank 0): rank 0 is in a BalancedDistributedSampler's ...
    """
    groups, _, _ = _groups(list(tags), str)
    if len(groups) == 1:
        return None
    names = [_CALL_OF_TAG.get(tag) for tag in groups]
    shown = [f"{f'rank {ranks[0]} is' if len(ranks) == 1 else f'ranks {ranks} are'} in "
             f"{CALLS[name] if name else f'a collective orchmllm does not know (first word {tag:#x})'}"
             for (tag, ranks), name in zip(groups.items(), names)]
    hint = PAIRING_HINTS.get(frozenset(names), "every rank of the group must make the same orchmllm calls in the "
                             "same order (code that branches on the rank pairs one call's collectives with another's)")
    return f"orchmllm calls paired across ranks (seen from rank {rank}): {shown[0]} while {' and '.join(shown[1:])}: " \
           f"{hint}"


def call_header(call: str, payload: Sequence[int], group, phase: str) -> np.ndarray:
    """All-gather `call`'s header, its tag and `payload` (at most HEADER_WORDS - 1 ints, zero-padded), over
    `group` (more than one rank) as the collective `phase`; every rank's payload, (ranks, HEADER_WORDS - 1)
    int64.  Where ranks are in other calls (a header of another tag) every rank raises `ConfigMismatchError`
    naming the calls (`mispairing`); the group stays usable (every rank ran one collective)."""
    if call not in CALLS or len(payload) >= HEADER_WORDS:
        raise ValueError(f"a call header is one of {sorted(CALLS)} with at most {HEADER_WORDS - 1} words; got "
                         f"{call!r} with {len(payload)}")
    words = np.zeros(HEADER_WORDS, dtype=np.int64)
    words[0], words[1:1 + len(payload)] = call_tag(call), payload
    mine = torch.from_numpy(words).to(comm_device(group))
    gathered = [torch.empty_like(mine) for _ in range(group_size(group))]
    with collective(phase, group):
        finish(dist.all_gather(gathered, mine, group=group, async_op=True), group)
    rows = torch.stack(gathered).cpu().numpy()
    problem = mispairing(rows[:, 0].tolist(), group_rank(group))
    if problem:
        raise ConfigMismatchError(problem)
    return rows[:, 1:]


def kept_plan_problem(rank: int, given, planned, item: str, field: str) -> PlanMismatchError | None:
    """Why what this rank holds now (`given`: a value or row of values per `item`, as passed to the plan) is
    not what its plan was made from (`planned`): a plan kept from another step whose row totals happen to
    match, which an exchange cannot see in a packed tensor; None when they are the same.

    >>> print(kept_plan_problem(1, np.array([3, 5]), np.array([5, 3]), "item", "length"))  # doctest: +ELLIPSIS
    rank 1's item 0 has length 3 but the plan was made with 5: the plan is another step's ...
    """
    given, planned = (np.asarray(rows) if np.ndim(rows) == 2 else np.reshape(rows, (-1, 1))
                      for rows in (given, planned))
    if given.shape[0] != planned.shape[0]:
        return PlanMismatchError(f"rank {rank} dispatches {given.shape[0]} {item}s but the plan was made from "
                                 f"{planned.shape[0]} {item}s on this rank: make each step's plan from its own {item}s")
    differ = np.flatnonzero(np.any(given != planned, axis=1))
    if not differ.size:
        return None
    index = int(differ[0])
    shown = [str(int(row[0])) if row.size == 1 else str(tuple(row.tolist())) for row in (given[index], planned[index])]
    return PlanMismatchError(f"rank {rank}'s {item} {index} has {field} {shown[0]} but the plan was made with "
                             f"{shown[1]}: the plan is another step's (a plan kept from an earlier step?); make each "
                             f"step's plan from its own {item}s")


@dataclass(frozen=True)
class PieceSchema:
    """What one piece of an exchange is: name, dtype, trailing shape, rows per item.

    `rows_per_item` is an int k (k rows per item), -1 (rows given per item by lengths: per-token
    tensors) or -2 (a per-item tensor, `per_item`: a row per item, or per rank of a split item's group
    where the plan splits it; the same whether a step splits any, so that a site's schema stays that of
    its latest exchange from step to step).
    """

    name: str
    dtype: torch.dtype
    trailing_shape: tuple[int, ...]
    rows_per_item: int

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor, item_rows, per_item: bool = False) -> "PieceSchema":
        rows_per_item = -2 if per_item else int(item_rows) if is_int(item_rows) else -1
        return cls(str(name), tensor.dtype, tuple(int(n) for n in tensor.shape[1:]), rows_per_item)

    def zeros(self, rows: int, device) -> torch.Tensor:
        """A zero tensor of this schema with `rows` rows (sent by a deviating rank)."""
        return torch.zeros((rows, *self.trailing_shape), dtype=self.dtype, device=device)

    def __str__(self) -> str:
        rows = {-1: "per token", -2: "per item"}.get(self.rows_per_item, f"{self.rows_per_item} per item")
        return f"{self.name or '?'}: {str(self.dtype).removeprefix('torch.')}{list(self.trailing_shape)} ({rows})"


def schema_word(schema: Sequence[PieceSchema]) -> int:
    """The schema as one signed 64-bit word (first 8 bytes of its SHA-256)."""
    return int(np.frombuffer(fingerprint(tuple(map(str, schema))), dtype=np.int64)[0])


def describe(schema: Sequence[PieceSchema]) -> str:
    return "{" + ", ".join(map(str, schema)) + "}"


INVALID_WORD = -1  # the schema word of a rank whose own pieces failed their checks (never a schema's word)


MAX_MISSES = 2
"""Speculated headers that may miss at one site (every rank passed other pieces than expected, sent after zeros
of the expected ones) before its headers stay in the all-reduce for good."""


def sites_word(guards, *more) -> int:
    """The state of exchange sites (`SchemaGuard.state` of each of `guards`, and `more` state of the caller that
    every rank should hold alike) as one word, for a metadata all-gather (`gather_metadata`'s `state`): where a rank's
    sites were built since its peers' (a dispatcher rebuilt on one rank, probe27 P27-08: its first header went in the
    all-reduce while its peers' rode in the payload all-to-all, and every rank waited until the group's timeout), the
    words differ, and every rank starts its sites afresh."""
    return int(words_of(fingerprint(*(guard.state() for guard in guards), *more))[0])


class SchemaGuard:
    """The agreement check of one exchange site (see module docstring); `what` names the site in
    its errors.  Every rank must call the site the same number of times (the collective discipline
    every exchange already needs)."""

    def __init__(self, what: str = "exchange"):
        self.what = what
        self.fact = 0  # this rank's word for the next header: its fact (a loop run since the latest dispatch), + 2
        # where it records the site's backward (`tell`)
        self.facts: tuple[int, int] | None = None  # (fewest, most) over the ranks of the latest header's words
        self.schema: tuple[PieceSchema, ...] | None = None  # what every rank passed at the latest exchange
        self.followed = False  # whether every rank followed the plan expected there (`speculates`)
        self.missed = False  # every rank passed other pieces than expected, until a header round sees a schema again
        self.misses = 0  # such misses so far: after MAX_MISSES the site's headers stay in the all-reduce

    def state(self) -> tuple:
        """What decides this site's next header (`speculates`, and the sizes a riding one sends): alike on every rank
        whose guard took part in the same exchanges; a guard built since on some ranks holds another (probe27
        P27-08), which the metadata all-gather before the next plan's exchanges finds (`gather_metadata`'s
        `state`)."""
        return None if self.schema is None else schema_word(self.schema), self.followed, self.missed, self.misses

    def tell(self, fact: bool, records: bool = False) -> None:
        """Send `fact` with this site's next header (`every_rank` reads what every rank sent), and whether this rank
        records the site's backward (`records_differ`), in one word: `fact` + 2 * `records`."""
        self.fact, self.facts = int(fact) + 2 * int(records), None

    def every_rank(self, group) -> bool:
        """Whether every rank told this site's latest header its fact (where all record alike, which
        `records_differ` checks: the fewest word's parity); with no header (a group of one: this rank's own; else
        none ran, and no rank takes it for true)."""
        facts = self.facts or ((self.fact,) * 2 if group_size(group) == 1 else (0, 0))
        return facts[0] % 2 == 1

    def records_differ(self) -> bool:
        """Whether some ranks told the latest header that they record the site's backward and others not: those
        that record would wait in their backward's reverse exchange for the others until the collective timeout."""
        return self.facts is not None and self.facts[0] // 2 != self.facts[1] // 2

    def speculates(self, expected: int | None) -> bool:
        """Whether this site's next header rides in its payload all-to-all (`exchange`'s `reference`, whose plan
        is `expected`): where every rank of its latest exchange followed the plan expected then, whose schema
        (`self.schema`) every rank then expects again; what every rank knows alike."""
        return (expected is not None and self.schema is not None and self.followed and not self.missed
                and self.misses < MAX_MISSES)

    def words(self, schema: tuple[PieceSchema, ...], plan_id: int, problem: Exception | None) -> np.ndarray:
        """This rank's header: its schema's word (INVALID_WORD where it has a `problem`), `plan_id`, `self.fact`."""
        return np.array([INVALID_WORD if problem is not None else schema_word(schema), plan_id, self.fact],
                        dtype=np.int64)

    def agree(self, schema: tuple[PieceSchema, ...], plan_id: int, group, problem: Exception | None = None,
              expected: int | None = None) -> None:
        """Check that every rank of `group` exchanges pieces of the same schema along the same plan
        (one all-reduce of six int64 words); raise on every rank unless so.

        `problem` is this rank's own reason not to exchange: the other ranks raise naming it, and when
        every rank has one, each raises its own.  `self.fact` rides along: `self.facts` is then its fewest
        and most over the ranks, which every rank reads alike (what a caller decides from it, all decide).
        `expected`: the plan every rank was expected to follow (`speculates`), or None."""
        words = self.words(schema, plan_id, problem)
        folded = torch.from_numpy(np.concatenate([words, ~words])).to(comm_device(group))
        with collective(f"{self.what} header all-reduce", group):
            finish(dist.all_reduce(folded, op=dist.ReduceOp.MAX, group=group, async_op=True), group)
        largest = folded.cpu().numpy()
        self.facts = (int(~largest[5]), int(largest[2]))
        if np.array_equal(largest[:2], ~largest[3:5]):  # every rank's largest word is its smallest too
            self.missed = self.missed and schema != self.schema  # the same schema twice: it rides again
            self._settled(schema, plan_id, expected, problem)
            return
        gathered = [torch.empty_like(folded[:3]) for _ in range(group_size(group))]
        with collective(f"{self.what} header all-gather", group):
            finish(dist.all_gather(gathered, torch.from_numpy(words).to(folded.device), group=group, async_op=True),
                   group)
        self._refuse(np.stack([row.cpu().numpy() for row in gathered]), schema, group, problem)

    def settle(self, rows: np.ndarray, schema: tuple[PieceSchema, ...], expected: int, group,
               problem: Exception | None = None) -> bool:
        """`agree` from every rank's header as the payload all-to-all brought it (`rows`: one `words` a rank):
        True where every rank sent its pieces (the schema of `self.schema`, along the `expected` plan); False
        where every rank passed the same other ones (sent as zeros of the sizes expected: move them now);
        else every rank raises, as `agree` does."""
        self.facts = (int(rows[:, 2].min()), int(rows[:, 2].max()))
        if not np.all(rows[:, :2] == rows[0, :2]):
            self._refuse(rows, schema, group, problem)
        followed = self.schema == schema and rows[0, 1] == expected
        self.missed = not followed  # a site whose schema alternates (two dicts a step) rides no more (probe24 P24-02)
        self.misses += self.missed  # nor one whose schemas recur in longer periods (A, A, B, ...: P24-08)
        self._settled(schema, int(rows[0, 1]), expected, problem)
        return followed

    def _settled(self, schema: tuple[PieceSchema, ...], plan_id: int, expected: int | None,
                 problem: Exception | None) -> None:
        """Every rank sent the same header: raise this rank's own `problem` (every rank has one), else take
        the schema and whether the plan was the expected one for the next exchange (`speculates`)."""
        self.schema, self.followed = (None, False) if problem is not None else (schema, plan_id == expected)
        if problem is not None:
            raise problem

    def _refuse(self, rows: np.ndarray, schema: tuple[PieceSchema, ...], group, problem: Exception | None) -> None:
        """Raise on every rank, from every rank's header (`rows`, which differ), naming the ranks that differ."""
        self.schema, self.followed = None, False
        rank = group_rank(group)
        plans = disagreement(rows[:, 1].tolist(), f"{self.what}: the plan", rank,
                             show=lambda word: f"{word & (2**64 - 1):016x}"[:12])
        if plans:
            raise PlanMismatchError(f"{plans}; pass every exchange the plan of this step (and of this micro-batch): "
                                    f"a rank kept another step's plan or routes, or built its own, or the algorithm "
                                    f"plans differently in each process (a plugin whose plan depends on the process; "
                                    f"the runtime's check_plan=True compares the plans where they are made)")
        mine = (f"invalid input: {problem}", type(problem)) if problem is not None else (describe(schema), None)
        shown = [None] * group_size(group)
        with collective(f"{self.what} schema all-gather", group):
            dist.all_gather_object(shown, mine, group=group)
        raise self._error([text for text, _ in shown], [kind for _, kind in shown], rank) from problem

    def _error(self, texts: Sequence[str], kinds: Sequence, rank: int) -> Exception:
        """The error every rank raises: `SchemaMismatchError` for schemas that differ or a rank's bad row
        count (a plain ValueError); else the first failing rank's kind of error, naming the ranks and why."""
        failed = [r for r, kind in enumerate(kinds) if kind is not None]
        if not failed or kinds[failed[0]] is ValueError:
            return SchemaMismatchError(
                disagreement(texts, f"{self.what}: the schema of the pieces", rank) +
                "; every rank must pass the same keys, dtypes, trailing shapes and per-item keys")
        others = [r for r in range(len(kinds)) if r not in failed]
        detail = "; ".join(f"rank {r}: {texts[r]}" for r in failed)
        return kinds[failed[0]](f"{self.what} (seen from rank {rank}): ranks {failed} disagree with ranks {others}: "
                                f"{detail}")

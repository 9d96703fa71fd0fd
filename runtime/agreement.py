"""Cross-rank agreement: configuration fingerprints and exchange schemas, checked on every rank.

Two things every rank must share before payload bytes are interpreted:

- the configuration (algorithm, cost model, caps, stage declarations): a 32-byte
  fingerprint rides in the metadata all-gather the plan makes anyway
  (`gather_metadata(..., fingerprint=...)`), so a rank planning with other settings is
  named on every rank before any plan is used;
- the schema of what an exchange moves (per piece: name, dtype, trailing shape, rows per
  item): a `SchemaGuard` per exchange site.  Its first call all-gathers one 8-byte
  schema word; afterwards the word rides as an 8-byte header on every (source,
  destination) segment of the payload all-to-all itself, every segment sized by the
  agreed schema (a rank whose tensors deviate sends zeros of the agreed shape instead),
  so a mismatch is seen by every rank from the headers before any byte is reinterpreted,
  with no extra round trip.  When every rank changes its schema the same way (a new
  dtype for all), the exchange is redone once under the new schema.

Every rank sees the same gathered words, so every rank raises the same error, naming the
ranks that disagree with the majority.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
import torch.distributed as dist

from ..balancers.validation import is_int
from .comm import comm_device, group_rank, group_size


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
    """Options by name as ranks fingerprint and compare them: canonical values, and a tuple of
    dataclasses (the stages) one entry per field, so a mismatch names the field.

    >>> from orchmllm.orchestrator.stages import Stage
    >>> from orchmllm.balancers import CostModel
    >>> table = option_table({"stages": (Stage("llm", "llm", CostModel()),), "budget": np.int64(16)})
    >>> table["stages[0].algorithm"], table["budget"]
    ('lpt', 16)
    """
    table = {}
    for name, value in options.items():
        if isinstance(value, tuple) and value and all(dataclasses.is_dataclass(item) for item in value):
            for index, item in enumerate(value):
                table.update((f"{name}[{index}].{field.name}", canonical(getattr(item, field.name)))
                             for field in dataclasses.fields(item))
        else:
            table[name] = canonical(value)
    return table


def options_that_differ(shown: Sequence[Mapping[str, str]]) -> str:
    """The options whose shown values differ across ranks (one table per rank), with the ranks of each.

    >>> options_that_differ([{"algorithm": "'lpt'", "cap": "8"}, {"algorithm": "'kk'", "cap": "8"}])
    "`algorithm` (ranks [0]: 'lpt'; ranks [1]: 'kk')"
    """
    names = list(dict.fromkeys(name for table in shown for name in table))
    differing = []
    for name in names:
        groups, _, detail = _groups([table.get(name, "(absent)") for table in shown], str)
        if len(groups) > 1:
            differing.append(f"`{name}` ({detail})")
    return ", ".join(differing) or "none in their reprs (another orchmllm version on some ranks?)"


def words_of(digest: bytes) -> np.ndarray:
    """A 32-byte digest as four int64 words (to ride in an int64 all-gather)."""
    if len(digest) != 32:
        raise ValueError(f"`fingerprint` must be 32 bytes (SHA-256); got {len(digest)}")
    return np.frombuffer(digest, dtype=np.int64).copy()


@dataclass(frozen=True)
class PieceSchema:
    """What one piece of an exchange is: name, dtype, trailing shape, rows per item.

    `rows_per_item` is an int k (k rows per item, e.g. 1 for per-item tensors) or -1
    (rows given per item by lengths: per-token tensors).
    """

    name: str
    dtype: torch.dtype
    trailing_shape: tuple[int, ...]
    rows_per_item: int

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor, item_rows) -> "PieceSchema":
        rows_per_item = int(item_rows) if is_int(item_rows) else -1
        return cls(str(name), tensor.dtype, tuple(int(n) for n in tensor.shape[1:]), rows_per_item)

    def zeros(self, rows: int, device) -> torch.Tensor:
        """A zero tensor of this schema with `rows` rows (sent by a deviating rank)."""
        return torch.zeros((rows, *self.trailing_shape), dtype=self.dtype, device=device)

    def __str__(self) -> str:
        rows = "per token" if self.rows_per_item == -1 else f"{self.rows_per_item} per item"
        return f"{self.name or '?'}: {str(self.dtype).removeprefix('torch.')}{list(self.trailing_shape)} ({rows})"


def schema_word(schema: Sequence[PieceSchema]) -> int:
    """The schema as one signed 64-bit word (first 8 bytes of its SHA-256)."""
    return int(np.frombuffer(fingerprint(tuple(map(str, schema))), dtype=np.int64)[0])


def describe(schema: Sequence[PieceSchema]) -> str:
    return "{" + ", ".join(map(str, schema)) + "}"


class SchemaGuard:
    """The schema one exchange site agreed on, kept across steps (see module docstring).

    Every rank must own one guard per exchange site and call the site the same number
    of times (the collective discipline every exchange already needs).
    """

    def __init__(self, what: str = "exchange"):
        self.what = what
        self.agreed: tuple[PieceSchema, ...] | None = None

    def agree(self, schema: tuple[PieceSchema, ...], group) -> None:
        """The cold path: all-gather every rank's schema word (one small collective)."""
        words = [schema_word(schema)]
        if group_size(group) > 1:
            mine = torch.tensor(words, dtype=torch.int64, device=comm_device(group))
            gathered = [torch.empty_like(mine) for _ in range(group_size(group))]
            dist.all_gather(gathered, mine, group=group)
            words = [int(w.item()) for w in gathered]
        self.check(words, schema, group)
        self.agreed = schema

    def check(self, words: Sequence[int], schema: tuple[PieceSchema, ...], group, described: str | None = None
              ) -> None:
        """Raise SchemaMismatchError on every rank when the gathered words differ.

        Every rank sees the same words, so every rank takes part in the one
        `all_gather_object` that collects the schemas for the message; `described` stands for
        this rank's schema there (a rank whose own pieces failed their checks says why).
        """
        if disagreement(list(words), "", 0) is None:
            return
        mine = describe(schema) if described is None else described
        schemas = [mine]
        if group_size(group) > 1:
            schemas = [None] * group_size(group)
            dist.all_gather_object(schemas, mine, group=group)
        raise SchemaMismatchError(
            disagreement(schemas, f"{self.what}: the schema of the pieces", group_rank(group)) +
            "; every rank must pass the same keys, dtypes, trailing shapes and per-item keys")

"""Split items in the one fused exchange: a step's route at the grain of zigzag chunks.

An unsplit item is one unit; an item split at degree c is its 2c zigzag chunks
(`balancers.context_parallel.layout`), chunk j going to group rank k = min(j, 2c − 1 − j).
Units are listed item by item, chunks in order, so a rank's home tensor (its items' rows one
after another) is already its units' rows in unit order, and what arrives, in ascending unit
index, is each item whole (unsplit) or its shard (chunks k then 2c − 1 − k, as
`ContextParallelLayout` packs it).  The route over units is a plain `ExchangeMeta`: split items
move in the same single all-to-all as the rest, under the same agreement check, and the inverse
route (combine, backward) puts every chunk back in place at the item's home.

    units(i)   = [(i, 0)] if degree[i] == 1 else [(i, j) for j in range(2 * degree[i])]
    dest(i, j) = group[i][min(j, 2 * degree[i] - 1 - j)]
    rows(i, j) = chunk_sizes(l_i, degree[i])[j]      per-token tensors
    rows(i, j) = 1 if j < degree[i] else 0           per-item tensors going out: a copy per group rank
    rows(i, j) = 1 if j == 0 else 0                  per-item tensors coming home: group rank 0's row
    rows(i, j) = 1 if j < degree[i] else 0           or every group rank's, added at home (`home_sums`)

A step with no split item has one unit per item: the route is the item route, unchanged.
The groups, degrees and chunk layout ride in the plan's identity word (`digest`), which every
guarded exchange checks on every rank, so the per-micro-batch `ContextParallelLayout`s are
built from the plan with no collective of their own.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from ..balancers.context_parallel.layout import chunk_sizes
from ..balancers.problem import read_only
from .agreement import fingerprint
from .context_parallel import ContextParallelLayout, SplitItem
from .cp_rows import note_epoch
from .exchange import ExchangeMeta, home_ranks


def item_groups(plan, num_items: int) -> tuple[np.ndarray, np.ndarray]:
    """(first rank, degree) of every item of a balancer's plan (`BalancePlan`, `MicroBatchPlan`, or
    their context-parallel forms, whose item i runs on ranks first[i] .. first[i] + degree[i] − 1)."""
    if plan is None:
        return np.zeros(num_items, dtype=np.int64), np.ones(num_items, dtype=np.int64)
    first = plan.assignment if hasattr(plan, "assignment") else plan.rank
    degree = getattr(plan, "degree", None)
    return (np.asarray(first, dtype=np.int64),
            np.ones(num_items, dtype=np.int64) if degree is None else np.asarray(degree, dtype=np.int64))


@dataclass(frozen=True, eq=False)
class StepSharding:
    """Where every item's tokens go in a step: whole to one rank, or in zigzag chunks to its group.

    `groups` lists every item's ranks in shard order, concatenated (`degree[i]` of them for item
    i); `microbatch[i]` is the item's micro-batch.  `route` moves units (see module docstring)
    for this `rank`; `digest` is the 32-byte identity of the groups, degrees and chunks.

    >>> step = StepSharding.build([5, 2], counts=[2, 0], first=[0, 0], degree=[2, 1], microbatch=[0, 0], rank=1)
    >>> step.local_items.tolist(), step.local_tokens.tolist(), step.layout(0).positions().tolist()
    ([0], [2], [2, 3])
    """

    lengths: np.ndarray
    counts: np.ndarray
    degree: np.ndarray
    groups: np.ndarray
    microbatch: np.ndarray
    route: ExchangeMeta
    unit_item: np.ndarray
    unit_chunk: np.ndarray
    unit_tokens: np.ndarray
    digest: bytes
    layouts: dict = field(default_factory=dict)  # micro-batch index -> ContextParallelLayout, made on use

    @classmethod
    def build(cls, lengths, counts, first, degree, microbatch, rank: int, plan_id=None) -> "StepSharding":
        """The sharding of items of `lengths` (rank r contributed counts[r] of them) on ranks
        first[i] .. first[i] + degree[i] − 1; `plan_id(digest)` gives the route's plan word."""
        first = np.asarray(first, dtype=np.int64)
        degree = np.asarray(degree, dtype=np.int64)
        offsets = np.cumsum(degree) - degree
        groups = np.repeat(first - offsets, degree) + np.arange(int(degree.sum()), dtype=np.int64)
        return cls.from_groups(lengths, counts, degree, groups, microbatch, rank, plan_id)

    @classmethod
    def from_groups(cls, lengths, counts, degree, groups, microbatch, rank: int, plan_id=None) -> "StepSharding":
        """As `build`, from every item's group listed explicitly (any distinct ranks, in shard order)."""
        lengths, counts, degree, groups, microbatch = (np.array(values, dtype=np.int64) for values in
                                                       (lengths, counts, degree, groups, microbatch))
        units = np.where(degree > 1, 2 * degree, 1)
        unit_item = np.repeat(np.arange(lengths.size, dtype=np.int64), units)
        unit_chunk = np.arange(unit_item.size, dtype=np.int64) - np.repeat(np.cumsum(units) - units, units)
        unit_degree = degree[unit_item]
        shard = np.minimum(unit_chunk, 2 * unit_degree - 1 - unit_chunk)
        unit_dest = groups[(np.cumsum(degree) - degree)[unit_item] + np.where(unit_degree > 1, shard, 0)]
        unit_tokens = lengths[unit_item].copy()
        for c in np.unique(degree[degree > 1]).tolist():
            members = degree[unit_item] == c
            unit_tokens[members] = chunk_sizes(lengths[degree == c], c).ravel()
        split = degree > 1
        digest = fingerprint("context-parallel sharding", degree[split], groups[np.repeat(split, degree)],
                             np.flatnonzero(split))
        word = 0 if plan_id is None else plan_id(digest)
        route = ExchangeMeta(home_ranks(counts)[unit_item], unit_dest, rank, int(counts.size), word)
        for array in (lengths, counts, degree, groups, microbatch, unit_item, unit_chunk, unit_tokens):
            array.setflags(write=False)
        return cls(lengths, counts, degree, groups, microbatch, route, unit_item, unit_chunk, unit_tokens, digest)

    @property
    def any_split(self) -> bool:
        return bool(self.degree.size) and int(self.degree.max()) > 1

    def group(self, item: int) -> tuple[int, ...]:
        """The ranks of item `item`'s group, in shard order."""
        start = int(self.group_starts[item])
        return tuple(self.groups[start:start + int(self.degree[item])].tolist())

    @functools.cached_property
    def group_starts(self) -> np.ndarray:
        """Where each item's ranks start in `groups`."""
        return np.cumsum(self.degree) - self.degree

    @property
    def home_items(self) -> np.ndarray:
        """The items this rank contributed (holds before dispatch), ascending."""
        start = int(self.counts[:self.route.rank].sum())
        return np.arange(start, start + int(self.counts[self.route.rank]), dtype=np.int64)

    @property
    def local_units(self) -> np.ndarray:
        """Units this rank holds after dispatch, ascending: every item's whole, or its shard's two chunks."""
        return self.route.dest_items

    @functools.cached_property
    def local_items(self) -> np.ndarray:
        """Items with rows on this rank after dispatch (whole or a shard), ascending (read-only: the plan's)."""
        return read_only(np.unique(self.unit_item[self.local_units]))

    @functools.cached_property
    def local_tokens(self) -> np.ndarray:
        """Tokens this rank holds of each of `local_items` (an item's length, or its shard's)."""
        units = self.local_units
        return read_only(np.bincount(np.searchsorted(self.local_items, self.unit_item[units]),
                                     weights=self.unit_tokens[units], minlength=self.local_items.size).astype(np.int64))

    def item_rows(self, per_item: bool, home: bool = False):
        """Rows per unit of a per-token tensor (chunk tokens), or of a per-item tensor going out (a row
        per group rank) or coming home (`home`: group rank 0's row); an int 1 when nothing is split."""
        if not per_item:
            return self.unit_tokens
        if not self.any_split:
            return 1
        limit = 1 if home else self.degree[self.unit_item]
        return (self.unit_chunk < limit).astype(np.int64)

    def copies(self, tensor: torch.Tensor) -> torch.Tensor:
        """A per-item tensor of this rank's home items with each split item's row repeated once per
        group rank (what the route sends out); a tensor of another row count is left for the
        exchange's own check to name."""
        home = self.home_items
        if not self.any_split or not _rows(tensor, home.size):
            return tensor
        index = np.repeat(np.arange(home.size), self.degree[home])
        return tensor.index_select(0, torch.from_numpy(index).to(tensor.device))

    def first_copies(self, tensor: torch.Tensor) -> torch.Tensor:
        """A per-item tensor of this rank's `local_items` reduced to the rows going home: unsplit
        items' and those of the shards this rank holds as group rank 0."""
        items = self.local_items
        if not self.any_split or not _rows(tensor, items.size):
            return tensor
        units = self.local_units
        keep = np.searchsorted(items, self.unit_item[units[self.unit_chunk[units] == 0]])
        return tensor.index_select(0, torch.from_numpy(keep).to(tensor.device))

    def home_sums(self, tensor: torch.Tensor) -> torch.Tensor:
        """A per-item tensor come home with a row from every rank of each split item's group (`item_rows(True)`,
        in group rank order) as one row per home item: the group's rows added in group rank order, the same
        order on every device (no atomics: each step adds one row to distinct items)."""
        if not self.any_split:
            return tensor
        degree = self.degree[self.home_items]
        starts = np.cumsum(degree) - degree
        total = tensor.index_select(0, torch.from_numpy(starts).to(tensor.device))
        for k in range(1, int(degree.max(initial=1))):
            has = np.flatnonzero(degree > k)
            rows = tensor.index_select(0, torch.from_numpy(starts[has] + k).to(tensor.device))
            total = total.index_add(0, torch.from_numpy(has).to(tensor.device), rows)
        return total

    def layout(self, index: int, group=None) -> ContextParallelLayout:
        """Micro-batch `index`'s layout on this rank: its sequences (unsplit lengths, `SplitItem` shards)
        and every split item of the micro-batch, from the agreed plan (no collective)."""
        if index not in self.layouts:
            split = np.flatnonzero((self.degree > 1) & (self.microbatch == index))
            splits = {int(i): SplitItem(int(i), int(self.lengths[i]), self.group(int(i))) for i in split}
            items, tokens = self.local_items, self.local_tokens
            mine = self.microbatch[items] == index
            sequences = [splits.get(int(i), int(t)) for i, t in zip(items[mine], tokens[mine])]
            self.layouts[index] = ContextParallelLayout.planned(self.route.rank, self.route.world_size, sequences,
                                                                tuple(splits.values()), group=group)
        return self.layouts[index]


def _rows(tensor, count: int) -> bool:
    """Whether `tensor` is a tensor of `count` rows (else the exchange's checks name what is wrong)."""
    return isinstance(tensor, torch.Tensor) and tensor.dim() > 0 and tensor.shape[0] == count


@dataclass(frozen=True, eq=False)
class TextUnits:
    """A multi-stage pass's (or step's) text pieces as route units, sample by sample in chunk order:
    `tokens[u]` text rows of `sample[u]` go to LLM rank `rank[u]` in micro-batch `microbatch[u]`;
    `copies[u]` is 1 where the unit carries its sample's per-sample row (a copy per group rank:
    chunks 0 .. c − 1; the one unit of an unsplit sample), else 0."""

    sample: np.ndarray
    tokens: np.ndarray
    rank: np.ndarray
    copies: np.ndarray
    microbatch: np.ndarray

    @classmethod
    def of_pass(cls, plan, samples=None, microbatch: int = 0) -> "TextUnits":
        """The units of a `PassPlan`, its samples numbered `samples` (default: the pass's own)."""
        pieces, degree = plan.text_pieces, plan.llm.degree
        first = np.flatnonzero(np.diff(pieces.sample, prepend=-1) != 0)
        chunk = np.arange(pieces.sample.size) - np.repeat(first, np.diff(np.append(first, pieces.sample.size)))
        sample = pieces.sample if samples is None else np.asarray(samples, dtype=np.int64)[pieces.sample]
        return cls(sample, pieces.tokens, pieces.rank, (chunk < degree[pieces.sample]).astype(np.int64),
                   np.full(sample.size, microbatch, dtype=np.int64))

    @classmethod
    def of_step(cls, step) -> "TextUnits":
        """The units of every pass of a `StepPlan`, over the step's samples, sample by sample."""
        parts = [cls.of_pass(plan, samples, index)
                 for index, (plan, samples) in enumerate(zip(step.microbatches, step.microbatch_samples))]
        columns = [np.concatenate([getattr(part, name) for part in parts]) for name in
                   ("sample", "tokens", "rank", "copies", "microbatch")]
        order = np.argsort(columns[0], kind="stable")  # a sample's units stay in chunk order
        return cls(*(column[order] for column in columns))

    def route(self, batch, rank: int, size: int, plan_id: int) -> ExchangeMeta:
        """Every unit from its sample's home rank to its LLM rank."""
        return ExchangeMeta(batch.sample_source[self.sample], self.rank, rank, size, plan_id)

    def expand(self, tensor: torch.Tensor, home_samples: np.ndarray) -> torch.Tensor:
        """A per-sample tensor of `home_samples` (ascending) with each row repeated once per copy unit."""
        if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0 or tensor.shape[0] != home_samples.size:
            return tensor  # the exchange's own checks name what is wrong
        counts = np.bincount(self.sample, weights=self.copies, minlength=int(home_samples.max(initial=-1)) + 1)
        repeats = counts[home_samples].astype(np.int64)
        if np.all(repeats == 1):
            return tensor
        return tensor.index_select(0, torch.from_numpy(np.repeat(np.arange(home_samples.size), repeats)).to(
            tensor.device))


def pass_layout(plan, rank: int, size: int, samples, group=None) -> ContextParallelLayout:
    """Rank `rank`'s LLM layout in a multi-stage pass: its shard rows (unsplit samples' lengths, split
    samples' `SplitItem`s numbered by `samples`, the pass's samples in the step) and the pass's split
    samples, from the agreed plan (no collective), as the runtime's loop reaches the pass: every rank yields
    every pass in order, so each begins a layout epoch alike, and another pass's layout used in it swaps its
    header where its peers swap theirs, named on both ranks (`cp_rows`)."""
    note_epoch(group, collective=False)
    shards, llm, lengths = plan.shards, plan.llm, plan.batch.sample_llm_length
    samples = np.asarray(samples, dtype=np.int64)
    splits = {int(k): SplitItem(int(samples[k]), int(lengths[k]), tuple(int(r) for r in llm.item_ranks(k)))
              for k in np.flatnonzero(llm.degree > 1)}
    rows = shards.rows_on(rank)
    sequences = [splits.get(int(k), int(t)) for k, t in zip(shards.sample[rows], shards.tokens[rows])]
    return ContextParallelLayout.planned(rank, size, sequences, tuple(splits.values()), group=group)

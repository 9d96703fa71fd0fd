"""Peers' ways of running giant items, reimplemented from public descriptions, judged by one time model.

    no_split              today's best plain plan (`balance`, "auto"): every item whole
    static_cp             every item split at one degree c: D / c data-parallel groups of c ranks
                          (aligned blocks), items dealt to the groups by LPT on their time at c
                          (classic context parallelism: one CP size for the whole run)
    megatron_dynamic_cp   Megatron-LM's dynamic ("hybrid") context parallelism, from the public
                          `megatron/core/pipeline_parallel/hybrid_cp_schedule.py` (read 2026-08):
                          degree = next power of two of ceil(l / capacity) (capacity: the tokens a
                          rank holds of one sequence), work estimated as l² / c; the step runs in
                          waves separated by barriers, each wave built longest first from buckets
                          of about equal estimated work (one bucket per distinct degree): an item
                          opens a group of its degree on free ranks while there are enough, else
                          joins the least-loaded group of its degree; once a smaller degree than the
                          first one has appeared, the wave closes as soon as max − min of the
                          ranks' estimated work is within 5 % of the max; the most loaded rank's
                          latest item goes back to the pending ones while that narrows the spread;
                          ranks left idle are filled by doubling the degree of the first group of
                          the smallest size.  The next wave starts from the items left over.

Every plan is judged by the same `ContextParallel.time` (through `certify_split`): the step of a
plan is its makespan, Megatron's the sum of its waves' makespans (a barrier ends each wave).
Groups are laid on aligned blocks, largest first, inside nodes: the layout most favourable to
the peer.  Degrees are the spec's (Megatron's powers of two, those the spec holds: an item takes the
least that holds it, capped at the widest, and idle ranks double a group to the next one), so its
groups may span the whole world.
None of the peers' code is imported or copied; only the rules above are reproduced.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..balancers import ContextParallel, ContextParallelPlan, CostModel, balance
from ..balancers.context_parallel import certify_split
from ..balancers.context_parallel.blocks import free_blocks
from ..balancers.problem import as_lengths
from ..balancers.validation import as_int

MEGATRON_BALANCE_SLACK = 0.05  # a wave closes when max − min <= 5 % of max
MEGATRON_BUCKET_SLACK = 1.1  # a bucket closes before passing 1.1 × its share of the work


@dataclass(frozen=True, eq=False)
class WavePlan:
    """A step run as waves separated by barriers: each wave a split plan of some items."""

    waves: tuple[ContextParallelPlan, ...]
    items: tuple[np.ndarray, ...]  # the step's item indices each wave runs

    @property
    def step_cost(self) -> float:
        """Sum of the waves' makespans (cost units)."""
        return math.fsum(wave.makespan for wave in self.waves)

    @property
    def items_split(self) -> int:
        return sum(int(wave.split_items.size) for wave in self.waves)


def no_split(lengths, num_ranks, spec: ContextParallel, *, cost=None) -> ContextParallelPlan:
    """Today's best plan without splitting, certified against plans that may split."""
    plan = balance(lengths, num_ranks, cost=cost)
    return certify_split(lengths, num_ranks, spec, plan.assignment, np.ones(plan.num_items, dtype=np.int64),
                         cost=cost, algorithm="no_split")


def static_cp(lengths, num_ranks, spec: ContextParallel, degree: int, *, cost=None) -> ContextParallelPlan:
    """Every item at `degree` on one of the D // degree aligned blocks, dealt by LPT on its time."""
    lengths = as_lengths(lengths)
    degree = as_int(degree, "degree", minimum=1)
    cost = CostModel() if cost is None else cost
    groups = num_ranks // degree
    starts = np.arange(groups) * degree
    inside = starts // spec.gpus_per_node == (starts + degree - 1) // spec.gpus_per_node
    if not (inside.all() or spec.allow_inter_node):
        raise ValueError(f"static degree {degree} puts groups across nodes of {spec.gpus_per_node} gpus")
    times = spec.time(cost, lengths, degree, within_node=bool(inside.all()))
    group = balance(lengths, groups, costs=times, algorithm="lpt").assignment
    return certify_split(lengths, num_ranks, spec, starts[group], np.full(lengths.size, degree), cost=cost,
                         algorithm=f"static_cp{degree}")


def best_static_cp(lengths, num_ranks, spec: ContextParallel, degrees, *, cost=None) -> tuple[ContextParallelPlan, int]:
    """`static_cp` at each of `degrees` above 1 (at 1 when there is none): the plan of the lowest
    makespan (the smaller degree on ties) and its degree, what a static configuration picks at best."""
    choices = [c for c in degrees if c > 1] or [1]
    plans = [static_cp(lengths, num_ranks, spec, c, cost=cost) for c in choices]
    best = min(range(len(plans)), key=lambda k: (plans[k].makespan, k))
    return plans[best], choices[best]


def megatron_capacities(lengths, widest: int, most: int) -> list[int]:
    """Capacities to try Megatron at: powers of two from the least that fits the longest item in the
    widest group, doubling while within `most` (the first one always).

    >>> megatron_capacities(np.array([1000, 117113]), 8, 42319)
    [16384, 32768]
    """
    need = max(-(-int(np.max(lengths, initial=1)) // widest), 1)
    capacity = 1 << (need - 1).bit_length()
    return [capacity << k for k in range(max(most // capacity, 1).bit_length())]


def best_megatron_dynamic_cp(lengths, num_ranks, spec: ContextParallel, capacities, *, cost=None
                             ) -> tuple[WavePlan, int]:
    """`megatron_dynamic_cp` at each of `capacities`: the waves of the lowest step cost (the smaller
    capacity on ties) and that capacity, the peer at its best."""
    runs = [megatron_dynamic_cp(lengths, num_ranks, spec, capacity, cost=cost) for capacity in capacities]
    best = min(range(len(runs)), key=lambda k: (runs[k].step_cost, k))
    return runs[best], capacities[best]


class _Wave:
    """One Megatron wave being built: groups (members' estimated work, items), free ranks."""

    def __init__(self, num_ranks: int):
        self.free = num_ranks
        self.size: list[int] = []
        self.load: list[float] = []
        self.items: list[list[int]] = []
        self.by_size: dict[int, list[tuple[float, int]]] = {}  # size -> heap of (load, group)

    most = 0.0  # the largest group load so far (loads only grow while a wave is built)

    def place(self, item: int, size: int, work: float) -> None:
        """A new group on free ranks while they suffice (their load, 0, beats any group's), else the
        least-loaded group of this size."""
        heap = self.by_size.setdefault(size, [])
        if self.free >= size:
            self.free -= size
            group = len(self.size)
            self.size.append(size)
            self.load.append(0.0)
            self.items.append([])
        else:
            _, group = heapq.heappop(heap)
        self.load[group] += work
        self.most = max(self.most, self.load[group])
        self.items[group].append(item)
        heapq.heappush(heap, (self.load[group], group))

    def fits(self, size: int) -> bool:
        return self.free >= size or bool(self.by_size.get(size))

    def spread(self) -> tuple[float, float]:
        """(max, min) of the ranks' estimated work while placing (idle ranks count 0)."""
        if self.free:
            return self.most, 0.0
        return self.most, min(heap[0][0] for heap in self.by_size.values() if heap)


def _buckets(pending: list[int], degree: list[int], work: list[float]) -> list[deque]:
    """Pending items (longest first) cut into one run per distinct degree of about equal work."""
    k = len({degree[i] for i in pending})
    target = math.fsum(work[i] for i in pending) / k
    buckets, current, current_work = [], [], 0.0
    for position, item in enumerate(pending):
        # Megatron's rule, as written: close when over budget or when "saving items for the buckets
        # still to come", counted as k minus twice the closed ones.
        if current and (current_work + work[item] > MEGATRON_BUCKET_SLACK * target
                        or len(pending) - position <= k - 2 * len(buckets)):
            buckets.append(deque(current))
            current, current_work = [], 0.0
        current.append(item)
        current_work += work[item]
    return buckets + [deque(current)]


def _build_wave(pending: list[int], degree: list[int], work: list[float], lengths: np.ndarray, num_ranks: int,
                allowed: list[int]) -> tuple[_Wave, list[int]]:
    """One wave from the pending items (longest first): the wave and the items left over."""
    buckets = _buckets(pending, degree, work)
    wave, first, check = _Wave(num_ranks), None, False
    while buckets:
        bucket = next((b for b in buckets if b and wave.fits(degree[b[0]])), None)
        if bucket is None:
            break
        item = bucket.popleft()
        size = degree[item]
        wave.place(item, size, work[item])
        while buckets and not buckets[0]:
            buckets.pop(0)
        first = size if first is None else first
        check = check or size < first
        most, least = wave.spread()
        if check and buckets and most - least <= MEGATRON_BALANCE_SLACK * most:
            break
    left = [item for bucket in buckets for item in bucket]
    wave.most = max(wave.load, default=0.0)
    _trim(wave, work, left)
    _fill_idle(wave, lengths, allowed)
    return wave, left


def _trim(wave: _Wave, work: list[float], left: list[int]) -> None:
    """Send the most loaded group's latest item back while that narrows the spread."""
    while True:
        most, least = max(wave.load), 0.0 if wave.free else min(wave.load)
        if most - least <= MEGATRON_BALANCE_SLACK * most or least == 0:
            return
        group = int(np.argmax(wave.load))
        if len(wave.items[group]) <= 1:
            return
        item = wave.items[group][-1]
        loads = list(wave.load)
        loads[group] -= work[item]
        if max(loads) - (0.0 if wave.free else min(loads)) >= most - least:
            return
        wave.items[group].pop()
        wave.load[group] = loads[group]
        left.append(item)


def _fill_idle(wave: _Wave, lengths: np.ndarray, allowed: list[int]) -> None:
    """Widen the first group of the smallest size to the next `allowed` degree (double it, where the spec
    holds every power of two) onto idle ranks while they suffice."""
    while wave.free and wave.size:
        smallest = min(wave.size)
        wider = next((size for size in allowed if size > smallest), None)
        if wider is None or wave.free < wider - smallest:
            return
        group = wave.size.index(smallest)
        wave.free -= wider - smallest
        wave.size[group] = wider
        wave.load[group] = float(sum(int(lengths[i]) ** 2 for i in wave.items[group])) / wider


def megatron_waves(lengths, num_ranks, spec: ContextParallel, capacity: int) -> list[tuple[np.ndarray, ...]]:
    """Megatron's schedule alone (what its planner computes): per wave, (items, block start, degree)."""
    lengths = as_lengths(lengths)
    num_ranks = as_int(num_ranks, "num_ranks", minimum=1)
    capacity = as_int(capacity, "capacity", minimum=1)
    allowed = [size for size in spec.degrees if size <= num_ranks] or [1]
    need = -(-lengths // capacity)
    # the least allowed degree of at least the need (its next power of two where all are allowed), else the widest
    degree = np.array(allowed, dtype=np.int64)[np.minimum(np.searchsorted(allowed, need), len(allowed) - 1)]
    work = (lengths.astype(np.float64) ** 2 / degree).tolist()
    degree = degree.tolist()
    pending = np.lexsort((np.arange(lengths.size), -lengths)).tolist()
    waves = []
    while pending:
        wave, pending = _build_wave(pending, degree, work, lengths, num_ranks, allowed)
        waves.append(_lay_out(wave, num_ranks, spec))
    return waves


def megatron_dynamic_cp(lengths, num_ranks, spec: ContextParallel, capacity: int, *, cost=None) -> WavePlan:
    """Megatron-LM's dynamic context parallelism (see the module docstring), as waves of split plans."""
    lengths = as_lengths(lengths)
    waves = megatron_waves(lengths, num_ranks, spec, capacity)
    plans = tuple(certify_split(lengths[items], num_ranks, spec, start, size, cost=cost,
                                algorithm="megatron_dynamic_cp") for items, start, size in waves)
    return WavePlan(plans, tuple(items for items, _, _ in waves))


def _lay_out(wave: _Wave, num_ranks: int, spec: ContextParallel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(items, block start, degree) of a wave's groups laid on aligned blocks, largest first."""
    taken = np.zeros(num_ranks, dtype=bool)
    items, starts, sizes = [], [], []
    for group in sorted(range(len(wave.size)), key=lambda g: (-wave.size[g], g)):
        size = wave.size[group]
        blocks = free_blocks(taken, size, spec.gpus_per_node, spec.allow_inter_node)
        if not blocks.size:
            raise ValueError(f"no free aligned block of {size} ranks for a Megatron group on {num_ranks} ranks")
        taken[blocks[0]: blocks[0] + size] = True
        items += wave.items[group]
        starts += [int(blocks[0])] * len(wave.items[group])
        sizes += [size] * len(wave.items[group])
    return np.array(items, dtype=np.int64), np.array(starts, dtype=np.int64), np.array(sizes, dtype=np.int64)

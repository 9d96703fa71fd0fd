"""Peers' micro-batching, reimplemented from their public descriptions for comparison.

Every peer answers `balance_microbatches`' question (a cell (rank, micro-batch) per item,
every cell within the token budget T, the same M on every rank, step cost Σ_m max_r
load(r, m)) with its own rules and its own proxy of the work, and its plan goes through
the same certification (`make_microbatch_plan`, bound over every M), so all are judged
by the caller's real cost model on one footing.  None is imported from the peer's code.

    none              naive: every rank keeps the samples it drew (`sources`) and fills
                      micro-batches in sampling order, next fit under T; M = the most
                      any rank needs, the others run empty micro-batches at the end
    verl_dynamic_bsz  verl (`seqlen_balancing.py`, `rearrange_micro_batches` with
                      use_dynamic_bsz_balance): equal-count Karmarkar-Karp on
                      24576·l + l² across ranks (as `peers.verl_kk`), then every rank
                      Karmarkar-Karp (unequal sizes) on the same workload into
                      k = max_r min(n_r, ⌈tokens_r / T⌉) micro-batches (verl all-reduces
                      the max), ordered by workload, largest first, then the even
                      positions reversed followed by the odd ones (small ones at both ends)
    megatron_hybrid   Megatron-LM's hybrid-CP `BalancedCPScheduler.next_hdp_group` with
                      every sample on one GPU (all fit T): samples by l² (its workload
                      proxy), largest first, each to the least-loaded rank of the open
                      micro-batch with room under T; the micro-batch closes as soon as
                      every rank has work and max - min <= 0.05 · max of the l² loads,
                      or when nothing left fits; the rest opens the next one
    sorted_grid       an open torchtitan proposal: first-fit-decreasing rows under T,
                      rows sorted by Σ l² (largest first), cut into micro-batches of D
                      rows, row k of a micro-batch on rank k

Where the original leaves the budget unchecked (verl's Karmarkar-Karp on workloads can
overflow T: verl PR#7553), the reimplementation takes the most favourable reading: k
grows by one until every cell fits.  All are deterministic (ties by index, then rank).
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from ..balancers.microbatch.api import make_microbatch_problem
from ..balancers.microbatch.plan import MicroBatchPlan, MicroBatchProblem, MicroBatchResult, make_microbatch_plan
from ..balancers.problem import sorted_order
from ..balancers.validation import as_sources
from ..integrations.verl import verl_karmarkar_karp
from .peers import verl_workload

MEGATRON_BALANCE_SLACK = 0.05  # next_hdp_group's delta


def _default_sources(num_items: int, num_ranks: int) -> np.ndarray:
    """Sample i drawn by rank i · D // n (contiguous shares, as `sample_workload` deals them)."""
    return np.arange(num_items, dtype=np.int64) * num_ranks // num_items


def naive_fill(problem: MicroBatchProblem, sources: np.ndarray) -> tuple[MicroBatchResult, int]:
    """Every rank's own samples in sampling order, next fit under T."""
    microbatch = np.empty(problem.num_items, dtype=np.int64)
    for rank in range(problem.num_ranks):
        current, used = 0, 0
        for item in np.flatnonzero(sources == rank).tolist():
            length = int(problem.lengths[item])
            if used + length > problem.max_tokens_per_microbatch and used > 0:
                current, used = current + 1, 0
            microbatch[item] = current
            used += length
    return MicroBatchResult(rank=sources.copy(), microbatch=microbatch), int(microbatch.max()) + 1


def _fits(problem: MicroBatchProblem, rank: np.ndarray, microbatch: np.ndarray, count: int) -> bool:
    cells = microbatch * problem.num_ranks + rank
    tokens = np.bincount(cells, weights=problem.lengths, minlength=count * problem.num_ranks)
    return bool(tokens.max() <= problem.max_tokens_per_microbatch)


def verl_dynamic_bsz(problem: MicroBatchProblem, sources: np.ndarray) -> tuple[MicroBatchResult, int]:
    """verl's two stages: equal-count Karmarkar-Karp across ranks, then per rank into k micro-batches."""
    n, d = problem.num_items, problem.num_ranks
    workload = verl_workload(problem.lengths)
    rank = verl_karmarkar_karp(workload, d, n % d == 0)
    members = [np.flatnonzero(rank == r) for r in range(d)]
    k = max(min(ids.size, -(-int(problem.lengths[ids].sum()) // problem.max_tokens_per_microbatch)) for ids in members)
    k = max(k, 1)
    microbatch = np.empty(n, dtype=np.int64)
    while True:
        for ids in members:
            if not ids.size:
                continue
            part = verl_karmarkar_karp(workload[ids], k, False)
            sums = np.bincount(part, weights=workload[ids], minlength=k)
            first = np.full(k, n, dtype=np.int64)
            np.minimum.at(first, part, ids)
            by_work = sorted(range(k), key=lambda p: (sums[p], first[p]), reverse=True)
            order = by_work[::2][::-1] + by_work[1::2]
            position = np.empty(k, dtype=np.int64)
            position[order] = np.arange(k)
            microbatch[ids] = position[part]
        if _fits(problem, rank, microbatch, k):
            return MicroBatchResult(rank=rank, microbatch=microbatch), k
        k += 1


def _megatron_group(problem: MicroBatchProblem, proxy: np.ndarray, waiting: list, rank: np.ndarray,
                    microbatch: np.ndarray, group: int) -> list:
    """Fill micro-batch `group` from `waiting`; return the items left for the next one, in order.

    Each item goes to the least (l² load, rank) among the ranks with room for it, as a heap popped
    until a rank has room would; but a rank found without room waits in `full`, keyed by its room,
    and comes back to `free` once an item fits it: `waiting` is by l², so lengths only fall, and a
    rank's room stays put until it takes an item.  A rank thus leaves `free` at most once more than
    it takes items: O(n log D) heap operations where re-pushing every rank without room was O(n · D).
    `lows` holds every rank's (load, rank), stale entries dropped when they reach the top.
    """
    d, cap = problem.num_ranks, problem.max_tokens_per_microbatch
    free = [(0.0, r) for r in range(d)]  # (l² load, rank) of the ranks with room: the least loaded on top
    lows, full = list(free), []
    loads, tokens, counts, busy, top = [0.0] * d, [0] * d, [0] * d, 0, 0.0
    leftover = []
    for position, item in enumerate(waiting):
        length = int(problem.lengths[item])
        while full and -full[0][0] >= length:
            r = heapq.heappop(full)[1]
            heapq.heappush(free, (loads[r], r))
        while free and tokens[free[0][1]] + length > cap:
            r = heapq.heappop(free)[1]
            heapq.heappush(full, (tokens[r] - cap, r))
        if free:
            load, r = heapq.heappop(free)
            rank[item], microbatch[item] = r, group
            busy += counts[r] == 0
            counts[r] += 1
            tokens[r] += length
            load += float(proxy[item])
            loads[r], top = load, max(top, load)
            heapq.heappush(free, (load, r))
            heapq.heappush(lows, (load, r))
        else:
            leftover.append(item)
        while lows[0][0] != loads[lows[0][1]]:
            heapq.heappop(lows)
        if busy == d and top - lows[0][0] <= MEGATRON_BALANCE_SLACK * top:
            return leftover + waiting[position + 1:]
    return leftover


def megatron_hybrid(problem: MicroBatchProblem, sources: np.ndarray) -> tuple[MicroBatchResult, int]:
    """Megatron's hybrid greedy: one micro-batch group at a time, closed at 5 % imbalance of l²."""
    proxy = problem.lengths.astype(np.float64) ** 2
    waiting = sorted_order(proxy).tolist()
    rank = np.empty(problem.num_items, dtype=np.int64)
    microbatch = np.empty(problem.num_items, dtype=np.int64)
    group = 0
    while waiting:
        waiting = _megatron_group(problem, proxy, waiting, rank, microbatch, group)
        group += 1
    return MicroBatchResult(rank=rank, microbatch=microbatch), group


def sorted_grid(problem: MicroBatchProblem, sources: np.ndarray) -> tuple[MicroBatchResult, int]:
    """First-fit-decreasing rows under T, rows by Σ l², cut into micro-batches of D rows."""
    row_of = np.empty(problem.num_items, dtype=np.int64)
    room = np.full(problem.num_items, problem.max_tokens_per_microbatch, dtype=np.int64)  # at most one row per item
    rows = 0
    for item in sorted_order(problem.lengths).tolist():
        length = int(problem.lengths[item])
        row = int(np.argmax(room[:rows + 1] >= length))  # row `rows` is a fresh one
        rows = max(rows, row + 1)
        room[row] -= length
        row_of[item] = row
    squares = np.bincount(row_of, weights=problem.lengths.astype(np.float64) ** 2, minlength=rows)
    order = np.lexsort((np.arange(rows), -squares))
    position = np.empty(rows, dtype=np.int64)
    position[order] = np.arange(rows)
    slot = position[row_of]
    d = problem.num_ranks
    return MicroBatchResult(rank=slot % d, microbatch=slot // d), -(-rows // d)


MICROBATCH_PEERS_KERNELS = {
    "none": naive_fill,
    "verl_dynamic_bsz": verl_dynamic_bsz,
    "megatron_hybrid": megatron_hybrid,
    "sorted_grid": sorted_grid,
}

MICROBATCH_PEER_LABELS = {
    "none": "naive: every rank fills its own samples in sampling order, next fit under T",
    "verl_dynamic_bsz": "verl: equal-count KK across ranks, then per-rank KK into max_r ceil(tokens/T) micro-batches",
    "megatron_hybrid": "Megatron-LM hybrid greedy: one micro-batch at a time, closed at max - min <= 5% of max (l^2)",
    "sorted_grid": "torchtitan proposal: FFD rows under T, sorted by sum l^2, groups of D",
}


def run_microbatch_peer(name: str, lengths, num_ranks, *, max_tokens_per_microbatch, cost=None, costs=None,
                        microbatch_overhead=0.0, sources=None) -> MicroBatchPlan:
    """Run peer `name` and certify its cells under the real cost; algorithm ``"peer:<name>"``.

    `sources` (the rank that drew each sample) matters to "none" only; default: contiguous
    shares in item order.

    >>> plan = run_microbatch_peer("sorted_grid", [6, 5, 4, 3, 2, 2], 2, max_tokens_per_microbatch=8)
    >>> plan.num_microbatches, plan.step_cost, plan.lower_bound
    (2, 14.0, 11.0)
    """
    if not isinstance(name, str) or name not in MICROBATCH_PEERS_KERNELS:
        raise ValueError(f"unknown micro-batch peer {name!r}; choose one of "
                         f"{', '.join(sorted(MICROBATCH_PEERS_KERNELS))}")
    problem = make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=max_tokens_per_microbatch,
                                      cost=cost, costs=costs, microbatch_overhead=microbatch_overhead)
    if sources is None:
        sources = _default_sources(problem.num_items, problem.num_ranks)
    else:
        sources = as_sources(sources, problem.num_items, problem.num_ranks)
    start = time.perf_counter()
    result, count = MICROBATCH_PEERS_KERNELS[name](problem, sources)
    seconds = time.perf_counter() - start
    return make_microbatch_plan(problem, result, count, f"peer:{name}", floor_microbatches=problem.min_microbatches,
                                solve_seconds=seconds)


def _runner(name: str):
    def run(lengths, num_ranks, **options) -> MicroBatchPlan:
        return run_microbatch_peer(name, lengths, num_ranks, **options)
    run.__name__ = name
    run.__doc__ = f"`run_microbatch_peer({name!r}, ...)`: {MICROBATCH_PEER_LABELS[name]}."
    return run


MICROBATCH_PEERS = {name: _runner(name) for name in MICROBATCH_PEERS_KERNELS}

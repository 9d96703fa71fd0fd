"""The fills' grouping (`grouping.group_microbatches`) weighs the ranks items hold alone only up to each micro-batch's
token room: the same micro-batches as weighing every item at every micro-batch's level (the reference below, the
grouping before), with a count of the items weighed (allbig, D = 2560 x 32: 82k items at each of 50-96 levels, 0.26 s
of a 3.7 s planning)."""

import dataclasses

import numpy as np
import pytest

from orchmllm import ContextParallel, Topology
from orchmllm.balancers.context_parallel import grouping
from orchmllm.balancers.context_parallel.grouping import BACK_FILL, alone_degrees, group_microbatches
from orchmllm.balancers.context_parallel.microbatch_bound import split_bound
from orchmllm.study.models import MODELS

COST = MODELS["84b"].stages()[-1].cost


def _reference(items, num_ranks: int, num_microbatches: int, room: int) -> np.ndarray:
    """The grouping with the alone-held ranks summed over every item at each level (as before the windows)."""
    times, order, tokens, work = items.times, items.order, items.tokens, items.work
    n = order.size
    microbatch = np.empty(n, dtype=np.int64)
    start, held = 0, []
    for m in range(num_microbatches):
        later, end = num_microbatches - m - 1, n
        if later and start < n:
            base_tokens, base_work = (int(tokens[start - 1]), float(work[start - 1])) if start else (0, 0.0)
            level = max(float(times[order[start]]), (float(work[-1]) - base_work) / (num_ranks * (later + 1)))
            exclusive = np.cumsum(alone_degrees(items.table, items.degrees, items.sharing, level))
            base_ranks = int(exclusive[start - 1]) if start else 0
            by_tokens = int(min(np.searchsorted(tokens, base_tokens + room, side="right"),
                                np.searchsorted(exclusive, base_ranks + num_ranks, side="right")))
            by_work = int(np.searchsorted(work, base_work + num_ranks * level, side="right"))
            needed = int(np.searchsorted(tokens, int(tokens[-1]) - later * room, side="left")) + 1
            end = max(start + 1, min(by_tokens, max(by_work, needed)))
            held.append((level, float(work[end - 1]) - base_work, int(tokens[end - 1]) - base_tokens,
                         int(exclusive[end - 1]) - base_ranks, exclusive))
        microbatch[order[start:end]] = m
        start = min(end, n)
    first = n - int(np.sum(microbatch == len(held)))
    for m, (level, used_work, used_tokens, used_ranks, exclusive) in enumerate(held):
        if first >= n:
            break
        base = (int(tokens[first - 1]), float(work[first - 1]), int(exclusive[first - 1])) if first else (0, 0.0, 0)
        end = max(first, int(min(
            np.searchsorted(work, base[1] + BACK_FILL * num_ranks * level - used_work, side="right"),
            np.searchsorted(tokens, base[0] + room - used_tokens, side="right"),
            np.searchsorted(exclusive, base[2] + num_ranks - used_ranks, side="right"))))
        microbatch[order[first:end]] = m
        first = end
    return microbatch


def _fixed(bound: tuple) -> tuple:
    """`split_bound`'s answer with its items grouped as for a fixed M (the reference's; with M free the grouping
    may open more micro-batches: tests/test_cp_grouping_free.py)."""
    return *bound[:3], dataclasses.replace(bound[3], free=False)


def _mix(kind: str, num_ranks: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = 8 * num_ranks
    short = rng.integers(200, 6000, n)
    return {"allbig": rng.integers(32768, 65536, n),
            "giants": np.where(rng.random(n) < 0.08, rng.integers(40000, 120000, n), short),
            "halves": np.where(rng.random(n) < 0.4, rng.integers(9000, 17000, n), short), "short": short}[kind]


@pytest.mark.parametrize("kind", ["allbig", "giants", "halves", "short"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_windows_group_as_every_item_weighed(kind, seed):
    """Long, giant-heavy, half-T and short mixes on 64 ranks at T = 16k and 32k, at the fills' rooms and counts from
    the fewest micro-batches to twice as many: the same micro-batches as the reference."""
    num_ranks = 64
    spec = ContextParallel().on(Topology(num_nodes=8, gpus_per_node=8))
    lengths = _mix(kind, num_ranks, seed).astype(np.int64)
    for budget in (16384, 32768):
        _, fewest, _, items = _fixed(split_bound(lengths, num_ranks, spec, COST, budget, 0.0, None))
        for fill in (0.95, 0.8, 0.5):
            room = int(fill * num_ranks * budget)
            for count in sorted({fewest, -(-int(lengths.sum()) // room), 2 * fewest + 1}):
                assert np.array_equal(group_microbatches(items, num_ranks, count, room),
                                      _reference(items, num_ranks, count, room))


def test_regression_every_micro_batch_weighed_every_item(monkeypatch):
    """allbig on 64 ranks (512 items), T = 32k, a 95 % fill of 13 micro-batches: the items weighed for their
    alone-held ranks, 6144 before (512 at each of 12 levels), now at most twice the items."""
    spec = ContextParallel().on(Topology(num_nodes=8, gpus_per_node=8))
    lengths = _mix("allbig", 64, 4).astype(np.int64)
    _, fewest, _, items = _fixed(split_bound(lengths, 64, spec, COST, 32768, 0.0, None))
    weighed, alone = [], grouping.alone_degrees

    def counted(table, *args):
        weighed.append(table.shape[0])
        return alone(table, *args)

    monkeypatch.setattr(grouping, "alone_degrees", counted)
    room = int(0.95 * 64 * 32768)
    count = -(-int(lengths.sum()) // room)
    assert np.array_equal(group_microbatches(items, 64, count, room), _reference(items, 64, count, room))
    assert count == 13 and 0 < sum(weighed) <= 2 * lengths.size

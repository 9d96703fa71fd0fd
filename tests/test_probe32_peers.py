"""probe32's P32-04: the Megatron hybrid peer placed each item after popping every rank without room (O(n · D))."""

import heapq

import numpy as np
import pytest

from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.study import microbatch_peers
from orchmllm.study.microbatch_peers import MEGATRON_BALANCE_SLACK, megatron_hybrid


def megatron_by_scan(lengths, num_ranks, cap):
    """The rule read plainly: each item (by l², largest first, ties by index) to the least (l² load, rank) with room."""
    lengths = np.asarray(lengths, dtype=np.int64)
    proxy = lengths.astype(np.float64) ** 2
    waiting = sorted(range(lengths.size), key=lambda i: (-proxy[i], i))
    rank, microbatch, group = [0] * lengths.size, [0] * lengths.size, 0
    while waiting:
        loads, tokens, counts, leftover = [0.0] * num_ranks, [0] * num_ranks, [0] * num_ranks, []
        for position, item in enumerate(waiting):
            fits = [r for r in range(num_ranks) if tokens[r] + lengths[item] <= cap]
            if not fits:
                leftover.append(item)
            else:
                r = min(fits, key=lambda r: (loads[r], r))
                rank[item], microbatch[item] = r, group
                counts[r], tokens[r], loads[r] = counts[r] + 1, tokens[r] + int(lengths[item]), loads[r] + proxy[item]
            if min(counts) > 0 and max(loads) - min(loads) <= MEGATRON_BALANCE_SLACK * max(loads):
                leftover.extend(waiting[position + 1:])
                break
        waiting, group = leftover, group + 1
    return rank, microbatch, group


@pytest.mark.parametrize("seed", range(12))
def test_megatron_hybrid_places_as_the_plain_scan(seed):
    rng = np.random.default_rng(seed)
    num_ranks, cap = int(rng.choice([1, 2, 3, 8])), int(rng.choice([5, 64, 1000]))
    kind = seed % 3
    if kind == 0:
        lengths = rng.integers(1, cap + 1, int(rng.integers(1, 60)))
    elif kind == 1:
        lengths = rng.choice([0, 1, cap // 3, cap // 2, cap], int(rng.integers(1, 60)))
    else:
        lengths = np.minimum(cap, (rng.pareto(1.2, int(rng.integers(1, 60))) * cap / 8 + 1).astype(np.int64))
    result, count = megatron_hybrid(make_microbatch_problem(lengths, num_ranks, max_tokens_per_microbatch=cap), None)
    rank, microbatch, group = megatron_by_scan(lengths, num_ranks, cap)
    assert (count, result.rank.tolist(), result.microbatch.tolist()) == (group, rank, microbatch)


def test_megatron_hybrid_heap_operations_grow_with_items_not_items_times_ranks(monkeypatch):
    calls = [0]

    class Counted:
        @staticmethod
        def heappop(heap):
            calls[0] += 1
            return heapq.heappop(heap)

        @staticmethod
        def heappush(heap, entry):
            calls[0] += 1
            heapq.heappush(heap, entry)

    monkeypatch.setattr(microbatch_peers, "heapq", Counted)
    ranks, lengths = 256, np.random.default_rng(3).integers(1, 1001, 256 * 16)
    _, groups = megatron_hybrid(make_microbatch_problem(lengths, ranks, max_tokens_per_microbatch=1000), None)
    assert calls[0] <= 10 * (lengths.size + ranks * groups)  # 26 801 here; the pop-and-re-push loop made 7.5 M


def test_a_micro_batched_simulation_too_large_to_plan_in_seconds_is_refused_before_sampling(monkeypatch, capsys):
    """2560 GPUs × 1000 samples: every peer planned 2.56 M samples, past 5 minutes and 3 GB with no word."""
    from orchmllm.cli import main
    from orchmllm.study import microbatch_sim

    def sampled(*args, **kwargs):
        raise AssertionError("the workload was sampled before the size check")

    monkeypatch.setattr(microbatch_sim, "sample_workload", sampled)
    assert main(["simulate", "--max-tokens-per-microbatch", "16384", "--samples-per-rank", "1000", "--json"]) == 2
    error = capsys.readouterr().err
    assert "--samples-per-rank 1000" in error and "MAX_SIMULATED_SAMPLES = 2**19 = 524288" in error


def test_a_context_parallel_simulation_too_large_is_refused_before_sampling(monkeypatch, capsys):
    """2560 GPUs × 1000 samples with --context-parallel reached 4.7 GB unfinished after 2 minutes."""
    from orchmllm.cli import main
    from orchmllm.study import context_parallel_sim

    monkeypatch.setattr(context_parallel_sim, "sample_workload", None)  # called: a TypeError, not the refusal
    assert main(["simulate", "--context-parallel", "1,2,4,8", "--samples-per-rank", "1000", "--json"]) == 2
    error = capsys.readouterr().err
    assert "--samples-per-rank 1000" in error and "simulated context-parallel step" in error

"""The verl drop-in (`orchmllm.integrations.verl`) against verl's published algorithm on the same instances.

Baseline: verl's `get_seqlen_balanced_partitions` (Karmarkar-Karp on the values given, equal sizes
when asked), reimplemented from its description as `study.peers.verl_seqlen_partitions`; both sides
get the same `seqlen_list` and `equal_size`.  Quality (largest partition sum) and time.

Run: python3.11 -m pytest benchmarks/bench_verl.py --benchmark-only -q -s
"""

import numpy as np
import pytest

from orchmllm.integrations.verl import get_seqlen_balanced_partitions
from orchmllm.study.peers import verl_seqlen_partitions


def largest_sums(instances, partitions):
    return np.array([max(int(s[part].sum()) for part in parts) for s, parts in zip(instances, partitions)])


@pytest.mark.parametrize("equal_size", [False, True], ids=["free_sizes", "equal_size"])
@pytest.mark.parametrize("k", [8, 64], ids=["k8", "k64"])
def test_drop_in_vs_verl_karmarkar_karp(benchmark, best_of, k, equal_size):
    rng = np.random.default_rng(k)
    instances = [(rng.lognormal(7, 0.8, 16 * k)).astype(int) + 1 for _ in range(20)]
    parts = benchmark.pedantic(lambda: [get_seqlen_balanced_partitions(s.tolist(), k, equal_size) for s in instances],
                               rounds=3, iterations=1)
    ours = largest_sums(instances, parts)
    verl = largest_sums(instances, [verl_seqlen_partitions(s.tolist(), k, equal_size) for s in instances])
    verl_seconds = best_of(lambda: [verl_seqlen_partitions(s.tolist(), k, equal_size) for s in instances], 3)
    bound = np.array([s.sum() / k for s in instances])
    assert np.all(ours <= verl)  # never worse than verl's Karmarkar-Karp on the same values and sizes
    benchmark.extra_info.update(no_worse_fraction=float(np.mean(ours <= verl)),
                                mean_makespan_ratio=float(np.mean(ours / verl)),
                                time_over_verl=benchmark.stats.stats.min / verl_seconds)
    print(f"k={k} equal_size={equal_size}: ours no worse on {np.mean(ours <= verl):.0%}, mean makespan ratio "
          f"{np.mean(ours / verl):.4f} (min {np.min(ours / verl):.4f}), largest sum / (total / k): ours "
          f"{np.mean(ours / bound):.4f}, verl {np.mean(verl / bound):.4f}; time "
          f"{benchmark.stats.stats.min / verl_seconds:.1f}x verl's")

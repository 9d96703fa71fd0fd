"""The verl drop-in (`orchmllm.integrations.verl`) against verl's published algorithm (Karmarkar-Karp,
reimplemented from its description as the `verl_kk` peer) on the same instances: quality and time.

Run: python3.11 -m pytest benchmarks/bench_verl.py --benchmark-only -q -s
"""

import numpy as np
import pytest

import orchmllm.study.peers  # noqa: F401  (registers verl_kk)
from orchmllm import balance
from orchmllm.integrations.verl import get_seqlen_balanced_partitions


@pytest.mark.parametrize("equal_size", [False, True], ids=["free_sizes", "equal_size"])
@pytest.mark.parametrize("k", [8, 64], ids=["k8", "k64"])
def test_drop_in_vs_verl_karmarkar_karp(benchmark, best_of, k, equal_size):
    rng = np.random.default_rng(k)
    instances = [(rng.lognormal(7, 0.8, 16 * k)).astype(int) + 1 for _ in range(20)]
    parts = benchmark.pedantic(lambda: [get_seqlen_balanced_partitions(s.tolist(), k, equal_size) for s in instances],
                               rounds=3, iterations=1)
    ours = np.array([max(int(s[p].sum()) for p in part) for s, part in zip(instances, parts)])
    verl = np.array([balance(s, k, algorithm="verl_kk", equal_counts=False).makespan for s in instances])
    verl_seconds = best_of(lambda: [balance(s, k, algorithm="verl_kk") for s in instances], 3)
    assert np.all(ours <= verl) or equal_size  # free sizes: never worse than verl's KK
    benchmark.extra_info.update(no_worse_fraction=float(np.mean(ours <= verl)),
                                mean_makespan_ratio=float(np.mean(ours / verl)),
                                time_over_verl_kk=benchmark.stats.stats.min / verl_seconds)
    print(f"k={k} equal_size={equal_size}: ours no worse on {np.mean(ours <= verl):.0%}, mean makespan ratio "
          f"{np.mean(ours / verl):.4f}, time {benchmark.stats.stats.min / verl_seconds:.1f}x verl_kk's")

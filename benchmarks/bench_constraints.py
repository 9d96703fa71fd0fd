"""Equal item counts: orchmllm's `equal_counts=True` against verl-style equal-size Karmarkar-Karp.

Both balance the same objective, verl's workload 24576·l + l² per sample (passed as
`costs=`), on realistic LLM-stage lengths (the study's workloads), D dividing n so that
verl's equal-size mode applies.  The baseline is verl's algorithm as reimplemented in
`orchmllm.study.peers` (equal_size=True), run in the same process on the same instances.

Run: python3.11 -m pytest benchmarks/bench_constraints.py --benchmark-only -q -s
Figures go to the "Constraints" section of BENCHMARKS.md.
"""

import numpy as np
import pytest

from orchmllm.balancers import balance
from orchmllm.integrations.verl import verl_karmarkar_karp
from orchmllm.study.peers import verl_workload
from orchmllm.study.workloads import sample_workload

GRID = [(num_ranks, per_rank, workload) for num_ranks in (8, 16, 32, 64) for per_rank in (2, 4, 8, 16)
        for workload in ("default", "vision", "speech")]
SEEDS = range(3)


def instances():
    for num_ranks, per_rank, workload in GRID:
        for seed in SEEDS:
            lengths = sample_workload(workload, num_ranks, per_rank, seed=seed).sample_llm_length
            yield num_ranks, np.asarray(lengths, dtype=np.int64)


def makespans(lengths, num_ranks):
    """(ours, verl-style) makespans of verl's workload, both with equal counts."""
    weights = verl_workload(lengths)
    ours = balance(lengths, num_ranks, costs=weights, equal_counts=True)
    verl = verl_karmarkar_karp(weights, num_ranks, equal_size=True)
    counts = np.bincount(verl, minlength=num_ranks)
    assert counts.min() == counts.max() == lengths.size // num_ranks
    return ours.makespan, float(np.bincount(verl, weights=weights, minlength=num_ranks).max()), ours.lower_bound


def test_equal_counts_no_worse_than_verl_kk_on_95_percent(benchmark):
    cases = list(instances())
    results = benchmark.pedantic(lambda: [makespans(lengths, d) for d, lengths in cases], rounds=1, iterations=1)
    ours, verl, bounds = (np.array(column) for column in zip(*results))
    no_worse = float(np.mean(ours <= verl))
    better = float(np.mean(ours < verl))
    print(f"\n{len(cases)} instances: ours <= verl-style KK on {no_worse:.1%} (strictly better on {better:.1%}); "
          f"mean gap to the bound ours {np.mean(ours / bounds - 1):.5f}, verl {np.mean(verl / bounds - 1):.5f}; "
          f"worst ours/verl {np.max(ours / verl):.5f}")
    assert no_worse >= 0.95


@pytest.mark.parametrize("num_ranks, per_rank", [(64, 16), (256, 16)], ids=["D64x16", "D256x16"])
def test_equal_counts_time_against_verl_kk(benchmark, best_of, num_ranks, per_rank):
    lengths = np.asarray(sample_workload("default", num_ranks, per_rank, seed=0).sample_llm_length, dtype=np.int64)
    weights = verl_workload(lengths)
    baseline = best_of(lambda: verl_karmarkar_karp(weights, num_ranks, equal_size=True), 3)
    plan = benchmark.pedantic(lambda: balance(lengths, num_ranks, costs=weights, equal_counts=True),
                              rounds=3, iterations=1)
    assert set(np.bincount(plan.assignment, minlength=num_ranks).tolist()) == {per_rank}
    ours = benchmark.stats.stats.min
    print(f"\nD={num_ranks} n={lengths.size}: equal_counts {ours * 1e3:.1f} ms, verl-style KK {baseline * 1e3:.1f} ms "
          f"(ratio {ours / baseline:.2f}), gap {plan.gap:.5f}")

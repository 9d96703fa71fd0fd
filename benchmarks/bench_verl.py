"""The verl drop-in (`orchmllm.integrations.verl`) against verl's real `get_seqlen_balanced_partitions`.

verl's function runs only here, from verl's own source outside this repository: set
VERL_SEQLEN_BALANCING to a copy of verl's `verl/utils/seqlen_balancing.py` (or install verl);
without either, these benchmarks are skipped.  From that file only `karmarkar_karp` and
`get_seqlen_balanced_partitions` are compiled, as they are (their module's other imports,
torch and verl.protocol, are not used by them).

Both sides get the same instances, as verl's trainer builds them: workloads 24576·l + l² of
lognormal(7, 0.8) sequence lengths, as a list; equal sizes for its DP ranks, free sizes for
its micro-batches.  Seeds 2026_12_04 on, never used to choose the drop-in's algorithm.
Quality: the largest partition sum, ours / verl's.  Time: CPU seconds (process time, so
other processes' load does not count), ours and verl's interleaved call by call.

Run: VERL_SEQLEN_BALANCING=/path/to/verl/utils/seqlen_balancing.py \\
     python3.11 -m pytest benchmarks/bench_verl.py --benchmark-only -q -s
"""

import ast
import heapq
import os
import time
from pathlib import Path

import numpy as np
import pytest

from orchmllm.integrations.verl import get_seqlen_balanced_partitions

SEED = 2026_12_04


def load_verl():
    """verl's `get_seqlen_balanced_partitions` (installed, or compiled from VERL_SEQLEN_BALANCING), or None."""
    try:
        from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions as verls
        return verls
    except ImportError:
        pass
    path = Path(os.environ.get("VERL_SEQLEN_BALANCING", ""))
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text())
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)
                 and node.name in ("karmarkar_karp", "get_seqlen_balanced_partitions")]
    namespace = {"heapq": heapq}
    exec(compile(ast.Module(functions, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["get_seqlen_balanced_partitions"]


@pytest.fixture(scope="module")
def verl_partitions():
    function = load_verl()
    if function is None:
        pytest.skip("verl's seqlen_balancing.py not found: set VERL_SEQLEN_BALANCING or install verl")
    return function


def workloads(rng, n):
    lengths = rng.lognormal(7, 0.8, n).astype(np.int64) + 1
    return (24576 * lengths + lengths ** 2).tolist()


def largest_sum(values, partitions):
    return max(sum(values[i] for i in partition) for partition in partitions)


def timed(function, *args):
    start = time.process_time()
    result = function(*args)
    return time.process_time() - start, result


@pytest.mark.parametrize("n, k, equal_size", [(1024, 8, True), (2048, 64, True), (8192, 128, True),
                                              (64, 4, False), (256, 8, False), (512, 16, False)],
                         ids=lambda value: str(value))
def test_no_worse_than_verl_on_its_instances(benchmark, verl_partitions, n, k, equal_size):
    rng = np.random.default_rng([SEED, n, k])
    instances = [workloads(rng, n) for _ in range(20)]
    ratios, ours_seconds, verl_seconds = [], 0.0, 0.0
    for values in instances:
        ours_time, ours = timed(get_seqlen_balanced_partitions, values, k, equal_size)
        verl_time, verls = timed(verl_partitions, values, k, equal_size)
        ours_seconds, verl_seconds = ours_seconds + ours_time, verl_seconds + verl_time
        assert len(ours) == len(verls) == k and (not equal_size or {len(part) for part in ours} == {n // k})
        ratios.append(largest_sum(values, ours) / largest_sum(values, verls))
    benchmark.pedantic(lambda: [get_seqlen_balanced_partitions(values, k, equal_size) for values in instances],
                       rounds=1, iterations=1)
    ratios = np.array(ratios)
    benchmark.extra_info.update(ratio_min=float(ratios.min()), ratio_median=float(np.median(ratios)),
                                ratio_max=float(ratios.max()), cpu_time_over_verl=ours_seconds / verl_seconds)
    print(f"\nn={n} k={k} equal_size={equal_size}: largest sum ours / verl over 20 instances: min "
          f"{ratios.min():.5f}, median {np.median(ratios):.5f}, max {ratios.max():.5f}, no worse on "
          f"{np.mean(ratios <= 1):.0%}; CPU time ours {ours_seconds * 1e3 / 20:.2f} ms, verl "
          f"{verl_seconds * 1e3 / 20:.2f} ms per call ({ours_seconds / verl_seconds:.2f}x)")
    assert np.all(ratios <= 1)


@pytest.mark.parametrize("equal_size, rounds", [(True, 15), (False, 1)], ids=["equal_size", "free_sizes"])
def test_at_least_as_fast_as_verl_at_n8192_k128(benchmark, verl_partitions, equal_size, rounds):
    """Interleaved calls on one instance; the minimum of each side's CPU time (verl's free sizes take seconds)."""
    values = workloads(np.random.default_rng([SEED, 8192, 128, 1]), 8192)
    ours_times, verl_times = [], []
    for _ in range(rounds):
        ours_times.append(timed(get_seqlen_balanced_partitions, values, 128, equal_size)[0])
        verl_times.append(timed(verl_partitions, values, 128, equal_size)[0])
    benchmark.pedantic(get_seqlen_balanced_partitions, args=(values, 128, equal_size), rounds=3, iterations=1)
    ours, verls = min(ours_times), min(verl_times)
    benchmark.extra_info.update(ours_cpu_ms=ours * 1e3, verl_cpu_ms=verls * 1e3)
    print(f"\nn=8192 k=128 equal_size={equal_size}: CPU time ours {ours * 1e3:.1f} ms, verl {verls * 1e3:.1f} ms "
          f"({ours / verls:.2f}x; min of {rounds})")
    assert ours <= verls

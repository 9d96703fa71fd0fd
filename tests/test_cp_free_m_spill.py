"""Split micro-batches with M free, where the fills made a repaired plan (`microbatch._more_counts`)."""

import numpy as np

from orchmllm import ContextParallel, balance_microbatches


def test_regression_free_m_after_a_stacked_spill_tries_its_count_fixed():
    """Zeros and giants (90 % empty items, the rest 10k-100k tokens; the issue 24 probe's zeros_giants), D = 256 x 16,
    seed 108, T = 32k, M free: the fullest fill had no layout, so its spill was repaired into 4 micro-batches, and
    the later fills' groupings of 4 were dropped against the repaired plan's step before the micro-batch search,
    which then lowered the repaired plan to only 1.114 the bound (a micro-batch of stacked giants 1.24x its own pass
    bound, no move out of it).  With M = 4 fixed the fills' best searched reaches 1.050; the free M now tries its own
    count fixed there (`_stacked`)."""
    from orchmllm.benchmarks.bench_context_parallel import COST

    rng = np.random.default_rng(108)
    lengths = np.where(rng.random(4096) < 0.9, 0, rng.integers(10000, 100000, 4096)).astype(np.int64)
    options = dict(cost=COST, max_tokens_per_microbatch=32768, context_parallel=ContextParallel())
    free = balance_microbatches(lengths, 256, **options)
    assert free.cell_tokens.max() <= 32768 and free.lower_bound <= free.step_cost <= 1.06 * free.lower_bound

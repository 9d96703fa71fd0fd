"""Split micro-batches with M free, far above the bound with more items than RETRY_ITEMS (`microbatch._more_counts`)."""

import numpy as np

from orchmllm import ContextParallel, balance_microbatches


def test_regression_free_m_far_above_its_bound_tries_more_counts_whatever_the_items():
    """Powers of two (the issue 24 probe's pow2: 2^4 to 2^16 tokens), D = 32 x 16, seed 3, T = 32k, M free: the
    fills' best searched was 1.093 the bound at M = 5 (a micro-batch 1.16x its own pass bound), and with 512 items,
    more than RETRY_ITEMS, no fixed count above it was tried; M = 6 fixed reaches 1.032.  A plan above the bound by
    more than RETRY_FAR now tries them whatever the items' count."""
    from orchmllm.benchmarks.bench_context_parallel import COST

    lengths = 2 ** np.random.default_rng(3).integers(4, 17, 512)
    plan = balance_microbatches(lengths, 32, cost=COST, max_tokens_per_microbatch=32768,
                                context_parallel=ContextParallel())
    assert plan.cell_tokens.max() <= 32768 and plan.lower_bound <= plan.step_cost <= 1.05 * plan.lower_bound
    assert plan.num_microbatches > 5

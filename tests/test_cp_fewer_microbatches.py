"""A fixed `num_microbatches` on few ranks is never above the free count's split plan padded with empty micro-batches
(probe25 P25-07 (c): 31.1 at M = 3 where the free plan of M = 2 steps 24.0, the brute-force optimum)."""

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel, balance_microbatches
from orchmllm.testing.context_parallel import brute_force_split_microbatches

SPEC = ContextParallel(degrees=(1, 2), gpus_per_node=2, seconds_per_cost=1.0, intra_node_bw_bytes_per_s=1e9,
                       inter_node_bw_bytes_per_s=1e9, latency_s=0.0, kv_bytes_per_token=0.0, half_efficiency_tokens=4.0)


@pytest.mark.parametrize("overhead", [0.0, 1.5])
def test_fixed_count_is_the_free_plan_padded(overhead):
    lengths, cost = [22, 8, 9], CostModel(linear=1.0)
    free = balance_microbatches(lengths, 2, cost=cost, max_tokens_per_microbatch=19, context_parallel=SPEC,
                                microbatch_overhead=overhead)
    fixed = balance_microbatches(lengths, 2, cost=cost, max_tokens_per_microbatch=19, num_microbatches=3,
                                 context_parallel=SPEC, microbatch_overhead=overhead)
    optimum = brute_force_split_microbatches(lengths, 2, SPEC, max_tokens_per_microbatch=19, num_microbatches=3,
                                             cost=cost, microbatch_overhead=overhead)
    assert free.num_microbatches == 2 and fixed.num_microbatches == 3
    assert fixed.step_cost == free.step_cost + overhead == pytest.approx(optimum.makespan)
    assert fixed.lower_bound <= optimum.makespan + 1e-9
    assert np.asarray(fixed.cell_loads)[2].sum() == 0 and fixed.cell_loads.shape == (3, 2)
    assert np.array_equal(fixed.microbatch, free.microbatch) and np.array_equal(fixed.degree, free.degree)


def test_fixed_count_is_kept_where_the_free_plan_needs_more():
    """[28, 27, 25, 8] at T = 27: the free plan takes 3 micro-batches, so M = 4 pads it, M = 2 is not helped."""
    lengths, cost = [28, 27, 25, 8], CostModel(linear=1.0)
    free = balance_microbatches(lengths, 2, cost=cost, max_tokens_per_microbatch=27, context_parallel=SPEC)
    four = balance_microbatches(lengths, 2, cost=cost, max_tokens_per_microbatch=27, num_microbatches=4,
                                context_parallel=SPEC)
    assert free.num_microbatches == 3 and four.num_microbatches == 4 and four.step_cost <= free.step_cost

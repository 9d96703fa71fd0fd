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


def _probe26_case(seed):
    rng = np.random.default_rng(seed)
    ranks = int(rng.choice([4, 8, 16, 32]))
    group = min(int(rng.choice([2, 4, 8])), ranks)
    degrees = tuple(d for d in (1, 2, 4, 8) if d <= group)
    n, budget = ranks * int(rng.integers(1, 4)), int(rng.integers(1000, 4000))
    lengths = rng.integers(1, budget, n)
    big = rng.random(n) < 0.15
    lengths[big] = rng.integers(budget + 1, budget * max(degrees), big.sum())
    spec = ContextParallel(degrees=degrees, gpus_per_node=group, seconds_per_cost=1e-3,
                           latency_s=float(rng.choice([0.0, 0.01])), kv_bytes_per_token=float(rng.choice([0.0, 1e3])),
                           half_efficiency_tokens=float(rng.choice([0.0, 256.0])), intra_node_bw_bytes_per_s=1e9,
                           inter_node_bw_bytes_per_s=1e8)
    return lengths, ranks, budget, spec, CostModel(linear=1.0, quadratic=float(rng.choice([0.0, 1e-4])))


def test_regression_above_eight_ranks_a_fixed_count_was_above_the_free_plan_padded():
    """probe26 P26-02: the rule ran on <= 8 ranks only; at D = 16 M = 3 and 4 planned 3713.8 and 3926.3 where the
    free plan of 2 micro-batches, padded, steps 3382.0 (27 of 180 rows at D 16/32 were worse, up to 16 %)."""
    lengths, ranks, budget, spec, cost = _probe26_case(46)
    free = balance_microbatches(lengths, ranks, cost=cost, max_tokens_per_microbatch=budget, context_parallel=spec)
    assert ranks == 16 and free.num_microbatches == 2
    for count in (3, 4):
        fixed = balance_microbatches(lengths, ranks, cost=cost, max_tokens_per_microbatch=budget,
                                     num_microbatches=count, context_parallel=spec)
        assert fixed.num_microbatches == count and fixed.step_cost <= free.step_cost

"""The packing bound's time kind takes no piece count from a piece of no time (probe25 c19 seed 1250)."""

import pytest

from orchmllm import ContextParallel, CostModel, InfeasibleError, balance_microbatches
from orchmllm.testing import brute_force_split_microbatches

LINKS = dict(seconds_per_cost=1.0, intra_node_bw_bytes_per_s=1e9, inter_node_bw_bytes_per_s=1e9)


def test_regression_a_piece_of_no_time_crashed_the_packing_bound():
    """probe25 c19 seed 1250: an empty item (time 0 at degree 1) beside one over the budget; a later fill's
    packing bound took ⌈L / 0⌉ pieces for its time kind: OverflowError (cannot convert float infinity).  At T = 29
    the 123 tokens do not fit one micro-batch of 4 ranks (refused by count, probe28 P28-05); at T = 31 (crashed
    alike before the fix) the plan is the brute force's optimum."""
    spec = ContextParallel(degrees=(1, 2, 4), gpus_per_node=4, **LINKS, latency_s=0.5, kv_bytes_per_token=0.0,
                           half_efficiency_tokens=0.0)
    call = dict(num_microbatches=1, cost=CostModel(linear=1.0), microbatch_overhead=2.0)
    assert brute_force_split_microbatches([83, 0, 20, 20], 4, spec, max_tokens_per_microbatch=29, **call).makespan \
        is None
    with pytest.raises(InfeasibleError, match="`num_microbatches`=1 is too few"):
        balance_microbatches([83, 0, 20, 20], 4, context_parallel=spec, max_tokens_per_microbatch=29, **call)
    optimum = brute_force_split_microbatches([83, 0, 20, 20], 4, spec, max_tokens_per_microbatch=31, **call)
    plan = balance_microbatches([83, 0, 20, 20], 4, context_parallel=spec, max_tokens_per_microbatch=31, **call)
    assert plan.lower_bound <= optimum.makespan == plan.step_cost

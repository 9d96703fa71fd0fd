"""Tiny CP micro-batch instances the planner refuses get the exact micro-batch search (probe25 P25-07 (a)/(b)): no
refusal where a grouping lays out, and then the brute force's optimum, proven."""

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel, InfeasibleError, balance_microbatches
from orchmllm.balancers.context_parallel.exact_microbatch import partitions
from orchmllm.testing import brute_force_split_microbatches

LINKS = dict(gpus_per_node=2, seconds_per_cost=1.0, intra_node_bw_bytes_per_s=1e9, inter_node_bw_bytes_per_s=1e9)


@pytest.mark.parametrize("lengths, budget, overhead, spec", [
    ([28, 27, 25, 8], 27, 0.0, dict(latency_s=0.5, kv_bytes_per_token=0.0, half_efficiency_tokens=4.0)),
    ([25, 14, 18, 12], 21, 2.0, dict(latency_s=0.0, kv_bytes_per_token=1e6, half_efficiency_tokens=0.0)),
], ids=["a", "b"])
def test_regression_two_micro_batches_the_fills_missed_were_refused(lengths, budget, overhead, spec):
    """P25-07 (a)/(b): the fills group a micro-batch up to its share of the tokens and found no 2 micro-batches
    (refused at M = 2), where the brute force packs 2 (173 / 44.94)."""
    spec = ContextParallel(degrees=(1, 2), **LINKS, **spec)
    cost = CostModel(linear=1.0)
    optimum = brute_force_split_microbatches(lengths, 2, spec, max_tokens_per_microbatch=budget, num_microbatches=2,
                                             cost=cost, microbatch_overhead=overhead).makespan
    plan = balance_microbatches(lengths, 2, cost=cost, max_tokens_per_microbatch=budget,
                                num_microbatches=2, microbatch_overhead=overhead, context_parallel=spec)
    assert plan.num_microbatches == 2 and plan.step_cost == optimum and plan.status.value == "optimal"
    assert plan.lower_bound == optimum


@pytest.mark.parametrize("seed", range(10))
def test_tiny_plans_are_the_brute_force_optimum(seed):
    """Items over the budget among short ones on 2-4 ranks, a fixed M: a plan where the brute force finds one
    (its optimum, proven, where the planner found none), refused where it finds none."""
    rng = np.random.default_rng(1000 + seed)
    num_ranks = int(rng.choice([2, 4]))
    degrees = (1, 2) if num_ranks == 2 else (1, 2, 4)
    budget = int(rng.integers(8, 30))
    lengths = rng.integers(0, budget + 1, int(rng.integers(2, 5)))
    lengths[0] = int(rng.integers(budget + 1, budget * degrees[-1] + 1))
    spec = ContextParallel(degrees=degrees, **{**LINKS, "gpus_per_node": num_ranks}, latency_s=0.5 * (seed % 2),
                           kv_bytes_per_token=0.0, half_efficiency_tokens=4.0 * (seed % 3 == 0))
    cost, overhead = CostModel(linear=1.0, quadratic=0.05), 2.0 * (seed % 2)
    count = 1 + seed % (3 if num_ranks == 2 else 2)  # within the brute force's plans
    optimum = brute_force_split_microbatches(lengths, num_ranks, spec, max_tokens_per_microbatch=budget,
                                             num_microbatches=count, cost=cost, microbatch_overhead=overhead).makespan
    call = dict(cost=cost, max_tokens_per_microbatch=budget, num_microbatches=count, microbatch_overhead=overhead,
                context_parallel=spec)
    if optimum is None:
        with pytest.raises(InfeasibleError):
            balance_microbatches(lengths, num_ranks, **call)
        return
    plan = balance_microbatches(lengths, num_ranks, **call)
    assert plan.lower_bound <= optimum <= plan.step_cost
    assert plan.status.value != "optimal" or plan.step_cost == optimum


def test_partitions_are_every_grouping_once():
    """Bell(5) = 52 partitions of 5 items, 51 into at most 4 micro-batches; none twice."""
    every, four = list(partitions(5, 5)), list(partitions(5, 4))
    assert len(every) == len(set(every)) == 52 and len(four) == 51
    canonical = {frozenset(frozenset(k for k, b in enumerate(p) if b == m) for m in set(p)) for p in every}
    assert len(canonical) == 52


"""Static context parallelism (degrees without 1) in every entry point, the exact split search's certificate within
float rounding, and counts the tokens refuse (probe28 P28-01, P28-02, P28-04, P28-05, empty items, static spec).

Each case failed on the tree before its fix: the micro-batch planner kept items at degree 1 where every item fit
the budget unsplit and certified that plan against plans the spec forbids; the exact search proved 'optimal' one ulp
above the optimum; options the unsplit planner reads went unchecked where no unsplit plan was made; a batch of
empty items under a static spec divided by a zero target."""

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel, InfeasibleError, Orchestrator, balance, balance_microbatches
from orchmllm.orchestrator import Batch, Sample, Stage
from orchmllm.testing import brute_force_split, brute_force_split_microbatches, check_split_plan
from orchmllm.topology import Topology

STATIC = ContextParallel(degrees=(2,), gpus_per_node=4, seconds_per_cost=1.0, kv_bytes_per_token=0.0, latency_s=1.0,
                         half_efficiency_tokens=0.0)


@pytest.mark.parametrize("algorithm", ["auto", "exact"])
@pytest.mark.parametrize("num_microbatches", [None, 3])
def test_micro_batches_under_a_static_spec_split_every_item_and_certify_over_those_plans(algorithm, num_microbatches):
    """P28-01: degree [1, 1, 1], step = bound 11.25, 'optimal', against an optimum of 728.65 (738.65 at M = 3)
    over the plans the spec allows."""
    options = dict(max_tokens_per_microbatch=5, cost=CostModel(quadratic=0.05), microbatch_overhead=5.0)
    plan = balance_microbatches([0, 5, 1], 2, context_parallel=STATIC, algorithm=algorithm,
                                num_microbatches=num_microbatches, **options)
    optimum = brute_force_split_microbatches([0, 5, 1], 2, STATIC, num_microbatches=num_microbatches or range(1, 4),
                                             **options)
    assert set(plan.degree.tolist()) == {2}
    assert plan.lower_bound <= optimum.makespan <= plan.step_cost


def test_a_static_spec_on_a_larger_batch_keeps_its_degrees_in_micro_batches():
    """P28-01 at 64 items on 8 ranks (the default spec's costs): degrees (2, 4) and (4, 8) came back at degree 1."""
    lengths = np.random.default_rng(5).integers(1, 4000, 64)
    for degrees in ((2, 4), (4, 8)):
        plan = balance_microbatches(lengths, 8, max_tokens_per_microbatch=16384, cost=CostModel(linear=1.0),
                                    context_parallel=ContextParallel(degrees=degrees))
        assert set(plan.degree.tolist()) <= set(degrees)


@pytest.mark.parametrize("lengths, degrees, gpus, cap, latency, inter_node", [
    ([16, 32, 32, 16, 16], (1, 2), 8, 57, 1.0, False),
    ([16, 16, 16, 32, 16], (1, 2), 8, None, 0.0, True),
    ([32, 32, 16, 32], (1, 2), 2, None, 0.0, False)])
def test_the_exact_split_search_proves_no_optimum_an_ulp_above_the_best_plan(lengths, degrees, gpus, cap, latency,
                                                                           inter_node):
    """P28-02: 248.5875 'optimal' where a plan of 248.58749999999998 exists (7.300000000000001 / 7.3, 7.6...05 /
    7.6): the average work, summed in another order than the loads, rounded above the better plan's peak."""
    spec = ContextParallel(degrees=degrees, gpus_per_node=gpus, seconds_per_cost=1.0 if cap else 0.5,
                           latency_s=latency, kv_bytes_per_token=0.0, half_efficiency_tokens=3.0 if cap else 0.0,
                           allow_inter_node=inter_node)
    cost = CostModel(per_item=1.0, linear=0.1)
    plan = balance(lengths, 2, cost=cost, max_tokens_per_rank=cap, context_parallel=spec)
    check_split_plan(plan, lengths, 2, spec, cost=cost, max_tokens_per_rank=cap,
                     optimum=brute_force_split(lengths, 2, spec, cost=cost, max_tokens_per_rank=cap))


@pytest.mark.parametrize("options, message", [
    (dict(algorithm="bogus"), "unknown `algorithm` 'bogus'"),
    (dict(algorithm="lpt"), "'lpt' balances a step of one pass"),
    (dict(sources=[0, 1, 2]), "`sources` must have one rank per item: 3 entries != 40 items"),
    (dict(sources=[99] * 40), "`sources` must be ranks in [0, 8)"),
    (dict(item_bytes=[-5] * 40), "`item_bytes` needs `sources`"),
    (dict(time_limit=-1.0), "`time_limit` must be a positive finite number")])
def test_options_of_the_unsplit_planner_are_checked_where_no_unsplit_plan_is_made(options, message):
    """P28-04: with an item over the budget (the unsplit plan never made) each of these came back as a plan."""
    lengths = np.random.default_rng(1).integers(1, 3000, 40)
    lengths[0] = 30000
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        balance_microbatches(lengths, 8, max_tokens_per_microbatch=8192, cost=CostModel(quadratic=1e-4),
                             context_parallel=ContextParallel(degrees=(1, 2, 4, 8)), **options)


def test_empty_items_under_a_static_spec_plan_at_zero():
    """probe28: ZeroDivisionError from the pairing's demand at a target of 0 (balance, micro-batches, a step)."""
    spec = ContextParallel(degrees=(2, 4), latency_s=0.0)
    assert balance([0, 0, 0], 4, context_parallel=spec).makespan == 0.0
    plan = balance_microbatches([0, 0], 2, max_tokens_per_microbatch=1, context_parallel=ContextParallel(
        degrees=(2,), latency_s=0.0))
    assert plan.step_cost == 0.0 and set(plan.degree.tolist()) == {2}
    batch = Batch.from_samples([Sample(0, (), source=0), Sample(0, (), source=1)], 2)
    step = Orchestrator((Stage("llm", "llm", CostModel()),), Topology(1, 2, latency_s=0.0),
                        context_parallel=ContextParallel(degrees=(2,))).plan(batch)
    assert [p.llm.degree.tolist() for p in step.microbatches] == [[2, 2]]


def test_a_fixed_count_too_few_for_the_tokens_is_named_with_the_least_count_and_budget():
    """P28-05: 36348 tokens on 4 ranks at T 8192 and M = 1: the fills' refusal said a larger budget "may fit" and
    gave min_cap 8193, refused again; the tokens alone need 2 micro-batches, or a budget of 9087 at M = 1."""
    with pytest.raises(InfeasibleError, match=r"`num_microbatches`=1 is too few: the items' 36348 tokens need at "
                                              r"least 2 micro-batches") as refused:
        balance_microbatches([16338, 14579, 3172, 2259], 4, max_tokens_per_microbatch=8192, num_microbatches=1,
                             cost=CostModel(quadratic=1e-4), context_parallel=ContextParallel(degrees=(1, 2, 4)))
    assert refused.value.min_cap == 9087


def test_an_item_no_degree_fits_is_named_before_a_count_too_few():
    """probe30 P30-04: the count refusal came first ("a budget of at least 2 at 1"), and budget 2 was refused again
    for the item, which needs 4 at degree 2 whatever the count."""
    spec = ContextParallel(degrees=(2,), gpus_per_node=4, latency_s=0, kv_bytes_per_token=0,
                           half_efficiency_tokens=0, seconds_per_cost=1.0)
    with pytest.raises(InfeasibleError, match=r"item 0 \(7 tokens\) fits max_tokens_per_microbatch=1 at no allowed "
                                              r"degree \(2,\)") as refused:
        balance_microbatches([7], 4, max_tokens_per_microbatch=1, num_microbatches=1, context_parallel=spec)
    assert refused.value.min_cap == 4

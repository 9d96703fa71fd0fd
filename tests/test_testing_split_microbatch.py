"""`check_split_microbatch_plan`: the invariants of `balance_microbatches(..., context_parallel=)`'s plans (probe56
F10: no checker took a `SplitMicroBatchPlan`, and `check_split_plan` given another plan raised AttributeError)."""

import dataclasses
import warnings

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel, Topology, balance, balance_microbatches
from orchmllm.balancers import Status
from orchmllm.testing import SplitOptimum, check_split_microbatch_plan, check_split_plan

SPEC = ContextParallel(degrees=(1, 2, 4), gpus_per_node=4, latency_s=0.0, seconds_per_cost=1.0)
LENGTHS = [40, 30, 5, 5, 3]  # items 0 and 1 split over ranks 0-1 and 2-3 in micro-batch 0


@pytest.fixture(scope="module")
def plan():
    made = balance_microbatches(LENGTHS, 4, max_tokens_per_microbatch=25, num_microbatches=2, context_parallel=SPEC)
    assert made.degree.tolist()[:2] == [2, 2] and made.split_items.size == 2
    return made


@pytest.mark.parametrize("lengths, num_ranks, spec, options", [
    (LENGTHS, 4, SPEC, dict(max_tokens_per_microbatch=25, num_microbatches=2)),
    ([40, 30, 6, 5, 5, 3], 4, SPEC, dict(max_tokens_per_microbatch=20)),
    ([60, 12, 10, 9, 5, 4], 4, SPEC, dict(max_tokens_per_microbatch=20, microbatch_overhead=100.0,
                                          cost=CostModel(per_item=5.0, linear=1.0, quadratic=1e-3))),
    ([40, 5, 5], 2, ContextParallel(degrees=(1, 2), latency_s=0.0, seconds_per_cost=1.0),
     dict(max_tokens_per_microbatch=25)),  # small enough for the default oracle (brute force)
    ([9, 8, 7, 3], 2, ContextParallel(degrees=(1, 2)), dict(max_tokens_per_microbatch=12)),  # nothing splits
    ([40, 30, 30, 20, 5], 6, ContextParallel(degrees=(1, 2), gpus_per_node=3), dict(max_tokens_per_microbatch=25)),
], ids=["fixed-m", "free-m", "overhead-cost", "oracle", "unsplit", "odd-nodes"])
def test_real_plans_pass(lengths, num_ranks, spec, options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the default cost's warning under context_parallel
        made = balance_microbatches(lengths, num_ranks, context_parallel=spec, **options)
    check_split_microbatch_plan(made, lengths, num_ranks, spec, options["max_tokens_per_microbatch"],
                                cost=options.get("cost"), microbatch_overhead=options.get("microbatch_overhead", 0.0))


def test_a_plan_on_a_topology_passes_with_the_spec_on_it():
    topology = Topology(num_nodes=2, gpus_per_node=2)
    spec = ContextParallel(degrees=(1, 2), seconds_per_cost=1.0)
    made = balance_microbatches(LENGTHS, 4, max_tokens_per_microbatch=25, context_parallel=spec, topology=topology)
    assert made.split_items.size
    check_split_microbatch_plan(made, LENGTHS, 4, spec.on(topology), 25)


def _edited(plan, **arrays):
    """`plan` with fields replaced; an array given as (index, value) is a copy of the plan's with that entry set."""
    fields = {}
    for name, value in arrays.items():
        if isinstance(value, tuple) and name in ("rank", "microbatch", "degree", "item_time", "cell_loads",
                                                 "cell_tokens"):
            array = np.array(getattr(plan, name))
            array[value[0]] = value[1]
            value = array
        fields[name] = value
    return dataclasses.replace(plan, **fields)


TAMPERED = {  # name -> (fields to change, the message naming the invariant)
    "unaligned": (dict(rank=(0, 1)), r"item 0 is on ranks \[1, 2\] at degree 2: not an aligned block"),
    "degree not allowed": (dict(degree=(2, 8)), r"item 2 is on ranks .* at degree 8: not an aligned block"),
    "groups overlap": (dict(degree=(0, 4)), r"item 1's group \[2, 3\] overlaps another group in micro-batch 0"),
    "tokens off the group": (dict(rank=(1, 0)), r"cell loads .* differ from the items'"),
    "micro-batch out of range": (dict(microbatch=(3, 2)), r"item 3 is in micro-batch 2, outside \[0, 2\)"),
    "item time": (dict(item_time=(2, 6.0)), r"item 2: shards \[5\] of 5 tokens, time 6.0 \(expected 5.0\)"),
    "cell loads": (dict(cell_loads=((1, 0), 1.0)), r"cell loads .* differ from the items'"),
    "cell tokens": (dict(cell_tokens=((0, 0), 21)), r"cell tokens .* differ from the items'"),
    "step": ("step", r"step cost .* / bound .* against Σ_m max_r load"),
    "bound above step": ("bound", r"step cost .* / bound .* against Σ_m max_r load"),
    "optimal unproven": (dict(status=Status.OPTIMAL), r"status optimal with step cost"),
    "status text": (dict(status="feasible"), r"status 'feasible' must be a Status"),
    "pass of another micro-batch": ("passes", r"micro-batch 0 holds 5 items but its pass is None"),
    "split without passes": (dict(passes=None), r"item 0 is split but the plan has no `passes`"),
}


@pytest.mark.parametrize("name", TAMPERED)
def test_each_broken_invariant_is_caught(plan, name):
    change, message = TAMPERED[name]
    if change == "step":
        change = dict(step_cost=plan.step_cost + 1.0)
    elif change == "bound":
        change = dict(lower_bound=plan.step_cost * 2)
    elif change == "passes":
        change = dict(passes=plan.passes[::-1])
    with pytest.raises(AssertionError, match=message):
        check_split_microbatch_plan(_edited(plan, **change), LENGTHS, 4, SPEC, 25)


def test_cells_over_the_budget_are_caught(plan):
    budget = int(plan.cell_tokens.max()) - 1
    with pytest.raises(AssertionError, match=rf"holds {budget + 1} tokens > max_tokens_per_microbatch={budget}"):
        check_split_microbatch_plan(_edited(plan, max_tokens_per_microbatch=budget), LENGTHS, 4, SPEC, budget)
    with pytest.raises(AssertionError, match=r"was made for .* = \(4, 25, 0.0, False, None\); expected \(4, 30,"):
        check_split_microbatch_plan(plan, LENGTHS, 4, SPEC, 30)


def test_a_group_across_nodes_is_caught():
    spec = ContextParallel(degrees=(1, 2), gpus_per_node=3, seconds_per_cost=1.0)
    lengths = [40, 30, 30, 20, 5]
    made = balance_microbatches(lengths, 6, max_tokens_per_microbatch=25, context_parallel=spec)
    item = int(np.flatnonzero((made.degree == 2) & (made.rank == 4))[0])  # ranks 4-5, inside node 1
    with pytest.raises(AssertionError, match=rf"item {item}'s group \[2, 3\] crosses nodes of 3 gpus"):
        check_split_microbatch_plan(_edited(made, rank=(item, 2)), lengths, 6, spec, 25)


def test_a_bound_above_the_optimum_is_caught(plan):
    below = SplitOptimum(plan.lower_bound - 1.0, None, None, 0)
    with pytest.raises(AssertionError, match=r"do not bracket the optimum"):
        check_split_microbatch_plan(plan, LENGTHS, 4, SPEC, 25, optimum=below)


def test_the_split_checks_name_the_check_that_takes_another_plan(plan):
    """check_split_plan read `.cost` of a SplitMicroBatchPlan and `.degree` of a BalancePlan (AttributeError)."""
    with pytest.raises(TypeError, match=r"check_split_plan takes a ContextParallelPlan .*; got SplitMicroBatchPlan; "
                                        r"check_split_microbatch_plan checks a SplitMicroBatchPlan"):
        check_split_plan(plan, LENGTHS, 4, SPEC)
    with pytest.raises(TypeError, match=r"check_split_plan takes a ContextParallelPlan .*; got BalancePlan; "
                                        r"check_plan checks a BalancePlan"):
        check_split_plan(balance(LENGTHS, 4), LENGTHS, 4, SPEC)
    with pytest.raises(TypeError, match=r"check_split_microbatch_plan takes a SplitMicroBatchPlan .*; got "
                                        r"ContextParallelPlan; check_split_plan checks a ContextParallelPlan"):
        check_split_microbatch_plan(balance(LENGTHS, 4, context_parallel=SPEC), LENGTHS, 4, SPEC, 25)


def test_first_stage_costs_of_a_plan_without_a_pipeline_are_refused():
    """check_microbatch_plan ignored them where they mean nothing (probe56 F10's note)."""
    from orchmllm.testing import check_microbatch_plan
    plain = balance_microbatches([6, 5, 4, 3], 2, max_tokens_per_microbatch=8)
    with pytest.raises(ValueError, match=r"`first_stage_costs` apply to a plan with a pipeline"):
        check_microbatch_plan(plain, [6, 5, 4, 3], 2, 8, first_stage_costs=[1.0, 1.0, 1.0, 1.0])

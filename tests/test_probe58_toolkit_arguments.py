"""The toolkit's checks and oracles on wrong arguments: a TypeError or ValueError naming the argument, never a raw
AttributeError, numpy's error, or "no plan fits" for a typo (probe58 U1)."""

import dataclasses

import pytest

from orchmllm import ContextParallel, balance, balance_microbatches
from orchmllm.testing import (brute_force, brute_force_microbatches, brute_force_of, check_microbatch_plan, check_plan,
                              check_split_plan, exact, padded_optimum)
from orchmllm.testing.context_parallel import (brute_force_split, brute_force_split_microbatches,
                                               check_split_microbatch_plan)

SPEC = ContextParallel(degrees=(1, 2), latency_s=0.0, seconds_per_cost=1.0)
LENGTHS = [40, 5, 5]


@pytest.fixture(scope="module")
def split_microbatch_plan():
    return balance_microbatches(LENGTHS, 2, max_tokens_per_microbatch=25, context_parallel=SPEC)


@pytest.mark.parametrize("options, error, match", [
    (dict(spec=None), TypeError, r"`spec` must be a ContextParallel .*; got NoneType"),
    (dict(spec={"degrees": (1, 2)}), TypeError, r"`spec` must be a ContextParallel .*; got dict"),
    (dict(optimum=5), TypeError, r"`optimum` must be of type SplitOptimum \(what brute_force_split_microbatches "
                                 r"returns\) or None; got int"),
], ids=["spec-None", "spec-dict", "optimum-int"])
def test_check_split_microbatch_plan_names_a_bad_argument(split_microbatch_plan, options, error, match):
    arguments = dict(spec=SPEC, optimum=None) | options
    with pytest.raises(error, match=match):
        check_split_microbatch_plan(split_microbatch_plan, LENGTHS, 2, arguments.pop("spec"), 25, **arguments)


def test_check_split_plan_names_a_bad_optimum():
    plan = balance(LENGTHS, 2, context_parallel=SPEC)
    with pytest.raises(TypeError, match=r"`optimum` must be of type SplitOptimum \(what brute_force_split returns\)"):
        check_split_plan(plan, LENGTHS, 2, SPEC, optimum="x")
    with pytest.raises(TypeError, match=r"`spec` must be a ContextParallel"):
        check_split_plan(plan, LENGTHS, 2, None)


@pytest.mark.parametrize("options, error, match", [
    (dict(num_microbatches=2.5), TypeError, r"`num_microbatches` must be an int; got float"),
    (dict(num_microbatches=True), TypeError, r"`num_microbatches` must be an int; got bool"),
    (dict(num_microbatches=0), ValueError, r"`num_microbatches` must be >= 1; got 0"),
    (dict(num_microbatches=-1), ValueError, r"`num_microbatches` must be >= 1; got -1"),
    (dict(num_microbatches=range(0, 2)), ValueError, r"`num_microbatches` must be >= 1; got 0"),
    (dict(num_microbatches=[]), ValueError, r"`num_microbatches` must be an int or a non-empty range"),
    (dict(max_tokens_per_microbatch=-5), ValueError, r"`max_tokens_per_microbatch` must be >= 1; got -5"),
    (dict(microbatch_overhead=-1.0), ValueError, r"`microbatch_overhead` must be finite and >= 0"),
], ids=["M-float", "M-bool", "M-0", "M-negative", "M-range-from-0", "M-empty", "T-negative", "overhead-negative"])
def test_brute_force_split_microbatches_refuses_what_brute_force_pipeline_refuses(options, error, match):
    arguments = dict(max_tokens_per_microbatch=4, num_microbatches=2) | options
    with pytest.raises(error, match=match):
        brute_force_split_microbatches([8, 2], 2, ContextParallel(degrees=(1, 2)), **arguments)


def test_brute_force_split_microbatches_takes_a_range_of_microbatch_counts():
    spec = ContextParallel(degrees=(1, 2), latency_s=0.0, kv_bytes_per_token=0.0, half_efficiency_tokens=0.0)
    assert brute_force_split_microbatches([8, 2, 2], 2, spec, max_tokens_per_microbatch=4,
                                          num_microbatches=range(1, 3)).makespan == 6.0


@pytest.mark.parametrize("field", ["degree", "rank", "microbatch", "item_time"])
def test_a_split_microbatch_plans_list_field_is_named(split_microbatch_plan, field):
    plan = dataclasses.replace(split_microbatch_plan, **{field: getattr(split_microbatch_plan, field).tolist()})
    with pytest.raises(AssertionError, match=rf"`{field}` is a list; expected a \(3,\) (int64|float64) array"):
        check_split_microbatch_plan(plan, LENGTHS, 2, SPEC, 25, optimum=None)


def test_check_microbatch_plan_refuses_a_list_rank_and_names_a_bad_optimum():
    plan = balance_microbatches([6, 5, 4, 3, 2, 2], 2, max_tokens_per_microbatch=8)
    listed = dataclasses.replace(plan, rank=plan.rank.tolist())
    with pytest.raises(AssertionError, match=r"`rank` is a list; expected a \(6,\) int64 array"):
        check_microbatch_plan(listed, [6, 5, 4, 3, 2, 2], 2, 8)
    with pytest.raises(TypeError, match=r"`optimum` must be of type MicroBatchOptimum .* or None; got int"):
        check_microbatch_plan(plan, [6, 5, 4, 3, 2, 2], 2, 8, optimum=5)


def test_check_plan_refuses_a_list_assignment_and_names_a_bad_optimum():
    plan = balance([5, 4, 3, 3, 3], 2)
    with pytest.raises(AssertionError, match=r"`assignment` is a list; expected a \(5,\) int64 array"):
        check_plan(dataclasses.replace(plan, assignment=plan.assignment.tolist()), [5, 4, 3, 3, 3], 2)
    with pytest.raises(TypeError, match=r"`optimum` must be of type Optimum .* or None; got float"):
        check_plan(plan, [5, 4, 3, 3, 3], 2, optimum=9.0)


ORACLES = {"brute_force": brute_force, "exact": exact, "padded_optimum": padded_optimum,
           "brute_force_split": lambda lengths, num_ranks, **options: brute_force_split(lengths, num_ranks, SPEC,
                                                                                       **options)}


@pytest.mark.parametrize("oracle", ORACLES.values(), ids=ORACLES.keys())
@pytest.mark.parametrize("options, error, match", [
    (dict(max_tokens_per_rank=-5), ValueError, r"`max_tokens_per_rank` must be >= 1; got -5"),
    (dict(max_tokens_per_rank=2.5), TypeError, r"`max_tokens_per_rank` must be an int or None; got float"),
    (dict(max_tokens_per_rank="x"), TypeError, r"`max_tokens_per_rank` must be an int or None; got str"),
    (dict(cost="x"), TypeError, r"`cost` must be a CostModel( or None)?; got str"),
], ids=["cap-negative", "cap-float", "cap-str", "cost-str"])
def test_an_oracle_names_a_bad_cap_or_cost_rather_than_finding_no_plan(oracle, options, error, match):
    with pytest.raises(error, match=match):
        oracle([8, 2, 3], 2, **options)


@pytest.mark.parametrize("oracle", [brute_force, exact], ids=["brute_force", "exact"])
def test_an_oracle_names_a_padded_flag_that_is_no_bool(oracle):
    with pytest.raises(TypeError, match=r"`padded` must be a bool; got int"):
        oracle([8, 2, 3], 2, padded=1)


def test_a_plan_made_with_another_spec_is_named(split_microbatch_plan):
    other = ContextParallel(degrees=(1, 2), latency_s=1.0, seconds_per_cost=1.0)
    relabelled = dataclasses.replace(split_microbatch_plan, context_parallel=other)
    with pytest.raises(AssertionError, match=r"was made with context_parallel=.*latency_s=1.0.*not the `spec`"):
        check_split_microbatch_plan(relabelled, LENGTHS, 2, SPEC, 25, optimum=None)
    plan = balance(LENGTHS, 2, context_parallel=SPEC)
    with pytest.raises(AssertionError, match=r"was made with context_parallel="):
        check_split_plan(dataclasses.replace(plan, context_parallel=other), LENGTHS, 2, SPEC)


@pytest.mark.parametrize("call, error, match", [
    (lambda: check_plan(balance([5, 4, 3], 2), [5, 4, 3], 2, max_tokens_per_rank="x"), TypeError,
     r"`max_tokens_per_rank` must be an int or None; got str"),
    (lambda: brute_force_microbatches([6, 5, 4], 2, 8, 2, cost="x"), TypeError, r"`cost` must be a CostModel or None"),
    (lambda: brute_force_microbatches([6, 5, 4], 2, 8, 2, microbatch_overhead=-1), ValueError,
     r"`microbatch_overhead` must be finite and >= 0; got -1"),
    (lambda: brute_force_microbatches([6, 5, 4], 2, 8, 2, padded=1), TypeError, r"`padded` must be a bool; got int"),
    (lambda: brute_force([5, 4, 3, 3, 3], 2, groups=[0]), ValueError, r"`groups` must hold one group id per item"),
    (lambda: brute_force_of(5), TypeError, r"`problem` must be a Problem \(what make_problem returns\); got int"),
], ids=["check_plan-cap-str", "microbatch-cost-str", "microbatch-overhead-negative", "microbatch-padded-int",
        "groups-too-few", "brute_force_of-int"])
def test_more_oracle_arguments_are_named(call, error, match):
    with pytest.raises(error, match=match):
        call()

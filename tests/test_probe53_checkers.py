"""probe53 F9-F12: the testing toolkit's checkers catch tampered plans, and its helpers name the caller's arguments."""

import dataclasses

import numpy as np
import pytest

from orchmllm import CostModel, ContextParallel, Pipeline, balance, balance_microbatches
from orchmllm.balancers.problem import Status
from orchmllm.testing import check_microbatch_plan, check_split_plan

LENGTHS = [9, 8, 7, 6, 5, 4]


def _frozen(values):
    array = np.array(values, dtype=np.float64)
    array.setflags(write=False)
    return array


@pytest.mark.parametrize("change", [dict(step_time=1.0), dict(lower_bound=1e9), dict(status=Status.OPTIMAL),
                                    dict(replica_times=_frozen([0.0, 0.0]))])
def test_regression_check_microbatch_plan_ignored_the_pipeline_step(change):
    """Cause (probe53 F10): `check_microbatch_plan` never looked at `plan.pipeline`; a fake step time, a bound above
    the step, a false `optimal` or zeroed replica times passed.  The replicas are now the event simulation's."""
    plan = balance_microbatches(LENGTHS, 2, max_tokens_per_microbatch=20, num_microbatches=3,
                                pipeline=Pipeline(stages=2))
    check_microbatch_plan(plan, LENGTHS, 2, 20)
    tampered = dataclasses.replace(plan, pipeline=dataclasses.replace(plan.pipeline, **change))
    with pytest.raises(AssertionError, match="pipeline"):
        check_microbatch_plan(tampered, LENGTHS, 2, 20)


def test_check_microbatch_plan_times_first_stage_costs():
    cost = CostModel(linear=1.0)
    first = np.array(LENGTHS, dtype=np.float64) * 0.5
    plan = balance_microbatches(LENGTHS, 2, max_tokens_per_microbatch=20, num_microbatches=2, cost=cost,
                                pipeline=Pipeline(stages=2), first_stage_costs=first)
    check_microbatch_plan(plan, LENGTHS, 2, 20, cost=cost, first_stage_costs=first)
    with pytest.raises(AssertionError, match="event simulation"):  # timed without them: other replica times
        check_microbatch_plan(plan, LENGTHS, 2, 20, cost=cost)


def test_regression_check_split_plan_had_no_oracle_of_its_own():
    """Cause (probe53 F10): without `optimum=`, a non-optimal split plan marked optimal with bound = makespan passed;
    `check_split_plan` now runs `brute_force_split` itself on small instances, as `check_plan` does."""
    cost = CostModel(linear=1.0, quadratic=0.01)
    lengths = [3509, 414, 2802, 2407]
    spec = ContextParallel(degrees=(1, 2), seconds_per_cost=1.0, kv_bytes_per_token=1e-3, half_efficiency_tokens=64.0)
    plan = balance(lengths, 2, cost=cost, context_parallel=spec, algorithm="lpt")
    check_split_plan(plan, lengths, 2, spec, cost=cost)
    tampered = dataclasses.replace(plan, status=Status.OPTIMAL, lower_bound=plan.makespan)
    check_split_plan(tampered, lengths, 2, spec, cost=cost, optimum=None)  # None skips the oracle
    with pytest.raises(AssertionError, match="optimum"):
        check_split_plan(tampered, lengths, 2, spec, cost=cost)


def test_regression_check_plan_status_as_text_read_as_no_contradiction():
    """Cause (probe53 F9): a plan whose status is the text 'optimal' failed with "status optimal with makespan 20.0
    and bound 20.0", which reads as no contradiction; the check now says the status must be a `Status`."""
    from orchmllm.testing import check_plan

    plan = balance(LENGTHS, 2, algorithm="lpt")
    with pytest.raises(AssertionError, match=r"status 'optimal' must be a Status \(orchmllm.balancers.Status\)"):
        check_plan(dataclasses.replace(plan, status="optimal"), LENGTHS, 2)

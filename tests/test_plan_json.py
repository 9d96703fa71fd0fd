"""Plans share one certification step (`certify`) and one JSON form (`to_json`): the CLI prints the plan's own."""

import json

import numpy as np
import pytest

from orchmllm import balance, balance_microbatches
from orchmllm.balancers.plan import certify
from orchmllm.balancers.problem import Status
from orchmllm.cli import main

HEAD = {"algorithm", "num_ranks", "num_items", "padded", "lower_bound", "gap", "status", "solve_seconds", "digest"}


def test_balance_and_microbatch_plans_share_one_json_form():
    lengths = [5, 4, 3, 3, 3, 7, 1]
    plan, cells = balance(lengths, 2), balance_microbatches(lengths, 2, max_tokens_per_microbatch=8)
    for payload, digest in ((plan.to_json(), plan.digest()), (cells.to_json(), cells.digest())):
        assert HEAD <= payload.keys() and payload["digest"] == digest and payload["num_items"] == len(lengths)
        assert json.loads(json.dumps(payload, allow_nan=False)) == payload  # plain JSON types only
    assert plan.to_json()["makespan"] == plan.makespan and cells.to_json()["step_cost"] == cells.step_cost


def test_communication_aware_plan_names_its_pass_in_json():
    plan = balance([5, 4, 3, 3, 3, 7], 2, sources=[0, 0, 0, 1, 1, 1])
    assert plan.to_json()["algorithm"] == "auto+locality" and plan.to_json()["cost"]["linear"] == 1.0
    assert balance([5, 4], 2, costs=[1.0, 2.0]).to_json()["cost"] is None  # no model behind given costs


def test_cli_plan_json_is_the_plans_to_json(tmp_path, capsys):
    path = tmp_path / "lengths.npy"
    np.save(path, np.array([50, 40, 30, 30, 30, 70, 10]))
    assert main(["plan", str(path), "-D", "3", "--algorithm", "lpt", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    expected = balance(np.load(path), 3, algorithm="lpt").to_json()
    assert {**printed, "solve_seconds": 0} == {**expected, "solve_seconds": 0}


@pytest.mark.parametrize("what", ["makespan", "step cost"])
def test_certify_refuses_an_unproven_optimal_claim(what):
    assert certify(10.0, 10.5, Status.FEASIBLE, "k", what) == (10.0, Status.OPTIMAL)  # bound held at the cost
    assert certify(10.0, 9.0, Status.FEASIBLE, "k", what) == (9.0, Status.FEASIBLE)
    with pytest.raises(RuntimeError, match=f"algorithm 'k' claimed optimality at {what} 10.0 but only proved a "
                                           f"bound of 9.0"):
        certify(10.0, 9.0, Status.OPTIMAL, "k", what)


def test_on_ranks_moves_each_group_with_its_loads_and_keeps_the_certificate():
    plan = balance([5, 4, 3, 3, 3, 7, 1], 3, algorithm="lpt")
    moved = plan.on_ranks(np.array([2, 0, 1]))
    assert moved.assignment.tolist() == [[2, 0, 1][rank] for rank in plan.assignment.tolist()]
    assert moved.loads[[2, 0, 1]].tolist() == plan.loads.tolist() and moved.tokens[2] == plan.tokens[0]
    assert (moved.makespan, moved.lower_bound, moved.status) == (plan.makespan, plan.lower_bound, plan.status)
    assert not moved.assignment.flags.writeable and plan.assignment.tolist() != moved.assignment.tolist()
    with pytest.raises(ValueError, match=r"`rank_of_group` must be a permutation of the 3 ranks; got \[0, 0, 1\]"):
        plan.on_ranks(np.array([0, 0, 1]))

"""`auto` under `equal_counts` and a cap that equal-count LPT gives up on: the tiny MILP (`equal_counts._decided`) runs
to a budget of branch-and-bound nodes, not of seconds (probe27 P27-01: under its 10 s clock the same call planned on
one run and refused on another, or raised a raw TimeoutError; every rank plans the same step and must end alike)."""

import numpy as np
import pytest

from orchmllm import balance
from orchmllm.balancers.constraints import equal_counts
from orchmllm.balancers.exact import milp
from orchmllm.balancers.problem import InfeasibleError


@pytest.fixture
def node_limits(monkeypatch):
    """The node limits HiGHS was given, call by call."""
    seen, solve = [], milp.solve_milp

    def counted(*args, **kwargs):
        seen.append(kwargs.get("node_limit"))
        return solve(*args, **kwargs)

    monkeypatch.setattr(milp, "solve_milp", counted)
    return seen


def _partition(seed: int, num_items: int, num_ranks: int, bits: int, room: int):
    """Random `bits`-bit lengths and costs under a cap of the mean tokens plus `room`: a partition problem."""
    rng = np.random.default_rng(seed)
    lengths, costs = rng.integers(1, 2**bits, num_items), rng.integers(1, 2**bits, num_items).astype(float)
    return lengths, costs, int(-(-lengths.sum() // num_ranks)) + room


def test_regression_a_plan_found_within_the_nodes_is_kept_and_the_same_on_every_call(node_limits):
    lengths, costs, cap = _partition(1, 20, 2, 16, 2000)  # HiGHS proves no optimum in 500 nodes, finds plans
    plans = [balance(lengths, 2, costs=costs, equal_counts=True, max_tokens_per_rank=cap) for _ in range(2)]
    assert node_limits == [equal_counts.TINY_NODES] * 2  # was None: the wall clock alone ended the search
    plan = plans[0]
    counts = np.bincount(plan.assignment, minlength=2)
    assert counts.tolist() == [10, 10] and plan.tokens.max() <= cap
    assert str(plan.status) == "feasible" and plan.lower_bound <= plan.makespan
    assert plans[1].digest() == plan.digest()


def test_regression_no_plan_within_the_nodes_is_the_refusal_not_a_timeout(node_limits):
    lengths, costs, cap = _partition(0, 21, 3, 20, 0)  # was TimeoutError "raise `time_limit`" after 10 s
    with pytest.raises(InfeasibleError, match="algorithm='exact' decides"):
        balance(lengths, 3, costs=costs, equal_counts=True, max_tokens_per_rank=cap)
    assert node_limits == [equal_counts.TINY_NODES]

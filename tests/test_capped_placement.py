"""LPT under a token cap (`lpt_capped`): the textbook loop's plan, without offering full ranks again and again."""

import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchmllm.balancers import CostModel, InfeasibleError, balance, balance_microbatches, make_problem
from orchmllm.balancers.kernels import lpt, lpt_capped
from orchmllm.balancers.kernels.reference import capped_lpt
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload, trace_table


def assert_matches_the_loop(problem, cap):
    reference = capped_lpt(problem.item_costs, problem.lengths, problem.num_ranks, cap)
    if reference is None:
        with pytest.raises(InfeasibleError, match=f"under max_tokens_per_rank={cap}; lpt fits under a cap of|"
                                                  f"^no plan fits max_tokens_per_rank={cap} "):  # or the pigeonhole's
            lpt.solve(problem)
    else:
        np.testing.assert_array_equal(lpt.solve(problem).assignment, reference)


@given(lengths=st.lists(st.integers(0, 60), min_size=1, max_size=300), num_ranks=st.integers(1, 70),
       costs=st.sampled_from(["linear", "quadratic", "per_item_only", "noisy", "random", "zeros"]),
       slack=st.floats(0.0, 0.3), seed=st.integers(0, 2**16))
def test_capped_lpt_is_the_textbook_loop(lengths, num_ranks, costs, slack, seed):
    """Every item, largest cost first, to the least-loaded rank with room (ties by rank); lengths that
    fall with the costs (cost models) and lengths in any order (costs given per item)."""
    lengths = np.array(lengths)
    rng = np.random.default_rng(seed)
    kwargs = {"linear": dict(cost=CostModel()), "quadratic": dict(cost=CostModel(linear=1, quadratic=0.5)),
              "per_item_only": dict(cost=CostModel(per_item=1, linear=0)),
              "noisy": dict(costs=lengths * rng.uniform(1.0, 1.3, lengths.size)),
              "random": dict(costs=rng.integers(0, 4, lengths.size).astype(float)),
              "zeros": dict(costs=np.where(rng.random(lengths.size) < 0.6, 0.0, lengths * 1.0))}[costs]
    cap = max(int(lengths.max()), int(lengths.sum() / num_ranks * (1 + slack)), 1)
    try:
        problem = make_problem(lengths, num_ranks, max_tokens_per_rank=cap, **kwargs)
    except InfeasibleError:
        return
    assert_matches_the_loop(problem, cap)


def trace_instance(seed):
    """Real request lengths (the shipped Azure samples) on 40-200 ranks under a cap a few percent above
    the mean: a quadratic cost model (lengths fall with the costs) or noisy per-item costs."""
    rng = np.random.default_rng(seed)
    table = trace_table(("conv", "code")[seed % 2]).sum(axis=1)
    num_ranks = int(rng.choice([40, 64, 100, 200]))
    lengths = table[rng.integers(0, table.size, num_ranks * int(rng.integers(4, 16)))]
    per_item = seed % 3 == 2
    kwargs = dict(costs=lengths * rng.uniform(1.0, 1.2, lengths.size)) if per_item else \
        dict(cost=CostModel(linear=1, quadratic=float(rng.choice([1e-5, 1e-4, 1e-3]))))
    cap = max(int(lengths.sum() / num_ranks * rng.uniform(1.0, 1.08)) + 1, int(lengths.max()))
    return make_problem(lengths, num_ranks, max_tokens_per_rank=cap, **kwargs), cap


def calls_of(monkeypatch, name):
    """The (arguments, result) of every call of `lpt_capped.<name>` from now on."""
    calls, kernel = [], getattr(lpt_capped, name)

    def spy(*args):
        calls.append((args, kernel(*args)))
        return calls[-1][1]

    monkeypatch.setattr(lpt_capped, name, spy)
    return calls


@pytest.mark.parametrize("seed,path", [(0, "_release_merge"), (111, "_heap_run"), (17, "_tree_round")],
                         ids=["merged_rounds_with_released_ranks", "heap_run", "tree_rounds"])
def test_capped_lpt_is_the_textbook_loop_on_real_lengths(monkeypatch, seed, path):
    """Each way of placing a round (merging ranks released as the items shorten, heap steps when the
    least-loaded ranks take item after item, tree descents when lengths grow) on seeded instances
    that take it."""
    calls = calls_of(monkeypatch, path)
    problem, cap = trace_instance(seed)
    assert_matches_the_loop(problem, cap)
    assert calls
    if path == "_release_merge":  # a rank without room for its round's first item took a later one
        assert any(np.isin(taken, late).any() for (_, late, _, _), taken in calls)


def test_items_of_cost_zero_go_in_one_descent_each_not_a_round_each(monkeypatch):
    """Regression (mb38's profile): the items of cost 0, last in cost order, in lengths up and down, went one
    `_tree_round` each (its tree of the D ranks built for every item): `balance_microbatches` at 512 x 32 with half
    the costs 0 took 53 s CPU (cells of 16k tokens).  Their costs change no load, so the ranks' order stays and
    they go in one `_free_run`, a rank taking item after item: the textbook loop's plan."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(1, 8000, 64 * 32)
    costs = np.where(rng.random(lengths.size) < 0.5, 0.0, lengths * 1.0)
    cap = int(lengths.sum() / 64 * 1.05)
    problem = make_problem(lengths, 64, costs=costs, max_tokens_per_rank=cap)
    rounds, runs = calls_of(monkeypatch, "_tree_round"), calls_of(monkeypatch, "_free_run")
    assert_matches_the_loop(problem, cap)
    assert len(runs) == 1 and len(rounds) < 16


def test_full_ranks_are_not_offered_again_and_again():
    """Regression: the capped loop popped and re-pushed every rank without room for each item, O(n · D)
    heap operations once the cells filled up; on long-tailed lengths (D = 512 × 32, T = 8k, the 84B
    model's costs) `balance_microbatches` took ~340× a plain step's LPT (1 s), now a few times."""
    lengths = sample_workload("long_tail", 512, 32, seed=0).sample_llm_length
    cost = MODELS["84b"].llm.cost(causal=True)
    start = time.process_time()
    plain = balance(lengths, 512, cost=cost, algorithm="lpt")
    plain_seconds = time.process_time() - start
    start = time.process_time()
    plan = balance_microbatches(lengths, 512, max_tokens_per_microbatch=8192, cost=cost)
    seconds = time.process_time() - start
    assert plan.cell_tokens.max() <= 8192 and plain.makespan > 0
    assert seconds < 40 * max(plain_seconds, 1e-3)

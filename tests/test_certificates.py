"""A plan's certificate (bound and status) is checked, not taken on a kernel's word: a bound
above the plan's own cost is a false certificate refused naming the kernel, the built-in exact
kernels' proofs stay `optimal`, and bounds round up to the next integer where every cost is one."""

import dataclasses
import functools
import math
import re

import numpy as np
import pytest

from orchmllm.balancers import (Algorithm, ContextParallel, CostModel, KernelResult, Kind, MicroBatchAlgorithm, Status,
                                balance, balance_microbatches, make_problem, registry)
from orchmllm.balancers.kernels import lpt
from orchmllm.balancers.microbatch import greedy as microbatch_greedy
from orchmllm.balancers.microbatch.plan import MicroBatchResult, cell_loads, step_cost
from orchmllm.balancers.plan import make_plan, rounded_up
from orchmllm.testing import brute_force, brute_force_microbatches, check_plan

LENGTHS = [3, 3, 2, 2, 2]  # LPT: {3, 2, 2} = 7 on 2 ranks; optimum 6 ({3, 3} and {2, 2, 2})


@pytest.fixture
def register(monkeypatch):
    """Register a record for one test only."""
    def add(record):
        table = registry._microbatch_records if isinstance(record, MicroBatchAlgorithm) else registry._records
        monkeypatch.setitem(table, record.name, record)
        return record.name
    return add


def lpt_certified_by(bound):
    def kernel(problem):
        return KernelResult(lpt.solve(problem).assignment, lower_bound=bound)
    return kernel


def greedy_certified_by(bound):
    def kernel(problem, num_microbatches):
        result = microbatch_greedy.solve(problem, num_microbatches)
        return None if result is None else result._replace(lower_bound=bound)
    return kernel


@pytest.mark.parametrize("bound", [math.inf, 1e18, 8.0], ids=["inf", "1e18", "one-above"])
def test_regression_a_kernel_bound_above_its_makespan_made_the_plan_optimal(register, bound):
    """Cause: make_plan took any kernel bound at or above the makespan for a proof of optimality,
    so a plugin's `lower_bound=inf` labelled a plan far above the optimum `optimal`."""
    name = register(Algorithm("test_lpt_false_bound", lpt_certified_by(bound), description="LPT, false bound"))
    assert balance(LENGTHS, 2, algorithm="lpt").makespan == 7.0 > brute_force(LENGTHS, 2).makespan
    with pytest.raises(RuntimeError, match=rf"algorithm 'test_lpt_false_bound' returned lower_bound="
                                           rf"{re.escape(repr(bound))} above the makespan 7.0 of its own plan: "
                                           r".* certificate is false"):
        balance(LENGTHS, 2, algorithm=name)


@pytest.mark.parametrize("bound", [math.nan, "90", np.array([90.0])], ids=["nan", "str", "array"])
def test_a_kernel_bound_that_is_no_number_is_refused_naming_the_kernel(bound):
    problem = make_problem(LENGTHS, 3)
    with pytest.raises(RuntimeError, match=r"algorithm 'mine' returned lower_bound=.* expected a real number or None"):
        make_plan(problem, lpt.solve(problem).assignment, Status.FEASIBLE, "mine", kernel_bound=bound)


def test_a_kernel_status_that_is_no_status_is_refused_naming_the_kernel():
    problem = make_problem(LENGTHS, 3)
    with pytest.raises(RuntimeError, match=r"algorithm 'mine' returned status 'best'; expected one of \['optimal'"):
        make_plan(problem, lpt.solve(problem).assignment, "best", "mine")


@pytest.mark.parametrize("returned, got", [(None, "None"), ((np.zeros(5, np.int64), "feasible", None), "a tuple"),
                                           (np.zeros(5, np.int64), "a ndarray")], ids=["None", "tuple", "ndarray"])
@pytest.mark.parametrize("options", [{}, {"groups": [0, 0, 1, 2, 3]},
                                     {"context_parallel": ContextParallel(degrees=(1, 2))}],
                         ids=["plain", "groups", "context-parallel"])
def test_regression_a_plain_kernel_returning_no_kernel_result_raised_an_attribute_error(register, returned, got,
                                                                                       options):
    """Cause: balance read `result.assignment` unchecked, so a plugin returning None, a tuple or
    its bare assignment raised `'NoneType' object has no attribute 'assignment'`, no kernel named."""
    name = register(Algorithm("test_returns_no_result", lambda problem: returned, description="returns no result"))
    with pytest.raises(RuntimeError, match=rf"algorithm 'test_returns_no_result' returned {got}; expected a "
                                           r"KernelResult$"):
        balance(LENGTHS, 2, algorithm=name, **options)


def test_a_kernel_bound_within_float_rounding_of_its_makespan_proves_it():
    """Bounds and loads are float sums in other orders: a bound one ulp above is the kernel's proof."""
    problem = make_problem([1, 2, 3], 2, cost=CostModel(linear=0.1))
    assignment = np.array([0, 0, 1])
    makespan = 0.1 + 0.2  # 0.30000000000000004, the loads' sum
    plan = make_plan(problem, assignment, Status.OPTIMAL, "mine", kernel_bound=math.nextafter(makespan, 1.0))
    assert plan.makespan == plan.lower_bound == makespan and plan.status is Status.OPTIMAL


@pytest.mark.parametrize("name", ["exact", "ilp", "padded"])
def test_the_built_in_exact_kernels_still_prove_their_plans(name):
    padded = name == "padded"
    plan = balance([23, 19, 17, 13, 11, 7, 5, 3, 2], 3, algorithm=name, padded=padded,
                   cost=CostModel(linear=1.5, quadratic=0.01))
    assert plan.status is Status.OPTIMAL and plan.lower_bound == plan.makespan


@pytest.mark.parametrize("num_microbatches", [None, 2], ids=["free-M", "fixed-M"])
def test_regression_a_microbatch_kernel_bound_above_its_step_cost_made_the_plan_optimal(register, num_microbatches):
    """Cause: with M fixed, make_microbatch_plan clamped any kernel bound to the step cost, so a
    micro-batch kernel's `lower_bound=1e18` labelled its plan `optimal`."""
    name = register(MicroBatchAlgorithm("test_greedy_false_bound", greedy_certified_by(1e18), description="false"))
    with pytest.raises(RuntimeError, match=r"algorithm 'test_greedy_false_bound' returned lower_bound=1e\+18 above "
                                           r"the Σ_m max_r load \S+ of its own plan"):
        balance_microbatches(LENGTHS, 2, max_tokens_per_microbatch=6, algorithm=name,
                             num_microbatches=num_microbatches)


def test_the_exact_microbatch_kernel_still_proves_its_plans():
    plan = balance_microbatches([6, 5, 4, 3, 2, 2], 2, max_tokens_per_microbatch=8, num_microbatches=2,
                                algorithm="exact", microbatch_overhead=0.25, cost=CostModel(linear=1.5))
    assert plan.status is Status.OPTIMAL and plan.lower_bound == plan.step_cost
    assert plan.step_cost == brute_force_microbatches([6, 5, 4, 3, 2, 2], 2, 8, 2, cost=CostModel(linear=1.5),
                                                      microbatch_overhead=0.25).step_cost


# -- integer costs: bounds round up ------------------------------------------------------

ROUNDING = [5, 4, 3, 3, 2]  # total 17 on 2 ranks: bound 8.5, optimum 9 ({5, 4} and {3, 3, 2})


@pytest.mark.parametrize("algorithm, options", [
    ("lpt", {}), ("multifit", {"cost": CostModel(per_item=1, linear=2)}), ("lpt", {"costs": [5, 4, 3, 3, 2]}),
    ("lpt", {"equal_counts": True})], ids=["tokens", "integer-model", "costs", "equal-counts"])
def test_regression_a_fractional_bound_left_an_optimal_plan_feasible(algorithm, options):
    """Cause: the bound total / D = 8.5 was kept as it was, though with integer costs no plan
    costs less than 9: LPT's optimal plan of makespan 9 was labelled `feasible` (MULTIFIT's of
    20 with costs 1 + 2·l, bound 19.5)."""
    plan = balance(ROUNDING, 2, algorithm=algorithm, **options)
    optimum = brute_force(ROUNDING, 2, **options)
    assert plan.makespan == optimum.makespan and plan.lower_bound == plan.makespan
    assert plan.status is Status.OPTIMAL


@pytest.mark.parametrize("options, bound, makespan, status", [
    ({"costs": [5, 4, 3, 3, 1.5]}, 8.5, 8.5, Status.OPTIMAL),  # costs in halves: 8.25 rounds up to 8.5, not to 9
    ({"cost": CostModel(linear=1, quadratic=0.5)}, 24.5, 25.0, Status.FEASIBLE),
    ({"costs": [5, 4, 3, 3, 1.1]}, 8.05, 8.1, Status.FEASIBLE),  # no power-of-two unit: as summed (less rounding)
], ids=["fractional-costs", "fractional-model", "no-unit"])
def test_a_bound_rounds_up_to_the_costs_unit_only(options, bound, makespan, status):
    """A bound is rounded up to the costs' unit (`cost_unit`: the coarsest power of two every cost is a multiple of;
    probe27 P27-06, statuses: x0.5 or x1024 read 'feasible' where x1 read 'optimal'), never past it."""
    plan = balance(ROUNDING, 2, algorithm="lpt", **options)
    assert (plan.makespan, plan.status) == (makespan, status) and plan.lower_bound == pytest.approx(bound, abs=1e-12)
    assert brute_force(ROUNDING, 2, **options).makespan >= plan.lower_bound


def test_no_rounding_where_a_sum_could_be_inexact():
    """num_ranks · makespan at or above 2**53: some sum behind the bound may have rounded."""
    assert rounded_up(4.5, 2.0**52, 2, lambda: 1.0) == 4.5
    assert rounded_up(4.5, 2.0**52, 1, lambda: 1.0) == 5.0


@pytest.mark.parametrize("overhead, status", [(0.0, Status.OPTIMAL), (2.0, Status.OPTIMAL),
                                              (0.5, Status.FEASIBLE)], ids=["none", "integer", "fractional"])
def test_regression_a_fractional_microbatch_bound_left_an_optimal_plan_feasible(overhead, status):
    """Cause: the same, for micro-batched steps: Σ c / D = 8.5 (plus M · overhead) was kept;
    with integer costs and overhead every step costs an integer."""
    plan = balance_microbatches(ROUNDING, 2, max_tokens_per_microbatch=100, algorithm="greedy",
                                microbatch_overhead=overhead)
    optimum = brute_force_microbatches(ROUNDING, 2, 100, 1, microbatch_overhead=overhead)
    assert plan.num_microbatches == 1 and plan.step_cost == optimum.step_cost == 9.0 + overhead
    assert plan.status is status
    assert plan.lower_bound == (plan.step_cost if status is Status.OPTIMAL else 8.5 + overhead)


@pytest.mark.parametrize("algorithm", ["identity", "karmarkar_karp"])
def test_an_exact_sum_bound_is_lowered_below_the_float_loads_it_bounds(algorithm):
    """Cause: the equal-counts bound 23.1 + (3.9 + 2.4), rounded once, is 29.400000000000002, while the optimum's
    load 3.9 + 23.1 + 2.4 summed in item order is 29.4: a plan of makespan 31.1 carried a bound 1 ulp above the
    optimum, which check_plan refused (probe3 SW2)."""
    lengths, cost = [4, 3, 5, 11, 4, 2], CostModel(linear=1.0, quadratic=0.1)
    options = dict(cost=cost, max_tokens_per_rank=19, equal_counts=True)
    plan = balance(lengths, 2, algorithm=algorithm, **options)
    optimum = brute_force(lengths, 2, **options)
    assert plan.makespan == 31.1 and optimum.makespan == 29.4
    assert optimum.makespan * (1 - 1e-14) < plan.lower_bound <= optimum.makespan
    check_plan(plan, lengths, 2, **options)
    assert balance(lengths, 2, algorithm="lpt", **options).lower_bound == 29.4  # optimal: held at its makespan


def lpt_of_a_rescaled_half(problem):
    """Balance the first half rescaled with LPT on a `dataclasses.replace` of the problem (a natural way
    to reuse a kernel), the rest round robin: its sub-problem's orders are of other items."""
    half = problem.num_items // 2
    sub = dataclasses.replace(problem, lengths=problem.lengths[:half], item_costs=problem.item_costs[:half] * 10)
    rest = np.arange(problem.num_items - half) % problem.num_ranks
    return KernelResult(np.concatenate([lpt.solve(sub).assignment, rest]))


@pytest.mark.parametrize("cost", [None, CostModel(linear=1, quadratic=0.5)], ids=["linear", "quadratic"])
def test_regression_a_replace_with_other_items_shared_the_orders_that_certify_the_plan(register, cost):
    """`dataclasses.replace` of a problem shared its orders dict even with other lengths and costs: the
    sub-problem's sorted costs then bounded the caller's plan (24 certified optimal; the optimum is 23)."""
    lengths = [9, 8, 7, 1, 1, 1, 9, 8]
    name = register(Algorithm("rescaled_half", lpt_of_a_rescaled_half, kind="plugin", description="test"))
    plan = balance(lengths, 2, algorithm=name, cost=cost)
    optimum = brute_force(lengths, 2, cost=cost).makespan
    assert plan.lower_bound <= optimum
    assert plan.lower_bound == balance(lengths, 2, algorithm="lpt", cost=cost).lower_bound
    assert plan.status is Status.FEASIBLE or plan.makespan == optimum


def forging_orders(name):
    def kernel(problem):
        problem.orders[name] = np.full(problem.num_items, 1e9) if name == "sorted_costs" else \
            np.zeros(problem.num_items, dtype=np.int64)
        return KernelResult(np.arange(problem.num_items) % problem.num_ranks)
    return kernel


@pytest.mark.parametrize("key", ["sorted_costs", "cost_order", "length_order"])
def test_regression_a_kernel_writing_the_problem_orders_forged_the_certificate(register, key):
    """The orders were a plain dict a kernel could fill: round robin certified optimal at 18 (optimum 11)."""
    name = register(Algorithm(f"forges_{key}", forging_orders(key), kind="plugin", description="test"))
    with pytest.raises(RuntimeError, match=rf"algorithm {name!r} raised RuntimeError: .*orders\[{key!r}\]"):
        balance([9, 1, 1, 1, 8, 1], 2, algorithm=name)


def test_regression_a_microbatch_kernel_writing_the_problem_orders_was_not_refused(register):
    def kernel(problem, num_microbatches):
        problem.orders["length_order"] = np.arange(problem.num_items)[::-1].copy()
        return microbatch_greedy.solve(problem, num_microbatches)
    name = register(MicroBatchAlgorithm("forges_mb", kernel, kind="plugin", description="test"))
    with pytest.raises(RuntimeError, match=rf"{name!r} raised RuntimeError: .*orders\['length_order'\]"):
        balance_microbatches([9, 1, 1, 1, 8, 1], 2, max_tokens_per_microbatch=9, algorithm=name)


def round_robin_claiming(status):
    """Round robin with its own makespan as `lower_bound`: the field misread as "the plan's cost"."""
    def kernel(problem):
        assignment = np.arange(problem.num_items) % problem.num_ranks
        loads = np.bincount(assignment, weights=problem.item_costs, minlength=problem.num_ranks)
        return KernelResult(assignment, status, float(loads.max()))
    return kernel


OWN_BOUND = [9, 1, 1, 1, 8, 1, 5, 5]  # round robin: 23; the optimum 16 (equal counts too)


@pytest.mark.parametrize("options", [{}, {"equal_counts": True}, {"padded": True}], ids=["plain", "equal", "padded"])
@pytest.mark.parametrize("status", [Status.FEASIBLE, Status.OPTIMAL])
def test_regression_a_heuristic_plugin_s_own_makespan_as_bound_labelled_its_plan_optimal(register, options, status):
    """A plugin heuristic's `lower_bound` equal to its own makespan (feasible, or claiming optimal) made its
    plan `optimal` at 23 (optimum 16): a record neither exact nor orchmllm's does not certify its plans."""
    kernel = round_robin_claiming(status)
    name = register(Algorithm("own_bound", kernel, equal_counts=kernel, description="round robin, own bound"))
    plan = balance(OWN_BOUND, 2, algorithm=name, **options)
    assert plan.makespan > brute_force(OWN_BOUND, 2, **options).makespan
    assert plan.status is Status.FEASIBLE and plan.lower_bound < plan.makespan


def test_regression_a_heuristic_microbatch_plugin_s_own_step_cost_as_bound_labelled_its_plan_optimal(register):
    """With M fixed, a micro-batch plugin's bound equal to its own step cost labelled 22 optimal (optimum 15)."""
    def kernel(problem, num_microbatches):  # item i in cell (i mod D, i // D mod M)
        rank = np.arange(problem.num_items) % problem.num_ranks
        result = MicroBatchResult(rank, np.arange(problem.num_items) // problem.num_ranks % num_microbatches)
        return result._replace(lower_bound=step_cost_of(problem, result, num_microbatches))
    name = register(MicroBatchAlgorithm("own_step_bound", kernel, description="dealt, own bound"))
    lengths = [9, 1, 1, 8, 5, 5]
    plan = balance_microbatches(lengths, 2, max_tokens_per_microbatch=10, num_microbatches=3, algorithm=name)
    assert plan.step_cost > brute_force_microbatches(lengths, 2, 10, 3).step_cost
    assert plan.status is Status.FEASIBLE and plan.lower_bound < plan.step_cost


def test_regression_a_plugin_registered_as_ours_had_its_own_bound_certify_its_plan(register):
    """Cause: a record's certificates counted where its `kind` said "ours", a free argument of the public
    registration: round robin registered so was labelled optimal at 23 (optimum 16), a micro-batch plugin
    at 22 (15).  Only the records built into the registry count as orchmllm's own."""
    kernel = round_robin_claiming(Status.OPTIMAL)
    name = register(Algorithm("own_bound_as_ours", kernel, kind=Kind.OURS, description="round robin, own bound"))
    plan = balance(OWN_BOUND, 2, algorithm=name)
    assert plan.status is Status.FEASIBLE and plan.lower_bound < plan.makespan
    def dealt(problem, num_microbatches):
        rank = np.arange(problem.num_items) % problem.num_ranks
        result = MicroBatchResult(rank, np.arange(problem.num_items) // problem.num_ranks % num_microbatches)
        return result._replace(lower_bound=step_cost_of(problem, result, num_microbatches))
    name = register(MicroBatchAlgorithm("own_step_bound_as_ours", dealt, kind=Kind.OURS, description="dealt"))
    plan = balance_microbatches([9, 1, 1, 8, 5, 5], 2, max_tokens_per_microbatch=10, num_microbatches=3,
                                algorithm=name)
    assert plan.status is Status.FEASIBLE and plan.lower_bound < plan.step_cost


def step_cost_of(problem, result, num_microbatches):
    loads = cell_loads(problem, result.microbatch * problem.num_ranks + result.rank,
                       num_microbatches * problem.num_ranks)
    return step_cost(loads.reshape(num_microbatches, problem.num_ranks), 0.0)


@pytest.mark.parametrize("options", [{}, {"padded": True}, {"groups": [0, 1, 2, 3, 4, 5]},
                                     {"max_tokens_per_rank": 40}], ids=["plain", "padded", "groups", "capped"])
def test_regression_an_exact_plugin_s_false_optimal_at_its_own_cost_was_trusted(register, options):
    """probe20 P20-01: an `exact=True` plugin putting every item on rank 0 with its own makespan as bound (31)
    was labelled optimal, though LPT reaches 16: a claim above what orchmllm proves is weighed against its 'auto'
    plan, and one that plan beats is a false certificate naming the kernel."""
    def everything_on_rank_zero(problem):
        assignment = np.zeros(problem.num_items, dtype=np.int64)
        return KernelResult(assignment, Status.OPTIMAL, float(np.sum(problem.item_costs)))
    name = register(Algorithm("liar_exact", everything_on_rank_zero, exact=True, description="false proof"))
    with pytest.raises(RuntimeError, match=r"algorithm 'liar_exact' returned lower_bound=.*'auto' plan .* reaches a "
                                           r"makespan of .*certificate is false"):
        balance([9, 7, 5, 4, 3, 3], 2, algorithm=name, **options)


@pytest.mark.parametrize("lengths", [LENGTHS, [8, 7, 6, 5, 4]])
def test_regression_an_exact_plugin_claiming_lpt_s_plan_optimal_was_trusted(register, lengths):
    """probe20 P20-01 (recheck): LPT's own plan (7 on LENGTHS, 17 on [8, 7, 6, 5, 4]) claimed optimal passed a
    witness that was LPT; 'auto' reaches the optima (6, 15)."""
    name = register(Algorithm("lpt_liar", lpt_certified_by_its_makespan, exact=True, description="false proof"))
    with pytest.raises(RuntimeError, match=r"algorithm 'lpt_liar' returned lower_bound=(7|17)\.0, but orchmllm's "
                                           r"'auto' plan of the same problem reaches a makespan of (6|15)\.0"):
        balance(lengths, 2, algorithm=name)


@pytest.mark.parametrize("overhead", [0.0, 2.5])
def test_regression_an_exact_microbatch_plugin_s_false_optimal_at_its_own_cost_was_trusted(register, overhead):
    """probe20 P20-01, micro-batched: an `exact=True` kernel putting every item on rank 0, one per micro-batch,
    claiming its own step cost (31 at M = 6) was labelled optimal; 'auto' cells at the same M reach 16."""
    def rank_zero(problem, num_microbatches):
        result = MicroBatchResult(np.zeros(problem.num_items, dtype=np.int64),
                                  np.arange(problem.num_items) % num_microbatches, Status.OPTIMAL)
        return result._replace(lower_bound=step_cost_of(problem, result, num_microbatches))
    name = register(MicroBatchAlgorithm("liar_exact_mb", rank_zero, exact=True, description="false proof"))
    with pytest.raises(RuntimeError, match=r"algorithm 'liar_exact_mb' returned lower_bound=.* at 6 micro-batches "
                                           r"\(overhead included\), but orchmllm's 'auto' cells reach a step cost of"):
        balance_microbatches([9, 7, 5, 4, 3, 3], 2, max_tokens_per_microbatch=9, num_microbatches=6, algorithm=name,
                             microbatch_overhead=overhead)


def lpt_certified_by_its_makespan(problem):
    assignment = lpt.solve(problem).assignment
    loads = np.bincount(assignment, weights=problem.item_costs, minlength=problem.num_ranks)
    return KernelResult(assignment, Status.OPTIMAL, float(loads.max()))


def test_an_exact_plugin_still_certifies_its_plans(register):
    """`exact=True` is the record's word that its bounds are proofs (the conformance suite checks it)."""
    def kernel(problem):
        return KernelResult(np.array([0, 0, 1, 1, 1]), Status.OPTIMAL, 6.0)
    name = register(Algorithm("exact_plugin", kernel, exact=True, description="knows the optimum"))
    plan = balance(LENGTHS, 2, algorithm=name)
    assert plan.status is Status.OPTIMAL and plan.lower_bound == plan.makespan == 6.0


def orders_writer(problem):
    """The orders' one writer: `_keep` (public as `keep` until probe5 P5-02)."""
    return getattr(problem.orders, "_keep", None) or problem.orders.keep


def overwrite(array, value):
    array.setflags(write=True)
    array[:] = value


WRITES_PAST_THE_READ_ONLY_API = {  # what a kernel can try on the problem it is handed (probe5 P5-02)
    "orders' writer": lambda problem: orders_writer(problem)("sorted_costs", np.full(problem.num_items, 1e9)),
    "sorted costs' flag": lambda problem: overwrite(problem.sorted_costs, 1e9),
    "item costs' flag": lambda problem: overwrite(problem.item_costs, 1.0),
    "setattr orders": lambda problem: object.__setattr__(problem, "orders",
                                                         {"sorted_costs": np.full(problem.num_items, 1e9)}),
}


def round_robin_after(write):
    """Round robin (micro-batches: one item per cell, None when they are too few), after trying `write` on its
    problem (whatever the write raises is ignored)."""
    def kernel(problem, *num_microbatches):
        try:
            write(problem)
        except Exception:  # noqa: BLE001 - the write refused is fine; the plan's certificate is under test
            pass
        items = np.arange(problem.num_items)
        if not num_microbatches:
            return KernelResult(items % problem.num_ranks)
        if problem.num_items > num_microbatches[0] * problem.num_ranks:
            return None
        return MicroBatchResult(items % problem.num_ranks, items // problem.num_ranks)
    return kernel


@pytest.mark.parametrize("write", WRITES_PAST_THE_READ_ONLY_API.values(), ids=WRITES_PAST_THE_READ_ONLY_API)
def test_regression_the_certificate_read_the_problem_after_the_kernel_could_write_it(register, write):
    """Cause: the bound was computed after the kernel ran, of the problem object it was handed and the orders
    it holds: `orders.keep` (public), `setflags(write=True)` on the sorted costs or the item costs, or
    `object.__setattr__` of its orders made round robin `optimal` at 18 (optimum 11).  The bound is now
    computed before the kernel runs, the kernel gets a copy (`for_kernel`), and the arrays stay read-only."""
    lengths = [9, 1, 1, 1, 8, 1]
    name = register(Algorithm("writes_its_problem", round_robin_after(write), kind="plugin", description="test"))
    plan = balance(lengths, 2, algorithm=name)
    assert brute_force(lengths, 2).makespan == 11.0
    assert (plan.makespan, plan.lower_bound, plan.status) == (18.0, 11.0, Status.FEASIBLE)
    assert plan.loads.tolist() == [18.0, 3.0]


MICROBATCH_WRITES = {"cached cost bound": lambda problem: problem.__dict__.__setitem__("cost_bound", 1e9),
                     **WRITES_PAST_THE_READ_ONLY_API}


@pytest.mark.parametrize("num_microbatches", [3, None], ids=["M=3", "M free"])
@pytest.mark.parametrize("write", MICROBATCH_WRITES.values(), ids=MICROBATCH_WRITES)
def test_regression_the_step_certificate_read_the_problem_after_the_kernel_could_write_it(register, write,
                                                                                       num_microbatches):
    """Cause: as for `balance`; a micro-batch kernel setting the problem's cached `cost_bound` made its dealt
    cells `optimal` at 22 (optimum 15)."""
    lengths = [9, 1, 1, 8, 5, 5]
    name = register(MicroBatchAlgorithm("writes_its_problem", round_robin_after(write), kind="plugin",
                                        description="test"))
    plan = balance_microbatches(lengths, 2, max_tokens_per_microbatch=10, num_microbatches=num_microbatches,
                                algorithm=name)
    assert brute_force_microbatches(lengths, 2, 10, 3).step_cost == 15.0
    assert (plan.num_microbatches, plan.step_cost, plan.lower_bound, plan.status) == (3, 22.0, 15.0, Status.FEASIBLE)


def test_regression_a_kernel_setting_its_problem_s_budget_had_its_cells_checked_against_that(register):
    """Cause: the plan was checked against the fields of the problem object the kernel was handed: a kernel
    that raised `max_tokens_per_rank` (`max_tokens_per_microbatch`) on it had a plan over the caller's cap
    returned without a word."""
    def lift_cap(problem):
        object.__setattr__(problem, "max_tokens_per_rank", None)
        return KernelResult(np.zeros(problem.num_items, dtype=np.int64))
    name = register(Algorithm("lifts_the_cap", lift_cap, kind="plugin", description="test"))
    with pytest.raises(RuntimeError, match=r"'lifts_the_cap' put 21 tokens on rank 0, over max_tokens_per_rank=15"):
        balance([9, 1, 1, 1, 8, 1], 2, algorithm=name, max_tokens_per_rank=15)
    def lift_budget(problem, num_microbatches):
        object.__setattr__(problem, "max_tokens_per_microbatch", 10**9)
        zeros = np.zeros(problem.num_items, dtype=np.int64)
        return MicroBatchResult(zeros, zeros)
    name = register(MicroBatchAlgorithm("lifts_the_budget", lift_budget, kind="plugin", description="test"))
    with pytest.raises(RuntimeError, match=r"'lifts_the_budget' put 29 tokens in cell \(rank 0, micro-batch 0\), "
                                           r"over max_tokens_per_microbatch=10"):
        balance_microbatches([9, 1, 1, 8, 5, 5], 2, max_tokens_per_microbatch=10, num_microbatches=3, algorithm=name)


@pytest.mark.parametrize("call", ["balance", "balance_microbatches"])
def test_regression_a_plan_kept_the_kernel_s_own_array_which_a_buffer_reusing_kernel_rewrote(register, call):
    """Cause: make_plan (and a micro-batch result's check) kept a kernel's contiguous int64 array as it was, so a
    kernel that fills a buffer it reuses and returns a view of it rewrote every plan it had made: the first plan's
    assignment became the second's, its loads and tokens no longer its items' (probe6 P6-12)."""
    buffer = np.zeros(16, dtype=np.int64)

    def round_robin_in_a_buffer(problem, *num_microbatches):
        items = np.arange(problem.num_items)
        buffer[:problem.num_items] = (items + int(problem.lengths[0])) % problem.num_ranks
        if not num_microbatches:
            return KernelResult(buffer[:problem.num_items])
        if problem.num_items > num_microbatches[0] * problem.num_ranks:
            return None
        return MicroBatchResult(buffer[:problem.num_items], items // problem.num_ranks)
    if call == "balance":
        name = register(Algorithm("buffered", round_robin_in_a_buffer, kind="plugin", description="test"))
        plan = functools.partial(balance, num_ranks=2, algorithm=name)
    else:
        name = register(MicroBatchAlgorithm("buffered", round_robin_in_a_buffer, kind="plugin", description="test"))
        plan = functools.partial(balance_microbatches, num_ranks=2, max_tokens_per_microbatch=9, algorithm=name)
    first = plan([5, 4, 3, 2])
    before = first.digest()
    plan([6, 4, 3, 2])
    assert first.digest() == before
    assert (first.assignment if call == "balance" else first.rank).tolist() == [1, 0, 1, 0]


def test_regression_a_bound_below_the_cost_on_exact_sums_was_promoted_to_a_proof(register):
    """probe26 P26-03: on integer costs whose every sum is exact, an exact plugin's honest bound 1 below its plan
    (2**52 + 1 against 2**52 + 2, the optimum 2**52 + 1) was taken as a proof: no rounding explains it, so it stays
    a bound, in `balance` and in `balance_microbatches` alike."""
    half = 2.0**51
    costs = [half + 1, half + 1, half, half]  # the plan pairs the two larger items; the optimum pairs unlike ones

    def pairs_the_larger(problem):
        return KernelResult(np.array([0, 0, 1, 1]), Status.FEASIBLE, 2 * half + 1)

    def pairs_the_larger_cells(problem, num_microbatches):
        return MicroBatchResult(np.array([0, 0, 1, 1]), np.zeros(4, dtype=np.int64), Status.FEASIBLE, 2 * half + 1)

    plain = balance([1, 1, 1, 1], 2, costs=costs, algorithm=register(Algorithm("honest_pairs", pairs_the_larger,
                                                                               exact=True, description="test")))
    assert brute_force([1, 1, 1, 1], 2, costs=costs).makespan == 2 * half + 1 < plain.makespan
    cells = balance_microbatches([1, 1, 1, 1], 2, costs=costs, max_tokens_per_microbatch=2, num_microbatches=1,
                                 algorithm=register(MicroBatchAlgorithm("honest_pairs_mb", pairs_the_larger_cells,
                                                                        exact=True, description="test")))
    for plan, cost in ((plain, plain.makespan), (cells, cells.step_cost)):
        assert plan.status is Status.FEASIBLE and plan.lower_bound < cost == 2 * half + 2

"""orchmllm.testing: the oracles agree with each other, check_plan catches tampered plans,
the strategies reach what they promise, and check_conformance passes every registered
algorithm while it catches deliberately broken kernels with a message naming the fault."""

import dataclasses
import itertools
import random
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

import orchmllm.study.peers  # noqa: F401  (registers the peers' heuristics, which must conform too)
from orchmllm import balance_microbatches
from orchmllm.balancers import (ALGORITHMS, MICROBATCH_ALGORITHMS, CostModel, InfeasibleError, KernelResult, Status,
                                balance, make_problem, microbatch_algorithms)
from orchmllm.balancers.kernels import lpt
from orchmllm.balancers.kernels.lpt import greedy_unpadded
from orchmllm.balancers.microbatch.plan import MicroBatchResult, cell_loads, step_cost
from orchmllm.balancers.problem import require_within_cap
from orchmllm.balancers.registry import Algorithm, MicroBatchAlgorithm
from orchmllm.testing import (ConformanceError, ConformanceReport, MicroBatchConformanceReport, brute_force,
                              brute_force_microbatches, check_conformance, check_microbatch_conformance,
                              check_microbatch_plan, check_plan, exact, fewest_microbatches, hard_cases, oracles,
                              padded_optimum, multimodal_batches, problems, topologies)
from orchmllm.testing import conformance
from orchmllm.testing.harness import PROCESS_CASES, compare_processes

NAMES = sorted(ALGORITHMS)


@settings(max_examples=80)
@given(case=problems(max_items=6, max_ranks=3, padded=True))
def test_padded_dp_agrees_with_brute_force_including_infeasibility(case):
    """Brute force over all plans also checks the sorted-runs structure the DP relies on."""
    everything = brute_force(case.lengths, case.num_ranks, **case.options)
    runs = padded_optimum(case.lengths, case.num_ranks, cost=case.cost, max_tokens_per_rank=case.max_tokens_per_rank)
    assert (everything.makespan, everything.min_cap) == (runs.makespan, runs.min_cap)


@settings(max_examples=15)
@given(case=problems(max_items=9, max_ranks=3, padded=False, caps=False))
def test_exact_beyond_brute_force_sizes_agrees_with_brute_force(case):
    optimum = brute_force(case.lengths, case.num_ranks, cost=case.cost)
    original = oracles.BRUTE_FORCE_MAX_PLANS
    oracles.BRUTE_FORCE_MAX_PLANS = 1  # force the exact solver's path
    try:
        proven = exact(case.lengths, case.num_ranks, cost=case.cost)
    finally:
        oracles.BRUTE_FORCE_MAX_PLANS = original
    assert proven.method == "ilp" and proven.makespan == optimum.makespan


def test_brute_force_refuses_instances_too_large_to_enumerate():
    with pytest.raises(ValueError, match=r"brute force over 4\*\*11 = 4194304 plans exceeds"):
        brute_force([1] * 11, 4)


def test_brute_force_constraints_by_hand():
    assert brute_force([6, 1, 1, 1], 2).makespan == 6.0
    assert brute_force([6, 1, 1, 1], 2, equal_counts=True).makespan == 7.0
    assert brute_force([6, 1, 1, 1], 2, groups=[0, 1, 2, 0]).makespan == 7.0
    assert brute_force([6, 1, 1, 1], 2, costs=[1, 5, 5, 1]).makespan == 6.0
    # groups that force more than ceil(n/D) items together make equal counts impossible
    nothing = brute_force([1, 1, 1, 1], 2, equal_counts=True, groups=[0, 0, 0, 1])
    assert not nothing.feasible and nothing.min_cap is None


def tampered(plan, **changes):
    return dataclasses.replace(plan, **changes)


@pytest.mark.parametrize("change, message", [
    (lambda plan: tampered(plan, loads=plan.loads + 1), r"loads \[.*\] differ from the items'"),
    (lambda plan: tampered(plan, tokens=plan.tokens[::-1].copy()), r"tokens \[.*\] differ"),
    (lambda plan: tampered(plan, makespan=plan.makespan - 1), "makespan 9.0 != the largest load 10.0"),
    (lambda plan: tampered(plan, lower_bound=9.5), r"lower bound 9.5 exceeds the optimum 9.0"),
    (lambda plan: tampered(plan, lower_bound=1.0), r"lower bound 1.0 is below max\(total / D, the k\+1 smallest"),
    (lambda plan: tampered(plan, status=Status.OPTIMAL), "status optimal with makespan 10.0 and bound 9.0"),
    (lambda plan: tampered(plan, assignment=np.array([0, 1, 1, 0, 2])), "item 4 goes to rank 2, outside"),
    (lambda plan: tampered(plan, num_ranks=3), "was made for 3 ranks"),
], ids=["loads", "tokens", "makespan", "bound-above-optimum", "bound-too-weak", "status", "rank-range", "ranks"])
def test_check_plan_catches_a_tampered_plan(change, message):
    lengths = [5, 4, 3, 3, 3]
    plan = balance(lengths, 2, algorithm="lpt")
    check_plan(plan, lengths, 2)
    with pytest.raises(AssertionError, match=message):
        check_plan(change(plan), lengths, 2)


def test_check_plan_checks_caps_and_constraints():
    plan = balance([5, 4, 3, 3, 3], 2, algorithm="lpt")  # ranks hold 8 and 10 tokens, 2 and 3 items
    with pytest.raises(AssertionError, match="rank 1 holds 10 tokens > max_tokens_per_rank=9"):
        check_plan(plan, [5, 4, 3, 3, 3], 2, max_tokens_per_rank=9, optimum=None)
    with pytest.raises(AssertionError, match=r"group 7 is split over ranks \[0, 1\]"):
        check_plan(plan, [5, 4, 3, 3, 3], 2, groups=[7, 7, 1, 2, 3])
    check_plan(plan, [5, 4, 3, 3, 3], 2, equal_counts=True)
    lopsided = balance([5, 1, 1, 1, 1], 2, algorithm="lpt")  # 5 alone, four 1s together
    with pytest.raises(AssertionError, match=r"item counts per rank \[1, 4\] are not all floor or ceil of 5/2"):
        check_plan(lopsided, [5, 1, 1, 1, 1], 2, equal_counts=True)


def test_check_plan_accepts_a_plan_of_explicit_costs():
    plan = balance([5, 4, 3, 3], 2, costs=[1, 2, 3, 4])  # such a plan has no cost model
    check_plan(plan, [5, 4, 3, 3], 2, costs=[1, 2, 3, 4])
    with pytest.raises(AssertionError, match="was made for 2 ranks, padded=False, cost=None"):
        check_plan(plan, [5, 4, 3, 3], 2)


@pytest.mark.parametrize("change, message", [
    (lambda plan: tampered(plan, cell_loads=plan.cell_loads + 1), r"cell loads \[.*\] differ from the items'"),
    (lambda plan: tampered(plan, step_cost=plan.step_cost - 1), r"step cost 10.0 != Σ_m max_r load"),
    (lambda plan: tampered(plan, rank=np.zeros(6, dtype=np.int64), microbatch=np.zeros(6, dtype=np.int64),
                           cell_loads=np.array([[22.0, 0.0], [0.0, 0.0]]), cell_tokens=np.array([[22, 0], [0, 0]]),
                           step_cost=22.0),
     r"cell \(rank 0, micro-batch 0\) holds 22 tokens > max_tokens_per_microbatch=8"),
    (lambda plan: tampered(plan, status=Status.FEASIBLE), "status feasible with step cost 11.0 and bound 11.0"),
], ids=["cell-loads", "step-cost", "budget", "status"])
def test_check_microbatch_plan_catches_a_tampered_plan(change, message):
    lengths = [6, 5, 4, 3, 2, 2]
    plan = balance_microbatches(lengths, 2, max_tokens_per_microbatch=8)
    optimum = brute_force_microbatches(lengths, 2, 8, plan.num_microbatches)
    check_microbatch_plan(plan, lengths, 2, 8, optimum=optimum)
    with pytest.raises(AssertionError, match=message):
        check_microbatch_plan(change(plan), lengths, 2, 8)


def test_micro_batch_oracle_agrees_with_the_one_rank_oracle_at_one_micro_batch():
    """With M = 1 a step is one plan over the ranks: the two brute forces must agree, caps included."""
    for lengths, ranks, budget in (([5, 4, 3, 3, 3], 2, 9), ([5, 4, 3, 3, 3], 2, 8), ([7, 1, 1, 2], 3, 7)):
        one = brute_force(lengths, ranks, max_tokens_per_rank=budget)
        step = brute_force_microbatches(lengths, ranks, budget, 1)
        assert step.step_cost == one.makespan and (step.rank is None) == (one.assignment is None)
    assert fewest_microbatches([5, 4, 3, 3, 3], 2, 8) == 2


def test_problems_reach_roomy_tight_and_infeasible_caps_and_heavy_tails():
    # Existence only: the first example found will do, so no shrinking (which took 6-27 s), and derandomised so
    # the search is the same on every run.
    first = settings(phases=[Phase.generate], database=None, derandomize=True, max_examples=5000)

    def rejected(case):
        try:
            make_problem(case.lengths, case.num_ranks, **case.options)
        except InfeasibleError:
            return True
        return False

    assert rejected(find(problems(), rejected, settings=first))
    tight = find(problems(padded=False), lambda case: case.max_tokens_per_rank is not None and not rejected(case)
                 and not brute_force(case.lengths, case.num_ranks, **case.options).feasible, settings=first)
    assert tight.max_tokens_per_rank >= max(tight.lengths)
    assert max(find(problems(), lambda case: max(case.lengths) >= 512, settings=first).lengths) >= 512
    assert len(set(find(problems(), lambda case: len(case.lengths) >= 6 and len(set(case.lengths)) <= 2,
                        settings=first).lengths)) <= 2


# -- check_conformance on every registered algorithm ------------------------------------

@pytest.mark.background
@pytest.mark.parametrize("name", NAMES)
def test_every_registered_algorithm_conforms(name):
    """Every property but the process check, which `test_every_registered_algorithm_plans_alike_in_other_processes`
    runs for all of them at once."""
    report = check_conformance(name, examples=15, processes=False)
    assert report.algorithm == name and report.plans_certified > 0 and report.repeated_calls >= 700
    record = ALGORITHMS[name]
    expected = [constraint for constraint, applies in (("costs", record.unpadded), ("equal_counts",
                record.equal_counts is not None), ("groups", record.unpadded)) if applies]
    assert list(report.constraints) == expected and (report.constrained_plans > 0 or not expected)


class EveryRegisteredAlgorithm:
    """Every registered algorithm as one suite target, each with the process check's seeded cases of
    `check_conformance`'s defaults: two other processes recompute them all, not two per algorithm (each
    spends most of its time importing orchmllm).  Importable by those processes from this module."""

    name = "every registered algorithm"

    def __init__(self):
        self.targets = {name: conformance._Target(name, None, None, None, None, None) for name in NAMES}

    def cases(self) -> list:
        return [(name, case) for name, target in self.targets.items()
                for case in conformance._seeded_cases(target, PROCESS_CASES, 6, 3, seed=20240531)]

    def run(self, case):
        name, inner = case
        return self.targets[name].run(inner)

    def describe(self, case) -> str:
        name, inner = case
        return f"{name}: {self.targets[name].describe(inner)}"


@pytest.mark.background
def test_every_registered_algorithm_plans_alike_in_other_processes():
    every = EveryRegisteredAlgorithm()
    assert compare_processes(every, every.cases()) == PROCESS_CASES * len(NAMES)


# -- ... and on deliberately broken kernels ---------------------------------------------

def lpt_assignment(problem):
    return greedy_unpadded(problem.item_costs, problem.num_ranks)


def claims_false_optimality(problem):
    """Deals items round robin and claims the plan optimal."""
    assignment = np.arange(problem.num_items, dtype=np.int64) % problem.num_ranks
    require_within_cap(problem, assignment, "round robin")
    makespan = float(np.bincount(assignment, weights=problem.item_costs, minlength=problem.num_ranks).max())
    return KernelResult(assignment, Status.OPTIMAL, lower_bound=makespan)


def everything_on_rank_zero(problem):
    """Ignores the cap."""
    return KernelResult(np.zeros(problem.num_items, dtype=np.int64))


def refuses_without_a_larger_cap(problem):
    """Gives up under any cap and names the same cap as the one to try."""
    if problem.max_tokens_per_rank is not None:
        raise InfeasibleError("no room", min_cap=problem.max_tokens_per_rank)
    return KernelResult(lpt_assignment(problem))


CALLS = itertools.count()


def shifting_ranks(problem):
    """Another plan on every call, as from an unseeded generator, but surely so: a round robin that
    starts one rank further on each call (LPT under a cap, so only the non-determinism is wrong)."""
    if problem.max_tokens_per_rank is not None:
        return lpt.solve(problem)
    return KernelResult((np.arange(problem.num_items) + next(CALLS)) % problem.num_ranks)


def list_scheduling_in_input_order(problem):
    """Each item, as given, to the least loaded rank: LPT without the sort."""
    loads = np.zeros(problem.num_ranks)
    assignment = np.empty(problem.num_items, dtype=np.int64)
    for item, item_cost in enumerate(problem.item_costs):
        assignment[item] = int(np.argmin(loads))
        loads[assignment[item]] += item_cost
    require_within_cap(problem, assignment, "list scheduling")
    return KernelResult(assignment)


def returns_its_bare_assignment(problem):
    """LPT's assignment without the KernelResult around it (check_conformance raised an AttributeError)."""
    return lpt_assignment(problem)


@pytest.mark.parametrize("kernel, message", [
    (claims_false_optimality, r"claims optimality at makespan \S+ but the optimum \(brute_force\) is"),
    (everything_on_rank_zero, r"everything_on_rank_zero ignores the memory cap: .* over max_tokens_per_rank="),
    (refuses_without_a_larger_cap, r"refuses_without_a_larger_cap refused its input with a contradiction: .* raised "
                                   r"InfeasibleError with min_cap=\d+, not above the max_tokens_per_rank=\d+ it was"),
    (shifting_ranks, "shifting_ranks is not deterministic: the same input gave"),
    (list_scheduling_in_input_order, r"list_scheduling_in_input_order depends on input order: makespan"),
    (returns_its_bare_assignment, r"returns_its_bare_assignment returned a broken plan: algorithm "
                                  r"'returns_its_bare_assignment' returned a ndarray; expected a KernelResult; input"),
], ids=["false-optimality", "ignores-caps", "unusable-min-cap", "non-deterministic", "input-order", "bare-assignment"])
def test_broken_kernel_fails_with_a_message_naming_its_fault(kernel, message):
    with pytest.raises(ConformanceError, match=message):
        check_conformance(kernel, padded=False, processes=False, examples=30)


def optimal_by_its_own_costs(problem):
    """Proves its plan optimal for the costs f(length) of the problem's model (the default one when
    `problem.cost` is None): it ignores `problem.item_costs`, the form in which explicit costs reach a
    kernel, and groups too, as super-items of summed costs.  Exact on unconstrained problems."""
    optimum = brute_force(problem.lengths, problem.num_ranks, cost=problem.cost,
                          max_tokens_per_rank=problem.max_tokens_per_rank)
    if not optimum.feasible:
        raise InfeasibleError("no plan fits the cap", min_cap=optimum.min_cap)
    return KernelResult(np.array(optimum.assignment), Status.OPTIMAL, lower_bound=optimum.makespan)


IGNORES_EQUAL_COUNTS = Algorithm("lpt_ignoring_equal_counts", lpt.solve, equal_counts=lpt.solve,
                                 description="runs plain LPT under equal_counts=True")


@pytest.mark.parametrize("target, constraint, message", [
    (IGNORES_EQUAL_COUNTS, "equal_counts",
     r"lpt_ignoring_equal_counts ignores `equal_counts=True`: .* put \d+ items on rank \d+; `equal_counts` allows "
     r".*equal_counts=True"),
    (optimal_by_its_own_costs, "costs",  # a bound above its makespan: refused as a false certificate
     r"optimal_by_its_own_costs\b.* (claim(s|ed) optimality at|returned lower_bound=\S+ above) the makespan .*, "
     r"costs=\["),
    (optimal_by_its_own_costs, "groups",
     r"optimal_by_its_own_costs\b.* claim(s|ed) optimality at makespan .*, groups=\["),
], ids=["ignores-equal-counts", "ignores-explicit-costs", "ignores-group-costs"])
def test_kernel_that_ignores_a_constraint_fails_naming_it(target, constraint, message):
    if target is optimal_by_its_own_costs:  # conforms where there is no constraint (at brute-force sizes)
        check_conformance(target, padded=False, processes=False, examples=10, max_items=4, constraints=())
    with pytest.raises(ConformanceError, match=message):
        check_conformance(target, padded=False, processes=False, examples=30, max_items=4, constraints=[constraint])


def test_regression_one_constraint_given_as_a_str_was_read_letter_by_letter():
    """Cause: `constraints="costs"` was iterated character by character: "must be names in (...); got ['c', 'o',
    's', 't']" (probe8 P8-08).  A str is one name."""
    report = check_conformance("lpt", padded=False, processes=False, examples=3, max_items=4, constraints="costs")
    assert report.constraints == ("costs",)


def test_constraints_a_target_cannot_take_are_refused():
    with pytest.raises(ValueError, match=r"lpt_kernel cannot be checked under \['equal_counts'\]"):
        check_conformance(lpt_kernel, padded=False, constraints=["equal_counts"])
    with pytest.raises(ValueError, match=r"`constraints` must be names in \('costs', 'equal_counts', 'groups'\)"):
        check_conformance("lpt", constraints=["sorted"])


def lpt_kernel(problem):
    return lpt.solve(problem)


HASH_ORDERED = textwrap.dedent('''
    import numpy as np
    from orchmllm.balancers import KernelResult
    from orchmllm.balancers.problem import require_within_cap

    def hash_ordered_ranks(problem):
        """Deals items round robin in the order of their names' str hashes (which change per process)."""
        order = sorted(range(problem.num_items), key=lambda item: hash(f"item {item}"))
        assignment = np.empty(problem.num_items, dtype=np.int64)
        assignment[order] = np.arange(problem.num_items) % problem.num_ranks
        require_within_cap(problem, assignment, "hash-ordered round robin")
        return KernelResult(assignment)
''')


@pytest.mark.background
def test_kernel_that_depends_on_the_hash_seed_fails_across_processes(tmp_path):
    """In conftest's background process (`run_background`), whose `sys.path` gains the kernel's folder."""
    (tmp_path / "hash_ordered_kernel.py").write_text(HASH_ORDERED)
    sys.path.insert(0, str(tmp_path))
    from hash_ordered_kernel import hash_ordered_ranks

    with pytest.raises(ConformanceError, match="hash_ordered_ranks is not deterministic across processes"):
        check_conformance(hash_ordered_ranks, padded=False, order_invariant=False, examples=10, max_ranks=4)


def test_a_kernel_that_cannot_be_pickled_is_named_for_the_process_check():
    with pytest.raises(TypeError, match=r"cannot check <lambda> across processes: its kernel cannot be pickled .*; "
                                        r"define the kernel in a module another process can import .*, or pass "
                                        r"processes=False"):
        check_conformance(lambda problem: lpt.solve(problem), padded=False, examples=3)


# -- regressions: what the suite let through -----------------------------------------------

def lpt_claiming_optimality_beyond(items):
    def kernel(problem):
        """LPT, claiming its plan optimal (a bound equal to its makespan) from `items` items on."""
        result = lpt.solve(problem)
        if problem.num_items < items:
            return result
        makespan = float(np.bincount(result.assignment, weights=problem.item_costs, minlength=problem.num_ranks).max())
        return KernelResult(result.assignment, Status.OPTIMAL, lower_bound=makespan)
    kernel.__name__ = f"lpt_claiming_optimality_from_{items}_items"
    return kernel


@pytest.mark.parametrize("max_items", [8, 4])
def test_regression_lpt_claiming_optimality_from_7_items_passed(max_items):
    """Cause: the suite met LPT's bad cases only by chance (at max_items=8 it accepted an LPT that
    claims optimality from 7 items on), and the determinism runs, up to twice max_items, were
    never certified.  Graham's instances (LPT 4D - 1, optimum 3D; 7 items at D = 3) now run
    first, and the determinism runs are certified where the exact solver proves the optimum."""
    with pytest.raises(ConformanceError, match=r"lpt_claiming_optimality_from_7_items: plan of .* claims optimality "
                                               r"at makespan 11.0 but the optimum \(brute_force\) is 9.0; input "
                                               r"lengths=\[5, 5, 4, 4, 3, 3, 3\], num_ranks=3"):
        check_conformance(lpt_claiming_optimality_beyond(7), padded=False, processes=False, examples=5,
                          max_items=max_items, constraints=())


def swaps_two_items_now_and_then(problem):
    """LPT, but in 2 % of calls (drawn from Python's global generator) items 0 and 1 change ranks."""
    assignment = np.array(lpt.solve(problem).assignment)
    if problem.num_items >= 2 and random.random() < 0.02:
        assignment[[0, 1]] = assignment[[1, 0]]
    return KernelResult(assignment)


def test_regression_hypothesis_reseeding_hid_a_kernel_that_changes_its_plan_in_2_percent_of_calls():
    """Cause: the determinism runs happened inside Hypothesis, which reseeds the global random
    generators for every example: a kernel drawing from them repeated the same few draws (none
    below 2 %) and passed at any number of examples.  Each case now also runs ~70 times outside."""
    random.seed(1)
    with pytest.raises(ConformanceError, match=r"swaps_two_items_now_and_then is not deterministic: call \d+ of \d+ "
                                               r"on the same input gave"):
        check_conformance(swaps_two_items_now_and_then, padded=False, processes=False, examples=5, max_items=4)


@pytest.mark.parametrize("arguments, error, message", [
    (dict(examples=0), ValueError, r"`examples` must be >= 1; got 0"),
    (dict(max_ranks=0), ValueError, r"`max_ranks` must be >= 1; got 0"),
    (dict(max_items=0), ValueError, r"`max_items` must be >= 1; got 0"),
    (dict(examples=2.5), TypeError, r"`examples` must be an int; got float"),
    (dict(processes="yes"), TypeError, r"`processes` must be a bool"),
    (dict(time_limit=-1.0), ValueError, r"`time_limit` must be finite and > 0"),
], ids=["examples", "max_ranks", "max_items", "float-examples", "processes", "time_limit"])
def test_regression_bad_suite_arguments_raised_hypothesis_internals(arguments, error, message):
    """Cause: the arguments went to Hypothesis unchecked (`examples=0` and `max_ranks=0` failed in
    its settings and strategies)."""
    for check in (check_conformance, check_microbatch_conformance):
        with pytest.raises(error, match=message):
            check("greedy" if check is check_microbatch_conformance else "lpt", **arguments)


def _unpadded_round_robin(problem, num_microbatches):
    cell = np.arange(problem.num_items, dtype=np.int64)
    return MicroBatchResult(cell % problem.num_ranks, cell // problem.num_ranks % num_microbatches)


@pytest.mark.parametrize("check, target, padded, kind", [
    (check_conformance, "padded", False, "unpadded"),
    (check_conformance, Algorithm("only_unpadded_record", lpt_kernel, padded=False), True, "padded"),
    (check_microbatch_conformance, MicroBatchAlgorithm("only_unpadded_cells", _unpadded_round_robin, padded=False),
     True, "padded"),
], ids=["built-in padded", "plugin record", "micro-batch record"])
def test_regression_a_kind_the_record_does_not_solve_was_run_and_blamed_on_the_kernel(check, target, padded, kind):
    """Cause: `padded=` was taken as the kind to run without asking the record, so `check_conformance('padded',
    padded=False)` ran the padded-only kernel on unpadded cases and raised ConformanceError calling its
    certificate false (probe10 P10-12).  A ValueError naming `padded` and the record, before any case runs."""
    name = target if isinstance(target, str) else target.name
    with pytest.raises(ValueError, match=rf"^`padded`={padded}: algorithm '{name}' does not solve {kind} problems "
                                         rf"\(its record says {kind}=False\); pass padded={not padded}"):
        check(target, padded=padded, processes=False, examples=2)


@pytest.mark.parametrize("strategy, arguments, message", [
    (problems, dict(max_items=0), r"`max_items` must be >= 1; got 0"),
    (problems, dict(max_ranks=0), r"`max_ranks` must be >= 1; got 0"),
    (problems, dict(min_ranks=-1), r"`min_ranks` must be >= 1; got -1"),
    (problems, dict(min_items=5, max_items=2),
     r"`min_items` must be at most `max_items`; got min_items=5 > max_items=2"),
    (multimodal_batches, dict(max_samples=0), r"`max_samples` must be >= 1; got 0"),
    (multimodal_batches, dict(max_segments=-1), r"`max_segments` must be >= 0; got -1"),
    (topologies, dict(max_nodes=0), r"`max_nodes` must be >= 1; got 0"),
], ids=["max_items", "max_ranks", "min_ranks", "min-above-max", "max_samples", "max_segments", "max_nodes"])
def test_regression_degenerate_strategy_sizes_raised_hypothesis_internals_at_the_first_draw(
        strategy, arguments, message):
    """Cause: the public strategies took their sizes unchecked, so `problems(max_items=0)` was built and failed at
    its first draw with "Cannot sample from a length-zero sequence", naming no argument (probe3 UE6)."""
    with pytest.raises(ValueError, match=message):
        strategy(**arguments)


MAIN_KERNEL = textwrap.dedent('''
    from orchmllm.balancers.kernels import lpt
    from orchmllm.testing import check_conformance

    def my_kernel(problem):
        return lpt.solve(problem)

    try:
        check_conformance(my_kernel, padded=False, examples=2, max_items=3)
    except TypeError as error:
        print(error)
''')


@pytest.mark.background
def test_regression_a_kernel_defined_in_main_failed_the_process_check_with_a_pickle_traceback(tmp_path):
    """Cause: a kernel in `__main__` pickles by reference, and the child process (whose `__main__`
    is another) failed to unpickle it: the parent showed the child's traceback."""
    (tmp_path / "script.py").write_text(MAIN_KERNEL)
    done = subprocess.run([sys.executable, str(tmp_path / "script.py")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "cannot check my_kernel across processes: another process could not import its kernel (AttributeError: "
        "Can't get attribute 'my_kernel' on <module '__main__' (built-in)>); define the kernel in a module another "
        "process can import (not __main__: a script or an interactive session), or pass processes=False")


# -- the micro-batch suite -----------------------------------------------------------------

@pytest.mark.background
@pytest.mark.parametrize("name", [record.name for record in microbatch_algorithms(kind="ours")])
def test_every_microbatch_algorithm_of_ours_conforms(name):
    report = check_microbatch_conformance(name, examples=15, processes=name == "auto")
    assert report.algorithm == name and report.plans_certified > 0 and report.repeated_calls >= 700
    assert report.plans_optimal == report.plans_certified or not MICROBATCH_ALGORITHMS[name].exact
    assert report.processes_compared == (8 if name == "auto" else 0)


def test_regression_check_conformance_of_a_microbatch_record_raised_a_type_error():
    """Cause: check_conformance knew balancing kernels only and called a micro-batch record with
    one argument; it now runs the micro-batch suite (a name of ours that both registries hold,
    as 'exact', stays the balancing algorithm's)."""
    report = check_conformance(MICROBATCH_ALGORITHMS["greedy"], examples=5, processes=False)
    assert isinstance(report, MicroBatchConformanceReport) and report.algorithm == "greedy"
    assert isinstance(check_conformance("exact", examples=2, processes=False, max_items=3), ConformanceReport)


def microbatch_round_robin_claiming_optimality(problem, num_microbatches):
    """Items dealt to the cells in turn (None over the budget), every plan claimed optimal: its
    bound is its own Σ_m max_r load."""
    cells = num_microbatches * problem.num_ranks
    cell = np.arange(problem.num_items) % cells
    result = MicroBatchResult(cell % problem.num_ranks, cell // problem.num_ranks)
    if np.bincount(cell, weights=problem.lengths, minlength=cells).max(initial=0) > problem.max_tokens_per_microbatch:
        return None
    loads = cell_loads(problem, cell, cells).reshape(num_microbatches, problem.num_ranks)
    return result._replace(status=Status.OPTIMAL, lower_bound=step_cost(loads, 0.0))


def microbatch_all_in_cell_zero(problem, num_microbatches):
    zeros = np.zeros(problem.num_items, dtype=np.int64)
    return MicroBatchResult(zeros, zeros)


def microbatch_short_result(problem, num_microbatches):
    return MicroBatchResult(np.zeros(problem.num_items + 1, dtype=np.int64),
                            np.zeros(problem.num_items, dtype=np.int64))


def microbatch_never_packs(problem, num_microbatches):
    return None


def microbatch_shifting(problem, num_microbatches):
    """One item per cell, from a cell further on in 2 % of calls (Python's global generator)."""
    if problem.num_items > num_microbatches * problem.num_ranks:
        return None
    cell = (np.arange(problem.num_items) + (random.random() < 0.02)) % (num_microbatches * problem.num_ranks)
    return MicroBatchResult(cell % problem.num_ranks, cell // problem.num_ranks)


@pytest.mark.parametrize("kernel, options, message", [
    (microbatch_round_robin_claiming_optimality, {"padded": False},
     r"step cost 7.0 and bound 7.0 do not bracket the optimum 6.0; input lengths=\[3, 3, 2, 2, 2\]"),
    (microbatch_all_in_cell_zero, {}, r"microbatch_all_in_cell_zero returned a broken plan: .* put \d+ tokens in "
                                      r"cell \(rank 0, micro-batch 0\), over max_tokens_per_microbatch"),
    (microbatch_short_result, {}, r"returned a broken plan: algorithm 'microbatch_short_result' returned `rank` of "
                                  r"shape \(\d+,\) and dtype int64; expected \(\d+,\) ints"),
    (microbatch_never_packs, {"exact": True}, r"microbatch_never_packs is declared exact but found no packing"),
    (microbatch_shifting, {}, r"microbatch_shifting is not deterministic: call \d+ of \d+ on the same input"),
], ids=["false-optimality", "over-budget", "malformed", "exact-never-packs", "non-deterministic"])
def test_broken_microbatch_kernel_fails_with_a_message_naming_its_fault(kernel, options, message):
    random.seed(1)
    with pytest.raises(ConformanceError, match=message):
        check_microbatch_conformance(kernel, processes=False, examples=20, **options)


PIPELINE_SLIPS = {  # (oracle, arguments) -> the ValueError/TypeError it must raise, naming the argument
    "nan forward": ("simulate", ([[np.nan, 1], [1, 1]], [[2, 2], [2, 2]]),
                    r"`forward` must hold finite non-negative numbers; got nan at \[0, 0\]"),
    "negative backward": ("simulate", ([[1, 1], [1, 1]], [[-1, 2], [2, 2]]),
                          r"`backward` must hold finite non-negative numbers; got -1.0 at \[0, 0\]"),
    "one row for two stages": ("simulate", ([[1, 1]], [[2, 2]]),
                               r"`forward` must be a \(P=2, M\) array of seconds, one row per stage; "
                               r"got shape \(1, 2\)"),
    "backward of another shape": ("simulate", ([[1, 1], [1, 1]], [[2, 2, 2], [2, 2, 2]]),
                                  r"`backward` must have `forward`'s shape \(2, 2\); got \(2, 3\)"),
    "ragged forward": ("simulate", ([[1, 1], [1]], [[2, 2], [2, 2]]), r"`forward` must be .*; got a ragged"),
    "nan replica cost": ("replica", ([np.nan, 1.0],), r"`cell_costs` must hold finite non-negative numbers; got nan"),
    "2-D replica costs": ("replica", ([[1, 2], [3, 4]],),
                          r"`cell_costs` must be a 1-D sequence .*; got shape \(2, 2\)"),
    "costs and lengths of other sizes": ("brute", ([1.0, 2.0], [1], 1, 2, 10),
                                         r"`item_costs` must be a 1-D sequence of one cost per item, "
                                         r"as `lengths` \(1\)"),
    "no rank": ("brute", ([1.0], [1], 0, 2, 10), r"`num_ranks` must be >= 1"),
    "durations that overflow the step": ("simulate", ([[1e308, 1e308], [1e308, 1e308]], [[1e308, 1e308]] * 2),
                                         r"must sum to a finite number of seconds"),
    "durations as text": ("simulate", ([["1", "1"], ["1", "1"]], [[2, 2], [2, 2]]),
                          r"`forward` must be .*; got a ragged or non-numeric list"),
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize("slip", sorted(PIPELINE_SLIPS))
def test_regression_the_pipeline_oracle_looped_forever_or_raised_raw_errors_on_bad_durations(slip):
    """A NaN duration never ended `simulate_pipeline`'s event loop (now = NaN); negative durations gave a
    step time; shapes other than (P, M) raised numpy's errors or "the schedule deadlocked (a bug of the oracle)"."""
    from orchmllm.balancers.pipeline import Pipeline
    from orchmllm.testing import brute_force_pipeline, replica_step, simulate_pipeline
    oracle, arguments, message = PIPELINE_SLIPS[slip]
    run = {"simulate": simulate_pipeline, "replica": replica_step, "brute": brute_force_pipeline}[oracle]
    with pytest.raises(ValueError, match=message):
        run(Pipeline(stages=2), *arguments)


def test_the_pipeline_oracle_names_a_pipeline_that_is_none_and_an_interleaved_count_it_cannot_run():
    from orchmllm.balancers.pipeline import Pipeline
    from orchmllm.testing import simulate_pipeline
    with pytest.raises(TypeError, match=r"`pipeline` must be a Pipeline .*; got str"):
        simulate_pipeline("1f1b", np.ones((2, 2)), np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"`M \(the columns of `forward`\)`=3 must be a multiple of the pipeline's "
                                         r"`stages`=2"):
        simulate_pipeline(Pipeline(stages=2, schedule="interleaved", virtual_stages=2), np.ones((2, 3)),
                          np.ones((2, 3)))


def test_regression_check_plan_failed_an_optimal_plan_an_ulp_above_the_optimum_s_float_sum():
    """LPT under equal counts holds {9.6, 11.9, 1.1} on rank 0, summed in item order to 22.600000000000005;
    brute force's optimum holds the same costs in another order, 22.6: check_plan failed a correct plan."""
    lengths, cost = [1, 6, 7, 2, 1, 7], CostModel(linear=1.0, quadratic=0.1)
    plan = balance(lengths, 2, cost=cost, equal_counts=True, algorithm="lpt")
    assert plan.status is Status.OPTIMAL and plan.makespan == 22.600000000000005
    assert brute_force(lengths, 2, cost=cost, equal_counts=True).makespan == 22.6
    check_plan(plan, lengths, 2, cost=cost, equal_counts=True)


@pytest.mark.parametrize("lengths, options, error, message", [
    ([5.5, 4, 3, 3, 2], {}, ValueError, r"`lengths` must be non-negative integers; got 5.5 at index 0"),
    ("54332", {}, TypeError, r"`lengths` must be a 1-D sequence of integers; got str"),
    ([5, 4, 3, 3, 2], dict(costs=[5, 4, 3, "x", 2]), TypeError, r"`costs` must hold real numbers; got dtype <U"),
    ([5, 4, 3, 3, 2], dict(costs=[5, 4, 3, 3]), ValueError, r"`costs` must hold one cost per item, shape \(5,\)"),
    ([5, 4, 3, 3, 2], dict(groups=[0, 0, 1]), ValueError, r"`groups` must hold one group id per item, shape \(5,\)"),
], ids=["fractional-length", "str-lengths", "str-cost", "costs-short", "groups-short"])
def test_regression_check_plan_truncated_fractional_lengths_and_gave_numpy_s_errors(lengths, options, error, message):
    """Cause: check_plan read its input with `np.asarray(..., dtype=int64)`: a length of 5.5 became 5 and the plan of
    [5, 4, 3, 3, 2] passed as a plan of this input, and bad costs or groups raised numpy's conversion or index
    errors; it now reads them with balance()'s own validators, as check_microbatch_plan does."""
    made = {"costs": dict(costs=[5, 4, 3, 3, 2]),
            "groups": dict(groups=[0, 0, 1, 2, 3])}.get(next(iter(options), ""), {})  # a plan balance() accepts
    plan = balance([5, 4, 3, 3, 2], 2, **made)
    with pytest.raises(error, match=message):
        check_plan(plan, lengths, 2, **options)


@pytest.mark.parametrize("arguments, message", [
    (dict(max_items=0), r"`max_items` must be >= 1; got 0"),
    (dict(max_ranks=0), r"`max_ranks` must be >= 1; got 0"),
    (dict(padded=()), r"`padded` must list the kinds to draw, False and/or True; got \(\)"),
], ids=["max_items", "max_ranks", "padded"])
def test_regression_microbatch_cases_took_its_sizes_unchecked_and_failed_at_the_first_draw(arguments, message):
    """P4-11: `microbatch_cases(max_items=0)` was built (`sampled_from(range(1, 1))`) and failed only when drawn."""
    from orchmllm.testing import microbatch_cases
    with pytest.raises(ValueError, match=message):
        microbatch_cases(**arguments)


def test_regression_a_check_given_the_other_kind_of_plan_raised_an_attribute_error():
    """P4-11: check_plan of a MicroBatchPlan (or a str) raised "no attribute 'assignment'", check_microbatch_plan
    of a BalancePlan "no attribute 'num_microbatches'"; now a TypeError naming the check that takes it."""
    micro, plain = balance_microbatches([5, 4, 3], 2, max_tokens_per_microbatch=8), balance([5, 4, 3], 2)
    with pytest.raises(TypeError, match=r"check_plan takes a BalancePlan as `plan` \(what balance\(\) returns\); got "
                                        r"MicroBatchPlan; check_microbatch_plan checks a MicroBatchPlan"):
        check_plan(micro, [5, 4, 3], 2)
    with pytest.raises(TypeError, match=r"check_plan takes a BalancePlan as `plan` .*; got str$"):
        check_plan("x", [5, 4, 3], 2)
    with pytest.raises(TypeError, match=r"check_microbatch_plan takes a MicroBatchPlan as `plan` .*; got BalancePlan; "
                                        r"check_plan checks a BalancePlan"):
        check_microbatch_plan(plain, [5, 4, 3], 2, 8)


def test_regression_check_conformance_beyond_brute_force_s_reach_failed_after_seconds_naming_no_argument():
    """P4-11: `check_conformance("lpt", max_items=50)` ran for 10 s, then its constrained cases' brute force raised
    "2**21 plans exceeds BRUTE_FORCE_MAX_PLANS", naming neither `max_items` nor the size that works."""
    with pytest.raises(ValueError, match=r"`max_items`=50 on `max_ranks`=3 makes constrained cases of up to 3\*\*50 "
                                         r"plans, beyond BRUTE_FORCE_MAX_PLANS = 2\*\*20.*use max_items <= 12"):
        check_conformance("lpt", max_items=50, processes=False)
    assert check_conformance("lpt", max_items=50, processes=False, examples=1, constraints=()).constraints == ()


def test_regression_the_generic_checks_failed_a_correct_split_plan_with_loads_differ():
    """P4-25: check_plan / check_microbatch_plan recomputed a context-parallel plan's loads as if every item sat on
    its first rank ("loads [27.0, 27.0] differ from the items' [49.0, 5.0]"), and the split checks that pass it were
    not exported from orchmllm.testing; now a TypeError naming them, and they are."""
    from orchmllm.balancers import ContextParallel
    from orchmllm.testing import brute_force_split, brute_force_split_microbatches, check_split_plan
    spec = ContextParallel(degrees=(1, 2), latency_s=0.0, seconds_per_cost=1.0, kv_bytes_per_token=0.0,
                           half_efficiency_tokens=0.0)
    lengths = [40, 5, 5, 4]
    split = balance(lengths, 2, context_parallel=spec)
    with pytest.raises(TypeError, match=r"check_plan takes a plan of unsplit items; got a ContextParallelPlan "
                                        r"\(context parallelism\): orchmllm.testing.check_split_plan"):
        check_plan(split, lengths, 2)
    check_split_plan(split, lengths, 2, spec, optimum=brute_force_split(lengths, 2, spec))
    micro = balance_microbatches(lengths, 2, max_tokens_per_microbatch=30, context_parallel=spec)
    with pytest.raises(TypeError, match=r"check_microbatch_plan takes a plan of unsplit items; got a "
                                        r"SplitMicroBatchPlan .*brute_force_split_microbatches"):
        check_microbatch_plan(micro, lengths, 2, 30)
    optimum = brute_force_split_microbatches(lengths, 2, spec, max_tokens_per_microbatch=30,
                                             num_microbatches=micro.num_microbatches)
    assert optimum.makespan <= micro.step_cost


def test_regression_check_conformance_took_exact_by_truth():
    """Cause (review7 R7-07): `exact` beside `padded` was taken by truth, so `exact='no'` ran the exact suite and
    blamed the kernel's certificate."""
    with pytest.raises(TypeError, match="`exact`"):
        check_conformance("lpt", exact="no")


@pytest.mark.parametrize("options, error, message", [
    (dict(constraints=5), TypeError, r"`constraints` must be a name in \('costs', 'equal_counts', 'groups'\) or a "
                                     r"sequence of them; got int"),
    (dict(constraints=[["costs"]]), TypeError, r"`constraints` must be a name in .* or a sequence of them; got a "
                                               r"list holding list"),
    (dict(order_invariant="x"), TypeError, r"`order_invariant` must be a bool; got str"),
    (dict(max_ranks=10**9), ValueError, r"`max_items`=6 on `max_ranks`=1000000000 makes constrained cases .* use "
                                        r"max_ranks <= 10 \(or constraints=\(\)\)")],
    ids=["constraints not a sequence", "constraints holding a list", "order_invariant not a bool",
         "max_ranks past the brute force"])
def test_regression_conformance_options_raised_python_s_errors_passed_unchecked_or_advised_max_items_0(
        options, error, message):
    """Cause (fix24d F24-05): `constraints=5` raised Python's "'int' object is not iterable" and a list inside it
    "unhashable type", `order_invariant="x"` was taken for true, and `max_ranks=10**9` was told "use max_items <= 0"
    (max_items must be >= 1: only fewer ranks reach the brute force)."""
    with pytest.raises(error, match=message):
        check_conformance("lpt", processes=False, examples=1, **options)


def test_regression_a_balancing_record_given_to_the_micro_batch_suite_failed_its_own_call():
    """Cause (fix24d F24-05): check_microbatch_conformance(ALGORITHMS["lpt"]) called the record as a micro-batch
    kernel and reported a ConformanceError for the suite's own wrong call ("Algorithm.__call__() takes 2
    positional arguments but 3 were given") as the algorithm's broken plan."""
    with pytest.raises(TypeError, match=r"algorithm 'lpt' is a balancing record \(Problem -> KernelResult\), not a "
                                        r"micro-batch one: check_conformance runs it"):
        check_microbatch_conformance(ALGORITHMS["lpt"], processes=False, examples=1)


def _checked(check):
    """`check` run on a fresh plan of its kind over [900, 5, 4, 3] on 4 ranks, with `num_ranks` as given."""
    from orchmllm import ContextParallel, balance
    from orchmllm.testing import check_split_plan

    lengths, spec = [900, 5, 4, 3], ContextParallel(degrees=(1, 2))
    return {"check_plan": lambda d: check_plan(balance(lengths, 4), lengths, d),
            "check_microbatch_plan": lambda d: check_microbatch_plan(
                balance_microbatches(lengths, 4, max_tokens_per_microbatch=1000), lengths, d, 1000),
            "check_split_plan": lambda d: check_split_plan(balance(lengths, 4, context_parallel=spec), lengths, d,
                                                           spec)}[check]


@pytest.mark.parametrize("num_ranks, error, message", [(4.0, TypeError, r"`num_ranks` must be an int; got float"),
                                                       (0, ValueError, r"`num_ranks` must be >= 1; got 0")])
@pytest.mark.parametrize("check", ["check_plan", "check_microbatch_plan", "check_split_plan"])
def test_regression_a_plan_check_given_num_ranks_as_a_float_failed_in_numpy(check, num_ranks, error, message):
    """Cause (fix24d F24-08): the plan checks compared `num_ranks` with the plan's (4 == 4.0) and then sized their
    arrays with it: numpy's "expected a sequence of integers or a single integer, got '4.0'" (Python's "'float'
    object cannot be interpreted as an integer" in check_microbatch_plan); 0 was reported as the plan's fault."""
    with pytest.raises(error, match=message):
        _checked(check)(num_ranks)


@pytest.mark.parametrize("make, error, message", [
    (lambda: problems(padded="x"), TypeError, r"`padded` must be a bool; got str"),
    (lambda: problems(caps="x"), TypeError, r"`caps` must be a bool; got str"),
    (lambda: problems(costs="x"), TypeError, r"`costs` must be a non-empty list or tuple of CostModels; got 'x'"),
    (lambda: problems(costs=[1.0]), TypeError, r"`costs` must hold CostModels; got \['float'\]"),
    (lambda: problems(constraints=5), TypeError, r"`constraints` must be a name in .* or a sequence of them; got int"),
    (lambda: hard_cases(max_items=1.5), TypeError, r"`max_items` must be an int; got float"),
    (lambda: hard_cases(padded="x"), ValueError, r"`padded` must list the kinds to draw, False and/or True; got 'x'"),
    (lambda: hard_cases(padded=5), ValueError, r"`padded` must list the kinds to draw, False and/or True; got 5"),
    (lambda: multimodal_batches(modalities="image"), TypeError, r"`modalities` must be a non-empty list or tuple of "
                                                                r"modality names; got 'image'"),
    (lambda: multimodal_batches(modalities=()), TypeError, r"`modalities` must be a non-empty list or tuple"),
    (lambda: multimodal_batches(modalities=("llm",)), ValueError, r"`modality` must not be 'llm'"),
    (lambda: topologies(gpus_per_node=()), TypeError, r"`gpus_per_node` must be a non-empty list or tuple of ints"),
    (lambda: topologies(gpus_per_node=3), TypeError, r"`gpus_per_node` must be a non-empty list or tuple of ints; "
                                                     r"got 3"),
], ids=["problems padded", "problems caps", "problems costs str", "problems costs floats", "problems constraints int",
        "hard_cases float size", "hard_cases padded str", "hard_cases padded int", "batches modalities str",
        "batches no modality", "batches llm modality", "topologies no gpus", "topologies gpus int"])
def test_regression_strategy_options_were_taken_unchecked_or_failed_in_hypothesis(make, error, message):
    """Cause (fix24d F24-13): the strategies' options were used as given: `padded="x"` or `caps="x"` drew cases as if
    true, `hard_cases(padded="x")` iterated the letters as kinds and `hard_cases(max_items=1.5)` returned no case,
    `multimodal_batches(modalities="image")` drew modalities 'i', 'm', 'a', 'g', 'e', and an int or an empty
    sequence failed at the first draw inside Hypothesis ("Cannot sample from a length-zero sequence", "not an
    ordered collection") or Python ("'int' object is not iterable")."""
    with pytest.raises(error, match=message):
        make()

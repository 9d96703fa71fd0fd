"""`check_microbatch_conformance`: the property suite against one micro-batch kernel.

A micro-batch kernel ((MicroBatchProblem, M) -> MicroBatchResult | None, the contract of
`orchmllm.register_microbatch_algorithm`) conforms when, on inputs of up to `max_items` items,
`max_ranks` ranks, a token budget T from the longest item to all of them, M from the fewest
that may fit to one more, every cost model, padded or not, with or without an overhead:

    certified       every plan passes `check_microbatch_plan` against the optimum at its M
                    (brute force when small, else the exact kernel where it proves it): one
                    cell per item, exact loads and tokens, cells within T, a sound bound,
                    `optimal` only when it is; a malformed result or a false certificate is
                    named; None (no packing) is allowed only where one item per cell does not
                    fit (n > M · D: elsewhere `balance_microbatches` calls it the algorithm's
                    failure), and an exact kernel packs whenever some packing exists and
                    reaches the optimum; Graham's instances in one micro-batch run first
                    (`strategies.hard_cases`)
    deterministic   the same input (list, int64 or int32 array) gives the bit-identical plan,
                    call after call (`harness.REPEAT_CALLS`: a plan that differs in 1 % of
                    calls is caught with probability 99.9 %), also in another process with
                    another hash seed
    larger          the determinism runs (up to twice the items) and LARGER_CASES seeded cases
                    of max_items + 1 to 2 · max_items items are certified too, as above, against
                    the optimum wherever brute force or the exact kernel proves it within
                    ORACLE_WORK_SECONDS of work: a false `optimal` or bound on 6 to 10 items
                    is caught there at the default max_items = 5
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ..balancers import (Algorithm, CostModel, InfeasibleError, MicroBatchAlgorithm, Status,
                         get_microbatch_algorithm)
from ..balancers.microbatch.api import balance_microbatches, make_microbatch_problem
from ..balancers.microbatch.bounds import min_microbatches
from ..balancers.microbatch.plan import MicroBatchPlan, checked_kernel, make_microbatch_plan
from .harness import (PROCESS_CASES, REPEAT_CASES, ConformanceError, SuiteReport, SuiteTarget, check_repeats,
                      check_suite_arguments, compare_processes, fingerprint, run_properties, same, suite_settings,
                      with_examples)
from .microbatch import MicroBatchOptimum, brute_force_microbatches, check_microbatch_plan
from .oracles import BRUTE_FORCE_MAX_PLANS
from .strategies import COST_MODELS, MAX_DRAWN_ITEMS, _lengths, as_kinds, hard_cases, size_range

ORACLE_WORK_SECONDS = 1.0
"""The `time_limit` of the exact micro-batch kernel (a work budget: deterministic) where it is the
oracle, beyond brute-force sizes; a plan is certified against it only where it proves the optimum."""

OVERHEADS = (0.0, 1.0, 2.5)
"""The per-micro-batch overheads the cases draw."""

LARGER_CASES = 40
"""Seeded cases of max_items + 1 to 2 · max_items items certified beside the determinism runs (Hypothesis draws few
that large: a 'greedy' claiming `optimal` from 6 items up passed 60 examples of them; 3 of these 40 catch it at the
defaults, in ~0.3 s)."""


@dataclass(frozen=True)
class MicroBatchCase:
    """One input of a micro-batch kernel: these items on `num_ranks` ranks in `num_microbatches`
    micro-batches of `max_tokens_per_microbatch` tokens per cell."""

    lengths: tuple[int, ...]
    num_ranks: int
    max_tokens_per_microbatch: int
    num_microbatches: int
    cost: CostModel
    padded: bool
    microbatch_overhead: float

    def describe(self, lengths=None) -> str:
        lengths = list(self.lengths if lengths is None else np.asarray(lengths).tolist())
        return (f"lengths={lengths}, num_ranks={self.num_ranks}, "
                f"max_tokens_per_microbatch={self.max_tokens_per_microbatch}, "
                f"num_microbatches={self.num_microbatches}, cost={self.cost}, padded={self.padded}, "
                f"microbatch_overhead={self.microbatch_overhead}")


def _case(lengths: list[int], num_ranks: int, budget_share: float, extra: int, cost: CostModel, padded: bool,
          overhead: float) -> MicroBatchCase:
    """A case whose budget lies `budget_share` of the way from the longest item to all of them,
    and M `extra` above the fewest micro-batches that may fit."""
    longest = max(max(lengths), 1)
    budget = longest + int(budget_share * (max(sum(lengths), longest) - longest))
    fewest = min_microbatches(np.array(lengths, dtype=np.int64), num_ranks, budget)
    return MicroBatchCase(tuple(lengths), num_ranks, budget, fewest + extra, cost, padded, overhead)


def microbatch_cases(*, max_items: int = 5, max_ranks: int = 2, padded=(False, True)) -> st.SearchStrategy:
    """`MicroBatchCase`s: tied, heavy-tailed or spread lengths, budgets from tight to roomy.

    >>> from hypothesis import find
    >>> find(microbatch_cases(), lambda case: case.num_microbatches > 1).num_microbatches
    2
    """
    max_items = size_range(1, max_items, "items", MAX_DRAWN_ITEMS)[1]
    max_ranks = size_range(1, max_ranks, "ranks")[1]
    padded = as_kinds(padded)
    return st.builds(_case, st.sampled_from(range(1, max_items + 1)).flatmap(_lengths),
                     st.sampled_from(range(1, max_ranks + 1)), st.sampled_from([0.0, 0.25, 0.5, 1.0]),
                     st.integers(0, 1), st.sampled_from(list(COST_MODELS.values())), st.sampled_from(list(padded)),
                     st.sampled_from(OVERHEADS))


def _hard_microbatch_cases(max_items: int, max_ranks: int, kinds) -> list[MicroBatchCase]:
    """`strategies.hard_cases` in one micro-batch of room for all (a step of M = 1 is a balancing plan)."""
    return [MicroBatchCase(case.lengths, case.num_ranks, sum(case.lengths), 1, case.cost, case.padded, 0.0)
            for case in hard_cases(max_items, max_ranks, kinds)]


def _seeded_cases(kinds, count: int, max_items: int, max_ranks: int, seed: int,
                  fewest: int = 2) -> list[MicroBatchCase]:
    """`count` cases of `fewest` to 2 · max_items items on 2 to max(2, max_ranks) ranks, every cost
    model and kind in turn."""
    rng = np.random.default_rng(seed)
    return [_case(rng.integers(0, 4 + 100 * (index % 2), size=int(rng.integers(fewest, 2 * max_items + 1))).tolist(),
                  int(rng.integers(2, max(2, max_ranks) + 1)), float(rng.choice([0.0, 0.25, 0.5])), 0,
                  list(COST_MODELS.values())[index % len(COST_MODELS)], kinds[index % len(kinds)],
                  OVERHEADS[index % len(OVERHEADS)])
            for index in range(count)]


@functools.lru_cache(maxsize=4096)
def optimum_of(case: MicroBatchCase) -> MicroBatchOptimum | None:
    """The optimum at the case's M: brute force while (M · D)**n is small, else the exact kernel
    where it proves it within ORACLE_WORK_SECONDS of work; None when neither knows it.  Cached for the
    life of the process (up to 4096 cases), as the suites of several kernels draw the same cases."""
    n, cells = len(case.lengths), case.num_microbatches * case.num_ranks
    if cells**n <= BRUTE_FORCE_MAX_PLANS // 16:
        return brute_force_microbatches(case.lengths, case.num_ranks, case.max_tokens_per_microbatch,
                                        case.num_microbatches, cost=case.cost, padded=case.padded,
                                        microbatch_overhead=case.microbatch_overhead)
    return _proven_by_exact(case, ORACLE_WORK_SECONDS)


def _proven_by_exact(case: MicroBatchCase, time_limit: float) -> MicroBatchOptimum | None:
    """The optimum at the case's M where the exact kernel proves it within `time_limit`, else None."""
    try:
        plan = balance_microbatches(case.lengths, case.num_ranks,
                                    max_tokens_per_microbatch=case.max_tokens_per_microbatch, cost=case.cost,
                                    padded=case.padded, num_microbatches=case.num_microbatches,
                                    microbatch_overhead=case.microbatch_overhead, algorithm="exact",
                                    time_limit=time_limit)
    except InfeasibleError:
        return None
    if plan.status is not Status.OPTIMAL:
        return None
    return MicroBatchOptimum(plan.step_cost, plan.rank, plan.microbatch, plan.num_microbatches, "exact")


class _Target(SuiteTarget):
    """The micro-batch kernel under test, its name, and what it declares."""

    def __init__(self, target, padded, exact, time_limit):
        if isinstance(target, Algorithm):
            raise TypeError(f"algorithm {target.name!r} is a balancing record (Problem -> KernelResult), not a "
                            f"micro-batch one: check_conformance runs it")
        super().__init__(target, get_microbatch_algorithm, "a registered micro-batch name or record, or a kernel "
                         "((MicroBatchProblem, M) -> MicroBatchResult | None)", padded, exact, time_limit)

    def describe(self, case: MicroBatchCase, lengths=None) -> str:
        return case.describe(lengths)

    def provable(self, case: MicroBatchCase) -> bool:
        return _proven_by_exact(case, self.time_limit) is not None

    def run(self, case: MicroBatchCase, lengths=None) -> MicroBatchPlan | None:
        """The certified plan of `case` at its M (of `lengths` in its place), or None: no packing."""
        problem = make_microbatch_problem(case.lengths if lengths is None else lengths, case.num_ranks,
                                          max_tokens_per_microbatch=case.max_tokens_per_microbatch, cost=case.cost,
                                          padded=case.padded, microbatch_overhead=case.microbatch_overhead,
                                          time_limit=self.time_limit)
        try:
            result = self.timed(checked_kernel(self.kernel, self.name), problem, case.num_microbatches)
            if result is None:
                return None
            return make_microbatch_plan(problem, result, case.num_microbatches, self.name)
        except InfeasibleError as refusal:
            raise ConformanceError(f"{self.name} raised InfeasibleError ({refusal}); a micro-batch kernel returns "
                                   f"None when it finds no packing; input {case.describe(lengths)}") from None
        except RuntimeError as error:  # the kernel's raise or broken result (`checked_kernel`), or the plan's verdict
            raise ConformanceError(f"{self.name} returned a broken plan: {error}; input "
                                   f"{case.describe(lengths)}") from None


def _certify(target: _Target, case: MicroBatchCase, plan: MicroBatchPlan | None,
             optimum: MicroBatchOptimum | None) -> None:
    where = case.describe()
    if plan is None:
        if len(case.lengths) <= case.num_microbatches * case.num_ranks:
            raise ConformanceError(f"{target.name} found no packing into num_microbatches={case.num_microbatches} "
                                   f"on {case.num_ranks} ranks, though one item per cell packs them (n = "
                                   f"{len(case.lengths)} <= M · D; `balance_microbatches` calls that the "
                                   f"algorithm's failure, not the budget's); input {where}")
        if target.exact and optimum is not None and optimum.feasible:
            raise ConformanceError(f"{target.name} is declared exact but found no packing, though "
                                   f"{optimum.method} packs the items into M = {case.num_microbatches}; input {where}")
        return
    try:
        check_microbatch_plan(plan, case.lengths, case.num_ranks, case.max_tokens_per_microbatch, cost=case.cost,
                              padded=case.padded, optimum=optimum)
    except AssertionError as error:
        raise ConformanceError(f"{target.name}: {error}; input {where}") from None
    if target.exact and (unproved := target.unproved(plan.status, case)):
        raise ConformanceError(f"{target.name} is declared exact but {unproved} at step cost {plan.step_cost}; "
                               f"input {where}")


def _certify_where_proven(target: _Target, case: MicroBatchCase, plan: MicroBatchPlan | None) -> None:
    """`_certify` a plan of a larger run against its optimum where one is proven (`optimum_of`); a None there
    still where one item per cell fits."""
    optimum = optimum_of(case)
    if optimum is not None or plan is None:
        _certify(target, case, plan, optimum)


@dataclass(frozen=True)
class MicroBatchConformanceReport(SuiteReport):
    """What `check_microbatch_conformance` checked (all of it passed)."""

    no_packing: int  # cases where the kernel returned None
    repeated_calls: int
    processes_compared: int


def check_microbatch_conformance(algorithm_or_kernel, *, max_items: int = 5, max_ranks: int = 2, examples: int = 40,
                                 padded: bool | None = None, exact: bool | None = None, processes: bool = True,
                                 time_limit: float | None = None) -> MicroBatchConformanceReport:
    """Run the micro-batch property suite on a registered micro-batch algorithm (by name or
    record) or a bare kernel.

    Raises `ConformanceError` naming the broken property and the smallest input Hypothesis
    found.  `padded` and `exact` default to what the record declares (both kinds, heuristic
    for a bare kernel).  Inputs have up to `max_items` items (twice that for the determinism,
    repeated and cross-process runs; the determinism runs and LARGER_CASES more certified too
    wherever brute force or the exact kernel proves the optimum within ORACLE_WORK_SECONDS of
    work) on up to `max_ranks` ranks; `examples` per property; `time_limit` reaches the kernel as
    the problem's (an exact kernel may then stop at it, as `check_conformance` says).  `processes` also compares
    plans with two other Python processes (the kernel must then be importable from a module: one defined in
    `__main__` needs processes=False).

    >>> report = check_microbatch_conformance("greedy", examples=5, processes=False)
    >>> report.kinds, report.plans_certified + report.no_packing, report.repeated_calls  # + Graham's, both kinds
    (('unpadded', 'padded'), 7, 700)
    """
    max_items, max_ranks, examples, processes, time_limit = check_suite_arguments(max_items, max_ranks, examples,
                                                                                  processes, time_limit)
    target = _Target(algorithm_or_kernel, padded, exact, time_limit)
    counts = {"certified": 0, "optimal": 0, "no packing": 0}

    @suite_settings(examples)
    @with_examples(_hard_microbatch_cases(max_items, max_ranks, target.kinds))
    @given(microbatch_cases(max_items=max_items, max_ranks=max_ranks, padded=target.kinds))
    def certified(case):
        plan = target.run(case)
        _certify(target, case, plan, optimum_of(case))
        if plan is None:
            counts["no packing"] += 1
        else:
            counts["certified"] += 1
            counts["optimal"] += plan.status is Status.OPTIMAL

    @suite_settings(examples)
    @given(microbatch_cases(max_items=2 * max_items, max_ranks=max_ranks, padded=target.kinds))
    def deterministic(case):
        plans = [target.run(case, lengths) for lengths in
                 (list(case.lengths), np.array(case.lengths), np.array(case.lengths, dtype=np.int32))]
        prints = [fingerprint(plan) for plan in plans]
        if not all(same(print_, prints[0]) for print_ in prints):
            raise ConformanceError(f"{target.name} is not deterministic: the same input gave "
                                   f"{[p[:2] for p in prints]} on three runs; input {case.describe()}")
        _certify_where_proven(target, case, plans[-1])  # the last: its call's time is the target's `seconds`

    run_properties((certified, deterministic))
    for case in _seeded_cases(target.kinds, LARGER_CASES, max_items, max_ranks, seed=20240602, fewest=max_items + 1):
        _certify_where_proven(target, case, target.run(case))
    repeated = check_repeats(target, _seeded_cases(target.kinds, REPEAT_CASES, max_items, max_ranks, seed=20240601))
    compared = 0
    if processes:
        compared = compare_processes(target, _seeded_cases(target.kinds, PROCESS_CASES, max_items, max_ranks,
                                                           seed=20240531))
    return MicroBatchConformanceReport(target.name, tuple("padded" if kind else "unpadded" for kind in target.kinds),
                                       counts["certified"], counts["optimal"], counts["no packing"], repeated,
                                       compared)

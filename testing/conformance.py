"""`check_conformance`: the whole property suite against one algorithm or kernel.

A kernel (Problem -> KernelResult, the contract of `orchmllm.register_algorithm`) conforms
when, on inputs drawn by `problems()`:

    certified       every plan passes `check_plan` against the exact optimum: one rank
                    per item, exact loads and tokens, sound bound, `optimal` only when it is
    caps            plans meet the cap, or InfeasibleError with a `min_cap` above the cap
                    from which retrying reaches a plan; an exact kernel refuses only caps
                    that no plan meets
    deterministic   the same input (list, int64 or int32 array) gives the bit-identical
                    plan, call after call (`harness.REPEAT_CALLS`: a plan that differs in 1 %
                    of calls is caught with probability 99.9 %), also in another process
                    with another hash seed
    metamorphic     permuting the items keeps the makespan (unless order_invariant=False,
                    for baselines that keep the sampled order); no bound of one run
                    exceeds another run's makespan of the same instance; proven optima
                    scale with the lengths and never rise with another rank
    larger          the determinism runs (up to twice the items) are certified too, against
                    the exact optimum wherever the exact solver proves it within
                    `ORACLE_SECONDS`; both sizes also run Graham's instances on which list
                    scheduling is furthest from the optimum (`strategies.hard_cases`), not
                    left to chance
    constrained     with explicit `costs`, `equal_counts=True` (the record's equal-counts
                    kernel) and `groups`, as `balance()` runs them: certified against
                    brute force under the constraint, which the plan holds; an exact
                    kernel reaches the constrained optimum

Groups never reach a kernel: `balance()` balances one super-item per group (summed length,
summed cost, so `problem.cost` is None) and sends every item to its group's rank.  What a
kernel must honour for them, as for `costs=`, is `problem.item_costs`.

A micro-batch record (`MicroBatchAlgorithm`, or the name of one that is no balancing
algorithm's), or a bare kernel of two required arguments (problem, num_microbatches), runs
`check_microbatch_conformance` instead.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, replace

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ..balancers import (ALGORITHMS, MICROBATCH_ALGORITHMS, Algorithm, BalancePlan, CostModel, InfeasibleError,
                         MicroBatchAlgorithm, Status, get_algorithm, make_problem)
from ..balancers.api import _balance_groups
from ..balancers.constraints.groups import as_groups
from ..balancers.plan import make_plan, run_kernel
from ..balancers.validation import as_bool
from .checks import check_plan, rounding_apart
from .harness import (PROCESS_CASES, REPEAT_CASES, ConformanceError, SuiteReport, SuiteTarget, check_repeats,
                      check_suite_arguments, compare_processes, fingerprint, run_properties, same, with_examples)
from .harness import suite_settings as _settings  # a property's source seeds its derandomized examples: kept as it was
from .microbatch_conformance import MicroBatchConformanceReport, check_microbatch_conformance
from .oracles import BRUTE_FORCE_MAX_PLANS, brute_force
from .oracles import exact as exact_optimum
from .strategies import COST_MODELS, CONSTRAINTS, BalanceCase, as_constraints, hard_cases, problems

RETRIES = 8
"""Refusals `check_conformance` follows along `min_cap` before it calls the cap unusable."""

ORACLE_SECONDS = 2.0
"""What the exact solver may spend proving the optimum of a larger run (beyond brute force);
a plan is certified against it only where it proves it in that time."""


@dataclass(frozen=True)
class ConformanceReport(SuiteReport):
    """What `check_conformance` checked (all of it passed)."""

    refusals_followed: int
    metamorphic_checks: int
    processes_compared: int
    constraints: tuple[str, ...] = ()
    constrained_plans: int = 0
    repeated_calls: int = 0


class _Target(SuiteTarget):
    """The kernel under test, its name, and what it declares."""

    def __init__(self, target, padded, exact, order_invariant, time_limit, constraints):
        super().__init__(target, get_algorithm, "a registered name or a kernel (Problem -> KernelResult)", padded,
                         exact, time_limit)
        # The baseline keeps the sampled order, and peers' rules are theirs (next fit in order).
        ours = str(getattr(self.kernel, "kind", "plugin")) in ("ours", "plugin")
        self.order_invariant = ours if order_invariant is None else as_bool(order_invariant, "order_invariant")
        # An Algorithm record may carry the kernel it runs under equal_counts=True.
        self.equal_counts = getattr(self.kernel, "equal_counts", None)
        able = {name for name, applies in (("costs", False in self.kinds), ("groups", False in self.kinds),
                                           ("equal_counts", self.equal_counts is not None)) if applies}
        asked = set(as_constraints(constraints))
        if constraints is not None and asked - able:
            raise ValueError(f"{self.name} cannot be checked under {sorted(asked - able)}: costs and groups need "
                             f"an unpadded kernel, equal_counts a record with an `equal_counts` kernel")
        self.constraints = tuple(name for name in CONSTRAINTS if name in asked & able)

    def run(self, case: BalanceCase, lengths=None) -> BalancePlan | InfeasibleError:
        """The certified plan of `case` (or of `lengths` in its place), or the refusal, as `balance()` makes it."""
        lengths = case.lengths if lengths is None else lengths
        options = dict(case.options)
        groups = options.pop("groups", None)
        kernel = self.equal_counts if case.equal_counts else self.kernel
        try:
            problem = make_problem(lengths, case.num_ranks, time_limit=self.time_limit, **options)
            if groups is not None:
                return self.timed(_balance_groups, problem, as_groups(groups, problem.num_items), kernel, self.name)
            result, bound = self.timed(run_kernel, kernel, problem, self.name)
        except InfeasibleError as refusal:
            return refusal
        except RuntimeError as error:  # the kernel's own, or make_plan's verdict on the groups' plan
            raise self._broken(case, lengths, error) from None
        try:
            return make_plan(problem, result.assignment, result.status, self.name, kernel_bound=result.lower_bound,
                             bound=bound)
        except RuntimeError as error:
            raise self._broken(case, lengths, error) from None

    def describe(self, case: BalanceCase) -> str:
        return _describe(case)

    def provable(self, case: BalanceCase) -> bool:
        return _proven_optimum(case, self.time_limit) is not None

    def _broken(self, case: BalanceCase, lengths, error: RuntimeError) -> ConformanceError:
        what = next((what for clue, what in (("raised InfeasibleError", "refused its input with a contradiction"),
                                             ("max_tokens_per_rank", "ignores the memory cap"),
                                             ("`equal_counts` allows", "ignores `equal_counts=True`"))
                     if clue in str(error)), "returned a broken plan")
        return ConformanceError(f"{self.name} {what}: {error}; input {_describe(case, lengths)}")


def _describe(case: BalanceCase, lengths=None) -> str:
    lengths = list(case.lengths if lengths is None else np.asarray(lengths).tolist())
    described = (f"lengths={lengths}, num_ranks={case.num_ranks}, cost={case.cost}, padded={case.padded}, "
                 f"max_tokens_per_rank={case.max_tokens_per_rank}")
    if case.constraint is not None:
        value = getattr(case, case.constraint)
        described += f", {case.constraint}={list(value) if isinstance(value, tuple) else value}"
    return described


def _optimum(case: BalanceCase):
    """The exact optimum of `case`: `exact`, or brute force under a constraint."""
    if case.constraint is None:
        return exact_optimum(case.lengths, case.num_ranks, **case.options)
    return brute_force(case.lengths, case.num_ranks, **case.options)


def _check_refusal(target: _Target, case: BalanceCase, refusal: InfeasibleError, optimum) -> None:
    cap = case.max_tokens_per_rank  # set, and refusal.min_cap above it (`call_kernel` refuses other refusals)
    where = _describe(case)
    if target.exact and optimum.feasible:
        raise ConformanceError(f"{target.name} is declared exact but refused max_tokens_per_rank={cap}, which the "
                               f"plan {optimum.assignment.tolist()} meets; input {where}")
    for _ in range(RETRIES):
        case = replace(case, max_tokens_per_rank=refusal.min_cap)
        cap = case.max_tokens_per_rank
        outcome = target.run(case)
        if not isinstance(outcome, InfeasibleError):
            _certify(target, case, outcome)
            return
        refusal = outcome
    raise ConformanceError(f"{target.name} still refuses after {RETRIES} retries along min_cap (last cap {cap}): "
                           f"{refusal}; input {where}")


def _certify(target: _Target, case: BalanceCase, plan: BalancePlan, optimum="compute") -> None:
    if optimum == "compute":
        optimum = _optimum(case)
    try:
        check_plan(plan, case.lengths, case.num_ranks, optimum=optimum, **case.options)
    except AssertionError as error:
        raise ConformanceError(f"{target.name}: {error}; input {_describe(case)}") from None
    if case.constraint is not None:
        # Under a constraint the bound may stay below the optimum, so exactness is the makespan's
        # (within rounding: groups sum an item's cost into its group first).
        if target.exact and plan.makespan > optimum.makespan * (1 + 1e-12):
            raise ConformanceError(f"{target.name} is declared exact but reached makespan {plan.makespan} above "
                                   f"the optimum {optimum.makespan} under {case.constraint}; input {_describe(case)}")
        return
    if target.exact and (unproved := target.unproved(plan.status, case)):
        raise ConformanceError(f"{target.name} is declared exact but {unproved} at makespan {plan.makespan} "
                               f"(optimum {optimum.makespan}); input {_describe(case)}")


@functools.lru_cache(maxsize=4096)
def _proven_optimum(case: BalanceCase, time_limit: float = ORACLE_SECONDS):
    """The optimum of an unconstrained `case` where it is proven (brute force or the padded DP
    when small, else the exact solver within `time_limit`), else None; cached, as the suites
    of several kernels draw the same cases."""
    try:
        return exact_optimum(case.lengths, case.num_ranks, time_limit=time_limit, **case.options)
    except (RuntimeError, TimeoutError, ValueError):  # not proven in time, or too large a model
        return None


def _certify_where_proven(target: _Target, case: BalanceCase, plan: BalancePlan) -> None:
    """`_certify` a plan of a larger run against its optimum, where one is proven."""
    optimum = _proven_optimum(case)
    if optimum is not None:
        _certify(target, case, plan, optimum)


def _metamorphic(target: _Target, case: BalanceCase, permutation: list[int]) -> int:
    """Permuted, scaled and one-more-rank runs of `case` (no cap); returns checks made."""
    plan = target.run(case)  # no cap: a plan (a refusal without a cap is a RuntimeError, `call_kernel`)
    lengths = np.asarray(case.lengths)
    runs = {"permuted": (case, lengths[permutation]), "reversed": (case, lengths[::-1]),
            "one more rank": (replace(case, num_ranks=case.num_ranks + 1), lengths)}
    if case.cost == CostModel():
        runs["lengths doubled"] = (case, 2 * lengths)
    where, terms = _describe(case), len(lengths) + 1  # loads summed in another item order (`rounding_apart`)
    for label, (other_case, other_lengths) in runs.items():
        other = target.run(other_case, other_lengths)
        scale = 2.0 if label == "lengths doubled" else 1.0
        first_bound, first_makespan = scale * plan.lower_bound, scale * plan.makespan
        if label != "one more rank" and (other.lower_bound > first_makespan or first_bound > other.makespan):
            raise ConformanceError(f"{target.name}: bounds contradict makespans ({label}): bound {plan.lower_bound}"
                                   f" and makespan {plan.makespan} as given, bound {other.lower_bound} and makespan "
                                   f"{other.makespan} {label}; input {where}")
        if label == "one more rank" and other.lower_bound > plan.makespan:
            raise ConformanceError(f"{target.name}: bound {other.lower_bound} on {other_case.num_ranks} ranks exceeds "
                                   f"the makespan {plan.makespan} reached on {case.num_ranks}; input {where}")
        both_optimal = plan.status is Status.OPTIMAL and other.status is Status.OPTIMAL
        if both_optimal and label != "one more rank" and rounding_apart(other.makespan, first_makespan, terms):
            raise ConformanceError(f"{target.name}: proven optima disagree ({label}): {first_makespan} expected, "
                                   f"{other.makespan} proven; input {where}")
        if both_optimal and label == "one more rank" and other.makespan > plan.makespan:
            raise ConformanceError(f"{target.name}: proven optimum rose from {plan.makespan} to {other.makespan} "
                                   f"with one more rank; input {where}")
        if label in ("permuted", "reversed") and target.order_invariant and rounding_apart(other.makespan,
                                                                                            plan.makespan, terms):
            order = permutation if label == "permuted" else "reversal"
            raise ConformanceError(
                f"{target.name} depends on input order: makespan {plan.makespan} on the items as given, "
                f"{other.makespan} on the same items permuted by {order}; a balancer's plan quality must "
                f"not depend on the order of the items (pass order_invariant=False for a baseline that keeps "
                f"the sampled order); input {where}")
    return len(runs)


def _seeded_cases(target: _Target, count: int, max_items: int, max_ranks: int, seed: int) -> list[BalanceCase]:
    """`count` cases of 2 to 2 · max_items items on 2 to max(2, max_ranks) ranks, tied or spread
    lengths, every cost model and kind in turn, no cap."""
    rng = np.random.default_rng(seed)
    cases = []
    for index in range(count):
        lengths = rng.integers(0, 4 + 100 * (index % 2), size=int(rng.integers(2, 2 * max_items + 1)))
        cases.append(BalanceCase(tuple(lengths.tolist()), int(rng.integers(2, max(2, max_ranks) + 1)),
                                 list(COST_MODELS.values())[index % len(COST_MODELS)],
                                 target.kinds[index % len(target.kinds)], None))
    return cases


def _takes_two(kernel) -> bool:
    """Whether `kernel` is a bare callable of two required positional arguments, (problem, num_microbatches): a
    micro-batch kernel (probe29 P29-03: taken for a balancing kernel, the suite called it with the problem alone
    and reported it broken)."""
    if isinstance(kernel, (str, Algorithm, MicroBatchAlgorithm)) or not callable(kernel):
        return False
    try:
        parameters = inspect.signature(kernel).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
               for p in parameters) == 2


def check_conformance(algorithm_or_kernel, *, max_items: int = 6, max_ranks: int = 3, examples: int = 40,
                      padded: bool | None = None, exact: bool | None = None, order_invariant: bool | None = None,
                      processes: bool = True, time_limit: float | None = None,
                      constraints=None) -> ConformanceReport | MicroBatchConformanceReport:
    """Run the property suite on a registered algorithm (by name) or a bare kernel.

    Raises `ConformanceError` (an AssertionError) naming the broken property and the
    smallest input Hypothesis found.  `padded`, `exact` and `order_invariant` default to
    what the registry record declares (both kinds, heuristic, order-invariant for a bare
    kernel; the baseline and peers' heuristics may depend on the sampled order).  Inputs have up to `max_items` items
    (twice that for the metamorphic and determinism runs, the latter certified where the exact
    solver proves the optimum within `ORACLE_SECONDS`) on up to `max_ranks` ranks; `examples` per
    property.  `time_limit` is each call's (an exact kernel may then stop at it: status `time_limit`, its plan still
    certified, where the call ran for at least half the limit or the exact solver does not prove the case within it
    either, `harness.STOPPED_SHARE`; the suite makes hundreds of calls).  Every determinism case also runs again and
    again outside Hypothesis (`harness.REPEAT_CALLS` calls in all: a kernel whose plan differs in 1 % of calls is
    caught with probability 99.9 %).  `processes` also compares plans with two other Python processes
    (the kernel must then be importable from a module: one defined in `__main__` needs
    processes=False).  `constraints` (names in `CONSTRAINTS`, or one name as a str) picks
    the constrained cases; by default every one the target supports: `costs` and `groups`
    for unpadded kernels, `equal_counts` for a record with an `equal_counts` kernel (pass
    the `Algorithm` record, e.g. `register_algorithm`'s, to check that kernel).  A micro-batch
    record (or the name of one that no balancing algorithm has, or a bare kernel of two required
    arguments) runs `check_microbatch_conformance` with these arguments.

    >>> report = check_conformance("lpt", examples=5, processes=False)
    >>> report.kinds, report.constraints, report.repeated_calls
    (('unpadded', 'padded'), ('costs', 'equal_counts', 'groups'), 700)
    """
    microbatch = (isinstance(algorithm_or_kernel, MicroBatchAlgorithm)
                  or isinstance(algorithm_or_kernel, str) and algorithm_or_kernel not in ALGORITHMS
                  and algorithm_or_kernel in MICROBATCH_ALGORITHMS or _takes_two(algorithm_or_kernel))
    if microbatch:
        if order_invariant is not None or constraints is not None:
            raise ValueError("`order_invariant` and `constraints` apply to balancing kernels only; a micro-batch "
                             "kernel runs check_microbatch_conformance")
        return check_microbatch_conformance(algorithm_or_kernel, max_items=max_items, max_ranks=max_ranks,
                                            examples=examples, padded=padded, exact=exact, processes=processes,
                                            time_limit=time_limit)
    max_items, max_ranks, examples, processes, time_limit = check_suite_arguments(max_items, max_ranks, examples,
                                                                                  processes, time_limit)
    target = _Target(algorithm_or_kernel, padded, exact, order_invariant, time_limit, constraints)
    if target.constraints:
        _check_brute_force_reach(max_items, max_ranks, target.constraints)
    counts = {"certified": 0, "optimal": 0, "refusals": 0, "metamorphic": 0, "constrained": 0}
    run_properties(_properties(target, counts, max_items, max_ranks, examples))
    repeated = check_repeats(target, _seeded_cases(target, REPEAT_CASES, max_items, max_ranks, seed=20240601))
    compared = 0
    if processes:
        compared = compare_processes(target, _seeded_cases(target, PROCESS_CASES, max_items, max_ranks, seed=20240531))
    return ConformanceReport(target.name, tuple("padded" if kind else "unpadded" for kind in target.kinds),
                             counts["certified"], counts["optimal"], counts["refusals"], counts["metamorphic"],
                             compared, target.constraints, counts["constrained"], repeated)


def _check_brute_force_reach(max_items: int, max_ranks: int, constraints) -> None:
    """ValueError, before any work, when the constrained cases' oracle (brute force over the
    max_ranks**max_items plans of the largest case) would pass BRUTE_FORCE_MAX_PLANS."""
    most = 0
    while max_ranks > 1 and max_ranks ** (most + 1) <= BRUTE_FORCE_MAX_PLANS:
        most += 1
    if max_ranks > 1 and max_items > most:
        ranks = int(round(BRUTE_FORCE_MAX_PLANS ** (1 / max_items)))  # the most ranks it reaches with max_items
        ranks -= ranks ** max_items > BRUTE_FORCE_MAX_PLANS
        fewer = f"max_items <= {most}, or max_ranks <= {ranks}" if most else f"max_ranks <= {ranks}"
        raise ValueError(f"`max_items`={max_items} on `max_ranks`={max_ranks} makes constrained cases of up to "
                         f"{max_ranks}**{max_items} plans, beyond BRUTE_FORCE_MAX_PLANS = 2**20, the brute force "
                         f"that checks the {', '.join(constraints)} cases; use {fewer} (or constraints=())")


def _properties(target: _Target, counts: dict, max_items: int, max_ranks: int, examples: int) -> tuple:
    """The suite's Hypothesis properties on `target` (certified, deterministic, metamorphic and,
    when the target supports one, constrained); each counts what it checked in `counts`."""
    kinds = st.sampled_from(target.kinds)

    def check_case(case, count: str):
        outcome = target.run(case)
        optimum = _optimum(case)
        if isinstance(outcome, InfeasibleError):
            counts["refusals"] += 1
            _check_refusal(target, case, outcome, optimum)
            return
        if not optimum.feasible:
            raise ConformanceError(f"{target.name} returned a plan although no plan meets the cap"
                                   f"{' and the constraint' if case.constraint else ''}; input {_describe(case)}")
        _certify(target, case, outcome, optimum)
        counts[count] += 1
        counts["optimal"] += outcome.status is Status.OPTIMAL

    @_settings(examples)
    @with_examples(hard_cases(max_items, max_ranks, target.kinds))
    @given(kinds.flatmap(lambda kind: problems(max_items=max_items, max_ranks=max_ranks, padded=kind)))
    def certified(case):
        check_case(case, "certified")

    @_settings(examples)
    @with_examples(hard_cases(2 * max_items, max_ranks, target.kinds))
    @given(kinds.flatmap(lambda kind: problems(max_items=2 * max_items, max_ranks=max_ranks, padded=kind)))
    def deterministic(case):
        outcomes = [target.run(case, lengths) for lengths in
                    (list(case.lengths), np.array(case.lengths), np.array(case.lengths, dtype=np.int32),
                     list(case.lengths))]
        prints = [fingerprint(outcome) for outcome in outcomes]
        if not all(same(print_, prints[0]) for print_ in prints):
            raise ConformanceError(f"{target.name} is not deterministic: the same input gave "
                                   f"{[p[:2] for p in prints]} on four runs; input {_describe(case)}")
        if isinstance(outcomes[-1], BalancePlan):  # the last: its call's time is the target's `seconds`
            _certify_where_proven(target, case, outcomes[-1])

    metamorphic_cases = kinds.flatmap(lambda kind: problems(
        max_items=2 * max_items, min_items=2, max_ranks=max(2, max_ranks), min_ranks=2, padded=kind, caps=False,
        costs=[COST_MODELS["tokens"], COST_MODELS["affine"]]))

    @_settings(examples)
    @given(metamorphic_cases.flatmap(lambda case: st.tuples(st.just(case),
                                                            st.permutations(range(len(case.lengths))))))
    def metamorphic(drawn):
        counts["metamorphic"] += _metamorphic(target, *drawn)

    # Integer cost models: groups sum costs per group first, and integer sums are exact.
    constrained_kinds = [(kind, names) for kind in target.kinds
                         if (names := [name for name in target.constraints if not kind or name == "equal_counts"])]

    @_settings(examples)
    @given(st.sampled_from(constrained_kinds or [(False, [])]).flatmap(lambda drawn: problems(
        max_items=max_items, max_ranks=max_ranks, padded=drawn[0], constraints=drawn[1],
        costs=[COST_MODELS["tokens"], COST_MODELS["affine"]])))
    def constrained(case):
        check_case(case, "constrained")

    return (certified, deterministic, metamorphic) + ((constrained,) if constrained_kinds else ())

"""The result of balancing: a frozen plan with its quality certificate."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .cost import CostModel
from .bounds import lower_bound
from .problem import (InfeasibleError, Kernel, KernelResult, Problem, Status, integer_values, rank_loads, rank_tokens,
                      read_only, require_equal_counts)
from .validation import SizeLimitError, as_index, frozen, is_real

FLOAT_EXACT = 2**53  # integer sums below this are exact in float64
LOCALITY_SUFFIX = "+locality"  # a plan's algorithm name after the communication-aware pass


def relative_gap(makespan: float, lower_bound: float) -> float:
    """makespan / lower_bound - 1: how far above a bound no plan can beat (0 when both are 0).

    >>> relative_gap(10.0, 8.0), relative_gap(0.0, 0.0), relative_gap(1.0, 0.0)
    (0.25, 0.0, inf)
    """
    if lower_bound == 0:
        return 0.0 if makespan == 0 else float("inf")
    return makespan / lower_bound - 1.0


@dataclass(frozen=True, eq=False)
class BalancePlan:
    """Where every item goes, what each rank then costs, and how far from optimal that is.

    `assignment[i]` is the rank of item i.  `loads[r]` is rank r's cost and `tokens[r]`
    the tokens it holds (count · max length when padded).  `lower_bound` is a makespan no
    plan can beat; `status` is `optimal` only when the makespan is proven optimal.
    `algorithm` is the registered name; `communication_aware` says whether the plan then went
    through the communication-aware pass (`balance(..., sources=...)`).  `item_costs` are the
    problem's own (read-only), which the loads sum: a caller need not compute them again.
    """

    assignment: np.ndarray
    loads: np.ndarray
    tokens: np.ndarray
    makespan: float
    lower_bound: float
    status: Status
    algorithm: str
    num_ranks: int
    padded: bool
    cost: CostModel | None  # None when the item costs were given per item
    communication_aware: bool = False
    solve_seconds: float = field(default=0.0, compare=False)
    item_costs: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def gap(self) -> float:
        """makespan / lower_bound - 1 (0 when both are 0)."""
        return relative_gap(self.makespan, self.lower_bound)

    @property
    def imbalance(self) -> float:
        """makespan / mean load: 1.0 is perfect balance."""
        mean = float(self.loads.sum()) / self.num_ranks
        return self.makespan / mean if mean > 0 else 1.0

    @property
    def num_items(self) -> int:
        return int(self.assignment.size)

    def items_of(self, rank: int) -> np.ndarray:
        """Indices of the items on `rank` (an int in range), ascending."""
        return np.flatnonzero(self.assignment == as_index(rank, "rank", self.num_ranks, "num_ranks"))

    def digest(self) -> str:
        """SHA-256 of the assignment: equal on every rank that computed the same plan."""
        return hashlib.sha256(self.assignment.astype("<i8").tobytes()).hexdigest()

    def on_ranks(self, rank_of_group: np.ndarray) -> BalancePlan:
        """This plan with the items of its rank g on rank `rank_of_group[g]` (a permutation of the ranks,
        e.g. `topology.place`'s): loads and tokens follow them; makespan, bound and status hold."""
        rank_of_group = np.asarray(rank_of_group)
        if rank_of_group.shape != (self.num_ranks,) or rank_of_group.dtype.kind not in "iu" or not np.array_equal(
                np.sort(rank_of_group), np.arange(self.num_ranks)):
            kind = "" if rank_of_group.dtype.kind in "iu" else f" (dtype {rank_of_group.dtype}: ranks are ints)"
            raise ValueError(f"`rank_of_group` must be a permutation of the {self.num_ranks} ranks; got "
                             f"{rank_of_group.tolist() if rank_of_group.size <= 16 else rank_of_group.shape}{kind}")
        loads, tokens = np.empty_like(self.loads), np.empty_like(self.tokens)
        loads[rank_of_group], tokens[rank_of_group] = self.loads, self.tokens
        return dataclasses.replace(self, assignment=read_only(rank_of_group[self.assignment]), loads=read_only(loads),
                                   tokens=read_only(tokens))

    def to_json(self) -> dict:
        """The plan as plain JSON types (what `orchmllm plan --json` prints): `json_head` and the
        makespan, the assignment, loads and tokens per rank."""
        name = self.algorithm + (LOCALITY_SUFFIX if self.communication_aware else "")
        cost = None if self.cost is None else {"per_item": self.cost.per_item, "linear": self.cost.linear,
                                               "quadratic": self.cost.quadratic}
        return {**json_head(self, name, self.makespan), "cost": cost, "imbalance": self.imbalance,
                "assignment": self.assignment.tolist(), "loads": self.loads.tolist(), "tokens": self.tokens.tolist()}


def json_head(plan, algorithm: str, cost: float) -> dict:
    """The JSON keys every plan shares (`BalancePlan`, `MicroBatchPlan`): its algorithm as `algorithm`
    names it, size, certificate (`cost` under the plan's own name: makespan or step_cost) and digest."""
    cost_name = "makespan" if isinstance(plan, BalancePlan) else "step_cost"
    return {"algorithm": algorithm, "num_ranks": plan.num_ranks, "num_items": plan.num_items, "padded": plan.padded,
            cost_name: cost, "lower_bound": plan.lower_bound, "gap": plan.gap, "status": str(plan.status),
            "solve_seconds": plan.solve_seconds, "digest": plan.digest()}


def require_result(result, expected: type, algorithm: str, called: str = "", also: str = "") -> None:
    """RuntimeError naming the kernel unless its `result` is an `expected` (a KernelResult, a
    MicroBatchResult): a plugin's None or tuple, never an AttributeError where it is read.
    `called` says for what it was called, `also` what else it may return."""
    if not isinstance(result, expected):
        got = "None" if result is None else f"a {type(result).__name__}"
        raise RuntimeError(f"algorithm {algorithm!r} returned {got}{called}; expected a {expected.__name__}{also}")


KERNEL_REFUSALS = (InfeasibleError, SizeLimitError, TimeoutError)  # a kernel's answers about the input, passed on


def call_kernel(kernel: Callable, algorithm: str, problem, *args, built_in: bool = False):
    """`kernel(problem.for_kernel(), *args)`, a copy of the problem (`SortedItems.for_kernel`): nothing the kernel
    sets on it reaches the problem the certificate reads.  A refusal of the heuristic it fell back to
    (`InfeasibleError.heuristic`) is told as the algorithm's.  An exception other than its refusals (`KERNEL_REFUSALS`)
    is a bug of the kernel: RuntimeError naming it, raised from the kernel's own (a write to the problem's read-only
    arrays too).  A `built_in` kernel may time out without a `time_limit`: orchmllm's exact searches run under
    `exact.ilp.DEFAULT_TIME_LIMIT` then (probe22 P22-18: their TimeoutError was called a bug of the kernel)."""
    try:
        return kernel(problem.for_kernel(), *args)
    except KERNEL_REFUSALS as error:
        contradiction = None if built_in and isinstance(error, TimeoutError) else _contradiction(error, problem)
        if contradiction is None and getattr(error, "heuristic", None) not in (None, algorithm):
            further = "" if algorithm == "auto" else "; algorithm='auto' searches further"
            raise InfeasibleError(f"algorithm {algorithm!r} falls back to {error.heuristic} under a cap its own plan "
                                  f"overflows, and {error}{further}", error.min_cap, algorithm) from error
        if contradiction is None:
            raise
        raise RuntimeError(f"algorithm {algorithm!r} raised {type(error).__name__} {contradiction}: a bug of the "
                           f"kernel ({error})") from error
    except Exception as error:
        hint = ""
        if isinstance(error, ValueError) and "read-only" in str(error):
            hint = " (a kernel gets the problem's arrays read-only: copy one before writing it)"
        elif isinstance(error, TypeError) and "InfeasibleError.__init__" in str(error):
            hint = (" (a kernel refuses with InfeasibleError(message, min_cap): min_cap is the cap to try next, "
                    "the smallest that could fit or one at which the kernel succeeds)")
        raise RuntimeError(f"algorithm {algorithm!r} raised {type(error).__name__}: {error}{hint}") from error


def _contradiction(error: Exception, problem) -> str | None:
    """How a kernel's refusal contradicts the problem it was given (None where it does not): no plan fits a cap
    the problem does not set, a cap to try next that is negative or not above the cap given, a time limit the
    problem does not set ran out."""
    if isinstance(error, InfeasibleError):
        if error.min_cap < 0:
            return f"with min_cap={error.min_cap}, a negative cap to try next"
        if not hasattr(problem, "max_tokens_per_rank"):  # a micro-batch problem's min_cap counts micro-batches
            return None
        cap = problem.max_tokens_per_rank
        if cap is None:
            return "on a problem with no token cap (`max_tokens_per_rank` None), which every plan fits"
        if error.min_cap <= cap:
            return f"with min_cap={error.min_cap}, not above the max_tokens_per_rank={cap} it was given"
    if isinstance(error, TimeoutError) and problem.time_limit is None:
        return "on a problem with no time limit (`time_limit` None)"
    return None


def run_kernel(kernel: Kernel, problem: Problem, algorithm: str,
               built_in: bool = False) -> tuple[KernelResult, float | None]:
    """(`kernel(problem)`'s result (`call_kernel`), checked to be a KernelResult (`require_result`), and
    `lower_bound(problem)`): the bound is computed before the kernel is handed the problem, so that nothing
    the kernel does to it (or to the orders the bound reads) reaches the certificate (`make_plan(bound=)`).
    The result's status and bound are checked here (`kernel_status`, `real_bound`),
    before any path reads or drops them (probe56 F2: under `sources=` a status 5 passed unread).
    A `built_in` kernel (`registry.built_in`) writes nothing: its bound is left to `make_plan` (None), which
    skips it where the kernel proved its plan optimal."""
    bound = None if built_in else lower_bound(problem)
    result = call_kernel(kernel, algorithm, problem, built_in=built_in)
    require_result(result, KernelResult, algorithm)
    status = kernel_status(result.status, algorithm)
    return result._replace(assignment=checked_assignment(result.assignment, problem, algorithm), status=status,
                           lower_bound=real_bound(result.lower_bound, algorithm)), bound


def checked_assignment(assignment, problem: Problem, algorithm: str) -> np.ndarray:
    """A kernel's `assignment` as an (n,) int64 array of ranks in [0, D); RuntimeError naming the kernel otherwise,
    before any path (`make_plan`, the communication-aware pass, the context-parallel merge) reads it (probe53 F1: a
    malformed one reached numpy's bincount and reshape under `sources=`)."""
    assignment = np.asarray(assignment)
    if assignment.shape != problem.lengths.shape or assignment.dtype.kind not in "iu":
        raise RuntimeError(f"algorithm {algorithm!r} returned an assignment of shape "
                           f"{assignment.shape} and dtype {assignment.dtype}; expected ({problem.num_items},) ints")
    if assignment.size and (assignment.min() < 0 or assignment.max() >= problem.num_ranks):
        raise RuntimeError(f"algorithm {algorithm!r} assigned an item outside ranks [0, {problem.num_ranks})")
    return assignment if assignment.dtype == np.int64 else assignment.astype(np.int64)


def owned(values: np.ndarray) -> np.ndarray:
    """A kernel's (n,) integer `values` as an int64 array the plan owns: a copy unless nobody can write them
    (`validation.frozen`), since a kernel that fills a buffer it reuses (and returns a view of) would rewrite
    every plan it made before."""
    if frozen(values) and values.dtype == np.int64 and values.flags.c_contiguous:
        return values
    return np.array(values, dtype=np.int64, order="C")


def kernel_status(status, algorithm: str) -> Status:
    """A kernel's `status` as a `Status`; RuntimeError naming the kernel when it is none."""
    try:
        return Status(status)
    except ValueError:
        raise RuntimeError(f"algorithm {algorithm!r} returned status {status!r}; expected one of "
                           f"{[str(known) for known in Status]}") from None


def real_bound(claimed, algorithm: str) -> float | None:
    """A kernel's `lower_bound` as a float (None when it claims none); RuntimeError naming the kernel where it is
    no real number, NaN, or beyond float64 (probe56 F1: an int 10**400 raised a raw OverflowError).

    >>> real_bound(7, "lpt"), real_bound(None, "lpt")
    (7.0, None)
    """
    if claimed is None:
        return None
    try:
        value = float(claimed) if is_real(claimed) else math.nan
    except OverflowError:
        raise RuntimeError(f"algorithm {algorithm!r} returned a lower_bound of magnitude about "
                           f"2**{_magnitude_bits(claimed)} ({type(claimed).__name__}), beyond float64; expected a real "
                           f"number of float64's range or None") from None
    if math.isnan(value):
        raise RuntimeError(f"algorithm {algorithm!r} returned lower_bound={claimed!r}; expected a real number or None")
    return value


def _magnitude_bits(value) -> int:
    """The bit length of a real beyond float64 (an int or a fraction) without printing its digits (an int of
    over 4300 digits has no str)."""
    return int(abs(math.trunc(value))).bit_length()


def claimed_bound(claimed, cost: float, algorithm: str, terms: int, what: str = "makespan",
                  exact: Callable[[], bool] = lambda: False) -> float | None:
    """A kernel's `lower_bound` (None when it claims none) as a float at most `cost`, its own plan's.

    No plan beats a lower bound, so one above the cost its plan reaches is a false certificate:
    RuntimeError naming the kernel, beyond what float rounding explains (bound and cost summed
    in other orders, `terms` additions each: a relative terms · 2**-52).  What is left, up to
    the cost, is the kernel's claim: a bound equal to its plan's cost, or below it by no more than
    that rounding, claims the plan optimal, as `check_conformance` verifies against the exact
    optimum (probe25 P25-03: the micro-batch search proved its optimum 15484.145499999999 summed
    in its item order, the plan's cells summed 15484.1455, and the plan's certificate raised).
    Where every sum up to the cost is exact (`exact()`: `sums_exact_below`), so is the plan's and the
    same sum in any other order: no rounding explains a bound below the cost, and it stays the
    kernel's bound (probe26 P26-03: a bound 1 below a plan of 2**52 + 2 on integer costs read as a
    proof of optimality).

    >>> claimed_bound(10.000000000000002, 10.0, "exact", terms=4), claimed_bound(None, 10.0, "lpt", terms=4)
    (10.0, None)
    >>> claimed_bound(15484.145499999999, 15484.1455, "auto", terms=12), claimed_bound(9.99, 10.0, "lpt", terms=4)
    (15484.1455, 9.99)
    >>> claimed_bound(2.0**52 + 1, 2.0**52 + 2, "plugin", terms=5, exact=lambda: True) == 2.0**52 + 1
    True
    """
    claimed = real_bound(claimed, algorithm)
    if claimed is None:
        return None
    if claimed > cost * (1.0 + terms * 2.0**-52):
        raise RuntimeError(f"algorithm {algorithm!r} returned lower_bound={claimed!r} above the {what} {cost!r} of "
                           f"its own plan: a bound no plan can beat cannot exceed a cost that a plan reaches, so the "
                           f"kernel's certificate is false")
    return cost if claimed >= cost or (claimed >= cost * (1.0 - terms * 2.0**-52) and not exact()) else claimed


def integral(costs: np.ndarray) -> bool:
    """Whether every cost is an integer (a float64 array).

    >>> integral(np.array([3.0, 0.0])), integral(np.array([2.5]))
    (True, False)
    """
    return not costs.size or integer_values(costs) is not None


def cost_unit(values: np.ndarray) -> float | None:
    """The coarsest power of two 2**e of which every one of the non-negative `values` (costs) is a whole multiple,
    where their sums are then exact: the quotients below 2**63 and, for a unit below 1, n times the largest below 2**53
    (integer costs keep the unit they have; costs of a float model, finely grained, have none); None elsewhere, or
    where every value is 0.  Exact rescales by powers of two scale it alike: x0.5, x2, x1024 keep the quotients
    (probe27 P27-06: the bound rounded up at 1 for integer costs only planned 141 and, x0.5 or x1024, 142).

    >>> cost_unit(np.array([6.0, 10.0])), cost_unit(np.array([1.5, 0.25])), cost_unit(np.array([3.0, 0.0]))
    (2.0, 0.25, 1.0)
    >>> cost_unit(np.array([0.1, 0.7])), cost_unit(np.array([0.0]))
    (None, None)
    """
    positive = values[values > 0]
    if not positive.size:
        return None
    top = float(positive.max())
    for some in (positive[:UNIT_SAMPLE], positive):  # a sample's unit is no finer than all's: its refusal holds
        unit = _power_unit(some)
        with np.errstate(over="ignore"):  # subnormal units: quotients beyond float64, refused below
            largest = top / unit
        if largest >= 2.0**63 or (unit < 1 and largest * positive.size >= FLOAT_EXACT):
            return None
    return unit


UNIT_SAMPLE = 64  # `cost_unit` refuses a float model's costs on this many (82k costs: 3 ms -> 0.2 ms)


def _power_unit(positive: np.ndarray) -> float:
    """The coarsest power of two of which every one of the positive `positive` is a whole multiple."""
    fraction, exponent = np.frexp(positive)  # positive = fraction · 2**exponent, 0.5 <= fraction < 1
    mantissa = np.ldexp(fraction, 53).astype(np.int64)  # exact: below 2**53
    _, lowest = np.frexp((mantissa & -mantissa).astype(np.float64))  # its lowest set bit: 2**(lowest - 1)
    return float(np.ldexp(1.0, int((exponent + lowest).min()) - 54))


def rounded_up(bound: float, cost: float, num_ranks: int, unit: Callable[[], float | None]) -> float:
    """`bound` raised to the next whole multiple of `unit()` (the costs' unit, `cost_unit`: 1 for integers) where
    every plan's cost is one (bound 101074.75 proves a makespan of 101075 optimal; of costs in halves, 50537.375
    proves 50537.5; rescaled by a power of two, the same: probe27 P27-06).

    Only where `unit()` is not None (every item cost, and overhead, a whole multiple of it, a power of two) and
    num_ranks · `cost` < 2**53 units: every load, sum and bound is then exact (Σ of all costs <= D · cost) but for
    the bound's last rounding, which never lifts it above the multiple it lies below, so no plan costs less than
    its ceiling.  Kernels' own bounds are not rounded: their float error is theirs.

    >>> rounded_up(101074.75, 101075.0, 4, lambda: 1.0), rounded_up(9.5, 10.0, 2, lambda: None)
    (101075.0, 9.5)
    >>> rounded_up(50537.375, 50537.5, 4, lambda: 0.5), rounded_up(7.0, 8.0, 2, lambda: 2.0)
    (50537.5, 8.0)
    """
    if bound >= cost:
        return bound
    step = unit()
    if step is None:
        return bound
    units = bound / step
    if units == math.floor(units) or num_ranks * cost >= FLOAT_EXACT * step:
        return bound
    return float(math.ceil(units)) * step


def rounded_down(bound: float, cost: float, num_ranks: int, costs: np.ndarray,
                 integral_costs: Callable[[], bool]) -> float:
    """`bound` lowered by the float error of a sum of the `costs`, so that no plan's float load lies below it.

    Bounds are sums rounded once (fsum), while a plan's load is its items' costs summed in item
    order, which may round below the exact sum by up to (n - 1) · 2**-53 of it: an exact bound
    can lie an ulp above the optimum's load (29.400000000000002 against 23.1 + 3.9 + 2.4 = 29.4).
    Kept where `cost` meets it (`certify` holds it at the plan's cost, optimal) and where every sum
    is exact: costs that are multiples of 2**-b (b = 0, `integral_costs()`, or 16: halves,
    quarters) and num_ranks · cost below 2**(53 - b).

    >>> rounded_down(29.400000000000002, 31.1, 2, np.array([23.1, 3.9, 2.4, 5.6, 5.6, 7.5]), lambda: False) < 29.4
    True
    >>> rounded_down(8.25, 8.5, 2, np.array([5, 4, 3, 3, 1.5]), lambda: False)
    8.25
    """
    if bound >= cost or sums_exact_below(num_ranks * cost, costs, integral_costs):
        return bound
    return bound * (1.0 - costs.size * 2.0**-52)


def sums_exact_below(limit: float, costs: np.ndarray, integral_costs: Callable[[], bool]) -> bool:
    """Whether every sum of `costs` up to `limit` is exact in float64: the costs multiples of 2**-b
    (b = 0: `integral_costs()`, or 16: halves, quarters) and `limit` below 2**(53 - b).

    >>> sums_exact_below(10.0, np.array([2.5, 0.25]), lambda: False)
    True
    >>> sums_exact_below(10.0, np.array([0.1]), lambda: False)
    False
    """
    return any(limit < 2.0**(53 - bits) and exact()
               for bits, exact in ((0, integral_costs), (16, lambda: integral(costs * 2.0**16))))


def certify(cost: float, bound: float, status: Status, algorithm: str, what: str) -> tuple[float, Status]:
    """The (lower bound, status) of a plan whose `what` (makespan, step cost) is `cost`: every plan's one
    certification step.  `bound` is held at most `cost` (bounds are float sums in another order than
    the plan's: rounding must never lift one above a cost that was reached); the status is optimal
    when they meet, and a kernel's `optimal` that they do not prove is its bug (RuntimeError).

    >>> certify(10.0, 10.000000000000002, Status.FEASIBLE, "lpt", "makespan")
    (10.0, <Status.OPTIMAL: 'optimal'>)
    """
    bound = min(bound, cost)
    if cost == bound:
        return bound, Status.OPTIMAL
    if status is Status.OPTIMAL:
        raise RuntimeError(f"algorithm {algorithm!r} claimed optimality at {what} {cost} "
                           f"but only proved a bound of {bound}")
    return bound, status


def make_plan(problem: Problem, assignment: np.ndarray, status: Status, algorithm: str,
              kernel_bound: float | None = None, solve_seconds: float = 0.0,
              communication_aware: bool = False, certified: bool = True, bound: float | None = None) -> BalancePlan:
    """Check a kernel's assignment and wrap it with loads, bound and status.

    A kernel that returns a malformed assignment, overflows the cap or certifies a bound above
    its own makespan is a bug, so this raises RuntimeError rather than hand a wrong plan to the
    caller.  The bound is the larger of `lower_bound(problem)` (rounded up to the costs' unit where
    they have one: `rounded_up`) and the kernel's (`claimed_bound`); the status is optimal when it
    equals the makespan.  A kernel that does not certify its plans (`registry.certifies`: not
    `certified`) has its bound checked, then left out, and its `optimal` read as feasible.  `bound`:
    `lower_bound(problem)` as `run_kernel` computed it before the kernel ran; None computes it here, for
    a problem no kernel was handed.
    """
    status = kernel_status(status, algorithm)
    assignment = owned(checked_assignment(assignment, problem, algorithm))
    loads = rank_loads(problem, assignment)
    tokens = rank_tokens(problem, assignment)
    cap = problem.max_tokens_per_rank
    if cap is not None and tokens.max() > cap:
        rank = int(np.argmax(tokens))
        raise RuntimeError(f"algorithm {algorithm!r} put {int(tokens[rank])} tokens on rank {rank}, "
                           f"over max_tokens_per_rank={cap}")
    if problem.equal_counts:
        require_equal_counts(problem, assignment, algorithm)
    makespan = float(loads.max())
    integral_costs = functools.cache(lambda: integral(problem.item_costs))
    claimed = claimed_bound(kernel_bound, makespan, algorithm, problem.num_items + 1,
                            exact=lambda: sums_exact_below(makespan, problem.item_costs, integral_costs))
    if not certified:
        claimed, status = None, Status.FEASIBLE if status is Status.OPTIMAL else status
    if claimed == makespan:
        bound = makespan  # the kernel proved its plan optimal: no other bound can add to that
    else:
        bound = rounded_up(lower_bound(problem) if bound is None else bound, makespan, problem.num_ranks,
                           lambda: cost_unit(problem.item_costs))
        bound = bound if claimed is None else max(bound, claimed)
        bound = rounded_down(bound, makespan, problem.num_ranks, problem.item_costs, integral_costs)
    bound, status = certify(makespan, bound, status, algorithm, "makespan")
    for array in (assignment, loads, tokens):
        read_only(array)
    return BalancePlan(assignment=assignment, loads=loads, tokens=tokens, makespan=makespan,
                       lower_bound=bound, status=status, algorithm=algorithm,
                       num_ranks=problem.num_ranks, padded=problem.padded, cost=problem.cost,
                       communication_aware=communication_aware, solve_seconds=solve_seconds,
                       item_costs=problem.item_costs)

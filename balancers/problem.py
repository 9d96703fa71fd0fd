"""The canonical balancing problem every kernel receives, its validation, loads and bounds.

Items i = 0..n-1 with integer lengths l_i go to ranks 0..D-1.  Minimise
max_r cost(r), where cost(r) = sum(c_i for i on r) unpadded, or
count(r) · f(max l_i on r) padded, subject to tokens(r) <= max_tokens_per_rank with
tokens(r) = sum(l_i) unpadded, count(r) · max(l_i) padded.  The item costs c_i are
f(l_i) for a `CostModel` f, or given per item (unpadded only).  With `equal_counts`,
every rank also holds floor(n / D) or ceil(n / D) items.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, NamedTuple

import numpy as np

from .cost import CostModel
from .orders import Orders, sealed
from .sums import exact_sum, integer_sum, integer_values
from .validation import (INT64_MAX, as_bool, as_int, as_non_negative_integers, as_numeric_array, as_rounded_up,
                         is_real)


class Status(str, Enum):
    """How much a plan is known to be worth."""

    OPTIMAL = "optimal"  # makespan proven equal to the optimum
    FEASIBLE = "feasible"  # a valid plan, optimality not proven
    TIME_LIMIT = "time_limit"  # an exact solver stopped at its time limit with this incumbent

    def __str__(self) -> str:
        return self.value


class InfeasibleError(ValueError):
    """No plan fits the memory cap.

    `min_cap` is a cap to try next.  Exact solvers and bound checks set it to the smallest cap that
    could work (necessary); a heuristic that gave up sets it to a cap at which it is certain to succeed
    (sufficient for that algorithm), and names itself in the message and in `heuristic` (None where no
    plan fits): an algorithm falling back to it says so (`plan.call_kernel`).
    """

    def __init__(self, message: str, min_cap: int, heuristic: str | None = None):
        super().__init__(message)
        self.min_cap = as_rounded_up(min_cap, "InfeasibleError's min_cap (the cap to try next)")
        self.heuristic = heuristic

    def __reduce__(self):  # pickled with its attributes: the default calls the class with the message only
        return type(self).__new__, (type(self), *self.args), self.__dict__


def integer_keys_fit(values: np.ndarray, count: int) -> bool:
    """Whether non-negative `values` are integers small enough for value · count + index keys."""
    return bool(values.size) and float(values.max()) * count < 2.0**62 and (
        values.dtype.kind in "iu" or bool(np.all(values == np.floor(values))))


def sorted_order(costs: np.ndarray) -> np.ndarray:
    """Item indices by cost, largest first, ties by index (the heap loop's order).

    A stable argsort of floats is slow; integer costs sort as unique int64 keys (cost rank · n
    + index), or below 2**16 as uint16 keys, which numpy's stable sort orders by radix.
    """
    n = costs.size
    if integer_keys_fit(costs, n):
        largest = int(costs.max())
        if largest < 2**16:
            keys = costs.astype(np.uint16)
            return np.argsort(np.subtract(largest, keys, out=keys), kind="stable")
        keys = (largest - costs.astype(np.int64)) * n + np.arange(n)
        return np.sort(keys) % n
    order = np.argsort(-costs)
    sorted_costs = costs[order]
    group = np.concatenate(([0], np.cumsum(sorted_costs[1:] != sorted_costs[:-1])))
    return np.sort(group * n + order) % n


def cost_order(lengths: np.ndarray, item_costs: np.ndarray, cost: CostModel,
               length_order: np.ndarray | None = None) -> np.ndarray:
    """`sorted_order(item_costs)` (read-only) of the costs `cost` gives `lengths`, from the
    length order where it is the same.

    Costs of a `cost` model never fall as lengths grow (each float operation of
    `CostModel.item_costs` rounds monotonically), so it is the length order (`length_order`,
    computed if None; a radix sort below 2**16) iff costs drop wherever lengths do.  That is
    counted along the sorted items, or, when fewer lengths than items lie below the
    longest, asked of all of them (sufficient).
    """
    if not lengths.size:
        return read_only(sorted_order(item_costs))
    order = read_only(sorted_order(lengths)) if length_order is None else length_order
    longest = int(lengths[order[0]])
    if longest < lengths.size:
        lengths = np.arange(longest + 1)
        costs = cost.item_costs(lengths)
    else:
        lengths, costs = lengths[order], item_costs[order]
    if np.count_nonzero(np.diff(costs)) != np.count_nonzero(np.diff(lengths)):
        order = read_only(sorted_order(item_costs))
    return order


def one_cost(costs: np.ndarray) -> bool:
    """Whether every one of `costs` (at least one) is the same (the first and last compared first).

    >>> one_cost(np.array([2.0, 2.0])), one_cost(np.array([2.0, 1.0, 2.0])), one_cost(np.zeros(0))
    (True, False, False)
    """
    return bool(costs.size and costs[0] == costs[-1] and (costs == costs[0]).all())


COST_LIMIT = 2.0**1023  # rank costs below this never overflow float64, whatever the summation order
MAX_RANKS = 2**20  # per-rank arrays stay small (8 MiB each); the largest clusters hold ~10**5 GPUs


def read_only(array: np.ndarray) -> np.ndarray:
    """`array`, made read-only in place (cached orders and costs are shared, never written)."""
    array.setflags(write=False)
    return array


class kept_order:
    """A property computed on first use and kept in the problem's `orders` (read-only), which problems
    over the same items share, so that each order is computed once for all of them."""

    def __init__(self, compute: Callable[["SortedItems"], np.ndarray]):
        self.compute, self.name, self.__doc__ = compute, compute.__name__, compute.__doc__

    def __get__(self, problem, owner=None):
        if problem is None:
            return self
        value = problem.orders.get(self.name)
        if value is None:
            value = problem.orders._keep(self.name, self.compute(problem))  # the one writer of `Orders`
        return value


class SortedItems:
    """The orders of a problem's items, each computed once (read-only): a `Problem`'s or a
    `MicroBatchProblem`'s `lengths`, `item_costs` and `cost` (None when costs are given per item).
    They live in the problem's `orders` field (`Orders`): a problem built over the same items (a
    `dataclasses.replace` of it, `balancing_problem`) is given them at construction."""

    def __post_init__(self):
        """`orders` as this problem's `Orders`: those given where they are of its items, or entries given
        as a mapping (computed of its items by the caller), else none yet."""
        orders = self.orders
        if not isinstance(orders, Orders) or not orders.holds(self.lengths, self.item_costs):
            entries = {} if isinstance(orders, Orders) else orders
            object.__setattr__(self, "orders", Orders(self.lengths, self.item_costs, entries))

    def for_kernel(self):
        """A shallow copy of this problem, which `plan.call_kernel` hands a kernel: a field or cached value the
        kernel sets stays on the copy, never on this problem, which the certificate reads.  The items and their
        `orders` are shared, `sealed` and kept once each."""
        return copy.copy(self)

    @kept_order
    def length_order(self) -> np.ndarray:
        """`sorted_order(lengths)`: items by length, longest first, ties by index."""
        return sorted_order(self.lengths)

    @kept_order
    def cost_order(self) -> np.ndarray:
        """`sorted_order(item_costs)`, computed once per problem (LPT, locality and the bound
        share it; with a cost model `cost_order`: the length order where it is the same; where
        every item costs the same, the index order, ties by index, without a sort)."""
        if one_cost(self.item_costs):
            return np.arange(self.item_costs.size)
        if self.cost is None:
            return sorted_order(self.item_costs)
        return cost_order(self.lengths, self.item_costs, self.cost, self.length_order)

    @kept_order
    def sorted_costs(self) -> np.ndarray:
        """`item_costs[cost_order]`, largest first (the costs themselves where all are one)."""
        return self.item_costs if one_cost(self.item_costs) else self.item_costs[self.cost_order]


@dataclass(frozen=True, eq=False)
class Problem(SortedItems):
    """Validated, canonical input of a kernel (kernels assume it is clean)."""

    lengths: np.ndarray  # int64 (n,)
    item_costs: np.ndarray  # float64 (n,), f(lengths) or the costs given per item
    num_ranks: int
    cost: CostModel | None  # None when the item costs were given per item
    padded: bool
    max_tokens_per_rank: int | None
    time_limit: float | None
    equal_counts: bool = False  # every rank holds floor(n / D) or ceil(n / D) items
    # `SortedItems`' orders once computed (`Orders`); a `dataclasses.replace` over the same items shares them
    orders: Orders = field(default_factory=dict, repr=False)  # a mapping given: its entries, of these items

    @property
    def num_items(self) -> int:
        return int(self.lengths.size)


class KernelResult(NamedTuple):
    """What a kernel returns: a rank per item, how sure it is, and any bound it proved."""

    assignment: np.ndarray
    status: Status = Status.FEASIBLE
    lower_bound: float | None = None


Kernel = Callable[[Problem], KernelResult]


def as_lengths(lengths, name: str = "lengths") -> np.ndarray:
    """Validate and canonicalise lengths to a 1-D int64 array of non-negative integers below 2**53 (as CLI files and
    batches: a longer one's cost f(l) = l rounds, probe31 P31-01), a private copy, so that a problem made read-only
    never freezes, nor a kernel writes, the caller's array (a frozen int64 array, `validation.frozen`, is kept)."""
    array = as_numeric_array(lengths, name, "integers")
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D; got shape {array.shape}")
    if array.size == 0:
        raise ValueError(f"`{name}` must not be empty")
    return as_non_negative_integers(array, name, integral_floats=True, copy=False, float_exact=True)


def as_num_ranks(num_ranks) -> int:
    """`num_ranks` as an int in [1, MAX_RANKS].

    >>> as_num_ranks(2**21)
    Traceback (most recent call last):
    ...
    ValueError: `num_ranks` must be at most 2**20 = 1048576 (...); got 2097152
    """
    num_ranks = as_int(num_ranks, "num_ranks", minimum=1)
    if num_ranks > MAX_RANKS:
        raise ValueError(f"`num_ranks` must be at most 2**20 = {MAX_RANKS} (a plan holds arrays of loads and "
                         f"tokens per rank); got {num_ranks}")
    return num_ranks


MAX_TIME_LIMIT = 1e9  # seconds (~32 years): work budgets, time_limit × operations per second, stay integers


def as_time_limit(time_limit, name: str = "time_limit") -> float | None:
    if time_limit is None:
        return None
    if not is_real(time_limit):
        raise TypeError(f"`{name}` must be a number of seconds or None; got {type(time_limit).__name__}")
    if not math.isfinite(time_limit) or time_limit <= 0:
        raise ValueError(f"`{name}` must be a positive finite number of seconds; got {time_limit}")
    if time_limit > MAX_TIME_LIMIT:
        raise ValueError(f"`{name}` must be at most MAX_TIME_LIMIT = {MAX_TIME_LIMIT:g} seconds (about 32 years; "
                         f"solvers turn it into a work budget); got {time_limit:g}")
    return float(time_limit)


def as_costs(costs, lengths: np.ndarray, name: str = "costs") -> np.ndarray:
    """Validate per-item costs (one non-negative real per item, not NaN; bools refused) to float64, a private
    copy; errors name the argument `name`."""
    array = as_numeric_array(costs, name, "reals")
    if array.dtype == object or array.dtype.kind not in "iuf":
        raise TypeError(f"`{name}` must hold real numbers; got dtype {array.dtype}")
    if array.shape != lengths.shape:
        raise ValueError(f"`{name}` must hold one cost per item, shape {lengths.shape}; got shape {array.shape}")
    array = np.array(array, dtype=np.float64, order="C")
    bad = np.flatnonzero(~(array >= 0))  # negative or nan
    if bad.size:
        raise ValueError(f"`{name}` must be finite and non-negative; got {array[bad[0]]} at index {bad[0]}")
    return array


def make_problem(lengths, num_ranks, *, cost=None, costs=None, padded=False, equal_counts=False,
                 max_tokens_per_rank=None, time_limit=None) -> Problem:
    """Validate user input once and build the canonical Problem.

    `costs` gives the item costs directly (unpadded only), instead of a `cost` model of
    the lengths: packed documents cost the sum over their documents, loss-masked samples
    their effective tokens; `lengths` stay what the memory cap counts.
    """
    lengths = as_lengths(lengths)
    num_ranks = as_num_ranks(num_ranks)
    padded = as_bool(padded, "padded")
    check_token_range(lengths, padded)
    if costs is not None and cost is None and padded:
        raise ValueError("`costs` cannot be combined with `padded=True`: a padded rank costs count · f(longest "
                         "length), a function of the lengths; pass a `cost` model instead")
    item_costs, cost = item_costs_of(lengths, cost, costs, padded)
    problem = Problem(
        lengths=sealed(lengths),  # a kernel that writes them raises, naming it (`plan.call_kernel`)
        item_costs=sealed(item_costs),
        num_ranks=num_ranks,
        cost=cost,
        padded=padded,
        max_tokens_per_rank=as_int(max_tokens_per_rank, "max_tokens_per_rank", minimum=1, optional=True),
        time_limit=as_time_limit(time_limit),
        equal_counts=as_bool(equal_counts, "equal_counts"),
    )
    check_cap_lower_bound(problem)
    return problem


def item_costs_of(lengths: np.ndarray, cost, costs, padded: bool) -> tuple[np.ndarray, CostModel | None]:
    """(item costs, their model or None) from a `cost` model of the lengths (default f(l) = l) or
    `costs` given per item, not both; every rank's cost checked to stay finite (`check_cost_range`).
    The one rule of `make_problem` and `make_microbatch_problem`."""
    if costs is not None:
        if cost is not None:
            raise ValueError("pass `cost` (a model of the lengths) or `costs` (one cost per item), not both")
        item_costs = as_costs(costs, lengths)
        check_cost_range(item_costs, lengths, padded, "`costs`")
        return item_costs, None
    if cost is None:
        cost = CostModel()
    if not isinstance(cost, CostModel):
        raise TypeError(f"`cost` must be a CostModel or None; got {type(cost).__name__}")
    with np.errstate(over="ignore"):  # an overflowing model is reported below
        item_costs = cost.item_costs(lengths)
    check_cost_range(item_costs, lengths, padded, f"`cost` {cost}")
    return item_costs, cost


def tokens_problem(problem: Problem, time_limit: float | None = None) -> Problem:
    """The unpadded, uncapped problem of `problem`'s tokens themselves (cost f(l) = l; its equal counts kept), built
    from its clean lengths without checking them again: where a kernel balances the tokens to meet a cap."""
    model = CostModel()
    return Problem(lengths=problem.lengths, item_costs=read_only(model.item_costs(problem.lengths)),
                   num_ranks=problem.num_ranks, cost=model, padded=False, max_tokens_per_rank=None,
                   time_limit=time_limit, equal_counts=problem.equal_counts)


def check_token_range(lengths: np.ndarray, padded: bool) -> None:
    """Raise ValueError unless every rank's tokens fit int64, so token sums stay exact.

    A rank holds at most the sum of all lengths, or n · max l when padded.
    """
    if padded:
        count, longest = lengths.size, int(lengths.max())
        if count * longest > INT64_MAX:
            raise ValueError(f"`lengths`: {count} items padded to the longest ({longest}) hold {count * longest} "
                             f"tokens, beyond int64 (2**63 - 1): token counts must be exact")
    elif lengths.size * int(lengths.max()) > INT64_MAX:
        total = integer_sum(lengths)
        if total > INT64_MAX:
            raise ValueError(f"`lengths` sum to {total} tokens, beyond int64 (2**63 - 1): token counts must be exact")


def check_cost_range(item_costs: np.ndarray, lengths: np.ndarray, padded: bool, source: str) -> None:
    """Raise ValueError unless item costs and every rank's cost stay finite in float64.

    `source` names where the costs come from (the cost model or the `costs` argument).
    A rank costs at most the sum of all costs, or n · max cost when padded; both must stay
    below 2**1023, so no float sum of them can overflow.
    """
    bad = np.flatnonzero(~np.isfinite(item_costs))
    if bad.size:
        index = int(bad[0])
        raise ValueError(f"{source} gives item {index} (length {int(lengths[index])}) the cost "
                         f"{item_costs[index]}; costs must be finite float64 (scale the costs down)")
    worst = float(item_costs.max()) * item_costs.size
    if worst < COST_LIMIT:
        return
    if not padded:
        try:
            worst = exact_sum(item_costs)
        except OverflowError:  # fsum's intermediate overflow: the sum is beyond float64
            worst = math.inf
    if worst >= COST_LIMIT:
        what = "n · max cost (padded)" if padded else "the sum of the costs"
        raise ValueError(f"{source}: {what} is {worst:.6g}, at or beyond 2**1023: rank costs would overflow "
                         f"float64 (scale the costs down)")


def check_cap_lower_bound(problem: Problem) -> None:
    """Raise InfeasibleError when the cap is below a bound every plan must exceed."""
    cap = problem.max_tokens_per_rank
    if cap is None:
        return
    largest = int(problem.lengths.max())
    if largest > cap:
        index = int(np.argmax(problem.lengths))
        raise InfeasibleError(
            f"`max_tokens_per_rank`={cap} is below the largest item ({largest} tokens at index {index}); "
            f"a cap of at least {largest} is needed", min_cap=largest)
    total = integer_sum(problem.lengths)
    if problem.padded and problem.num_ranks == 1:
        count = problem.num_items
        needed = count * largest
        if needed > cap:
            raise InfeasibleError(
                f"the one rank holds all {count} items padded to the longest ({largest}): {needed} tokens > "
                f"max_tokens_per_rank={cap}; a cap of at least {needed} is needed", min_cap=needed)
    needed = -(-total // problem.num_ranks)
    if needed > cap:
        raise InfeasibleError(
            f"`max_tokens_per_rank`={cap} × {problem.num_ranks} ranks = {cap * problem.num_ranks} tokens "
            f"< {total} tokens in total; a cap of at least {needed} is needed", min_cap=needed)


def require_within_cap(problem: Problem, assignment: np.ndarray, placement: str) -> None:
    """Raise InfeasibleError when a placement that cannot adapt overflows the cap.

    `placement` completes the sentence "<placement> puts N tokens on rank r".
    """
    cap = problem.max_tokens_per_rank
    if cap is None:
        return
    tokens = rank_tokens(problem, assignment)
    if tokens.max() > cap:
        rank = int(np.argmax(tokens))
        raise InfeasibleError(
            f"{placement} puts {int(tokens[rank])} tokens on rank {rank} > max_tokens_per_rank={cap}; "
            f"it needs a cap of at least {int(tokens.max())}", min_cap=int(tokens.max()))


def rank_counts(assignment: np.ndarray, num_ranks: int) -> np.ndarray:
    return np.bincount(assignment, minlength=num_ranks).astype(np.int64)


def rank_max_lengths(lengths: np.ndarray, assignment: np.ndarray, num_ranks: int) -> np.ndarray:
    longest = np.zeros(num_ranks, dtype=np.int64)
    np.maximum.at(longest, assignment, lengths)
    return longest


def rank_loads(problem: Problem, assignment: np.ndarray) -> np.ndarray:
    """Cost per rank (float64), accumulated in item order so it is bit-reproducible."""
    if problem.padded:
        counts = rank_counts(assignment, problem.num_ranks)
        longest = rank_max_lengths(problem.lengths, assignment, problem.num_ranks)
        return np.where(counts > 0, counts * problem.cost.item_costs(longest), 0.0)
    return np.bincount(assignment, weights=problem.item_costs, minlength=problem.num_ranks)


def rank_tokens(problem: Problem, assignment: np.ndarray) -> np.ndarray:
    """Tokens held per rank (int64): sum of lengths, or count · max length when padded."""
    if problem.padded:
        counts = rank_counts(assignment, problem.num_ranks)
        return counts * rank_max_lengths(problem.lengths, assignment, problem.num_ranks)
    return token_sums(assignment, problem.lengths, problem.num_ranks)


def token_sums(ranks: np.ndarray, lengths: np.ndarray, size: int, total: int | None = None) -> np.ndarray:
    """Σ lengths per rank (`size` ranks, item i on ranks[i]), exact int64: a float bincount (many
    times faster than np.add.at) while the sums stay below 2**53, int64 adds beyond.  `total`, the
    exact Σ lengths where the caller knows it, spares the bound n · max l."""
    bound = lengths.size * float(lengths.max(initial=0)) if total is None else total
    if bound < 2.0**53:
        return np.bincount(ranks, weights=lengths, minlength=size).astype(np.int64)
    tokens = np.zeros(size, dtype=np.int64)
    np.add.at(tokens, ranks, lengths)
    return tokens


def count_limits(num_items: int, num_ranks: int) -> tuple[int, int]:
    """(q, r) of equal counts: every rank holds q = n // D or q + 1 items, r = n - q·D of them q + 1."""
    return num_items // num_ranks, num_items % num_ranks


def require_equal_counts(problem: Problem, assignment: np.ndarray, algorithm: str) -> None:
    """Raise RuntimeError when a kernel broke `equal_counts` (a bug, never a plan)."""
    counts = rank_counts(assignment, problem.num_ranks)
    q, r = count_limits(problem.num_items, problem.num_ranks)
    if counts.min() < q or counts.max() > q + 1:
        rank = int(np.argmin(counts)) if counts.min() < q else int(np.argmax(counts))
        allowed = f"{q} or {q + 1}" if r else f"exactly {q}"
        raise RuntimeError(f"algorithm {algorithm!r} put {int(counts[rank])} items on rank {rank}; `equal_counts` "
                           f"allows {allowed} ({problem.num_items} items on {problem.num_ranks} ranks)")

"""The micro-batch problem every micro-batch kernel receives, and the certified plan it becomes."""

from __future__ import annotations

import hashlib
import math
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, NamedTuple

import numpy as np

from ..cost import CostModel
from ..orders import Orders
from ..plan import (call_kernel, certify, claimed_bound, cost_unit, integral, json_head, kernel_status, real_bound,
                    require_result, rounded_up, sums_exact_below)
from ..problem import Problem, SortedItems, Status, exact_sum, integer_sum, read_only, token_sums
from ..validation import as_index
from .bounds import beyond_one_microbatch, min_microbatches, step_cost_bound


@dataclass(frozen=True, eq=False)
class MicroBatchProblem(SortedItems):
    """Validated, canonical input of a micro-batch kernel (kernels assume it is clean); its
    items' orders (`length_order`, `cost_order`, `sorted_costs`) as a `Problem`'s."""

    lengths: np.ndarray  # int64 (n,), tokens each item holds
    item_costs: np.ndarray  # float64 (n,), its cost
    num_ranks: int
    max_tokens_per_microbatch: int  # T, per cell (the API's `max_tokens_per_microbatch`)
    padded: bool  # cell cost count · max c, cell tokens count · max l
    microbatch_overhead: float
    work_limit: int  # operations an anytime search may spend
    cost: CostModel | None = None  # the model that gave `item_costs`, None when given per item
    time_limit: float | None = None  # seconds, when given: each kernel converts it to its own operations
    # `SortedItems`' orders once computed (`Orders`); a `dataclasses.replace` over the same items shares them
    orders: Orders = field(default_factory=dict, repr=False)  # a mapping given: its entries, of these items
    # the tight token packing (`cells.tight_cells`) by budget, with the lengths it packed: one for every M,
    # found once and shared by the copies each kernel call gets (`for_kernel`)
    packings: dict = field(default_factory=dict, repr=False)

    @property
    def num_items(self) -> int:
        return int(self.lengths.size)

    @property
    def max_tokens(self) -> int:
        """Deprecated name of `max_tokens_per_microbatch` (the API's name, kept from the request to the plan);
        removed in 0.2."""
        warnings.warn("MicroBatchProblem.max_tokens is deprecated: read max_tokens_per_microbatch",
                      DeprecationWarning, stacklevel=2)
        return self.max_tokens_per_microbatch

    def for_kernel(self) -> MicroBatchProblem:
        """A shallow copy of this problem for a kernel (`SortedItems.for_kernel`), made once its bounds
        (`min_microbatches`, `cost_bound`, `certified_bound`) and `total_tokens` are computed: the copy shares them,
        and the certificate reads this problem's, computed before any kernel ran."""
        for name in ("min_microbatches", "cost_bound", "certified_bound", "total_tokens"):
            getattr(self, name)
        return super().for_kernel()

    @cached_property
    def min_microbatches(self) -> int:
        """The fewest micro-batches any plan needs (`microbatch_bounds.min_microbatches`; the
        lengths in the length order when a cost model computed that already)."""
        longest_first = None if self.cost is None else self.lengths[self.length_order]
        return min_microbatches(self.lengths, self.num_ranks, self.max_tokens_per_microbatch, longest_first)

    @cached_property
    def total_tokens(self) -> int:
        """Σ l, exact (at most 2**63 - 1: `check_token_range`)."""
        return integer_sum(self.lengths)

    @cached_property
    def total_cost(self) -> float:
        """Σ c, correctly rounded (`exact_sum`): the bounds' mean work."""
        return exact_sum(self.item_costs)

    @cached_property
    def cost_bound(self) -> float:
        """Σ_m max_r load(r, m) no plan beats, overhead excluded (`microbatch_bounds`)."""
        return step_cost_bound(self.item_costs, self.lengths, self.num_ranks, self.max_tokens_per_microbatch,
                               self.total_cost)

    @cached_property
    def certified_bound(self) -> float:
        """`cost_bound`, or `microbatch_bounds.beyond_one_microbatch` where larger: the plan's certificate
        (`make_microbatch_plan`).  The kernels' gates and searches keep `cost_bound`, which they were tuned
        against (raised, it kept the joint greedy out of a long-context plan it made 0.6 % cheaper)."""
        return max(self.cost_bound, beyond_one_microbatch(self.item_costs, self.lengths, self.num_ranks,
                                                          self.max_tokens_per_microbatch, self.total_cost,
                                                          self.total_tokens, self.cost_bound))

    def step_bound(self, num_microbatches: int) -> float:
        """The step no plan of `num_microbatches` micro-batches beats: `cost_bound` and their overheads."""
        return float_sum([self.cost_bound, num_microbatches * self.microbatch_overhead])


def balancing_problem(lengths: np.ndarray, costs: np.ndarray, num_ranks: int, cap: int,
                      order: np.ndarray | None = None, sorted_costs: np.ndarray | None = None) -> Problem:
    """An unpadded P||Cmax `Problem` over these items (for its kernels), costs taken as given.

    Costs given per item (explicit costs, pinned placeholders) need not rise with the lengths,
    so the problem has no cost model and orders them by themselves; built with their order
    (`order`) and `costs[order]` (`sorted_costs`) where the caller has them.
    """
    orders = {} if order is None else {"cost_order": read_only(order)}
    if sorted_costs is not None:
        orders["sorted_costs"] = read_only(sorted_costs)
    return Problem(lengths=lengths, item_costs=costs, num_ranks=num_ranks, cost=None, padded=False,
                   max_tokens_per_rank=cap, time_limit=None, orders=orders)


def cells_problem(problem: MicroBatchProblem, num_cells: int) -> Problem:
    """`balancing_problem` of all of `problem`'s items over `num_cells` cells of its budget,
    its cost order and sorted costs shared."""
    return balancing_problem(problem.lengths, problem.item_costs, num_cells, problem.max_tokens_per_microbatch,
                             problem.cost_order, problem.sorted_costs)


class MicroBatchResult(NamedTuple):
    """What a micro-batch kernel returns: a cell per item, how sure it is, a bound it proved."""

    rank: np.ndarray
    microbatch: np.ndarray
    status: Status = Status.FEASIBLE
    lower_bound: float | None = None  # on Σ_m max_r load, overhead excluded


MicroBatchKernel = Callable[[MicroBatchProblem, int], "MicroBatchResult | None"]


def cell_loads(problem: MicroBatchProblem, cell_of: np.ndarray, size: int) -> np.ndarray:
    """The cost of each of `size` cells, item i in cell cell_of[i] (count · max cost when padded),
    accumulated in item order (bit-reproducible)."""
    if problem.padded:
        counts = np.bincount(cell_of, minlength=size)
        top = np.zeros(size)
        np.maximum.at(top, cell_of, problem.item_costs)
        return counts * top
    return np.bincount(cell_of, weights=problem.item_costs, minlength=size)


def cell_token_sums(problem: MicroBatchProblem, cell_of: np.ndarray, size: int) -> np.ndarray:
    """Σ l of each of `size` cells, item i in cell cell_of[i], exact in int64 (no sum exceeds Σ l <= 2**63 - 1)."""
    return token_sums(cell_of, problem.lengths, size, problem.total_tokens)


def cell_accounts(problem: MicroBatchProblem, rank: np.ndarray, microbatch: np.ndarray,
                  num_microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """(loads, tokens) of every cell, shape (M, D), accumulated in item order (bit-reproducible)."""
    cells = num_microbatches * problem.num_ranks
    cell = microbatch * problem.num_ranks + rank
    shape = (num_microbatches, problem.num_ranks)
    loads = cell_loads(problem, cell, cells).reshape(shape)
    if problem.padded:
        top_length = np.zeros(cells, dtype=np.int64)
        np.maximum.at(top_length, cell, problem.lengths)
        return loads, (np.bincount(cell, minlength=cells) * top_length).reshape(shape)
    return loads, cell_token_sums(problem, cell, cells).reshape(shape)


def float_sum(values: list[float]) -> float:
    """`math.fsum(values)`, inf where the sum (or fsum's partial sums) is beyond float64.

    >>> float_sum([1.0, 2.0]), float_sum([1e308, 1e308])
    (3.0, inf)
    """
    try:
        return math.fsum(values)
    except OverflowError:  # fsum's intermediate overflow: the sum is beyond float64
        return math.inf


def step_cost(cell_loads: np.ndarray, overhead: float) -> float:
    """Σ_m max_r cell_loads[m, r] + M · overhead, correctly rounded (inf beyond float64)."""
    maxima = cell_loads.max(axis=1) if cell_loads.size else np.zeros(0)
    return float_sum(maxima.tolist() + [cell_loads.shape[0] * overhead])


def check_step_cost(cost: float, cell_loads: np.ndarray, overhead: float) -> None:
    """Raise ValueError unless a plan's step cost is finite in float64."""
    if not math.isfinite(cost):
        m = cell_loads.shape[0]
        maxima = float_sum(cell_loads.max(axis=1).tolist()) if cell_loads.size else 0.0
        raise ValueError(f"the step cost of {m} micro-batches is beyond float64: Σ_m max_r load = {maxima:.6g} plus "
                         f"{m} · `microbatch_overhead` = {m} · {overhead:.6g}; scale `costs` (or the `cost` model) "
                         f"and `microbatch_overhead` down")


@dataclass(frozen=True, eq=False)
class MicroBatchPlan:
    """Every item's cell (rank, micro-batch), the cells' loads and tokens, and a certificate.

    Item i runs on rank `rank[i]` in micro-batch `microbatch[i]`; every rank runs the same
    `num_microbatches` micro-batches (some may be empty on some ranks).  `cell_loads[m, r]`
    and `cell_tokens[m, r]` are that cell's cost and tokens (count · max when padded), every
    one within `max_tokens_per_microbatch`.  `step_cost` = Σ_m max_r cell_loads[m, r] +
    num_microbatches · microbatch_overhead; no plan of these items beats `lower_bound` (with
    `num_microbatches` free or as given); `status` is optimal only when that is proven.
    `pipeline` (`balance_microbatches(..., pipeline=)`): the schedule's step of these cells,
    micro-batch m run m-th on every replica (`balancers.pipeline.PipelineStep`), else None.
    """

    rank: np.ndarray
    microbatch: np.ndarray
    num_microbatches: int
    num_ranks: int
    cell_loads: np.ndarray
    cell_tokens: np.ndarray
    step_cost: float
    lower_bound: float
    status: Status
    algorithm: str
    max_tokens_per_microbatch: int
    microbatch_overhead: float
    padded: bool
    solve_seconds: float = field(default=0.0, compare=False)
    pipeline: "PipelineStep | None" = None

    @property
    def gap(self) -> float:
        """step_cost / lower_bound - 1 (0 when both are 0)."""
        if self.lower_bound == 0:
            return 0.0 if self.step_cost == 0 else float("inf")
        return self.step_cost / self.lower_bound - 1.0

    @property
    def num_items(self) -> int:
        return int(self.rank.size)

    @property
    def microbatch_costs(self) -> np.ndarray:
        """max_r cell_loads[m, r] per micro-batch: what each micro-batch's synchronised step costs."""
        return self.cell_loads.max(axis=1)

    def items_of(self, rank: int, microbatch: int) -> np.ndarray:
        """Indices of the items in cell (rank, microbatch), ascending (each an int in range)."""
        rank = as_index(rank, "rank", self.num_ranks, "num_ranks")
        microbatch = as_index(microbatch, "microbatch", self.num_microbatches, "num_microbatches")
        return np.flatnonzero((self.rank == rank) & (self.microbatch == microbatch))

    def digest(self) -> str:
        """SHA-256 of (M, rank, microbatch): equal on every rank that computed the same plan."""
        digest = hashlib.sha256(np.int64(self.num_microbatches).astype("<i8").tobytes())
        digest.update(self.rank.astype("<i8").tobytes())
        digest.update(self.microbatch.astype("<i8").tobytes())
        return digest.hexdigest()

    def to_json(self) -> dict:
        """The plan as plain JSON types: `json_head` (a `BalancePlan`'s keys) and the micro-batch
        options, the cells and their loads and tokens."""
        return {**json_head(self, self.algorithm, self.step_cost), "num_microbatches": self.num_microbatches,
                "max_tokens_per_microbatch": self.max_tokens_per_microbatch,
                "microbatch_overhead": self.microbatch_overhead,
                "rank": self.rank.tolist(), "microbatch": self.microbatch.tolist(),
                "cell_loads": self.cell_loads.tolist(), "cell_tokens": self.cell_tokens.tolist(),
                "pipeline": None if self.pipeline is None else self.pipeline.to_json()}


def check_result(problem: MicroBatchProblem, result, num_microbatches: int, algorithm: str) -> MicroBatchResult:
    """A micro-batch kernel's `result` for M = `num_microbatches`, its cells int64, checked for form.

    Anything but a `MicroBatchResult` of (n,) integer cells in range, a `Status` and a real
    bound or None is a bug of the kernel: RuntimeError naming it and what is wrong, never a
    numpy error in what reads the cells next.
    """
    require_result(result, MicroBatchResult, algorithm, f" for num_microbatches={num_microbatches}",
                   " (or None: no packing)")
    n = problem.num_items
    cells = []
    for name, values, limit in (("rank", result.rank, problem.num_ranks),
                                ("microbatch", result.microbatch, num_microbatches)):
        try:
            values = np.asarray(values)
        except (TypeError, ValueError) as error:  # a ragged list
            raise RuntimeError(f"algorithm {algorithm!r} returned `{name}` that is no array ({error}); "
                               f"expected ({n},) ints") from None
        if values.shape != (n,) or values.dtype.kind not in "iu":
            raise RuntimeError(f"algorithm {algorithm!r} returned `{name}` of shape {values.shape} and dtype "
                               f"{values.dtype}; expected ({n},) ints")
        if n and (values.min() < 0 or values.max() >= limit):
            item = int(np.flatnonzero((values < 0) | (values >= limit))[0])
            raise RuntimeError(f"algorithm {algorithm!r} put item {item} in {name} {values[item]}, outside "
                               f"[0, {limit}) for num_microbatches={num_microbatches} on {problem.num_ranks} ranks")
        cells.append(np.ascontiguousarray(values, dtype=np.int64))
    return MicroBatchResult(cells[0], cells[1], kernel_status(result.status, algorithm),
                            real_bound(result.lower_bound, algorithm))


def checked_kernel(kernel: MicroBatchKernel, algorithm: str, certified: bool = True,
                   built_in: bool = False, witness: MicroBatchKernel | None = None) -> MicroBatchKernel:
    """`kernel` called by `call_kernel`, every result it returns checked (`check_result`), its cells copied
    unless the kernel is orchmllm's own (`registry.built_in`: a plugin that reuses a buffer would rewrite them,
    here another M's result or a plan made before) and made read-only, a plugin's cells held to the budget
    (`within_budget`: before `sources=` or `pipeline=` re-deal them, probe56 F2), and its bound held to the result's own
    step cost (`claimed_bound`), as the choice of M reads every result it tries; a kernel that does not
    certify its plans (`registry.certifies`) then has its bound left out and `optimal` read as feasible.  `witness`
    (a certifying plugin's: orchmllm's auto) cross-examines a claimed bound (`_cross_examine`)."""
    def run(problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
        result = call_kernel(kernel, algorithm, problem, num_microbatches)
        if result is None:
            return None
        result = check_result(problem, result, num_microbatches, algorithm)
        cells = (result.rank, result.microbatch) if built_in else (result.rank.copy(), result.microbatch.copy())
        result = result._replace(rank=read_only(cells[0]), microbatch=read_only(cells[1]))
        loads = None
        if not built_in:
            loads = within_budget(problem, result, num_microbatches, algorithm)[0]
        if result.lower_bound is not None:
            if loads is None:
                loads = cell_loads(problem, result.microbatch * problem.num_ranks + result.rank,
                                   num_microbatches * problem.num_ranks).reshape(num_microbatches, problem.num_ranks)
            claimed = _claimed_step_bound(problem, result, loads, algorithm)
            if witness is not None:
                _cross_examine(problem, num_microbatches, claimed, algorithm, witness)
        if not certified:
            result = result._replace(lower_bound=None, status=Status.FEASIBLE if result.status is Status.OPTIMAL
                                     else result.status)
        return result
    return run


def _claimed_step_bound(problem: MicroBatchProblem, result: MicroBatchResult, loads: np.ndarray,
                        algorithm: str) -> float | None:
    """The kernel's bound on Σ_m max_r load (`claimed_bound`: at most its result's), plus its M's
    overhead; None without one.  A claim of the plan's own Σ_m max_r load is its step cost, summed as
    `step_cost` sums it: the correctly rounded Σ_m max_r load plus the overheads, rounded again, may
    differ from it in the last place (probe26 P26-07: a bound of 14.333333333333332 under a step of
    14.333333333333334 raised RuntimeError); a claim below that sum stays below it."""
    if result.lower_bound is None:
        return None
    m = loads.shape[0]
    costs, cost = problem.item_costs, step_cost(loads, 0.0)  # every cell's sum, and that of their maxima, <= cost
    claimed = claimed_bound(result.lower_bound, cost, algorithm, problem.num_items + m, "Σ_m max_r load",
                            exact=lambda: sums_exact_below(cost, costs, lambda: integral(costs)))
    if claimed == cost:
        return step_cost(loads, problem.microbatch_overhead)
    return float_sum([claimed, m * problem.microbatch_overhead])


def _cross_examine(problem: MicroBatchProblem, num_microbatches: int, claimed: float, algorithm: str,
                   witness: MicroBatchKernel) -> None:
    """RuntimeError naming a certifying plugin whose claimed step bound at M = `num_microbatches` (its overhead
    included) the `witness` kernel's cells (orchmllm's 'auto') at the same M beat, as `api.cross_examine` does for
    `balance`: run only where the claim exceeds orchmllm's own bound (`step_cost_bound`)."""
    own = step_cost_bound(problem.item_costs, problem.lengths, problem.num_ranks, problem.max_tokens_per_microbatch)
    if not claimed > own + num_microbatches * problem.microbatch_overhead:
        return
    cells = witness(problem, num_microbatches)
    if cells is None:
        return
    loads = cell_loads(problem, cells.microbatch * problem.num_ranks + cells.rank,
                       num_microbatches * problem.num_ranks).reshape(num_microbatches, problem.num_ranks)
    reached = step_cost(loads, problem.microbatch_overhead)
    if reached < claimed * (1.0 - (problem.num_items + num_microbatches + 1) * 2.0**-52):
        raise RuntimeError(f"algorithm {algorithm!r} returned lower_bound={claimed!r} at {num_microbatches} "
                           f"micro-batches (overhead included), but orchmllm's 'auto' cells reach a step cost of "
                           f"{reached!r} there: no plan beats a lower bound, so the kernel's certificate is false")


def within_budget(problem: MicroBatchProblem, result: MicroBatchResult, num_microbatches: int,
                  algorithm: str, accounts: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The (loads, tokens) of `result`'s cells (`accounts` when the caller summed them already, as `cell_accounts`
    does); RuntimeError naming the kernel for a cell over the budget."""
    if accounts is None:
        accounts = cell_accounts(problem, result.rank, result.microbatch, num_microbatches)
    loads, tokens = accounts
    if tokens.size and tokens.max() > problem.max_tokens_per_microbatch:
        m, r = np.unravel_index(int(np.argmax(tokens)), tokens.shape)
        raise RuntimeError(f"algorithm {algorithm!r} put {int(tokens[m, r])} tokens in cell (rank {r}, micro-batch "
                           f"{m}), over max_tokens_per_microbatch={problem.max_tokens_per_microbatch}")
    return loads, tokens


def make_microbatch_plan(problem: MicroBatchProblem, result: MicroBatchResult, num_microbatches: int,
                         algorithm: str, *, floor_microbatches: int | None = None,
                         proven_bound: float | None = None, solve_seconds: float = 0.0,
                         pipeline: PipelineStep | None = None, accounts: tuple | None = None) -> MicroBatchPlan:
    """Check a kernel's cells and wrap them with loads, tokens, bound and status.

    The bound is `problem.certified_bound` + floor_microbatches · overhead (the proven fewest
    micro-batches when M was chosen freely; M itself, the default, when fixed), or
    `proven_bound` (a step cost with overhead the caller proved) when larger, rounded up where
    every cost and the overhead are whole multiples of one unit (`rounded_up`); with M fixed, a bound the kernel
    proved counts too.  A malformed result (`check_result`), a cell over the budget, or a kernel's bound
    above its own step cost is a bug of the kernel: RuntimeError, never a wrong plan handed
    on; a step cost beyond float64 is the input's (ValueError).  `pipeline`: the schedule's step of
    these cells (`balancers.pipeline`), when planned for one; `accounts`: their (loads, tokens) as
    `cell_accounts` sums them, when the planner has them (not summed again).
    """
    result = check_result(problem, result, num_microbatches, algorithm)
    rank, microbatch = result.rank, result.microbatch
    loads, tokens = within_budget(problem, result, num_microbatches, algorithm, accounts)
    overhead = problem.microbatch_overhead
    cost = step_cost(loads, overhead)
    check_step_cost(cost, loads, overhead)
    claimed = _claimed_step_bound(problem, result, loads, algorithm)
    fixed = floor_microbatches is None
    floor_m = num_microbatches if fixed else floor_microbatches
    bound = float_sum([problem.certified_bound, floor_m * overhead])
    if proven_bound is not None:
        bound = max(bound, float(proven_bound))
    bound = rounded_up(bound, cost, problem.num_ranks,
                       lambda: cost_unit(np.append(problem.item_costs, overhead)))
    if fixed and claimed is not None:
        bound = max(bound, claimed)
    bound, status = certify(cost, bound, result.status, algorithm, "step cost")
    for array in (rank, microbatch, loads, tokens):
        read_only(array)
    return MicroBatchPlan(rank=rank, microbatch=microbatch, num_microbatches=num_microbatches,
                          num_ranks=problem.num_ranks, cell_loads=loads, cell_tokens=tokens, step_cost=cost,
                          lower_bound=bound, status=status, algorithm=algorithm,
                          max_tokens_per_microbatch=problem.max_tokens_per_microbatch, microbatch_overhead=overhead,
                          padded=problem.padded, solve_seconds=solve_seconds, pipeline=pipeline)

"""The result of balancing: a frozen plan with its quality certificate."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from .cost import CostModel
from .problem import Problem, Status, lower_bound, rank_loads, rank_tokens, require_equal_counts
from .validation import as_index


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
    through the communication-aware pass (`balance(..., sources=...)`).
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


def make_plan(problem: Problem, assignment: np.ndarray, status: Status, algorithm: str,
              kernel_bound: float | None = None, solve_seconds: float = 0.0,
              communication_aware: bool = False) -> BalancePlan:
    """Check a kernel's assignment and wrap it with loads, bound and status.

    A kernel that returns a malformed assignment or overflows the cap is a bug, so this
    raises RuntimeError rather than hand a wrong plan to the caller.
    """
    assignment = np.asarray(assignment)
    if assignment.shape != problem.lengths.shape or assignment.dtype.kind not in "iu":
        raise RuntimeError(f"algorithm {algorithm!r} returned an assignment of shape "
                           f"{assignment.shape} and dtype {assignment.dtype}; expected ({problem.num_items},) ints")
    assignment = np.ascontiguousarray(assignment, dtype=np.int64)
    if assignment.size and (assignment.min() < 0 or assignment.max() >= problem.num_ranks):
        raise RuntimeError(f"algorithm {algorithm!r} assigned an item outside ranks [0, {problem.num_ranks})")
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
    if kernel_bound is not None and kernel_bound >= makespan:
        bound = makespan  # the kernel proved its plan optimal: no other bound can add to that
    else:
        bound = lower_bound(problem)
        if kernel_bound is not None:
            bound = max(bound, float(kernel_bound))
        # Bounds are float sums in another order than the loads; never let rounding lift
        # one above a makespan that was actually reached.
        bound = min(bound, makespan)
    if makespan == bound:
        status = Status.OPTIMAL
    elif status is Status.OPTIMAL:
        raise RuntimeError(f"algorithm {algorithm!r} claimed optimality at makespan {makespan} "
                           f"but only proved a bound of {bound}")
    for array in (assignment, loads, tokens):
        array.setflags(write=False)
    return BalancePlan(assignment=assignment, loads=loads, tokens=tokens, makespan=makespan,
                       lower_bound=bound, status=status, algorithm=algorithm,
                       num_ranks=problem.num_ranks, padded=problem.padded, cost=problem.cost,
                       communication_aware=communication_aware, solve_seconds=solve_seconds)

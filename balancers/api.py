"""`balance()`: validate once, run a registered kernel, certify the plan."""

from __future__ import annotations

import time

from .plan import BalancePlan, make_plan
from .problem import make_problem
from .registry import ALGORITHMS


def balance(lengths, num_ranks, *, cost=None, padded=False, algorithm="auto",
            max_tokens_per_rank=None, time_limit=None) -> BalancePlan:
    """Assign items of the given lengths to `num_ranks` ranks, minimising the makespan.

    Args:
        lengths: 1-D non-negative integer lengths, one per item (tokens, patches, frames).
        num_ranks: number of data-parallel ranks D >= 1.
        cost: per-item cost model f(l); default f(l) = l.
        padded: rank cost is count · f(max l) (fixed-shape batches) instead of sum f(l).
        algorithm: a name in `ALGORITHMS`.
        max_tokens_per_rank: memory cap on tokens per rank (count · max l when padded).
        time_limit: seconds an exact or anytime solver may spend.

    Returns:
        A frozen `BalancePlan`; `InfeasibleError` (a ValueError) when the cap cannot be met.
    """
    if not isinstance(algorithm, str):
        raise TypeError(f"`algorithm` must be a str; got {type(algorithm).__name__}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown `algorithm` {algorithm!r}; choose one of {sorted(ALGORITHMS)}")
    problem = make_problem(lengths, num_ranks, cost=cost, padded=padded,
                           max_tokens_per_rank=max_tokens_per_rank, time_limit=time_limit)
    start = time.perf_counter()
    result = ALGORITHMS[algorithm](problem)
    seconds = time.perf_counter() - start
    return make_plan(problem, result.assignment, result.status, algorithm,
                     kernel_bound=result.lower_bound, solve_seconds=seconds)

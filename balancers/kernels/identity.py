"""No balancing: the baseline every other plan is compared against.

Items are taken to be listed rank by rank, as an all-gather of per-rank lengths lists
them, with ceil/floor(n / D) items per rank: item i stays on rank i · D // n.
"""

from __future__ import annotations

import numpy as np

from ..problem import KernelResult, Problem, require_within_cap


def chunk_sources(num_items: int, num_ranks: int) -> np.ndarray:
    """Rank that sampled item i when n items are dealt out in D contiguous chunks.

    (`orchmllm.runtime.exchange.home_ranks` is another question: the rank of each item given
    how many items every rank listed.)

    >>> chunk_sources(5, 2).tolist()
    [0, 0, 0, 1, 1]
    """
    return (np.arange(num_items, dtype=np.int64) * num_ranks) // num_items


def solve(problem: Problem) -> KernelResult:
    assignment = chunk_sources(problem.num_items, problem.num_ranks)
    require_within_cap(problem, assignment, "`identity` keeps every item home and")
    return KernelResult(assignment)

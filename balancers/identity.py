"""No balancing: the baseline every other plan is compared against.

Items are taken to be listed rank by rank, as an all-gather of per-rank lengths lists
them, with ceil/floor(n / D) items per rank: item i stays on rank i · D // n.
"""

from __future__ import annotations

import numpy as np

from .problem import InfeasibleError, KernelResult, Problem, rank_tokens


def home_ranks(num_items: int, num_ranks: int) -> np.ndarray:
    """Rank that sampled item i when n items are dealt out in D contiguous chunks."""
    return (np.arange(num_items, dtype=np.int64) * num_ranks) // num_items


def solve(problem: Problem) -> KernelResult:
    assignment = home_ranks(problem.num_items, problem.num_ranks)
    cap = problem.max_tokens_per_rank
    if cap is not None:
        tokens = rank_tokens(problem, assignment)
        if tokens.max() > cap:
            rank = int(np.argmax(tokens))
            raise InfeasibleError(
                f"`identity` keeps every item home, and rank {rank} holds {int(tokens[rank])} tokens > "
                f"max_tokens_per_rank={cap}; a cap of at least {int(tokens.max())} is needed",
                min_cap=int(tokens.max()))
    return KernelResult(assignment)

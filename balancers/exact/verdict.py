"""What a proof may conclude besides a plan: that no plan fits the memory cap.

The provers of this room return it and never raise; the kernel that ran them raises the
user's InfeasibleError, naming the smallest cap that works (which takes another solve).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CapInfeasible:
    """`prover` proved that no plan fits the problem's max_tokens_per_rank."""

    prover: str

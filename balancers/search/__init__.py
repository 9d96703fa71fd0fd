"""Improvers of a plan in hand: local search on loads and exact re-solves of small groups of ranks.

Every improver has one signature, `improve(problem, assignment, work_limit=None, target=-inf)
-> Improved`: descend from `assignment` (unpadded cost), never worse than it, until `target` (a
proven lower bound: nothing can beat it) is reached, no move helps, or `work_limit` units of
work (the improver's own, machine-independent count; its `default_work(num_items)` when None)
are spent.
"""

from typing import NamedTuple

import numpy as np


class Improved(NamedTuple):
    """An improver's plan (never worse than its start) and the work it spent."""

    assignment: np.ndarray
    work: int

"""A step's item times at every degree, made once per item for all its micro-batches' passes.

The split micro-batch planner plans many micro-batches of one step's items (fills, spills, the search over them),
and each pass made its items' times again: the allotment's candidates at every degree (`split.allot`) and the
packing bound's pieces (`packing_bound.Pieces`), on a block inside a node where the degree fits one.  `spec.item_times`
is elementwise, so a row made for one item is the row any call on that item makes (the same float operations):
here each item's row is made where first asked and kept.  Rows are made as `allot` makes them, with float errors
raised (an overflow); where that raises, no row is kept and the caller makes its own, as before, with its own
error (allgiant, D = 512 x 16, seed 11: 142 allotments and 82 packing bounds of overlapping sets, 9 % of the row
in `item_times`).
"""

from __future__ import annotations

import numpy as np

from .spec import ContextParallel


class StepTimes:
    """Rows of `lengths` (a step's items, int64) at `spec`'s degrees, made where first asked."""

    def __init__(self, lengths: np.ndarray, spec: ContextParallel, cost):
        self.lengths, self.spec, self.cost = lengths, spec, cost
        self.degrees = np.array(spec.degrees, dtype=np.int64)
        self.table = np.empty((lengths.size, self.degrees.size))
        self.known = np.zeros(lengths.size, dtype=bool)

    def rows(self, items: np.ndarray) -> np.ndarray | None:
        """The rows of the step's `items` (distinct indices), or None where making a missing one raises a float
        error."""
        items = np.asarray(items, dtype=np.int64)
        missing = items[~self.known[items]]
        if missing.size:
            try:
                with np.errstate(over="raise", invalid="raise"):
                    self.table[missing] = self.spec.item_times(self.cost, self.lengths[missing][:, None],
                                                               self.degrees[None, :],
                                                               (self.degrees <= self.spec.gpus_per_node)[None, :])
            except FloatingPointError:
                return None
            self.known[missing] = True
        return self.table[items]

    def reader(self, items: np.ndarray):
        """`rows` of a micro-batch's `items` by their places in it (`split.allot`'s candidates)."""
        items = np.asarray(items, dtype=np.int64)
        return lambda places: self.rows(items[places])

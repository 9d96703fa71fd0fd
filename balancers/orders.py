"""A problem's orders of its items (`problem.SortedItems`): computed once, shared by the problems over the
same items, and written by the problem only, since its certificate reads them."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class Orders(Mapping):
    """The orders `SortedItems` computed of a problem's items, name -> read-only array, each kept once.

    Only the problem writes them (`kept_order`): a kernel that assigns one gets a RuntimeError naming
    it, so no kernel can feed the certificate (`bounds.lower_bound` reads `sorted_costs`) other items'
    orders.  They belong to the `lengths` and `item_costs` they were computed of: a problem built over
    the same items (`dataclasses.replace` of other options) shares them, one over other items starts
    afresh (`SortedItems.__post_init__`)."""

    def __init__(self, lengths: np.ndarray, item_costs: np.ndarray, entries=()):
        self.lengths, self.item_costs = lengths, item_costs
        self._entries = {name: read_only_copy(value) for name, value in dict(entries).items()}

    def __getitem__(self, name: str) -> np.ndarray:
        return self._entries[name]

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str, default=None):
        return self._entries.get(name, default)

    def __setitem__(self, name: str, value) -> None:
        raise RuntimeError(f"problem.orders[{name!r}] is written by the problem only (its items' orders, read-only, "
                           f"which its certificate reads): read `problem.{name}`, or build another problem")

    def keep(self, name: str, value: np.ndarray) -> np.ndarray:
        """Keep `value` (made read-only) as the order `name`, computed once of these items."""
        value.setflags(write=False)
        self._entries[name] = value
        return value

    def holds(self, lengths: np.ndarray, item_costs: np.ndarray) -> bool:
        """Whether these orders are of `lengths` and `item_costs`: the same arrays, or equal ones."""
        return all(mine is theirs or (mine.shape == theirs.shape and bool(np.array_equal(mine, theirs)))
                   for mine, theirs in ((self.lengths, lengths), (self.item_costs, item_costs)))


def read_only_copy(value) -> np.ndarray:
    """`value` as an array that no one writes: itself where it is read-only already, else a read-only copy."""
    array = np.asarray(value)
    if array.flags.writeable:
        array = np.array(array)
        array.setflags(write=False)
    return array

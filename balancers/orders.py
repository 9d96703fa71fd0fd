"""A problem's orders of its items (`problem.SortedItems`): computed once, shared by the problems over the
same items, and written by the problem only, since its certificate reads them."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


class Orders(Mapping):
    """The orders `SortedItems` computed of a problem's items, name -> read-only array, each kept once.

    Only the problem writes them (`kept_order`, through the private `_keep`), each once: a kernel that
    assigns one gets a RuntimeError naming it, and every array is `sealed`.  The certificate does not
    rely on that: it reads the orders before any kernel is handed the problem (`plan.run_kernel`).  They belong to the
    `lengths` and `item_costs` they were computed of: a problem built over
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

    def _keep(self, name: str, value: np.ndarray) -> np.ndarray:
        """Keep `value` (`sealed`) as the order `name`, computed once of these items (never replaced)."""
        if name in self._entries:
            raise RuntimeError(f"problem.orders[{name!r}] is kept already: an order of the problem's items is "
                               f"computed once, never replaced")
        value = self._entries[name] = sealed(value)
        return value

    def holds(self, lengths: np.ndarray, item_costs: np.ndarray) -> bool:
        """Whether these orders are of `lengths` and `item_costs`: the same arrays, or equal ones."""
        return all(mine is theirs or (mine.shape == theirs.shape and bool(np.array_equal(mine, theirs)))
                   for mine, theirs in ((self.lengths, lengths), (self.item_costs, item_costs)))


def read_only_copy(value) -> np.ndarray:
    """`value` as an array that no one writes (`sealed`): itself where it is read-only already, else a copy."""
    array = np.asarray(value)
    return sealed(np.array(array) if array.flags.writeable else array)


def sealed(array: np.ndarray) -> np.ndarray:
    """`array` made read-only, as a view of it: a view of a read-only owner cannot be made writeable again
    (`setflags(write=True)` raises), so a kernel handed it cannot write it by mistake or by a flag.

    >>> view = sealed(np.arange(3))
    >>> view.setflags(write=True)
    Traceback (most recent call last):
    ...
    ValueError: cannot set WRITEABLE flag to True of this array
    """
    array.setflags(write=False)
    return array.view()

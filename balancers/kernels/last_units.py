"""The last thing made of some read-only arrays, kept for the next call over the same memory (`lpt`'s integer
costs and plans, which the pipeline planner's shaped LPT reads right after the plain planner's LPT made them)."""

from __future__ import annotations

import weakref

import numpy as np


class LastUnits:
    """What was made last of some read-only arrays (`lpt._key_steps`: the integer form of sorted costs, their int64
    values, bits, float total and the steps of one shift; `lpt._greedy_sorted`: its LPT plan), for the next call over
    the same memory: the pipeline planner's shaped LPT (`greedy_from`) runs over the sorted costs and cost order
    (a problem's kept orders, `orders.sealed`: views of read-only owners) that the plain planner's LPT used just
    before.  One entry, replaced whole (a thread sees the old or the new one, each array checked against its
    owner and place in it), dropped with any of its owners; read by the first of its arrays (the plan by its sorted
    costs, which the plain planner's canonical item order shares, `auto.in_canonical_order`), the rest still
    read-only."""

    def __init__(self):
        self.entry = None

    def get(self, *arrays: np.ndarray) -> tuple | None:
        """What was kept for these arrays, the first of those it was kept for (the rest still read-only), or None."""
        entry = self.entry
        if entry is None or len(entry[0]) < len(arrays):
            return None
        for index, (reference, place) in enumerate(zip(*entry[:2])):
            owner = reference()
            # an owner of its memory may be made writeable again (and written): then the entry is stale
            if owner is None or owner.flags.writeable:
                return None
            if index < len(arrays) and not same_memory(arrays[index], owner, place):
                return None
        return entry[2]

    def keep(self, arrays: tuple, units) -> None:
        """`units()` kept for these arrays where they are read-only (made only then)."""
        memories = [_memory(array) for array in arrays]
        if all(isinstance(owner, np.ndarray) and not (array.flags.writeable or owner.flags.writeable)
               for array, (owner, _) in zip(arrays, memories)):
            self.entry = (tuple(weakref.ref(owner, self._forget) for owner, _ in memories),
                          tuple(place for _, place in memories), units())

    def _forget(self, reference) -> None:
        entry = self.entry
        if entry is not None and any(kept is reference for kept in entry[0]):
            self.entry = None


def same_memory(array: np.ndarray, other: np.ndarray, place: tuple | None = None) -> bool:
    """Whether `array` lies where `other` does (`place`: where in `other`, the owner, it lies; else `other`'s own)."""
    owner, where = _memory(array)
    if place is None:
        other, place = _memory(other)
    return owner is other and where == place


def _memory(array: np.ndarray) -> tuple[np.ndarray, tuple]:
    """The array owning `array`'s memory, and where and how `array` lies in it."""
    return (array if array.base is None else array.base), (array.__array_interface__["data"][0], array.shape,
                                                            array.strides, array.dtype.str)

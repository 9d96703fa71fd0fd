"""The canonical-allotment lower bound of moldable scheduling, and the allotment itself.

For a makespan T, item i's canonical degree is the smallest allowed degree whose best-case
time fits T, t_i(c) <= T (intra-node κ: no plan's group does better); any plan of makespan
T runs every item at a degree at least that, so it does at least the work
W(T) = Σ_i min_{c' >= c_i(T)} c' · t_i(c') (= c_i · t_i(c_i), since work never falls with
the degree; the minimum keeps the bound valid even where rounding breaks that by an ulp).
So T is a bound unless some item fits no degree or W(T) > D · T:

    T* = min { T : every item fits T and W(T) <= D · T }

W is a step function that only falls where T crosses an item time, so T* is, on the first
interval [b_j, b_j+1) between sorted item times where it fits, max(b_j, W_j / D).  Work is
at least f (the unsplit cost), so T >= Σ f / D, and an item with f <= Σ f / D that may stay
unsplit runs unsplit at every T above: only the other items (the candidates, few) get times
at every degree and have their times sorted, O(n + m |C| log m) for m candidates.  The chosen
W_j is re-summed exactly (fsum), so with C = {1} the bound is exactly max(Σ f / D, max f).
Source: the canonical allotment of moldable-task scheduling (Ludwig & Tiwari 1994; Mounié,
Rapine & Trystram 2007).
T* asks nothing of where groups sit, only of each item's degree and time: on nodes of a size some
degree does not divide (6 GPUs, degree 4) the planners leave out the blocks straddling two nodes
(`blocks.free_blocks`), and fewer blocks only raise the optimum, so T* stays a lower bound there
(as does `microbatch_bound.py`, built on it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..problem import exact_sum, integer_sum, integer_values


def least_work(times: np.ndarray, degrees: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Suffix minima of the work c · t(c) over the degrees (columns, ascending): the least work
    of item i at degree index k or above among the allowed ones (inf where none is)."""
    work = np.where(allowed, times * degrees, np.inf)
    return np.minimum.accumulate(work[:, ::-1], axis=1)[:, ::-1]


def smallest_fitting(times: np.ndarray, allowed: np.ndarray, target: float) -> np.ndarray:
    """Index of each row's smallest allowed degree whose time fits `target` (-1 where none fits)."""
    fits = allowed & (times <= target)
    return np.where(fits.any(axis=1), np.argmax(fits, axis=1), -1)


@dataclass(frozen=True, eq=False)
class Allotment:
    """Items' unsplit costs, and the candidates' best-case times at every degree.

    `candidates`: the items that may split at some T above Σ f / D (longer than that, or
    over the token budget unsplit), ascending; `times[k, j]` the best-case time of candidate
    k at `degrees[j]` (ascending), `allowed[k, j]` whether that degree is open to it.  Every
    other item runs unsplit at cost `costs[i]` (degree 1 is allowed and fits).
    """

    costs: np.ndarray
    degrees: np.ndarray
    candidates: np.ndarray
    times: np.ndarray
    allowed: np.ndarray
    num_ranks: int
    canonical: dict = field(default_factory=dict, init=False, repr=False)  # target -> `degrees_at(target)`; a copy
    # (`dataclasses.replace`, e.g. of other times) starts empty
    found: list = field(default_factory=list, init=False, repr=False)  # `bound()`, once made (a copy starts empty)

    def degrees_at(self, target: float) -> np.ndarray:
        """The canonical degree of every item at `target` (0 where a candidate fits none), read-only, made once per
        target (the split planner asks for the bound's four times)."""
        degree = self.canonical.get(target)
        if degree is None:
            degree = np.ones(self.costs.size, dtype=np.int64)
            index = smallest_fitting(self.times, self.allowed, target)
            degree[self.candidates] = np.where(index >= 0, self.degrees[index], 0)
            degree.setflags(write=False)
            self.canonical[target] = degree
        return degree

    def _work(self, least: np.ndarray, others: _Unsplit, target: float) -> float:
        """The canonical work at `target`, summed exactly (inf when a candidate fits no degree); `others`
        the items that never split."""
        index = smallest_fitting(self.times, self.allowed, target)
        if index.size and index.min() < 0:
            return math.inf
        return others.sum_with(least[np.arange(index.size), index])

    def bound(self) -> float:
        """T*: the smallest T at which every item fits a degree and the canonical work is <= D · T, made once (a
        micro-batch's bound and its plan ask for it: `microbatch._PassPlans`).

        The interval is found on running float sums, then confirmed on exact sums (fsum).

        >>> a = Allotment(np.array([12.0, 3.0, 3.0]), np.array([1, 2]), np.array([0]),
        ...               np.array([[12.0, 6.5]]), np.ones((1, 2), dtype=bool), 2)
        >>> a.bound(), a.degrees_at(a.bound()).tolist()
        (9.5, [2, 1, 1])
        """
        if not self.found:
            self.found.append(self._bound())
        return self.found[0]

    def _bound(self) -> float:
        """`bound`, made."""
        d = self.num_ranks
        least = least_work(self.times, self.degrees, self.allowed)
        smallest = np.where(self.allowed, self.times, np.inf).min(axis=1)
        others = _Unsplit.of(np.delete(self.costs, self.candidates))
        start = max(float(smallest.max(initial=0.0)), float(others.costs.max(initial=0.0)),
                    others.sum_with(least[:, 0]) / d)
        worked: dict[float, float] = {}  # target -> `_work` there: the search below often asks for `start` again

        def work_at(target: float) -> float:
            if target not in worked:
                worked[target] = self._work(least, others, target)
            return worked[target]

        points, drops = _events(self.times, least, self.allowed, start)
        work = work_at(start) + np.concatenate(([0.0], np.cumsum(drops)))
        distinct = np.flatnonzero(np.append(points[1:] != points[:-1], True))  # last event of each time
        points, work = points[distinct], work[distinct]
        fits = np.append(np.maximum(points[:-1], work[:-1] / d) < points[1:], True)
        j = int(np.argmax(fits))
        while True:  # confirm on exact sums: interval j fits, interval j - 1 does not
            exact = work_at(float(points[j])) / d
            if j + 1 < points.size and max(points[j], exact) >= points[j + 1]:
                j += 1
            elif j > 0 and max(points[j - 1], work_at(float(points[j - 1])) / d) < points[j]:
                j -= 1
            else:
                return float(max(points[j], exact))


class _Unsplit(NamedTuple):
    """The costs of the items that never split, and their exact sum where all are integers (else None): summed once
    for the bound's many exact sums with the candidates' parts."""

    costs: np.ndarray
    total: int | None

    @classmethod
    def of(cls, costs: np.ndarray) -> _Unsplit:
        integers = integer_values(costs)
        return cls(costs, None if integers is None else integer_sum(integers))

    def sum_with(self, values: np.ndarray) -> float:
        """`exact_sum` of these costs and `values` together: the exact integer total, rounded once, is that float."""
        integers = None if self.total is None else integer_values(values)
        if integers is None:
            return exact_sum(np.concatenate((self.costs, values)))
        return float(self.total + integer_sum(integers))


def _events(times: np.ndarray, least: np.ndarray, allowed: np.ndarray, start: float) -> tuple[np.ndarray, np.ndarray]:
    """(`start` and the times above it at which some item's canonical degree drops, ascending;
    the change of the canonical work at each of those times but the first).

    Item i's canonical degree drops at the times below every smaller allowed degree's time
    (its record lows, read by ascending degree), from one record to the next larger one's.
    """
    masked = np.where(allowed, times, np.inf)
    rows_count, columns_count = masked.shape
    before = np.concatenate((np.full((rows_count, 1), np.inf), np.minimum.accumulate(masked, axis=1)[:, :-1]), axis=1)
    record = masked < before
    # The next record column to the right: the degree used just below this record's time.
    following = np.where(record, np.arange(columns_count), columns_count)
    following = np.concatenate((np.minimum.accumulate(following[:, ::-1], axis=1)[:, ::-1][:, 1:],
                                np.full((rows_count, 1), columns_count)), axis=1)
    rows, cols = np.nonzero(record & (masked > start))
    drops = least[rows, cols] - least[rows, following[rows, cols]]
    order = np.argsort(masked[rows, cols], kind="stable")
    return np.concatenate(([start], masked[rows, cols][order])), drops[order]

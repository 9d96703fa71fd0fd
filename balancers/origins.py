"""Where each item is now and what moving it costs: the input of a communication-aware plan, checked once.

`balance(..., sources=, item_bytes=, topology=)` and `balance_microbatches(...)` build one `Origins`
(`as_origins`); the locality passes read it as it is: item i sits on rank `sources[i]`, moving it
off that rank costs `item_bytes[i]`, and rank r is on node r // `gpus_per_node`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .validation import as_item_bytes, as_sources, is_int


@dataclass(frozen=True, eq=False)
class Origins:
    """The items' source ranks (int64), the bytes each moves (float64) and the node size (1: every
    rank its own node), checked by `as_origins`."""

    sources: np.ndarray
    item_bytes: np.ndarray
    gpus_per_node: int

    def take(self, items: np.ndarray) -> Origins:
        """The origins of `items` (indices or a mask), for a problem over them alone."""
        return Origins(self.sources[items], self.item_bytes[items], self.gpus_per_node)


def gpus_per_node(topology, num_ranks: int) -> int:
    """gpus_per_node of a duck-typed topology whose world size must equal num_ranks."""
    if not (hasattr(topology, "gpus_per_node") and hasattr(topology, "world_size")):
        raise TypeError(f"`topology` must have `gpus_per_node` and `world_size` (e.g. orchmllm.topology.Topology); "
                        f"got {type(topology).__name__}")
    gpus, world_size = topology.gpus_per_node, topology.world_size
    if not is_int(world_size) or world_size < 1:  # probe29 P29-02: Python's `%` errors on a str or None
        raise (ValueError if is_int(world_size) else TypeError)(f"`topology.world_size` must be a positive int; "
                                                                 f"got {world_size!r}")
    if not is_int(gpus) or gpus <= 0 or world_size % gpus:
        raise ValueError(f"`topology.gpus_per_node` must be a positive int dividing its world size {world_size}; "
                         f"got {gpus!r}")
    if world_size != num_ranks:
        raise ValueError(f"`topology` has {world_size // gpus} nodes × {gpus} gpus = {world_size} "
                         f"!= num_ranks {num_ranks}")
    return int(gpus)


def as_origins(problem, sources, item_bytes, topology) -> Origins | None:
    """The checked `Origins` of `problem`'s items (`item_bytes` default: their lengths; no `topology`:
    every rank its own node); None without `sources`, where `item_bytes` and `topology` must not be
    given either.

    >>> from orchmllm.balancers.problem import make_problem
    >>> as_origins(make_problem([3, 4], 2), [1, 0], None, None)
    Origins(sources=array([1, 0]), item_bytes=array([3., 4.]), gpus_per_node=1)
    """
    if sources is None:
        for name, value in (("item_bytes", item_bytes), ("topology", topology)):
            if value is not None:
                raise ValueError(f"`{name}` needs `sources` (the rank that holds each item now)")
        return None
    return Origins(sources=as_sources(sources, problem.num_items, problem.num_ranks),
                   item_bytes=as_item_bytes(problem.lengths if item_bytes is None else item_bytes, problem.num_items),
                   gpus_per_node=1 if topology is None else gpus_per_node(topology, problem.num_ranks))


def fit_in_turn(places: np.ndarray, lengths: np.ndarray, room: np.ndarray) -> np.ndarray:
    """Which items fit the `room` left at their place (`places[i]`, an index into `room`), taken shortest first at
    each place (ties: the order given): a mask in the items' order.  Items of cost 0 sent back to their sources
    (`balance`'s and `balance_microbatches`' last step): they change no load, only tokens.

    >>> fit_in_turn(np.array([0, 0, 1, 0]), np.array([5, 2, 9, 4]), np.array([6, 8])).tolist()
    [False, True, False, True]
    """
    if not places.size:
        return np.zeros(0, dtype=bool)
    order = np.lexsort((lengths, places))
    at, taken = places[order], lengths[order]
    starts = np.flatnonzero(np.r_[True, at[1:] != at[:-1]])  # each place's run
    total = np.cumsum(taken)
    before = (total[starts] - taken[starts]).repeat(np.diff(np.r_[starts, at.size]))
    fits = np.zeros(places.size, dtype=bool)
    fits[order] = total - before <= room[at]
    return fits

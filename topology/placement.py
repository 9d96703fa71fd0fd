"""Placement of balanced groups onto ranks: which rank runs which group.

A balanced plan fixes which items run together (group g); every bijection
rank_of_group: groups -> ranks gives the same makespan, but not the same traffic: item i
moves from sources[i] to rank_of_group[group_of_item[i]].  Methods, by name in
`PLACEMENTS`:
- "identity": group g -> rank g (the naive baseline);
- "lap": maximise bytes that stay on their rank, exactly (sparse linear assignment);
- "lap_node": maximise bytes that stay on their node, exactly (groups -> node slots),
  then, within every node, bytes that stay on their rank (exact per node);
- "ilp": the OrchMLLM paper's node-wise rearrangement (see `nodewise_ilp`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..balancers.locality.lap import assign_groups
from ..balancers.problem import Status, as_time_limit
from ..balancers.validation import as_item_bytes, as_sources
from .cluster import Topology
from .nodewise_ilp import solve as solve_nodewise_ilp
from .traffic import Traffic, traffic_of


@dataclass(frozen=True, eq=False)
class Placement:
    """A bijection of groups onto ranks and the traffic it causes.

    `rank_of_group[g]` runs group g; `destinations[i]` is item i's rank.  `status` is
    `optimal` when the method proved its objective optimal, `time_limit` when an exact
    solver stopped early, `feasible` otherwise.
    """

    rank_of_group: np.ndarray
    destinations: np.ndarray
    traffic: Traffic
    method: str
    status: Status
    solve_seconds: float


Method = Callable[[np.ndarray, np.ndarray, np.ndarray, Topology, float | None], tuple[np.ndarray, Status]]


def _identity(group_of_item, sources, item_bytes, topology, time_limit):
    return np.arange(topology.world_size, dtype=np.int64), Status.FEASIBLE


def _lap(group_of_item, sources, item_bytes, topology, time_limit):
    return assign_groups(group_of_item, sources, item_bytes, topology.world_size), Status.OPTIMAL


def _lap_node(group_of_item, sources, item_bytes, topology, time_limit):
    rank_of_group = assign_groups(group_of_item, sources, item_bytes, topology.world_size,
                                  topology.gpus_per_node)
    return rank_of_group, Status.OPTIMAL


PLACEMENTS: dict[str, Method] = {
    "identity": _identity,
    "lap": _lap,
    "lap_node": _lap_node,
    "ilp": solve_nodewise_ilp,
}


def place(group_of_item, sources, item_bytes, topology: Topology, method: str = "lap",
          time_limit: float | None = None) -> Placement:
    """Place the groups of a balanced plan (one group per rank) onto ranks with `method`.

    `group_of_item` is a plan's assignment (groups numbered 0..world_size-1), `sources`
    the rank that holds each item now, `item_bytes` its size.  `time_limit` bounds "ilp".
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"`topology` must be a Topology; got {type(topology).__name__}")
    if not isinstance(method, str) or method not in PLACEMENTS:
        raise ValueError(f"unknown placement `method` {method!r}; choose one of {sorted(PLACEMENTS)}")
    group_of_item = as_sources(group_of_item, np.size(group_of_item), topology.world_size, name="group_of_item")
    sources = as_sources(sources, group_of_item.size, topology.world_size)
    item_bytes = as_item_bytes(item_bytes, group_of_item.size)
    time_limit = as_time_limit(time_limit)
    start = time.perf_counter()
    rank_of_group, status = PLACEMENTS[method](group_of_item, sources, item_bytes, topology, time_limit)
    seconds = time.perf_counter() - start
    if not np.array_equal(np.sort(rank_of_group), np.arange(topology.world_size)):
        raise RuntimeError(f"placement {method!r} returned a map that is not a bijection of groups onto ranks")
    destinations = rank_of_group[group_of_item]
    rank_of_group.setflags(write=False)
    destinations.setflags(write=False)
    return Placement(rank_of_group, destinations, traffic_of(sources, destinations, item_bytes, topology),
                     method, status, seconds)

"""Communication-aware balancing: reach the plain makespan while moving only what must move.

Items start on `sources[i]`; moving item i off its rank costs `item_bytes[i]`, across
nodes far more than within one.  Given a plain plan of makespan M (any kernel), find

    minimise  sum(item_bytes[i] for i if node(dest[i]) != node(sources[i]))   (then off-rank bytes)
    s.t.      max(loads(dest)) <= M · (1 + slack),  tokens(dest) <= cap

Plain code (unpadded cost):
    target = M * (1 + slack)
    every rank keeps its own items, largest first, each one that still fits under target
    the rest, largest first, per node: dealt round robin to the node's least-loaded ranks
        that have room (4 · gpus_per_node items per node per round), while each fits its rank
    what no rank of its node takes: dealt the same way to the least-loaded ranks of all
        (an LPT round, k-th largest -> k-th least loaded, when nothing fits)
    while a rank is above target: the move or swap that fixes it adding the fewest
        inter-node bytes, partners from its own node first (every node at once), then
        from the roomiest ranks (repair)
A heuristic (the exact problem is a generalised assignment problem, NP-hard; bounds on
the inter-node bytes it must move are in `orchmllm.topology.bounds`); overloaded ranks
shed only what does not fit and under-loaded ranks take it, same node first.  Padded
cost, or whenever the above misses the target or the cap: the plain plan itself, its
groups placed on ranks by an exact sparse linear assignment (`assign_groups`, also used
by `orchmllm.topology.place`; on nodes greedily by bytes where its matrix would be large
and dense: length-grouped sampling, every group from many nodes), then items of equal
length re-dealt among the places such items take (no rank's load or tokens change).
Either way the result is never worse than the plain makespan times (1 + slack).  The deal runs under
labels read from the items (`canonical_ranks`), not the ranks' own, and so do the placement of the plain
plan's groups and its equal-length re-deal (probe27 P27-03): their ties by rank index then follow the items,
so a relabelling of a symmetric topology's ranks (sources mapped alike, every rank holding an item) relabels
their plans.  One candidate keeps the ranks' own labels: the plain plan itself, as its kernel labelled it (so
that the result never moves more bytes than it); where it moves the fewest bytes a relabelling may move other
bytes (`balance`: 0 of probe27's f06 rows, seeds 400-599; `balance_microbatches`, which keeps its plain cells
so too: 6 of 200 rows, 5 on tied lengths, all at D <= 16).

The deal's plan stands where a relaxation proves that no labelling of the plain plan's
groups (a bijection onto the ranks) moves fewer bytes (each group on its own best node, the
bijection ignored; rank bytes on a tie of node bytes): O(n), a few ms at D = 2560 and 360k
items, where the LAP takes 40-55 ms.  Elsewhere the LAP's placement (as above) and the plain
plan itself are candidates too, and the one moving the fewest bytes wins (the deal's on
ties).  So the result never moves more bytes than the plain plan (lexicographically), nor,
where the LAP runs, more bytes across nodes than the best labelling of its groups (where the
greedy places them instead: 0.02-0.25 % more across nodes on the measured inputs, the
length-grouped ones and padded plans at D >= 1024, makespans equal).  Original to orchmllm;
the LAP is scipy's LAPJVsp (Jonker-Volgenant).

The phases live in their own modules: `locality_deal` (keep home, take in node, take
anywhere), `locality_repair`, `lap` (the exact group placement) and `redeal` (the
equal-length re-deal); inputs are checked by `validation.as_sources` / `as_item_bytes`.
"""

from __future__ import annotations

import numpy as np

from ..origins import Origins
from ..problem import Problem, rank_loads, rank_tokens
from .deal import NoRoom, keep_home, take_anywhere, take_in_node
from .fill import fill_locally, filler_share
from .lap import LAP_MAX_ENTRIES, _pair_bytes, assign_groups
from .partial_plan import PartialPlan, node_of, on_other_nodes
from .redeal import redeal_equal_items
from .repair import repair

FILL_ON_MISS, FILL_ONLY = "on_miss", "only"
FILLS = (None, FILL_ON_MISS, FILL_ONLY)


def _unpadded(problem: Problem, target: float, sources: np.ndarray, item_bytes: np.ndarray,
              gpus_per_node: int, fill: str | None, max_lpt_rounds: int | None) -> PartialPlan:
    """Keep home, take within the node, take anywhere, repair (unpadded cost); with `fill`, the deal of
    `locality_fill` instead of the repair, after the three phases missed the target ("on_miss") or
    without them ("only", and "on_miss" where the target leaves a rank less room above the mean
    load than the smallest item: the three phases' last deals cannot level the ranks then, they
    miss).  Past `max_lpt_rounds` LPT rounds of `take_anywhere`, NoRoom.  Returns the partial plan, every item
    placed."""
    state = PartialPlan(problem, target)
    total = float(problem.item_costs.sum())
    if fill == FILL_ON_MISS and total > 0 and target - total / problem.num_ranks < problem.sorted_costs[-1]:
        fill = FILL_ONLY
    if fill != FILL_ONLY:
        keep_home(state, sources)
        take_anywhere(state, take_in_node(state, sources, gpus_per_node), max_lpt_rounds)
        missed = state.loads.max() > target
        if missed and fill is None:
            repair(state, sources, item_bytes, gpus_per_node)
        if not missed or fill is None:
            return state
        state = PartialPlan(problem, target)
    slack = target * problem.num_ranks / total - 1.0 if total > 0 else 0.0  # room above the mean load
    fill_locally(state, sources, item_bytes, gpus_per_node, filler_share(slack), max_lpt_rounds)
    return state


def deal_locally(problem: Problem, target: float, origins: Origins, fill: str | None = None,
                 max_lpt_rounds: int | None = None) -> np.ndarray | None:
    """`balance_locally`'s unpadded deal (keep home, take in node, take anywhere, repair; or with `fill`)
    under `target`: its destinations where every rank meets the target and the cap, else None (also past
    `max_lpt_rounds` LPT rounds of `take_anywhere`, where token room binds)."""
    labelled = ItemLabels(origins.sources, problem.num_ranks, origins.gpus_per_node)
    try:
        state = _unpadded(problem, target, labelled.sources, origins.item_bytes, origins.gpus_per_node, fill,
                          max_lpt_rounds)
    except NoRoom:
        return None
    candidate, cap = labelled.ranks(state.destinations), problem.max_tokens_per_rank
    # exact sums (one cost): the deal's loads are the plan's in any order; else summed again in item order
    loads = state.loads if state.exact_cost is not None else rank_loads(problem, candidate)
    if loads.max() <= target and (cap is None or rank_tokens(problem, candidate).max() <= cap):
        candidate.setflags(write=False)  # nobody writes them again: a plan holds them without a copy (`plan.owned`)
        return candidate
    return None


def canonical_ranks(sources: np.ndarray, num_ranks: int, gpus_per_node: int) -> np.ndarray | None:
    """Labels of the ranks that follow the items, not the ranks' own labels: nodes ordered by the first item (by
    index) that one of their ranks holds, and the ranks inside each node likewise (ranks that hold none last, by
    label); None where these are the ranks' own labels (sources rank by rank, every rank holding an item: where
    one holds none it goes last in its node, and the plan may change).  The deal run under these labels
    gives the same plan, relabelled, for any relabelling of a symmetric topology's ranks that maps the sources
    alike (whole nodes permuted, ranks permuted inside nodes): its tie-breaks by rank index (least-loaded ranks,
    partners) then read the items, and the bytes it moves are the same (probe25 P25-08: up to 1.34x across nodes).

    >>> canonical_ranks(np.array([2, 2, 3, 0]), 4, 2).tolist()  # node 1 holds item 0: it comes first
    [2, 3, 0, 1]
    >>> canonical_ranks(np.array([0, 1, 2, 3]), 4, 2) is None
    True
    """
    ranks = np.arange(num_ranks)
    # A rank's first item starts a run of equal sources (a sample's segments share theirs): one pass, then runs only.
    starts = np.flatnonzero(sources[1:] != sources[:-1])
    starts += 1
    first = np.full(num_ranks, sources.size, dtype=np.int64)
    if sources.size:
        first[sources[0]] = 0
    np.minimum.at(first, sources[starts], starts)
    by_node = first.reshape(-1, gpus_per_node)
    nodes = np.argsort(by_node.min(axis=1), kind="stable")
    order = (nodes[:, None] * gpus_per_node + np.argsort(by_node[nodes], axis=1, kind="stable")).ravel()
    if np.all(order[1:] > order[:-1]):
        return None
    labels = np.empty(num_ranks, dtype=np.int64)
    labels[order] = ranks
    return labels


class ItemLabels:
    """A deal's view of the ranks under the labels read from the items (`canonical_ranks`): `sources` relabelled,
    and `ranks(destinations)` mapping its result back to the ranks' own labels (both as given where those are the
    items' labels already).

    >>> labelled = ItemLabels(np.array([2, 2, 3, 0]), 4, 2)
    >>> labelled.sources.tolist(), labelled.ranks(labelled.sources).tolist()
    ([0, 0, 1, 2], [2, 2, 3, 0])
    """

    def __init__(self, sources: np.ndarray, num_ranks: int, gpus_per_node: int):
        self.labels = canonical_ranks(sources, num_ranks, gpus_per_node)
        self.sources = sources if self.labels is None else self.labels[sources]

    def ranks(self, destinations: np.ndarray) -> np.ndarray:
        """`destinations` under the items' labels, on the ranks' own."""
        return destinations if self.labels is None else np.argsort(self.labels)[destinations]


def balance_locally(problem: Problem, plain_assignment: np.ndarray, origins: Origins, makespan_slack: float,
                    fill: str | None = None) -> np.ndarray:
    """An assignment within (1 + makespan_slack) of the plain plan's makespan moving few bytes.

    `origins` (`as_origins`: checked) says where the items are.  Unpadded: keep home, take within
    the node, take anywhere, repair.  Padded, or when that misses the target or the cap, or
    when `_labelling_may_beat` cannot prove the deal's plan as good as every labelling of the
    plain groups: the plain plan with its groups placed on ranks by `assign_groups` (on nodes greedily where
    its node-level LAP would list more than LAP_MAX_ENTRIES pairs, each group from many nodes), then items
    of equal length re-dealt among their places (`redeal_equal_items`: no rank's load or tokens
    change, up to the order of a float sum; the re-deal is dropped if that lifts a rank above
    the target); of the deal's plan, that one and the plain plan itself, the first moving the
    fewest bytes (node bytes, then rank bytes).  `fill` ("on_miss": where the first three phases miss the target, or
    would: the target leaves less room above the mean load than the smallest item; "only": at
    once): the unpadded deal keeps its smallest items as filler (`locality_fill`), tight enough
    that repair rarely runs, for a few more bytes moved.
    """
    if fill not in FILLS:
        raise ValueError(f"`fill` must be one of {FILLS}; got {fill!r}")
    sources, item_bytes, gpus_per_node = origins.sources, origins.item_bytes, origins.gpus_per_node
    target = float(rank_loads(problem, plain_assignment).max()) * (1.0 + makespan_slack)
    candidate = None if problem.padded else deal_locally(problem, target, origins, fill)
    if candidate is not None and not _labelling_may_beat(candidate, plain_assignment, origins, problem.num_ranks):
        return candidate
    placed, swapped = _placed_and_redealt(problem, plain_assignment, origins)
    # Equal items hold equal costs, but a rank's float sum in another order can gain an ulp.
    candidates = [swapped if rank_loads(problem, swapped).max() <= target else placed, plain_assignment]
    if candidate is not None:
        candidates.insert(0, candidate)
    return min(candidates, key=lambda destinations: moved(destinations, origins))  # the first on ties


def _placed_and_redealt(problem: Problem, plain_assignment: np.ndarray, origins: Origins) -> tuple:
    """(the plain plan's groups placed on ranks by `assign_groups`, that placement with its items of equal length
    re-dealt by `redeal_equal_items`), both found under the ranks' labels read from the items (`canonical_ranks`),
    as `deal_locally`'s deal: the LAP's and the re-deal's ties by rank index then follow the items, so a relabelling
    of a symmetric topology's ranks relabels them (probe27 P27-03: the re-deal from a placement of other ties moved
    3100 or 3500 tokens across nodes at D = 4 x 4 on lengths 100/200/400)."""
    labelled = ItemLabels(origins.sources, problem.num_ranks, origins.gpus_per_node)
    placed = assign_groups(plain_assignment, labelled.sources, origins.item_bytes, problem.num_ranks,
                           origins.gpus_per_node, LAP_MAX_ENTRIES)[plain_assignment]
    swapped = redeal_equal_items(problem.lengths, placed, labelled.sources, origins.item_bytes, origins.gpus_per_node,
                                 problem.num_ranks)
    return labelled.ranks(placed), labelled.ranks(swapped)


def moved(destinations: np.ndarray, origins: Origins) -> tuple[float, float]:
    """(bytes that leave their node, bytes that leave their rank) when the items go to `destinations`: the
    pass's objective, compared lexicographically."""
    sources, item_bytes, gpus_per_node = origins.sources, origins.item_bytes, origins.gpus_per_node
    off_rank = destinations != sources
    off_node = off_rank if gpus_per_node == 1 else on_other_nodes(destinations, sources, gpus_per_node)
    return float(item_bytes[off_node].sum()), float(item_bytes[off_rank].sum())


BINCOUNT_CELLS = 2**21  # groups × places up to which `_fewest_moved` sums the pairs in one table (16 MiB)
CHEAP_CELLS, CHEAP_STRIDE = 2**16, 2  # the cheap bound's table (512 KiB: places merged to fit) and item stride


def _fewest_moved(group_of_item: np.ndarray, places: np.ndarray, item_bytes: np.ndarray, num_groups: int,
                  num_places: int) -> float:
    """A lower bound on the bytes that leave their place (`places[i]`: item i's) under every labelling of the
    groups (a bijection of the D groups onto the ranks, a place holding one or more ranks): each group on its
    own best place, the bijection ignored, Σ_g min_p bytes(g not from p).  The (group, place) bytes summed in
    one table, or by `lap`'s pair sums beyond BINCOUNT_CELLS."""
    if num_groups * num_places <= BINCOUNT_CELLS:
        table = np.bincount(group_of_item * num_places + places, weights=item_bytes, minlength=num_groups * num_places)
        kept = table.reshape(num_groups, num_places).max(axis=1, initial=0.0).sum()
    else:
        groups, _, held = _pair_bytes(group_of_item, places, item_bytes, num_places)
        kept = np.maximum.reduceat(held, np.flatnonzero(np.diff(groups, prepend=-1))).sum()
    return float(item_bytes.sum()) - float(kept)


def _labelling_may_beat(candidate: np.ndarray, group_of_item: np.ndarray, origins: Origins, num_ranks: int) -> bool:
    """Whether some labelling of the plain groups may move fewer bytes than `candidate` (`moved`, lexicographic):
    False where a relaxation proves none does, node bytes first, rank bytes on a tie: `_fewest_moved` on every
    CHEAP_STRIDE-th item with the places merged into at most CHEAP_CELLS / D (a weaker bound: an item subset
    and merged places only lower it), then on all items and places."""
    sources, item_bytes, gpus_per_node = origins.sources, origins.item_bytes, origins.gpus_per_node
    node_bytes, rank_bytes = moved(candidate, origins)
    widths = ((gpus_per_node, node_bytes), (1, rank_bytes)) if gpus_per_node > 1 else ((1, rank_bytes),)
    for width, moved_here in widths:
        num_places = num_ranks // width
        merged = -(-num_places // max(1, CHEAP_CELLS // num_ranks))
        sample = slice(None, None, CHEAP_STRIDE)
        sampled = sources[sample] if width == 1 else node_of(sources[sample], width)  # only the sample's places
        if _fewest_moved(group_of_item[sample], sampled // merged, item_bytes[sample], num_ranks,
                         -(-num_places // merged)) > moved_here:
            return False
        places = sources if width == 1 else node_of(sources, width)
        least = _fewest_moved(group_of_item, places, item_bytes, num_ranks, num_places)
        if least != moved_here:
            return least < moved_here
    return False

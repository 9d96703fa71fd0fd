"""Communication-aware micro-batch plans: every item near its source, no micro-batch's max raised.

Given a plain plan of M micro-batches whose micro-batch m costs t_m = max_r load(r, m), find

    minimise  sum(item_bytes[i] for i if node(rank[i]) != node(sources[i]))
    s.t.      load(r, m) <= t_m,  tokens(r, m) <= T      for every cell (r, m)

so the step cost Σ_m t_m is kept.  An item may stay on its rank in any of its M
micro-batches, so the M·D cells are balanced as one problem: cell c = r·M + m starts at
load max(t) - t_m, so that one target max(t) is t_m for every cell, and the items are
dealt in the phases of `locality_fill`'s filler deal, each rank's M cells its first group:

    (not tried where the tokens fill more than MAX_FILL of the cells: such deals run out of token room)
    filler = the smallest items, 0.3-1 % of the total cost (they carry few bytes)
    items longer than T / 2, then T / 4, then the rest (T / 8, T / 16 too on a second try
            when the first runs out of token room), largest first, each tier in turn:
        to the roomiest of their rank's own cells that fit (LPT inside the rank),
        then to the first of their node's cells that fits (first fit inside the node),
        then to the least-loaded of all (`locality_deal.take_anywhere`)
    (given up before the filler where the repair's certificate, `ranks_left_over` of the coming filler,
            already proves the repair cannot succeed: the filler only adds load, the bound only grows)
    the filler, largest first, to the least-loaded cells (it tops every cell up)
    (past MAX_LPT_ROUNDS LPT rounds of `take_anywhere` the deal gives up: token room binds)
    repair if a cell is still above its t_m
    every cell within its t_m and T (recomputed in item order), else None: the caller then
        keeps each micro-batch local on its own (`microbatch._keep_local`); with M = 1, a fill
        out of token room raises NoRoom: the caller places the plain cells at once

The rank and node deals run for all ranks (nodes) at once, an item of each per turn
(`group_deal`), from one sort of the items by (tier, source rank, cost).  LPT keeps a
rank's cells level in cost and tokens; first fit packs a node's left-overs into few cells,
so fewer leave the node.  With M = 1 (a cell per rank) `locality_fill.fill_locally` deals
them as in a plain step (`keep_home`'s runs are cheaper than turns over one cell), with its
own tiers and no second try.

The plain plan comes from `solve_near_sources` (the `auto` kernel with sources): the cells' own plan, whose
loads leave the deal room, or the plan without sources at that M where the cells' is more than ROOM_GAP
dearer or finds no packing.  Original to orchmllm.
"""

from __future__ import annotations

import numpy as np

from ..locality.balance import ItemLabels
from ..locality.deal import NoRoom, take_anywhere
from ..locality.fill import FINE_TIERS, TIERS, fill_locally, filler_items, filler_share, length_tiers
from ..locality.group_deal import by_group, deal_in_groups
from ..locality.partial_plan import PartialPlan
from ..locality.reach import ranks_left_over
from ..locality.repair import REPAIR_SEARCHES, repair
from ..origins import Origins, fit_in_turn
from .auto import one_microbatch_plan, plain_step, plan_cost, solve, solve_each
from .empty import apart_from_empty_items
from .plan import MicroBatchProblem, MicroBatchResult, cell_loads, cell_token_sums, cells_problem

MAX_FILL = 0.99  # tokens / (M · D · T) above which the cells deal is not tried: of 552 cells deals that met their
# maxima (17 workloads, 64 x 16 .. 512 x 32, T 8k-64k, seeds 0-2) none filled more than 0.981, and 18 deals missed
# above 0.99 (the code trace's contexts fill 0.999 at 2560 x 32: their tries ran out of token room, 50-110 ms)
MAX_LPT_ROUNDS = 256  # LPT rounds of one `take_anywhere` before the cells deal gives up: where token room
# binds they place about one item each, O(D) apiece (2 700 rounds, 1 s, at D = 2560 × 32 on the code trace,
# T = 8k); a deal that needs more misses anyway (at most 40 on the synthetic and 34 on the successful trace
# deals of D up to 2560 × 32)
ROOM_GAP = 0.01  # the step the cells' own plan may cost above the plan without sources (`solve_near_sources`)


@apart_from_empty_items
def solve_near_sources(problem: MicroBatchProblem, num_microbatches: int, cells=solve) -> MicroBatchResult | None:
    """The `auto` kernel with `sources`: `microbatch_auto.solve`'s plan (`cells`: a pipeline's `solve_each`), and
    the plan without sources where `cells` finds none or costs more than ROOM_GAP above it: with one micro-batch
    `plain_step`'s, with more (`cells` = `solve`) `one_microbatch_plan`'s, the one plan `solve_with_plain_step`
    weighs there and `solve` does not (probe26 P26-01: M = 3, step 7 where the plan without sources costs 6).  The
    cells' own plan leaves the locality deal room (the plain step's loads, level to ~1e-5, leave it none: 55-70 % of
    the bytes crossed nodes instead of 4-10 % on the traces at D 64-512, for steps 0.1-0.9 % lower), but no packing,
    or a step more than ROOM_GAP higher, is not the price of locality.  The plan without sources runs only where the
    cells' plan is not within ROOM_GAP of the certified `step_bound`."""
    m = num_microbatches
    result = cells(problem, m)
    cost = None if result is None else plan_cost(problem, result, m)
    if cost is not None and cost <= problem.step_bound(m) * (1 + ROOM_GAP):
        return result
    plain = plain_step(problem) if m == 1 else one_microbatch_plan(problem, m) if cells is solve else None
    if plain is None or (cost is not None and cost <= plan_cost(problem, plain, m) * (1 + ROOM_GAP)):
        return result
    return plain


def solve_each_near_sources(problem: MicroBatchProblem, num_microbatches: int) -> MicroBatchResult | None:
    """`solve_near_sources` from M's own cells (`microbatch_auto.solve_each`): a pipeline's start with `sources`."""
    return solve_near_sources(problem, num_microbatches, solve_each)


def _deal_cells(state: PartialPlan, sources: np.ndarray, item_bytes: np.ndarray, num_microbatches: int,
                gpus_per_node: int, share: float, tiers: tuple[int, ...]) -> None:
    """Place every item of `state` (its cells r·M + m) near its source rank, tier by tier, the
    filler last (see the module docstring); `NoRoom` when no cell has token room for an item."""
    n, num_ranks = state.costs.size, state.loads.size // num_microbatches
    # Cells are dealt up to a hair below the target: no summation order of a cell's items then
    # lifts its load above its micro-batch's max (the deal adds them largest first, from max(t) - t_m).
    limit = state.target - 2 * (n + 1) * np.finfo(np.float64).eps * state.target
    filler = filler_items(state, share)
    tier = length_tiers(state, tiers)
    tier[filler] = len(tiers) + 1
    # One sort for every tier: by (tier, source rank, cost), each tier a slice.
    ordered, owner = by_group(state, tier * num_ranks + sources, None)
    bounds = np.searchsorted(owner, np.arange(len(tiers) + 2) * num_ranks)  # tier k: ordered[bounds[k]:bounds[k + 1]]
    for k in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():  # the tiers that hold items
        tier_items = slice(bounds[k], bounds[k + 1])
        left = deal_in_groups(state, ordered[tier_items], owner[tier_items] - k * num_ranks, num_microbatches,
                              limit, least_loaded=True)
        left = deal_in_groups(state, *by_group(state, sources[left] // gpus_per_node, left),
                              num_microbatches * gpus_per_node, limit, least_loaded=False)
        take_anywhere(state, left, MAX_LPT_ROUNDS)
    if ranks_left_over(state, state.costs[filler]) > min(4 * state.loads.size, REPAIR_SEARCHES):
        raise NoRoom  # the repair after the filler would return at once (its first test), the cells still above
    take_anywhere(state, filler, MAX_LPT_ROUNDS)
    if state.loads.max() > state.target:
        repair(state, sources * num_microbatches, item_bytes, num_microbatches * gpus_per_node)


def keep_cells_local(problem: MicroBatchProblem, result: MicroBatchResult, num_microbatches: int,
                     origins: Origins) -> MicroBatchResult | None:
    """Cells of `result`'s step cost or less that keep items on their source rank, else their node;
    None when the deal and repair miss a micro-batch's max (unpadded problems only), or at once where the
    tokens fill more than MAX_FILL of the cells; NoRoom instead when, with one micro-batch, the fill runs out
    of token room (or past MAX_LPT_ROUNDS LPT rounds), or the tokens fill more than MAX_FILL.  The deal runs
    under the ranks' labels read from the items (`canonical_ranks`), as `deal_locally` does: a relabelling of a
    symmetric topology's ranks relabels the cells (probe25 P25-08)."""
    m = num_microbatches
    if problem.total_tokens > MAX_FILL * m * problem.num_ranks * problem.max_tokens_per_microbatch:
        if m == 1:
            raise NoRoom  # as the fill would (see below)
        return None
    item_bytes, gpus_per_node = origins.item_bytes, origins.gpus_per_node
    labelled = ItemLabels(origins.sources, problem.num_ranks, gpus_per_node)
    sources = labelled.sources
    cell = result.microbatch * problem.num_ranks + result.rank  # the plain loads as `cell_accounts` sums them
    maxima = cell_loads(problem, cell, m * problem.num_ranks).reshape(m, -1).max(axis=1)
    target = float(maxima.max())
    cells = cells_problem(problem, m * problem.num_ranks)
    total = float(problem.item_costs.sum())
    slack = problem.num_ranks * float(maxima.sum()) / total - 1.0 if total > 0 else 0.0  # room above the mean
    for tiers in (TIERS,) if m == 1 else (TIERS, FINE_TIERS):
        state = PartialPlan(cells, target)
        state.loads += np.tile(target - maxima, problem.num_ranks)  # cell r·M + m starts at max(t) - t_m
        try:
            if m == 1:  # a cell per rank: the filler deal of a plain step (keep_home's runs, the node's windows)
                fill_locally(state, sources, item_bytes, gpus_per_node, filler_share(slack), MAX_LPT_ROUNDS)
            else:
                _deal_cells(state, sources, item_bytes, m, gpus_per_node, filler_share(slack), tiers)
        except NoRoom:
            if m == 1:
                raise  # the caller's deal of the same items into the same cells would run out of token room too
            continue
        # Cell loads summed in item order, as `cell_accounts` sums the plan's; tokens exactly (the
        # deal's float sums round beyond 2**53).
        loads = cell_loads(problem, state.destinations, state.loads.size)
        tokens = cell_token_sums(problem, state.destinations, state.loads.size)
        if np.all(loads.reshape(-1, m).max(axis=0) <= maxima) and tokens.max() <= problem.max_tokens_per_microbatch:
            rank, microbatch = np.divmod(state.destinations, m)
            return result._replace(rank=labelled.ranks(rank), microbatch=microbatch)
    return None


def free_items_home(problem: MicroBatchProblem, result, num_microbatches: int, origins: Origins):
    """`result` with its items of cost 0 on their source ranks, in their own micro-batch, else in the source's
    roomiest cell of a micro-batch an item that stays keeps (none emptied), as far as the cells' token room allows
    (shortest first; unpadded: a padded cell counts its items), both again while some went home (the room they
    left may take others): they change no cell's cost (probe24 P24-09: 61 % of the bytes moved on tiny
    instances were theirs; after one pass each, 156 of 1500 instances still moved one that fit at home, now 2)."""
    away = None if problem.padded else np.flatnonzero((problem.item_costs == 0) & (result.rank != origins.sources))
    if away is None or not away.size:
        return result
    d, rank, microbatch = problem.num_ranks, result.rank.copy(), result.microbatch.copy()
    count = away.size + 1
    while 0 < away.size < count:  # again while some went home: their leaving freed room for others
        count = away.size
        for take_roomiest in (False, True):  # its own micro-batch on its source, then the source's roomiest cell
            # another micro-batch only where an item that stays (costly, or home already) keeps this one
            staying = np.ones(problem.num_items, dtype=bool)
            staying[away] = False
            kept = np.bincount(microbatch[staying], minlength=num_microbatches) > 0
            going = away[kept[microbatch[away]]] if take_roomiest else away
            room = (problem.max_tokens_per_microbatch - cell_token_sums(
                problem, microbatch * d + rank, num_microbatches * d)).reshape(num_microbatches, d)
            at = np.argmax(room, axis=0)[origins.sources[going]] if take_roomiest else microbatch[going]
            home = fit_in_turn(at * d + origins.sources[going], problem.lengths[going], room.ravel())
            rank[going[home]], microbatch[going[home]] = origins.sources[going[home]], at[home]
            away = away[rank[away] != origins.sources[away]]
    return result._replace(rank=rank, microbatch=microbatch)

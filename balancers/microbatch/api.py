"""`balance_microbatches()`: plan every rank's gradient-accumulation micro-batches jointly.

A step runs M micro-batches on every one of D ranks, each under a token budget T, and
FSDP / ZeRO-3 synchronise all ranks in every micro-batch, so a step costs the sum over
micro-batches of the slowest rank.  Items i (lengths l_i, costs c_i) get a cell (r, m):

    minimise  Σ_m max_r load(r, m) + M · microbatch_overhead
    s.t.      tokens(r, m) <= T                      for every cell
    load(r, m) = Σ_{i in (r, m)} c_i   (padded: count · max c),
    tokens(r, m) = Σ_{i in (r, m)} l_i (padded: count · max l)

Plain code:

    step_cost = sum(max(load[m][r] for r in range(D)) for m in range(M)) + M * overhead
    assert all(tokens[m][r] <= T for m in range(M) for r in range(D))

M is the same on every rank by construction.  Every plan carries a certified lower
bound (`microbatch_bounds`), its gap and a status (`optimal` only when proven).
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from ..context_parallel.microbatch import balance_microbatches_split
from ..kernels.lpt import sharing_plans
from ..locality.balance import ItemLabels, deal_locally, moved
from ..locality.deal import NoRoom
from ..locality.lap import assign_groups, assign_groups_greedily
from ..locality.redeal import redeal_equal_items
from ..orders import sealed
from ..origins import Origins, as_origins
from ..plan import LOCALITY_SUFFIX
from ..pipeline.planner import plan_for_pipeline
from ..pipeline.profile import flat_profile
from ..pipeline.spec import Pipeline, simulated_exactly
from ..problem import (InfeasibleError, Status, as_costs, as_lengths, as_num_ranks, as_time_limit,
                       check_token_range, item_costs_of, rank_loads)
from ..registry import built_in, certifies, get_microbatch_algorithm
from ..validation import as_bool
from . import auto as microbatch_auto, exact as microbatch_exact
from .auto import plan_cost
from .bounds import min_bins
from .locality import MAX_LPT_ROUNDS, free_items_home, keep_cells_local, solve_each_near_sources, solve_near_sources
from .options import MicroBatchOptions, microbatch_options
from .plan import (MicroBatchKernel, MicroBatchPlan, MicroBatchProblem, balancing_problem, cell_loads,
                   check_step_cost, checked_kernel, float_sum, make_microbatch_plan, step_cost, within_budget)

WORK_PER_SECOND = 20_000_000  # operations `time_limit` buys: a budget, never a clock
DEFAULT_WORK = 1_000_000
EXTRA_MICROBATCHES = 2  # beyond the fewest that fit, tried when the plan is not proven optimal
PAYING_GAP = 0.01  # ... only while the bound leaves more than this fraction to gain; the fewest M
# whose plan is within this fraction of the cheapest is taken: a micro-batch also costs what the
# model does not see (one more pass over every layer's parameters under FSDP, launches)
MAX_CELLS = 2**22  # M · D: a plan holds M × D arrays of loads and tokens (32 MiB each at most)


def make_microbatch_problem(lengths, num_ranks, *, max_tokens_per_microbatch, cost=None, costs=None,
                            padded=False, microbatch_overhead=0.0, time_limit=None) -> MicroBatchProblem:
    """Validate user input once and build the canonical MicroBatchProblem."""
    return _problem(lengths, num_ranks, microbatch_options(max_tokens_per_microbatch,
                                                           microbatch_overhead=microbatch_overhead),
                    cost, costs, padded, time_limit)


def _problem(lengths, num_ranks, options: MicroBatchOptions, cost, costs, padded, time_limit) -> MicroBatchProblem:
    """The MicroBatchProblem of these items under `options` (checked already): the items' checks."""
    lengths = as_lengths(lengths)
    num_ranks = as_num_ranks(num_ranks)
    budget = options.max_tokens_per_microbatch
    padded = as_bool(padded, "padded")
    check_token_range(lengths, padded)
    item_costs, cost = item_costs_of(lengths, cost, costs, padded)
    longest = int(np.argmax(lengths))
    if lengths[longest] > budget:
        raise InfeasibleError(
            f"item {longest} has {int(lengths[longest])} tokens > max_tokens_per_microbatch={budget}; no micro-batch "
            f"can hold it: a budget of at least {int(lengths[longest])} is needed", min_cap=int(lengths[longest]))
    limit = as_time_limit(time_limit)
    return MicroBatchProblem(lengths=sealed(lengths), item_costs=sealed(item_costs), num_ranks=num_ranks,
                             max_tokens_per_microbatch=budget, padded=padded,
                             microbatch_overhead=options.microbatch_overhead, work_limit=_work_limit(limit), cost=cost,
                             time_limit=limit)


def _work_limit(time_limit: float | None) -> int:
    return DEFAULT_WORK if time_limit is None else int(time_limit * WORK_PER_SECOND)


def _time_share(problem: MicroBatchProblem, calls: int) -> MicroBatchProblem:
    """`problem` with 1 / `calls` of its time limit (as many kernel calls share it), its items'
    orders shared (`orders`)."""
    if problem.time_limit is None or calls <= 1:
        return problem
    share = problem.time_limit / calls
    return dataclasses.replace(problem, time_limit=share, work_limit=_work_limit(share))


def _check_cells(num_microbatches: int | None, problem: MicroBatchProblem) -> None:
    """ValueError when a given M makes more than MAX_CELLS cells on the problem's ranks."""
    most = MAX_CELLS // problem.num_ranks
    if num_microbatches is not None and num_microbatches > most:
        raise ValueError(f"`num_microbatches`={num_microbatches} on {problem.num_ranks} ranks makes "
                         f"{num_microbatches * problem.num_ranks} cells, beyond 2**22 = {MAX_CELLS} (a plan holds "
                         f"M × D arrays of loads and tokens): at most {most} micro-batches on "
                         f"{problem.num_ranks} ranks")


def _most_microbatches(problem: MicroBatchProblem) -> int:
    """The most micro-batches a free M tries: one item per cell always fits, and M · D <= MAX_CELLS
    (ValueError when even the fewest that fit make more cells)."""
    fewest, d = problem.min_microbatches, problem.num_ranks
    most = MAX_CELLS // d
    if fewest > most:
        raise ValueError(f"`max_tokens_per_microbatch`={problem.max_tokens_per_microbatch} is too small for these "
                         f"items on {d} ranks: they need at least {fewest} micro-batches, {fewest * d} cells, beyond "
                         f"2**22 = {MAX_CELLS} (a plan holds M × D arrays); at most {most} micro-batches on {d} "
                         f"ranks")
    return min(max(fewest, -(-problem.num_items // d)), most)


def _packed_by_none(problem: MicroBatchProblem, algorithm: str) -> InfeasibleError:
    fewest, most = problem.min_microbatches, _most_microbatches(problem)
    one_per_cell = -(-problem.num_items // problem.num_ranks)
    why = (f"though one item per cell fits in {one_per_cell}: the algorithm failed, not the budget"
           if one_per_cell <= most else f"the most that M · D <= 2**22 = {MAX_CELLS} cells allows")
    return InfeasibleError(f"algorithm {algorithm!r} found no packing of the items for any `num_microbatches` from "
                           f"{fewest} to {most}, {why}; choose another `algorithm`", min_cap=most)


def _fewest_that_fit(problem: MicroBatchProblem, kernel: MicroBatchKernel, algorithm: str,
                     failed: int) -> tuple[int, str]:
    """(M, what is known of it): the fewest micro-batches `kernel` packs the items into (from the
    provable fewest up, as a free M does, skipping `failed`), and whether fewer are proven too few."""
    fewest = problem.min_microbatches
    known = next((m for m in range(fewest, _most_microbatches(problem) + 1)
                  if m != failed and kernel(problem, m) is not None), None)
    if known is None:
        raise _packed_by_none(problem, algorithm)
    if known == fewest:
        return known, f"{known} fit, the fewest possible"
    if all(microbatch_exact.packing_exists(problem, m) is False for m in range(fewest, known)):
        return known, f"{known} fit, the fewest possible (exhaustive search: {known - 1} do not)"
    return known, (f"algorithm {algorithm!r} packs them into {known} (as with num_microbatches=None); fewer are "
                   f"not proven impossible")


def _solve_fixed(problem: MicroBatchProblem, kernel: MicroBatchKernel, num_microbatches: int, algorithm: str,
                 exact: bool, packs: bool = False):
    """The kernel's result for M as given; InfeasibleError naming the fewest M that fit when it has none.
    `packs` (the default algorithm, `auto`): where the kernel finds none, the exhaustive search's packing
    (`microbatch_exact.packing`), improved (`microbatch_auto.from_packing`), instead of a refusal that says one
    exists (probe23 P23-10: auto refused a budget its own plan at a larger one met)."""
    fewest = problem.min_microbatches
    if num_microbatches < fewest:
        bins = min_bins(problem.lengths, problem.max_tokens_per_microbatch)
        known, what = _fewest_that_fit(problem, kernel, algorithm, num_microbatches)
        raise InfeasibleError(
            f"`num_microbatches`={num_microbatches} is too few: the items need at least {bins} cells of "
            f"max_tokens_per_microbatch={problem.max_tokens_per_microbatch} tokens, so at least {fewest} "
            f"micro-batches on {problem.num_ranks} ranks; {what}", min_cap=known)
    result = kernel(problem, num_microbatches)
    if result is not None:
        return result
    failed = (f"`num_microbatches`={num_microbatches}: algorithm {algorithm!r} found no packing of the items into "
              f"{num_microbatches} × {problem.num_ranks} cells of {problem.max_tokens_per_microbatch} tokens")
    exists = microbatch_exact.packing(problem, num_microbatches)
    if exists is not None and exists is not False:
        if packs:
            return microbatch_auto.from_packing(problem, exists, num_microbatches)
        hint = "a larger `time_limit`" if exact else "algorithm='exact'"
        raise InfeasibleError(f"{failed}, though one exists (exhaustive search): try {hint}", min_cap=num_microbatches)
    known, what = _fewest_that_fit(problem, kernel, algorithm, num_microbatches)
    proof = " (none exists: exhaustive search)" if exists is False else ""
    raise InfeasibleError(f"{failed}{proof}; {what}", min_cap=known)


def _solve(problem: MicroBatchProblem, kernel: MicroBatchKernel, num_microbatches: int | None, *,
           algorithm: str = "auto", exact: bool = False, packs: bool = False):
    """(result, M, floor M, proven bound) for M as given, or for the M that pays best.

    With M free, a kernel's `optimal` holds for its M only: the bound over all M is the
    least proven optimum of the M tried from the fewest up without a gap, or the cost
    bound plus the overhead of the next M, whichever is lower.  An `exact` kernel tries
    every M up to one item per cell while the bound leaves room and it proves each optimum
    (else as the others, at most EXTRA_MICROBATCHES beyond the fewest that fit), and the
    least step cost wins (the fewest M on ties); the others take the fewest M within PAYING_GAP.  `packs`: as
    `_solve_fixed`'s, for a given M.
    """
    if num_microbatches is not None:
        return _solve_fixed(problem, kernel, num_microbatches, algorithm, exact, packs), num_microbatches, None, None
    fewest = problem.min_microbatches
    overhead, floor = problem.microbatch_overhead, problem.cost_bound
    always = _most_microbatches(problem)
    paying = 0.0 if exact else PAYING_GAP
    problem = _time_share(problem, always - fewest + 1 if exact else min(always - fewest, EXTRA_MICROBATCHES) + 1)
    proven, chained, found = [], True, []  # found: (result, M, total) of every M that packed
    best_total, m = math.inf, fewest
    while m <= always and ((exact and chained) or not found or m <= found[0][1] + EXTRA_MICROBATCHES):
        if found and float_sum([floor, m * overhead]) * (1 + paying) >= best_total:
            break  # no plan with this many micro-batches, or more, can pay enough
        result = kernel(problem, m)
        total = math.inf if result is None else plan_cost(problem, result, m)
        if result is None:  # an exact kernel's None is a proof only when no packing exists at all
            chained = chained and exact and microbatch_exact.packing_exists(problem, m) is False
        else:
            chained = chained and result.status is Status.OPTIMAL
        if chained:
            proven.append(total)
        if result is not None:
            found.append((result, m, total))
            best_total = min(best_total, total)
        m += 1
    if not found:
        raise _packed_by_none(problem, algorithm)
    # the fewest micro-batches whose plan is within `paying` of the cheapest found
    result, m, _ = next(plan for plan in found if plan[2] <= best_total * (1 + paying))
    bound = min(proven + [float_sum([floor, (fewest + len(proven)) * overhead])]) if proven else None
    return result._replace(status=Status.FEASIBLE), m, fewest, bound


def _keep_local(problem: MicroBatchProblem, result, num_microbatches: int, origins: Origins, deal: bool = True):
    """`_kept_local`, found under the ranks' labels read from the items (`canonical_ranks`), as `deal_locally`'s
    deal: its placements' and re-deal's ties by rank index then follow the items, so a relabelling of a symmetric
    topology's ranks relabels its plan (probe27 P27-03).  The plain cells themselves, which `plan_microbatches`
    keeps where they move fewer bytes, keep the ranks' own labels: there a relabelling may move other bytes."""
    labelled = ItemLabels(origins.sources, problem.num_ranks, origins.gpus_per_node)
    if labelled.labels is None:
        return _kept_local(problem, result, num_microbatches, origins, deal)
    local = _kept_local(problem, result, num_microbatches,
                        Origins(labelled.sources, origins.item_bytes, origins.gpus_per_node), deal)
    return local._replace(rank=labelled.ranks(local.rank))


def _kept_local(problem: MicroBatchProblem, result, num_microbatches: int, origins: Origins, deal: bool):
    """`result` kept local micro-batch by micro-batch, moving few bytes without raising any micro-batch's max.

    Unpadded: each micro-batch's items dealt by `deal_locally` under its max (cap T, at most MAX_LPT_ROUNDS
    LPT rounds; with `deal` False, none); the micro-batches it misses keep their plain cells, placed on ranks
    greedily by bytes (`assign_groups_greedily`, all in one); then, when one missed, the items of equal length are
    re-dealt among all cells (`redeal_equal_items`, a rank's micro-batches as its places; dropped where a
    float sum in another order lifts a micro-batch's max).  Padded: the micro-batch's cells placed on
    ranks by `assign_groups` (loads unchanged).
    """
    rank = np.array(result.rank, dtype=np.int64)
    missed = []
    for m in range(num_microbatches):
        members = np.flatnonzero(result.microbatch == m)
        if not members.size:
            continue
        if problem.padded:
            placed = assign_groups(rank[members], origins.sources[members], origins.item_bytes[members],
                                   problem.num_ranks, origins.gpus_per_node)
            rank[members] = placed[rank[members]]
            continue
        local = None
        if deal:
            sub = balancing_problem(problem.lengths[members], problem.item_costs[members], problem.num_ranks,
                                    problem.max_tokens_per_microbatch)
            local = deal_locally(sub, float(rank_loads(sub, rank[members]).max()), origins.take(members),
                                 max_lpt_rounds=MAX_LPT_ROUNDS)
        if local is None:
            missed.append(members)
        else:
            rank[members] = local
    if not missed:
        return result._replace(rank=rank)
    # one greedy for all missed micro-batches: the k-th's groups and ranks offset by k·D, so that no pair
    # joins two of them and each is placed as it would be alone
    items = np.concatenate(missed)
    offset = np.repeat(np.arange(len(missed), dtype=np.int64) * problem.num_ranks, [len(m) for m in missed])
    placed = assign_groups_greedily(rank[items] + offset, origins.sources[items] + offset, origins.item_bytes[items],
                                    len(missed) * problem.num_ranks, origins.gpus_per_node)
    rank[items] = placed[rank[items] + offset] - offset
    return _redealt(problem, result._replace(rank=rank), num_microbatches, origins)


def _redealt(problem: MicroBatchProblem, result, num_microbatches: int, origins: Origins):
    """`result` with its items of equal length re-dealt among its cells (`redeal_equal_items`), unless a float
    sum in another order lifts a micro-batch's max."""
    m, d = num_microbatches, problem.num_ranks
    cell = redeal_equal_items(problem.lengths, result.rank * m + result.microbatch, origins.sources,
                              origins.item_bytes, origins.gpus_per_node, d, cells_per_rank=m)
    rank, microbatch = np.divmod(cell, m)
    before = cell_loads(problem, result.microbatch * d + result.rank, m * d).reshape(m, d).max(axis=1)
    after = cell_loads(problem, microbatch * d + rank, m * d).reshape(m, d).max(axis=1)
    return result._replace(rank=rank, microbatch=microbatch) if np.all(after <= before) else result


def _needs_pipeline(first_stage_costs, pipeline) -> None:
    """ValueError when `first_stage_costs` are given without a `pipeline` (they have no other use)."""
    if first_stage_costs is not None and pipeline is None:
        raise ValueError("`first_stage_costs` needs `pipeline`: they are the part of each item's cost that the "
                         "pipeline's first stage runs alone")


def as_first_stage_costs(values, problem: MicroBatchProblem) -> np.ndarray | None:
    """`first_stage_costs` checked to float64 (n,), or None: one finite cost per item in [0, the item's cost],
    on unpadded cells; TypeError / ValueError naming the argument, the item and the requirement otherwise."""
    if values is None:
        return None
    if problem.padded:
        raise ValueError("`first_stage_costs` need unpadded cells (padded=False): a padded cell's cost is not the sum "
                         "of its items' costs")
    array = as_costs(values, problem.item_costs, "first_stage_costs")
    bad = np.flatnonzero(~np.isfinite(array))
    if bad.size:
        raise ValueError(f"`first_stage_costs` must be finite and non-negative; got {array[bad[0]]} at index "
                         f"{bad[0]}")
    over = np.flatnonzero(array > problem.item_costs)
    if over.size:
        item = int(over[0])
        raise ValueError(f"`first_stage_costs`[{item}]={array[item]} is larger than item {item}'s cost "
                         f"{problem.item_costs[item]}: it is the part of the item's cost that the first stage runs "
                         f"alone, so at most that cost")
    return array


def _for_pipeline(problem: MicroBatchProblem, kernel: MicroBatchKernel, solved: tuple, fixed: int | None,
                  pipeline: Pipeline, record, origins: Origins | None, first_stage: np.ndarray | None) -> tuple:
    """`_solve`'s (result, M, floor M, bound) of `record`'s kernel, in whole groups of P for the interleaved
    schedule (a free M rounded up), its cells planned for `pipeline` (`first_stage`: each item's first-stage part,
    or None), the `PipelineStep` they make, and their `cell_accounts` (None once placed).  With `origins`, the
    planned replicas are placed on ranks by `assign_groups`: a permutation of replicas, so every time is
    unchanged (`replica_times` permuted with them: entry r is rank r's replica)."""
    result, m, floor_m, proven = solved
    if pipeline.runnable(m) != m:
        result, m, floor_m, proven = _solve(problem, kernel, pipeline.runnable(m), algorithm=record.name,
                                            exact=record.exact, packs=record.kernel is microbatch_auto.solve)
    accounts = within_budget(problem, result, m, record.name)  # the kernel's own cells: the re-plan rebuilds them
    overhead = problem.microbatch_overhead  # the schedule's mean replica time is at most this step cost: finite
    cost = step_cost(accounts[0], overhead)
    check_step_cost(cost, accounts[0], overhead)
    chunks = pipeline.stages * pipeline.virtual_stages  # its times and work sum up to ~(M + P·v) such steps per chunk
    if not math.isfinite(cost * (1.0 + pipeline.backward_factor) * chunks * problem.num_ranks * 4 * (m + chunks)):
        raise ValueError(f"the pipeline's step of {m} micro-batches over {chunks} model chunks on {problem.num_ranks} "
                         f"replicas is beyond float64 (a step cost of {cost:.6g} without the pipeline); scale `costs` "
                         f"(or the `cost` model) and `microbatch_overhead` down")
    rank, slot, step, accounts = plan_for_pipeline(problem, result.rank, result.microbatch, m, pipeline,
                                                   free_microbatches=fixed is None, first_stage=first_stage,
                                                   accounts=accounts)
    step = rounding_checked(step, problem, m)
    if origins is not None:
        placed = assign_groups(rank, origins.sources, origins.item_bytes, problem.num_ranks, origins.gpus_per_node)
        rank, accounts = placed[rank], None
        times = np.empty_like(step.replica_times)
        times[placed] = step.replica_times  # replica r now runs on rank placed[r]
        times.setflags(write=False)
        step = dataclasses.replace(step, replica_times=times)
    return result._replace(rank=rank, microbatch=slot, status=Status.FEASIBLE), m, floor_m, proven, step, accounts


def rounding_checked(step, problem: MicroBatchProblem, num_microbatches: int):
    """`step` (a `PipelineStep`), `optimal` only where `simulated_exactly` (else step and bound may meet by
    rounding); it resolves plans to float64's resolution, no finer (costs an ulp apart: the best step may sit an
    ulp above)."""
    costs = np.append(problem.item_costs, problem.microbatch_overhead)
    exact = simulated_exactly(step.pipeline, step.step_time, costs, num_microbatches)
    return step if exact or step.status != Status.OPTIMAL else dataclasses.replace(step, status=Status.FEASIBLE)


def _shapes_flat(problem: MicroBatchProblem, pipeline: Pipeline | None, fixed: int | None) -> bool:
    """Whether `pipeline`'s best shape (`flat_profile`) is flat at M (free: the fewest that fit): the pipeline
    planner's shaped start is then the plain planner's LPT where that ran from zero loads (`lpt.sharing_plans`)."""
    if pipeline is None:
        return False
    m = pipeline.runnable(fixed or problem.min_microbatches)
    return pipeline.plannable(m) and flat_profile(pipeline, m)


def balance_microbatches(lengths, num_ranks, *, max_tokens_per_microbatch, cost=None, costs=None, padded=False,
                         num_microbatches=None, microbatch_overhead=0.0, algorithm="auto", sources=None,
                         item_bytes=None, topology=None, time_limit=None, pipeline=None, first_stage_costs=None,
                         context_parallel=None) -> MicroBatchPlan:
    """Assign every item a cell (rank, micro-batch) minimising Σ_m max_r load + M · overhead (or a pipeline's step).

    Args:
        lengths: 1-D non-negative integer lengths below 2**53 (tokens), one per item.
        num_ranks: data-parallel ranks D >= 1.
        max_tokens_per_microbatch: token budget T of one cell (one rank, one micro-batch).
        cost: per-item cost model f(l) (default f(l) = l); or `costs`, one cost per item
            (padded too, unlike `balance`: a padded cell costs count · max of its costs).
        padded: a cell costs count · max cost and holds count · max length tokens.
        num_microbatches: M; None takes the fewest that fit, or more when that lowers the step cost including
            `microbatch_overhead` by more than `PAYING_GAP`: the fewest M whose plan is within that fraction of the
            cheapest of those tried (at most two more than the fewest that fit, tried only while the bound leaves
            more to gain). An exact algorithm (`algorithm="exact"`) takes the least step cost of the M it tries (the
            fewest on ties): every M up to one item per cell while it proves each optimum, so raising T never raises
            a proven optimum. Too few for the items: InfeasibleError naming the fewest M that fit (and whether fewer
            are proven impossible).
        microbatch_overhead: cost of one more micro-batch (same units as the costs).
        algorithm: a name in `MICROBATCH_ALGORITHMS`, the registry's micro-batch records
            (`register_microbatch_algorithm` adds one; "auto": exact search for small instances, else the better of
            the joint greedy and the cell LPT, each followed by local search; the cell LPT alone for large
            instances, unless its plan is over 1 % above the bound and the greedy costs about as much; at a given M
            where neither finds a packing, the exhaustive search's, improved; with one micro-batch, `balance`'s plan
            under max_tokens_per_rank=T too, so M=1 never does worse than a plain step; with `sources`, so a given
            M never does more than ROOM_GAP worse than the same call without them, nor refuses where that plans:
            `solve_near_sources`, whose own plan leaves the locality pass room).
        sources, item_bytes, topology: as in `balance`; items stay on their rank (in any of its micro-batches), else
            their node, as far as every micro-batch's max allows (`microbatch_locality`: all cells dealt at once;
            when that misses a micro-batch's max, each micro-batch is dealt on its own, and those that miss keep
            their plain cells, placed on ranks greedily by bytes; items of equal length then re-dealt over all cells;
            the plain cells themselves where they move fewer bytes, node bytes first).  All of it runs under rank
            labels read from the items, so relabelling a symmetric topology's ranks (sources mapped alike) relabels
            the plan, except where the plain cells, labelled as planned, move the fewest bytes (probe27 P27-03).
            Empty items (length 0, cost 0) are planned apart by the kernels, but this pass deals them with the
            others: with `sources` a batch padded with empty samples may get another step (review R19-05: 8 of
            1500 rows, -1.5 % to +0.02 %).
        context_parallel: a `ContextParallel`: items may split over groups (`balancers.context_parallel.microbatch`);
            `algorithm` and `sources` make only the plan without splits, kept unless splitting pays; that kernel is not
            run where an item must split (longer than T, or no degree 1: the plan's algorithm reads "context_parallel").
        time_limit: seconds of work an exact or anytime search may spend, all M tried together, converted to
            operation budgets (`WORK_PER_SECOND`, the exact search's `CELLS_PER_SECOND`) so plans never depend on
            the clock.
        pipeline: a `Pipeline`: cells planned for that schedule's step (`balancers.pipeline`),
            micro-batch m run m-th on every replica, `plan.pipeline` its step, bound and status;
            interleaved: M in whole groups of P (a free M rounded up); `sources`: replicas placed whole.  A free M
            is chosen as without the pipeline and is not raised to shrink the bubble (fewer, larger micro-batches
            can leave most of the step in fill and drain): pass `num_microbatches`, as trainers do.
        first_stage_costs: with `pipeline`, per item the part of its cost that the first stage runs alone (the
            encoders of a multimodal model, which sit before the LLM's layers), finite, in [0, the item's cost]
            (unpadded); the rest of the cost is spread evenly over the stages (`Pipeline.stage_times`).  None: every
            item's cost spread evenly.

    Returns:
        A frozen `MicroBatchPlan`.  InfeasibleError (a ValueError) when an item is longer
        than T or `num_microbatches` is below the provable minimum; ValueError when token
        sums could leave int64, the step cost leaves float64, or M · D passes MAX_CELLS.

    >>> plan = balance_microbatches([6, 5, 4, 3, 2, 2], 2, max_tokens_per_microbatch=8)
    >>> plan.num_microbatches, plan.step_cost, plan.lower_bound, str(plan.status)
    (2, 11.0, 11.0, 'optimal')
    >>> plan.cell_tokens.tolist(), plan.items_of(rank=0, microbatch=1).tolist()
    ([[6, 6], [5, 5]], [1])
    """
    _needs_pipeline(first_stage_costs, pipeline)
    if context_parallel is not None:  # the split planner; today's plan is this call without it
        return balance_microbatches_split(unsplit=balance_microbatches, **locals())
    options = microbatch_options(max_tokens_per_microbatch, num_microbatches, microbatch_overhead, algorithm,
                                 pipeline=pipeline)
    return plan_microbatches(lengths, num_ranks, options, cost=cost, costs=costs, padded=padded, sources=sources,
                             item_bytes=item_bytes, topology=topology, time_limit=time_limit,
                             first_stage_costs=first_stage_costs)


def plan_microbatches(lengths, num_ranks, options: MicroBatchOptions, *, cost=None, costs=None, padded=False,
                      sources=None, item_bytes=None, topology=None, time_limit=None, first_stage_costs=None,
                      context_parallel=None) -> MicroBatchPlan:
    """`balance_microbatches` with its micro-batch options checked already (`microbatch_options`: the
    orchestrator and the dispatcher hold them from their construction); the items' arguments as there."""
    _needs_pipeline(first_stage_costs, options.pipeline)
    if context_parallel is not None:
        return balance_microbatches_split(context_parallel, lengths, num_ranks, unsplit=balance_microbatches,
                                          **options.arguments(), cost=cost, costs=costs, padded=padded,
                                          sources=sources, item_bytes=item_bytes, topology=topology,
                                          time_limit=time_limit)
    record = get_microbatch_algorithm(options.algorithm)
    algorithm, fixed, pipeline = options.algorithm, options.num_microbatches, options.pipeline
    problem = _problem(lengths, num_ranks, options, cost, costs, padded, time_limit)
    if not record.solves(problem.padded):
        raise ValueError(record.why_not(problem.padded))
    first_stage = as_first_stage_costs(first_stage_costs, problem)
    _check_cells(fixed, problem)
    origins = as_origins(problem, sources, item_bytes, topology)
    kernel = record.kernel
    if kernel is microbatch_auto.solve:  # M = 1 at least `balance`'s plan (with sources: `solve_near_sources`)
        plain = (microbatch_auto.solve_with_plain_step, solve_near_sources)  # a pipeline's: the cells planned for M
        kernel = (plain if pipeline is None else (microbatch_auto.solve_each, solve_each_near_sources))[
            origins is not None]
    start = time.perf_counter()
    witness = microbatch_auto.solve if certifies(record) and not built_in(record) else None
    kernel = checked_kernel(kernel, algorithm, certifies(record), built_in(record), witness)
    with sharing_plans(_shapes_flat(problem, pipeline, fixed)):  # the shaped LPT may take the plain one's plan
        result, m, floor_m, proven = _solve(problem, kernel, fixed, algorithm=algorithm, exact=record.exact,
                                            packs=record.kernel is microbatch_auto.solve)
        name, step, accounts = (algorithm if pipeline is None else f"{algorithm}+pipeline"), None, None
        if pipeline is not None:
            result, m, floor_m, proven, step, accounts = _for_pipeline(
                problem, kernel, (result, m, floor_m, proven), fixed, pipeline, record, origins, first_stage)
    if origins is not None and step is None:
        try:
            local = None if problem.padded else keep_cells_local(problem, result, m, origins)
        except NoRoom:  # one micro-batch out of token room: its own deal, the same items in the same cells, too
            local = _keep_local(problem, result, m, origins, deal=False)
        if local is None:
            local = _keep_local(problem, result, m, origins)
        if moved(result.rank, origins) < moved(local.rank, origins):  # the plain cells move fewer bytes
            local = result
        result = free_items_home(problem, local._replace(status=Status.FEASIBLE), m, origins)
        name = f"{algorithm}{LOCALITY_SUFFIX}"
    seconds = time.perf_counter() - start
    return make_microbatch_plan(problem, result, m, name, floor_microbatches=floor_m, proven_bound=proven,
                                solve_seconds=seconds, pipeline=step, accounts=accounts)

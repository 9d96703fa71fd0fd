"""Oracles and checks for plans that split items over context-parallel groups.

    brute_force_split   every item on every aligned block of every allowed degree (D = 1..8,
                        a handful of items): the optimal makespan, independently of the planner
    check_split_plan    every invariant of a `ContextParallelPlan`, recomputed from the input:
                        each item's tokens on exactly the ranks of its group (zigzag shards),
                        groups aligned, inside a node unless allowed, one group per rank,
                        loads and tokens exact, the budget held, bound <= optimum <= makespan,
                        `optimal` only when the makespan is the bound or the optimum
    brute_force_split_microbatches
                        the same over every micro-batch of every item too: the optimal step
    check_split_microbatch_plan
                        every invariant of a `SplitMicroBatchPlan` (`balance_microbatches(...,
                        context_parallel=)`), as `check_split_plan`'s per micro-batch, cell
                        tokens within T, the step Σ_m max_r load + M · overhead, bound <= optimum
                        <= step, `optimal` exactly where the step is the bound

The model is the spec's: item i on the block [s, s + c) costs every rank of it
`spec.time(cost, [l_i], c, within_node)` and holds `layout.shard_tokens(l_i, c)` tokens;
loads are summed in item order, as the plan sums them, so optima compare with `==`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..balancers import ContextParallel, ContextParallelPlan, CostModel, Status
from ..balancers.context_parallel.layout import shard_tokens
from ..balancers.context_parallel.microbatch_plan import SplitMicroBatchPlan
from ..balancers.problem import as_lengths, as_num_ranks
from ..balancers.validation import as_int, as_real
from .checks import (_AUTO, check_optimum_type, check_plan_type, items_of, rounding_apart, step_complaint,
                     wrong_field, wrong_status)

SPLIT_BRUTE_FORCE_MAX_PLANS = 2**17
"""Largest number of (block, degree) combinations `brute_force_split` enumerates."""
AUTO_SPLIT_ORACLE_PLANS = 2**12  # `check_split_plan` runs `brute_force_split` itself up to this many (~0.1 s)


@dataclass(frozen=True, eq=False)
class SplitOptimum:
    """The optimal makespan (or step) over every split plan, and one plan reaching it (None: none fits the budget)."""

    makespan: float | None
    start: np.ndarray | None
    degree: np.ndarray | None
    plans: int  # combinations enumerated
    microbatch: np.ndarray | None = None  # micro-batches (`brute_force_split_microbatches`)


def _blocks(num_ranks: int, spec: ContextParallel) -> list[tuple[int, int, bool]]:
    """Every item's (start, degree, inside a node) choices: the aligned blocks of each degree that may hold a group."""
    g = spec.gpus_per_node
    return [(s, c, s // g == (s + c - 1) // g) for c in spec.degrees for s in range(0, num_ranks - c + 1, c)
            if c == 1 or s // g == (s + c - 1) // g or spec.allow_inter_node]


def _as_spec(spec) -> ContextParallel:
    """`spec` checked: TypeError naming it unless a ContextParallel (probe58 U1: None was an AttributeError)."""
    if not isinstance(spec, ContextParallel):
        raise TypeError(f"`spec` must be a ContextParallel (the plan's `context_parallel`); got {type(spec).__name__}")
    return spec


def _as_counts(num_microbatches) -> list[int]:
    """`num_microbatches`, an int or a non-empty range (list, tuple) of ints, each >= 1, as a list: probe58 U1, 0 or
    -1 read as "no plan fits", 2.5 or True as raw TypeErrors."""
    if not isinstance(num_microbatches, (range, list, tuple)):
        return [as_int(num_microbatches, "num_microbatches", minimum=1)]
    if not num_microbatches:
        raise ValueError("`num_microbatches` must be an int or a non-empty range of them; got an empty one")
    return [as_int(count, "num_microbatches", minimum=1) for count in num_microbatches]


def _options(lengths: np.ndarray, num_ranks: int, spec: ContextParallel, cost: CostModel):
    """Per item, its (start, degree, per-rank loads (D,), per-rank tokens (D,)) options."""
    blocks = _blocks(num_ranks, spec)
    per_item = []
    for length in lengths.tolist():
        options = []
        for s, c, inside in blocks:
            loads = np.zeros(num_ranks)
            loads[s:s + c] = spec.time(cost, [length], c, within_node=inside)[0]
            tokens = np.zeros(num_ranks, dtype=np.int64)
            tokens[s:s + c] = shard_tokens([length], c)[0]
            options.append((s, c, loads, tokens))
        per_item.append(options)
    return per_item


def _clash(a, b) -> bool:
    """Whether two split options sit on different but overlapping blocks."""
    (s1, c1), (s2, c2) = a[:2], b[:2]
    return c1 > 1 and c2 > 1 and (s1, c1) != (s2, c2) and s1 < s2 + c2 and s2 < s1 + c1


def brute_force_split(lengths, num_ranks, spec: ContextParallel, *, cost=None,
                      max_tokens_per_rank=None) -> SplitOptimum:
    """The optimum over every choice of degree and aligned block for every item.

    >>> spec = ContextParallel(degrees=(1, 2), latency_s=0.0, kv_bytes_per_token=0.0, half_efficiency_tokens=0.0)
    >>> optimum = brute_force_split([5, 5, 5], 2, spec)          # one item split over both ranks
    >>> optimum.makespan, sorted(optimum.degree.tolist())
    (7.5, [1, 1, 2])
    """
    lengths = as_lengths(lengths)
    num_ranks = as_int(num_ranks, "num_ranks", minimum=1)
    cost = CostModel() if cost is None else cost
    per_item = _options(lengths, num_ranks, _as_spec(spec), cost)
    total = math.prod(len(options) for options in per_item)
    if total > SPLIT_BRUTE_FORCE_MAX_PLANS:
        raise ValueError(f"brute force over {total} split plans exceeds SPLIT_BRUTE_FORCE_MAX_PLANS = "
                         f"{SPLIT_BRUTE_FORCE_MAX_PLANS}; use fewer items, ranks or degrees")
    cap = as_int(max_tokens_per_rank, "max_tokens_per_rank", minimum=1, optional=True)
    cap = math.inf if cap is None else cap
    best, best_plan = math.inf, None
    for plan in itertools.product(*per_item):
        if any(_clash(a, b) for a, b in itertools.combinations(plan, 2)):
            continue
        loads = np.zeros(num_ranks)
        tokens = np.zeros(num_ranks, dtype=np.int64)
        for option in plan:  # item order, as the plan sums
            loads += option[2]
            tokens += option[3]
        if tokens.max() <= cap and loads.max() < best:
            best, best_plan = float(loads.max()), plan
    if best_plan is None:
        return SplitOptimum(None, None, None, total)
    return SplitOptimum(best, np.array([o[0] for o in best_plan]), np.array([o[1] for o in best_plan]), total)


def _split_plans(num_items: int, num_ranks: int, spec: ContextParallel, num_microbatches: int = 1) -> float:
    """How many combinations `brute_force_split` (or `brute_force_split_microbatches` at one M) enumerates: every
    item has the same (micro-batch, block, degree) options."""
    per_item = num_microbatches * len(_blocks(num_ranks, spec))
    return math.inf if num_items * math.log2(max(per_item, 1)) > 64 else float(per_item ** num_items)


def _check_fields(plan: ContextParallelPlan | SplitMicroBatchPlan, names: tuple[str, ...], n: int) -> None:
    """AssertionError unless the plan's int64 per-item arrays `names` and its float64 `item_time` have n entries."""
    for name, dtype in [(name, np.int64) for name in names] + [("item_time", np.float64)]:
        if why := wrong_field(plan, name, n, dtype):
            _fail(plan, why)


def _check_spec(plan: ContextParallelPlan | SplitMicroBatchPlan, spec: ContextParallel) -> None:
    """AssertionError unless the plan says it was made with `spec` (probe57/58: a plan's `context_parallel` was
    never compared, so a plan relabelled with another spec passed)."""
    if plan.context_parallel != spec:
        _fail(plan, f"was made with context_parallel={plan.context_parallel}, not the `spec` it is checked against, "
                    f"{spec} (pass the plan's, `spec.on(topology)` where a topology was given)")


def _fail(plan: ContextParallelPlan | SplitMicroBatchPlan, message: str) -> None:
    what = "split plan" if isinstance(plan, ContextParallelPlan) else "split micro-batch plan"
    raise AssertionError(f"{what} of {plan.algorithm!r} ({items_of(plan)} items, {plan.num_ranks} ranks): {message}")


def _check_groups(plan: ContextParallelPlan | SplitMicroBatchPlan, start: np.ndarray, spec: ContextParallel,
                  num_ranks: int, microbatch: np.ndarray | None = None) -> None:
    """Degrees allowed; blocks from `start` aligned, in range, inside a node unless allowed; one group per rank (in
    each micro-batch of `microbatch`, when the plan has them)."""
    owners = np.full((1 if microbatch is None else plan.num_microbatches, num_ranks), -1, dtype=np.int64)
    for item in range(plan.num_items):
        s, c = int(start[item]), int(plan.degree[item])
        owner = owners[0 if microbatch is None else int(microbatch[item])]
        ranks = plan.item_ranks(item)
        if c not in spec.degrees or s % c or s < 0 or s + c > num_ranks or ranks.tolist() != list(range(s, s + c)):
            _fail(plan, f"item {item} is on ranks {ranks.tolist()} at degree {c}: not an aligned block of "
                        f"{spec.degrees}")
        if c > 1 and not spec.allow_inter_node and s // spec.gpus_per_node != (s + c - 1) // spec.gpus_per_node:
            _fail(plan, f"item {item}'s group {ranks.tolist()} crosses nodes of {spec.gpus_per_node} gpus")
        if c > 1:
            key = s * (num_ranks + 1) + c
            clash = owner[s:s + c][(owner[s:s + c] >= 0) & (owner[s:s + c] != key)]
            if clash.size:
                where = "" if microbatch is None else f" in micro-batch {int(microbatch[item])}"
                _fail(plan, f"item {item}'s group {ranks.tolist()} overlaps another group{where}")
            owner[s:s + c] = key


def _item_accounts(plan, start: np.ndarray, lengths: np.ndarray, spec: ContextParallel, cost: CostModel,
                   microbatch: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(loads, tokens) of every (micro-batch, rank), shape (M, D) (M = 1 without `microbatch`), recomputed: each
    item's `spec.time` on every rank of its group from `start`, its zigzag shards' tokens there, summed in item order;
    AssertionError where its shards do not hold its tokens or its `item_time` is not that time."""
    shape = (1 if microbatch is None else plan.num_microbatches, plan.num_ranks)
    loads, tokens = np.zeros(shape), np.zeros(shape, dtype=np.int64)
    g = spec.gpus_per_node
    for item in range(lengths.size):
        s, c, m = int(start[item]), int(plan.degree[item]), 0 if microbatch is None else int(microbatch[item])
        time = spec.time(cost, [lengths[item]], c, within_node=s // g == (s + c - 1) // g)[0]
        shards = shard_tokens([lengths[item]], c)[0]
        if int(shards.sum()) != int(lengths[item]) or plan.item_time[item] != time:
            _fail(plan, f"item {item}: shards {shards.tolist()} of {int(lengths[item])} tokens, time "
                        f"{plan.item_time[item]} (expected {time})")
        loads[m, s:s + c] += time
        tokens[m, s:s + c] += shards
    return loads, tokens


def check_split_plan(plan: ContextParallelPlan, lengths, num_ranks: int, spec: ContextParallel, *, cost=None,
                     max_tokens_per_rank=None, optimum=_AUTO) -> None:
    """Raise AssertionError unless `plan` is a certified split plan of this input (see the module).

    `optimum` (a `SplitOptimum`): default `brute_force_split` of the input when it enumerates at most
    AUTO_SPLIT_ORACLE_PLANS = 4096 plans; None skips it.

    >>> from orchmllm import balance
    >>> spec = ContextParallel(degrees=(1, 2), latency_s=0.0, seconds_per_cost=1.0)
    >>> plan = balance([40, 5, 5], 2, context_parallel=spec)
    >>> check_split_plan(plan, [40, 5, 5], 2, spec, optimum=brute_force_split([40, 5, 5], 2, spec))
    """
    check_plan_type(plan, ContextParallelPlan)
    lengths, num_ranks, spec = as_lengths(lengths), as_num_ranks(num_ranks), _as_spec(spec)
    check_optimum_type(optimum, SplitOptimum, "brute_force_split")
    cost = CostModel() if cost is None else cost
    n = lengths.size
    if plan.num_ranks != num_ranks or plan.cost != cost:
        _fail(plan, f"was made for {plan.num_ranks} ranks and {plan.num_items} items with cost {plan.cost}")
    _check_fields(plan, ("assignment", "degree"), n)
    _check_spec(plan, spec)
    _check_groups(plan, plan.assignment, spec, num_ranks)
    loads, tokens = (rows[0] for rows in _item_accounts(plan, plan.assignment, lengths, spec, cost))
    if not np.array_equal(loads, plan.loads) or not np.array_equal(tokens, plan.tokens):
        _fail(plan, f"loads {plan.loads.tolist()} / tokens {plan.tokens.tolist()} != recomputed "
                    f"{loads.tolist()} / {tokens.tolist()}")
    if max_tokens_per_rank is not None and tokens.max() > max_tokens_per_rank:
        _fail(plan, f"holds {int(tokens.max())} tokens on a rank > max_tokens_per_rank={max_tokens_per_rank}")
    if plan.makespan != loads.max() or not 0 <= plan.lower_bound <= plan.makespan:
        _fail(plan, f"makespan {plan.makespan} / bound {plan.lower_bound} against max load {loads.max()}")
    if why := wrong_status(plan.status):
        _fail(plan, why)
    if optimum is _AUTO:
        optimum = brute_force_split(lengths, num_ranks, spec, cost=cost, max_tokens_per_rank=max_tokens_per_rank) \
            if _split_plans(n, num_ranks, spec) <= AUTO_SPLIT_ORACLE_PLANS else None
    if optimum is not None and optimum.makespan is not None:
        if not plan.lower_bound <= optimum.makespan <= plan.makespan:
            _fail(plan, f"bound {plan.lower_bound} <= optimum {optimum.makespan} <= makespan {plan.makespan} fails")
        if plan.status is Status.OPTIMAL and rounding_apart(plan.makespan, optimum.makespan, plan.num_items + 1):
            _fail(plan, f"claims optimal at {plan.makespan}, the optimum is {optimum.makespan}")
    if plan.status is Status.OPTIMAL and plan.makespan != plan.lower_bound and optimum is None:
        _fail(plan, f"claims optimal at {plan.makespan} above its bound {plan.lower_bound}")


def check_split_pass(plan) -> None:
    """Raise AssertionError unless every row of a `PassPlan` with split samples lands exactly once
    where its sample's group and the zigzag layout put it (recomputed from the batch):

    each LLM rank's shard rows tile its packed sequence; shard j of sample k (degree c) sits on
    rank destination[k] + j with the tokens at `shard_positions(l, c, j)`; every embedding piece
    lands on the packed rows holding its segment's positions, from the encoder part holding its
    rows; every text row of every sample lands once, at the position its text order gives; the
    text pieces and the embedding pieces tile their items' rows in order.
    """
    from ..balancers.context_parallel.layout import shard_positions
    batch, llm, shards = plan.batch, plan.llm, plan.shards
    lengths = batch.sample_llm_length
    where = {}  # (sample, position) -> (rank, packed row)
    for row in range(shards.num_rows):
        k, rank, j, c = (int(shards.sample[row]), int(shards.rank[row]), int(shards.group_rank[row]),
                         int(shards.degree[row]))
        assert c == llm.degree[k] and rank == llm.destination[k] + j, f"shard row {row} of sample {k} misplaced"
        positions = shard_positions(int(lengths[k]), c, j)
        assert shards.tokens[row] == positions.size, f"shard row {row}: {shards.tokens[row]} != {positions.size} tokens"
        for i, position in enumerate(positions.tolist()):
            where[k, position] = (rank, int(shards.offset[row]) + i)
    assert len(where) == int(lengths.sum()), "some token of some sample is in no shard, or in two"
    for rank in range(plan.num_ranks):
        rows = shards.rows_on(rank)
        assert np.array_equal(shards.offset[rows], np.cumsum(shards.tokens[rows]) - shards.tokens[rows]), \
            f"rank {rank}'s shards do not tile its packed sequence"
    _check_pieces(plan, where)
    _check_text(plan, where)


def _check_pieces(plan, where) -> None:
    """Every embedding piece: from its encoder part, onto its segment's positions; pieces tile segments."""
    batch = plan.batch
    covered = np.zeros(batch.num_segments, dtype=np.int64)
    parts = {}
    for index, stage_plan in enumerate(plan.stage_plans[:-1]):
        for item in range(stage_plan.num_items):
            parts.setdefault(int(stage_plan.item_segment[item]), []).append((index, item))
    for e in range(plan.route_segment.size):
        s, row, tokens = int(plan.route_segment[e]), int(plan.route_row[e]), int(plan.route_tokens[e])
        assert row == covered[s], f"piece {e} of segment {s} starts at row {row}, not {covered[s]}"
        covered[s] += tokens
        (index, item), = [(i, k) for i, k in parts[s] if plan.stage_plans[i].item_first_row[k] <= row
                          < plan.stage_plans[i].item_first_row[k] + max(plan.stage_plans[i].item_tokens[k], 1)][-1:]
        part = plan.stage_plans[index]
        assert (plan.route_stage[e] == index and plan.route_encoder_rank[e] == part.destination[item]
                and plan.route_encoder_offset[e] == part.item_offset[item] + row - part.item_first_row[item]), \
            f"piece {e} of segment {s} does not leave the encoder part holding its rows"
        k, position = int(batch.segment_sample[s]), int(batch.segment_position[s]) + row
        for i in range(tokens):
            assert where.pop((k, position + i)) == (int(plan.route_llm_rank[e]), int(plan.route_llm_offset[e]) + i), \
                f"piece {e}: row {row + i} of segment {s} lands off its position {position + i} of sample {k}"
    assert np.array_equal(covered, batch.segment_tokens), "the pieces do not tile every segment's embeddings"


def _check_text(plan, where) -> None:
    """Every text row lands once, where its text order puts it; text pieces tile every sample's text."""
    from ..orchestrator.shards import text_before
    batch, pieces = plan.batch, plan.text_pieces
    at = {place: key for key, place in where.items()}  # (rank, packed row) -> (sample, position), text only now
    buffer = {}  # (rank, text buffer row) -> (sample, text row)
    next_row = np.zeros(batch.num_samples, dtype=np.int64)
    for p in range(pieces.sample.size):
        k, first, tokens = int(pieces.sample[p]), int(pieces.first[p]), int(pieces.tokens[p])
        assert first == next_row[k], f"text piece {p} of sample {k} starts at text row {first}, not {next_row[k]}"
        next_row[k] += tokens
        for i in range(tokens):
            buffer[int(pieces.rank[p]), int(pieces.offset[p]) + i] = (k, first + i)
    assert np.array_equal(next_row, batch.sample_text), "the text pieces do not tile every sample's text"
    for rank in range(plan.num_ranks):
        recipe = plan.assembly(rank)
        for t in range(recipe.text_sample.size):
            k = int(recipe.text_sample[t])
            for i in range(int(recipe.text_length[t])):
                sample, text_row = buffer.pop((rank, int(recipe.text_buffer_offset[t]) + i))
                owner, position = at.pop((rank, int(recipe.text_llm_offset[t]) + i))
                assert sample == k == owner, f"rank {rank}: text span {t} row {i} mixes samples {sample}, {k}, {owner}"
                assert text_before(batch, k, np.array([position]))[0] == text_row, \
                    f"rank {rank}: text row {text_row} of sample {k} lands at position {position}"
    assert not buffer and not at, f"{len(at)} positions received nothing; {len(buffer)} text rows unused"


def brute_force_split_microbatches(lengths, num_ranks, spec: ContextParallel, *, max_tokens_per_microbatch,
                                   num_microbatches, cost=None, microbatch_overhead=0.0) -> SplitOptimum:
    """The least step Σ_m max_r L(r, m) + M · overhead over every micro-batch and aligned block of
    every item, M = `num_microbatches` (an int, or a range of them), at most one group per rank and
    micro-batch, every cell within the budget; `start`/`degree` of a best plan, its micro-batches in
    `microbatch` (None when no plan fits).  Loads are summed in item order, as the planner sums them.

    >>> spec = ContextParallel(degrees=(1, 2), latency_s=0.0, kv_bytes_per_token=0.0, half_efficiency_tokens=0.0)
    >>> brute_force_split_microbatches([8, 2, 2], 2, spec, max_tokens_per_microbatch=4, num_microbatches=2).makespan
    6.0
    """
    lengths, counts, spec = as_lengths(lengths), _as_counts(num_microbatches), _as_spec(spec)
    budget = as_int(max_tokens_per_microbatch, "max_tokens_per_microbatch", minimum=1)
    overhead = as_real(microbatch_overhead, "microbatch_overhead")
    cost = CostModel() if cost is None else cost
    per_item = _options(lengths, as_int(num_ranks, "num_ranks", minimum=1), spec, cost)
    total = sum(math.prod(m * len(options) for options in per_item) for m in counts)
    if total > SPLIT_BRUTE_FORCE_MAX_PLANS:
        raise ValueError(f"brute force over {total} split micro-batch plans exceeds SPLIT_BRUTE_FORCE_MAX_PLANS = "
                         f"{SPLIT_BRUTE_FORCE_MAX_PLANS}; use fewer items, ranks, degrees or micro-batches")
    best, best_plan = math.inf, None
    for m in counts:
        choices = [[(k, option) for k in range(m) for option in options] for options in per_item]
        for plan in itertools.product(*choices):
            if any(a[0] == b[0] and _clash(a[1], b[1]) for a, b in itertools.combinations(plan, 2)):
                continue
            loads = np.zeros((m, num_ranks))
            tokens = np.zeros((m, num_ranks), dtype=np.int64)
            for k, option in plan:  # item order, as the plan sums
                loads[k] += option[2]
                tokens[k] += option[3]
            if tokens.max() > budget:
                continue
            step = math.fsum(loads.max(axis=1).tolist()) + m * overhead
            if step < best:
                best, best_plan = step, plan
    if best_plan is None:
        return SplitOptimum(None, None, None, total)
    return SplitOptimum(best, np.array([o[1][0] for o in best_plan]), np.array([o[1][1] for o in best_plan]), total,
                        np.array([o[0] for o in best_plan]))


def _check_passes(plan: SplitMicroBatchPlan) -> None:
    """`passes[m]`, where the plan has them, places micro-batch m's items (ascending) as the plan does: starts,
    degrees, times, loads and tokens (None for an empty micro-batch); without them no item is split."""
    if plan.passes is None:
        if plan.split_items.size:
            _fail(plan, f"item {int(plan.split_items[0])} is split but the plan has no `passes` to lay it out")
        return
    if len(plan.passes) != plan.num_microbatches:
        _fail(plan, f"has {len(plan.passes)} passes for {plan.num_microbatches} micro-batches")
    for m, cell in enumerate(plan.passes):
        items = np.flatnonzero(plan.microbatch == m)
        if cell is None or not items.size:
            if cell is not None or items.size:
                _fail(plan, f"micro-batch {m} holds {items.size} items but its pass is {cell!r:.60}")
            continue
        same = [(cell.assignment, plan.rank[items]), (cell.degree, plan.degree[items]),
                (cell.item_time, plan.item_time[items]), (cell.loads, plan.cell_loads[m]),
                (cell.tokens, plan.cell_tokens[m])]
        if not all(np.shape(ours) == np.shape(theirs) and np.array_equal(ours, theirs) for ours, theirs in same):
            _fail(plan, f"micro-batch {m}'s pass places its items {items.tolist()} otherwise than the plan")


def check_split_microbatch_plan(plan: SplitMicroBatchPlan, lengths, num_ranks: int, spec: ContextParallel,
                                max_tokens_per_microbatch: int, *, cost=None, microbatch_overhead=0.0,
                                optimum=_AUTO) -> None:
    """Raise AssertionError unless `plan` is a certified plan of `balance_microbatches(lengths, num_ranks,
    max_tokens_per_microbatch=, cost=, microbatch_overhead=, context_parallel=spec)` (`spec` on the plan's
    topology: `spec.on(topology)` where one was given).

    Checked from the input alone: every item in a micro-batch of [0, M) on an aligned group of an allowed degree,
    inside a node unless allowed, no two groups of a micro-batch overlapping; its zigzag shards hold its tokens,
    each on exactly its group's ranks, at `item_time` = `spec.time`; cell loads (summed in item order) and tokens
    exact, every cell within the budget; step = Σ_m max_r load + M · overhead; 0 <= bound <= step; `optimal`
    exactly where they are equal; `passes` as the plan places the items.  Against `optimum` (a `SplitOptimum` at the
    plan's M; default `brute_force_split_microbatches` where it enumerates at most AUTO_SPLIT_ORACLE_PLANS = 4096
    plans; None skips it): bound <= optimum <= step, equal when optimal.

    >>> from orchmllm import balance_microbatches
    >>> spec = ContextParallel(degrees=(1, 2), latency_s=0.0, seconds_per_cost=1.0)
    >>> plan = balance_microbatches([40, 5, 5], 2, max_tokens_per_microbatch=25, context_parallel=spec)
    >>> check_split_microbatch_plan(plan, [40, 5, 5], 2, spec, 25)
    """
    check_plan_type(plan, SplitMicroBatchPlan)
    lengths, num_ranks, spec = as_lengths(lengths), as_num_ranks(num_ranks), _as_spec(spec)
    check_optimum_type(optimum, SplitOptimum, "brute_force_split_microbatches")
    cost = CostModel() if cost is None else cost
    n, m = lengths.size, plan.num_microbatches
    expected = (num_ranks, max_tokens_per_microbatch, microbatch_overhead, False, None)
    made = (plan.num_ranks, plan.max_tokens_per_microbatch, plan.microbatch_overhead, plan.padded, plan.pipeline)
    if made != expected:
        _fail(plan, f"was made for (num_ranks, max_tokens_per_microbatch, microbatch_overhead, padded, pipeline) = "
                    f"{made}; expected {expected}")
    _check_fields(plan, ("rank", "microbatch", "degree"), n)
    _check_spec(plan, spec)
    outside = np.flatnonzero((plan.microbatch < 0) | (plan.microbatch >= m))
    if outside.size:
        _fail(plan, f"item {outside[0]} is in micro-batch {plan.microbatch[outside[0]]}, outside [0, {m})")
    _check_groups(plan, plan.rank, spec, num_ranks, plan.microbatch)
    loads, tokens = _item_accounts(plan, plan.rank, lengths, spec, cost, plan.microbatch)
    for name, recomputed, reported in (("cell loads", loads, plan.cell_loads), ("cell tokens", tokens,
                                                                                plan.cell_tokens)):
        if np.shape(reported) != (m, num_ranks) or np.any(np.asarray(reported) != recomputed):
            _fail(plan, f"{name} {np.asarray(reported).tolist()} differ from the items' {recomputed.tolist()}")
    if tokens.max(initial=0) > max_tokens_per_microbatch:
        cell = np.unravel_index(int(tokens.argmax()), tokens.shape)
        _fail(plan, f"cell (rank {cell[1]}, micro-batch {cell[0]}) holds {int(tokens.max())} tokens > "
                    f"max_tokens_per_microbatch={max_tokens_per_microbatch}")
    step = math.fsum(loads.max(axis=1).tolist() + [m * plan.microbatch_overhead])
    if plan.step_cost != step or not 0 <= plan.lower_bound <= step:
        _fail(plan, f"step cost {plan.step_cost} / bound {plan.lower_bound} against Σ_m max_r load + M · overhead "
                    f"= {step}")
    if why := wrong_status(plan.status):
        _fail(plan, why)
    if (plan.status is Status.OPTIMAL) != (step == plan.lower_bound):
        _fail(plan, f"status {plan.status} with step cost {step} and bound {plan.lower_bound}")
    _check_passes(plan)
    if optimum is _AUTO:
        optimum = brute_force_split_microbatches(
            lengths, num_ranks, spec, max_tokens_per_microbatch=max_tokens_per_microbatch, num_microbatches=m,
            cost=cost, microbatch_overhead=microbatch_overhead) \
            if _split_plans(n, num_ranks, spec, m) <= AUTO_SPLIT_ORACLE_PLANS else None
    if optimum is None:
        return
    if optimum.makespan is None:
        _fail(plan, f"brute_force_split_microbatches finds no plan within the budget at M = {m}, yet this one exists")
    complaint = step_complaint(plan, step, optimum.makespan, m)
    if complaint:
        _fail(plan, complaint)

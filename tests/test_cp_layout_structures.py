"""The split layout's kept-sorted structures and shortcuts against brute scans: the same layouts, fewer scans.

`place_groups` keeps every candidate (a rank, or a group of ranks) in keys sorted by its peak load and
searches them; the reference scans every candidate with numpy at each item (`Placement._candidates`).
`two_tiers` settles a group's token room by bounds; the reference checks every rank of it."""

import heapq
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel import placement, planner, search
from orchmllm.balancers.context_parallel.pairing import packable_degrees
from orchmllm.balancers.context_parallel.plan import rank_accounts
from orchmllm.balancers.context_parallel.split import allot, allowed_degrees
from orchmllm.balancers.context_parallel import tiers
from orchmllm.balancers.context_parallel.tiers import TIER_STEPS, two_tiers
from orchmllm.balancers.problem import InfeasibleError, make_problem
from orchmllm.study.models import MODELS

COST = MODELS["84b"].llm.cost(causal=True)
GPUS = 8


def layout_inputs(lengths, num_ranks, cap, step):
    """(problem, spec, TimeTable, packable degrees, long items, target) as `layout` builds them at the
    ladder's step `step` above the bound."""
    problem = replace(make_problem(np.asarray(lengths), num_ranks, cost=COST), max_tokens_per_rank=cap)
    spec = ContextParallel(gpus_per_node=GPUS)
    allotment = allot(problem, spec, allowed_degrees(spec, num_ranks, GPUS), GPUS, cap)
    bound = allotment.bound()
    target = bound * (1 + step * planner.LADDER_STEP)
    long = np.flatnonzero((allotment.degrees_at(bound) > 1) | (problem.item_costs > planner.LAYOUT_SHARE * bound))
    times = planner.TimeTable(problem, spec, GPUS, long)
    degree = packable_degrees(times, problem.lengths, allotment.degrees_at(target), target,
                              math.inf if cap is None else cap, num_ranks, spec.degrees)
    return problem, spec, times, degree, long, target


@st.composite
def giant_mixes(draw, ranks=(8, 16, 32)):
    """Giants that split, long unsplit items laid out with them, short ones; budgets from none to tight."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    num_ranks = draw(st.sampled_from(ranks))
    giants = rng.integers(60_000, 320_000, draw(st.integers(1, num_ranks // 2)))
    longs = rng.integers(8_000, 60_000, draw(st.integers(0, 4 * num_ranks)))
    short = rng.integers(100, 4_000, draw(st.integers(0, 4 * num_ranks)))
    lengths = np.concatenate((giants, longs, short))
    tight = max(-(-int(lengths.max()) // GPUS), -(-int(lengths.sum()) // num_ranks))
    cap = draw(st.sampled_from([None, tight + 2_000, 2 * tight]))
    return lengths, num_ranks, cap, draw(st.sampled_from([0, 3, 7]))


class _Scanning(placement.Placement):
    """The reference: every search a numpy scan of all candidates, an overflow's at every degree, every item of
    degree 1 through `place` (no spill runs, `spill.py`)."""

    def _search(self, degree, time, need, fullest):
        return None

    def spill_run(self):
        return None

    def _floor(self, degree, time, need):
        return -math.inf, degree


class _OneByOne(_Scanning):
    """The stricter reference: every item through `place` (no opening runs, `Placement.open_run`), no search
    decided by the least-loaded candidate (`Placement._quick`)."""

    def open_run(self, items, times, needs):
        return 0

    def _quick(self, degree, time, need):
        return None


def _same_layout(found, expected):
    """Assert that two layouts (or two refusals, None) are the same."""
    assert (found is None) == (expected is None)
    if found is not None:
        assert found[2] == expected[2]
        np.testing.assert_array_equal(found[0], expected[0])
        np.testing.assert_array_equal(found[1], expected[1])


def _layout(case, blocks_class, monkeypatch):
    monkeypatch.setattr(placement, "Placement", blocks_class)
    problem, spec, times, degree, long, target = layout_inputs(*case)
    return placement.place_groups(problem, spec, GPUS, times, degree, long, target)


@settings(max_examples=40, deadline=None)
@given(case=giant_mixes())
def test_place_groups_equals_the_brute_scan(case):
    with pytest.MonkeyPatch.context() as monkeypatch:
        found = _layout(case, placement.Placement, monkeypatch)
        scanned = _layout(case, _Scanning, monkeypatch)
    _same_layout(found, scanned)


@settings(max_examples=200, deadline=None)
@given(case=giant_mixes(ranks=(8, 16, 32, 64)))
def test_place_groups_equals_laying_out_item_by_item_with_numpy_scans(case):
    """The layout's shortcuts (`Placement.open_run`, `_quick`, one degree's overflow unsorted) make the layouts of
    every item through `place` with numpy scans of every candidate."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        found = _layout(case, placement.Placement, monkeypatch)
        expected = _layout(case, _OneByOne, monkeypatch)
    _same_layout(found, expected)


def test_regression_items_that_each_open_a_group_were_placed_one_by_one(monkeypatch):
    """Six giants at degree 8 on 64 ranks: each opens a group on the next free block.  Each went through `place`
    (a search of the keys, then the block) where the opening run is read off their times at once (the long
    workload's T = 16k step: 9.5k of its 36k items at degree 8)."""
    places, place = [], placement.Placement.place
    monkeypatch.setattr(placement.Placement, "place", lambda self, *a: places.append(a) or place(self, *a))
    problem, spec, times, degree, long, target = layout_inputs([300_000] * 6 + [2_000] * 40, 64, None, 0)
    start, degree, overflowed = placement.place_groups(problem, spec, GPUS, times, degree, long, target)
    assert not overflowed and (degree[:6] == GPUS).all() and sorted(start[:6].tolist()) == list(range(0, 48, 8))
    assert [a for a in places if a[1] > 1] == []


def test_regression_an_overflow_searched_where_one_degrees_least_loaded_candidate_decides(monkeypatch):
    """Without a token budget the least-loaded candidate of a degree always has room: where that degree's floor is
    below every other degree's, it is the overflow's block unless another load rounds to its peak.  Each such
    overflow went through `_lowest`, `_search` and `_scan` (and before that walked the keys' runs, `_least_fitting`);
    now `Placement.least_loaded` decides it (the long workload's T = 16k step: 21k overflows, 806 searches left; most
    of them now spill in runs, `spill.py`)."""
    scanning, overflows = [], []
    scan, overflow = placement.Placement._scan, placement.Placement._overflow
    monkeypatch.setattr(placement.Placement, "_scan",
                        lambda self, degree, time, need, fullest: scanning.append(fullest) or scan(
                            self, degree, time, need, fullest))
    monkeypatch.setattr(placement.Placement, "_overflow", lambda self, *a: overflows.append(a) or overflow(self, *a))
    problem, spec, times, degree, long, target = layout_inputs([200_000, 150_000] + [50_000] * 30 + [2_000] * 40,
                                                               16, None, 0)
    assert placement.place_groups(problem, spec, GPUS, times, degree, long, target)[2]  # some item overflowed
    assert overflows and False not in scanning


@settings(max_examples=40, deadline=None)
@given(case=giant_mixes())
def test_place_groups_going_on_from_a_kept_layout_equals_laying_out_afresh(case):
    """`planner.laid_out` lays out the long items, then (where the deal found no token room) every item; the second
    call goes on from the first's layout kept in `layouts`, placing only the items not laid out yet."""
    problem, spec, times, degree, long, target = layout_inputs(*case)
    every = np.arange(problem.num_items)
    every_times = planner.TimeTable(problem, spec, GPUS, every)
    layouts = {}
    first = placement.place_groups(problem, spec, GPUS, times, degree, long, target, layouts)
    _same_layout(first, placement.place_groups(problem, spec, GPUS, times, degree, long, target))
    laid, lay = [], placement._lay
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(placement, "_lay", lambda blocks, items, c: laid.extend(items.tolist()) or lay(
            blocks, items, c))
        kept = placement.place_groups(problem, spec, GPUS, every_times, degree, every, target, layouts)
    _same_layout(kept, placement.place_groups(problem, spec, GPUS, every_times, degree, every, target))
    rest = np.setdiff1d(np.flatnonzero(degree == 1), long).size
    assert len(laid) == (0 if first is None else rest) or (kept is None and len(laid) < rest)

def test_regression_overflowing_unsplit_items_scanned_every_group(monkeypatch):
    """While degree 1 was laid out the groups' keys were not kept, so each unsplit item that overflowed
    scanned every group of every degree with numpy (12k such scans in the `long` workload's step).  An item
    overflows through `Placement._overflow`, or spills onto a group in a run (`SpillRun.spill`)."""
    scans, overflows = [], []
    candidates, overflow = placement.Placement._candidates, placement.Placement._overflow
    spill = placement.SpillRun.spill
    monkeypatch.setattr(placement.Placement, "_candidates", lambda self, *a: scans.append(a) or candidates(self, *a))
    monkeypatch.setattr(placement.Placement, "_overflow", lambda self, *a: overflows.append(a) or overflow(self, *a))
    monkeypatch.setattr(placement.SpillRun, "spill", lambda self, *a: spill(self, *a) and not overflows.append(a))
    problem, spec, times, degree, long, target = layout_inputs([200_000, 150_000] + [50_000] * 30 + [2_000] * 40,
                                                               16, None, 0)
    start, degree, overflowed = placement.place_groups(problem, spec, GPUS, times, degree, long, target)
    assert overflowed and len(overflows) == 10 and (degree[start >= 0] > 1).any()
    assert scans == []



def test_an_items_shards_are_read_one_by_one_only_where_an_overflow_searches_another_degree(monkeypatch):
    """Each place() read its item's time and shards from the table, and each overflow its shards at every degree of
    its own and above (the long workload at D = 2560 x 16, T = 16k: 109k such reads in a step's layouts); `_lay` reads
    them for all its items at once, and an overflow another degree's only where it searches there (the same
    layout: `test_place_groups_equals_the_brute_scan`)."""
    from orchmllm.balancers.context_parallel import timetable

    asked, searched, decided = [], [], []
    shard, search, least = timetable.TimeTable.shard, placement.Placement._search, placement.Placement.least_loaded
    monkeypatch.setattr(timetable.TimeTable, "shard", lambda self, *a: asked.append(a) or shard(self, *a))
    monkeypatch.setattr(placement.Placement, "_search",
                        lambda self, *a, **k: searched.append(k) or search(self, *a, **k))
    monkeypatch.setattr(placement.Placement, "least_loaded", lambda self, *a: decided.append(a) or least(self, *a))
    problem, spec, times, degree, long, target = layout_inputs([200_000, 150_000] + [50_000] * 30 + [2_000] * 40,
                                                               16, None, 0)
    assert placement.place_groups(problem, spec, GPUS, times, degree, long, target)[2]  # some item overflowed
    assert 0 < len(asked) <= len(decided)  # every `_search(..., fullest=False)` asks `least_loaded` first


def test_regression_searches_short_of_tokens_fell_back_to_scans(monkeypatch):
    """Cause: a search counted every candidate short of tokens as a probe and, past BEST_FIT_PROBES, scanned
    them all with numpy, item after item (5.4k scans of 2560 ranks in the `long` workload's step): now the
    candidates surely short leave the keys until a search for a shard they may hold."""
    scans = []
    candidates = placement.Placement._candidates
    monkeypatch.setattr(placement.Placement, "_candidates", lambda self, *a: scans.append(a) or candidates(self, *a))
    lengths = [198_687, 309_052, 165_180, 30_268, 48_248, 46_136, 44_446, 34_529, 3_255, 1_100, 219, 813, 300,
               3_607, 3_925, 1_389, 1_771, 3_517, 482]
    problem, spec, times, degree, long, target = layout_inputs(lengths, 16, 58_058, 0)
    start, degree, _ = placement.place_groups(problem, spec, GPUS, times, degree, long, target)
    assert (degree[start >= 0] > 1).any()
    assert scans == []

def _reference_two_tiers(problem, spec, times, long, rest_work, water_level):
    """`two_tiers` with every rank's loads and tokens kept and every token check rank by rank."""
    widest = spec.degrees[-1]
    cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
    order = long[np.lexsort((long, -times(long, widest)))]
    alone = np.array([spec.degrees[-2] if times.shard(i, spec.degrees[-2])[1] <= cap else widest
                      for i in order.tolist()], dtype=np.int64)
    best = None
    for k in np.unique(np.linspace(0, order.size, TIER_STEPS + 1).astype(np.int64)).tolist():
        if int(alone[:k].sum()) > problem.num_ranks:
            break
        start, degree = np.full(problem.num_items, -1), np.ones(problem.num_items, dtype=np.int64)
        loads, tokens, position = np.zeros(problem.num_ranks), np.zeros(problem.num_ranks, dtype=np.int64), 0
        for index in np.argsort(-alone[:k], kind="stable").tolist():
            item, c = int(order[index]), int(alone[index])
            start[item], degree[item], loads[position: position + c] = position, c, times.time(item, c)
            position += c
        groups = [(0.0, s) for s in range(-(-position // widest) * widest, problem.num_ranks - widest + 1, widest)]
        for item in order[k:].tolist():
            shard, aside = times.shard(item, widest)[0], []
            while groups and not (tokens[groups[0][1]: groups[0][1] + widest] + shard <= cap).all():
                aside.append(heapq.heappop(groups))
            if not groups:
                break
            load, s = groups[0]
            heapq.heapreplace(groups, (load + times.time(item, widest), s))
            for entry in aside:
                heapq.heappush(groups, entry)
            start[item], degree[item] = s, widest
            loads[s: s + widest] += times.time(item, widest)
            tokens[s: s + widest] += shard
        else:
            estimate = max(float(loads.max()), water_level(loads, rest_work))
            if best is None or estimate < best[2]:
                best = (start, degree, estimate)
    return best


@settings(max_examples=40, deadline=None)
@given(case=giant_mixes())
def test_two_tiers_equals_rank_by_rank_checks(case):
    problem, spec, times, _, long, _ = layout_inputs(*case)
    rest_work = float(problem.item_costs.sum() - problem.item_costs[long].sum())
    found = two_tiers(problem, spec, GPUS, times, long, rest_work, planner.water_level)
    reference = _reference_two_tiers(problem, spec, times, long, rest_work, planner.water_level)
    _same_layout(found, reference)



@settings(max_examples=40, deadline=None)
@given(case=giant_mixes(), scale=st.sampled_from([0.5, 0.999, 1.0, 1.001, 2.0]))
def test_two_tiers_under_a_ceiling_keeps_every_best_below_it(case, scale):
    """`layout` keeps two tiers only where their estimate is below the ladder's best, so it passes that as the
    `ceiling` and no k whose floor reaches it is dealt: the result is the same wherever it is below the ceiling."""
    problem, spec, times, _, long, _ = layout_inputs(*case)
    rest_work = float(problem.item_costs.sum() - problem.item_costs[long].sum())
    free = two_tiers(problem, spec, GPUS, times, long, rest_work, planner.water_level)
    ceiling = scale * (free[2] if free is not None else 1.0)
    deals, deal = [], tiers._deal
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(tiers, "_deal", lambda *a: deals.append(a[6]) or deal(*a))
        found = two_tiers(problem, spec, GPUS, times, long, rest_work, planner.water_level, ceiling)
    if free is not None and free[2] < ceiling:
        _same_layout(found, free)
    else:
        assert found is None or found[2] >= ceiling
    widest = spec.degrees[-1]
    order = long[np.lexsort((long, -times(long, widest)))]
    wide_time = times(order, widest)
    assert all(k == order.size or wide_time[k] < ceiling for k in deals)  # the longest dealt is under it

@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(8, 60), min_size=1, max_size=30), cap=st.integers(8, 40))
def test_two_tiers_equals_rank_by_rank_checks_near_the_budget(lengths, cap):
    """Short items against a budget of a few shards: a group's bounds often leave its token room open."""
    problem = replace(make_problem(np.asarray(lengths), 16, cost=COST), max_tokens_per_rank=cap)
    spec, long = ContextParallel(gpus_per_node=GPUS), np.arange(len(lengths))
    times = planner.TimeTable(problem, spec, GPUS, long)
    found = two_tiers(problem, spec, GPUS, times, long, 0.0, planner.water_level)
    reference = _reference_two_tiers(problem, spec, times, long, 0.0, planner.water_level)
    _same_layout(found, reference)


@settings(max_examples=40, deadline=None)
@given(case=giant_mixes())
def test_two_tiers_floor_is_below_every_deals_estimate(case):
    """`two_tiers` skips a k whose `_floor` is no less than the best estimate: the floor must bound the
    estimate of the deal it skips, for every k (the skipped deals are never compared otherwise)."""
    problem, spec, times, _, long, _ = layout_inputs(*case)
    rest_work = float(problem.item_costs.sum() - problem.item_costs[long].sum())
    widest, below = spec.degrees[-1], spec.degrees[-2]
    cap = math.inf if problem.max_tokens_per_rank is None else problem.max_tokens_per_rank
    order = long[np.lexsort((long, -times(long, widest)))]
    rows = times.row[order]
    alone = np.where(times.shards[below][rows].max(axis=1) <= cap, below, widest)
    shards, wide_time = times.shards[widest][rows], times(order, widest)
    wide = (wide_time.tolist(), shards, shards.max(axis=1).tolist(), shards.min(axis=1).tolist())
    alone_time = times.table[rows, np.where(alone == below, times.column[below], times.column[widest])]
    for k in range(order.size + 1):
        if int(alone[:k].sum()) > problem.num_ranks:
            break
        laid = tiers._deal(problem, spec, GPUS, times, order, alone, k, widest, cap, wide)
        if laid is not None:
            estimate = max(float(laid[2].max()), planner.water_level(laid[2], rest_work))
            assert tiers._floor(k, alone, alone_time, wide_time, widest, problem.num_ranks, rest_work) <= estimate


def _checked_search(monkeypatch, spec) -> list[bool]:
    """Make the local search check, after every move, that its loads, tokens and item times are `rank_accounts`'
    of its blocks bit for bit (it sums again only the ranks a move changes), and every widening's trial peak
    against the accounts of the widened plan; returns, per move made, whether it widened a group."""
    widened, apply, widen = [], search._State.apply, search._State._widen

    def checked_apply(self, item, start, degree, rank):
        apply(self, item, start, degree, rank)
        widened.append(item == -2)
        for found, expected in zip((self.loads, self.tokens, self.times),
                                   rank_accounts(self.problem, spec, GPUS, self.start, self.degree)):
            assert found.dtype == expected.dtype and found.tobytes() == expected.tobytes()

    def checked_widen(self, members, group, base, wide):
        found = widen(self, members, group, base, wide)
        start, degree = self.start.copy(), self.degree.copy()
        start[members], degree[members] = base, wide
        loads, tokens, _ = rank_accounts(self.problem, spec, GPUS, start, degree)
        ranks = slice(base, base + wide)
        assert found[0] == (math.inf if (tokens[ranks] > self.cap).any() else float(loads[ranks].max()))
        return found

    monkeypatch.setattr(search._State, "apply", checked_apply)
    monkeypatch.setattr(search._State, "_widen", checked_widen)
    return widened


def test_search_moves_keep_the_accounts_exact(monkeypatch):
    """Plans whose search moves items and widens groups: k items sharing a group of 2 on ranks 0-1, short items
    on ranks 2-3, another item's group of 4 on ranks 4-7 (D = 8, no budget and a tight one)."""
    spec = ContextParallel(gpus_per_node=GPUS)
    widened = _checked_search(monkeypatch, spec)
    for seed in range(12):
        rng = np.random.default_rng(seed)
        k = 2 + seed % 3
        lengths = np.concatenate((rng.integers(20_000, 200_000, k), rng.integers(100_000, 400_000, 1),
                                  rng.integers(100, 2_000, 4)))
        start = np.concatenate((np.zeros(k, dtype=np.int64), [4], rng.integers(2, 4, 4)))
        degree = np.concatenate((np.full(k, 2), [4], np.ones(4, dtype=np.int64)))
        for cap in (None, int(lengths.sum()) // 4):
            problem = replace(make_problem(lengths, 8, cost=COST), max_tokens_per_rank=cap)
            search.improve(problem, spec, GPUS, start, degree, 0.0)
    assert any(widened) and not all(widened)


@settings(max_examples=40, deadline=None)
@given(case=giant_mixes())
def test_search_from_split_layouts_keeps_the_accounts_exact(case):
    lengths, num_ranks, cap, _ = case
    problem = replace(make_problem(np.asarray(lengths), num_ranks, cost=COST), max_tokens_per_rank=cap)
    spec = ContextParallel(gpus_per_node=GPUS)
    allotment = allot(problem, spec, allowed_degrees(spec, num_ranks, GPUS), GPUS, cap)
    bound = allotment.bound()
    try:
        start, degree = planner.laid_out(problem, spec, GPUS, allotment, bound)[:2]
    except InfeasibleError:
        return
    with pytest.MonkeyPatch.context() as monkeypatch:
        _checked_search(monkeypatch, spec)
        search.improve(problem, spec, GPUS, start, degree, bound)


def _moves_one_by_one(state, rank, items):
    """The reference of `_unsplit_moves`: each item taken out of `rank` on copies of the accounts, the least-loaded
    other rank with token room by argmin, its blocks by `blocks` (the search's item-by-item code)."""
    out = []
    for item in items.tolist():
        cost, length = state.times[item], int(state.problem.lengths[item])
        after, after_tokens = state.loads.copy(), state.tokens.copy()
        after[rank] -= cost
        after_tokens[rank] -= length
        room = np.where(after_tokens + length <= state.cap, after, math.inf)
        room[rank] = math.inf
        q = int(np.argmin(room))
        out.append((max(after[rank], room[q] + cost), item, q, 1))
        peak, start, degree = state.blocks(item, after, after_tokens, None)
        out.append((max(peak, after[rank]), item, start, degree))
    return out


def _same_unsplit_moves(problem, spec, start, degree):
    """Every rank's unsplit moves, all items at once, against the item-by-item reference, bit for bit."""
    state = search._State(problem, spec, GPUS, start, degree, 0.0)
    for rank in range(problem.num_ranks):
        items = np.flatnonzero((state.start == rank) & (state.degree == 1))
        if items.size:
            assert state._unsplit_moves(rank, items) == _moves_one_by_one(state, rank, items)


@settings(max_examples=30, deadline=None)
@given(case=giant_mixes(), chunk=st.sampled_from([1, 3, search.MOVE_CHUNK]))
def test_unsplit_moves_at_once_are_the_item_by_item_ones(case, chunk):
    lengths, num_ranks, cap, _ = case
    problem = replace(make_problem(np.asarray(lengths), num_ranks, cost=COST), max_tokens_per_rank=cap)
    spec = ContextParallel(gpus_per_node=GPUS)
    allotment = allot(problem, spec, allowed_degrees(spec, num_ranks, GPUS), GPUS, cap)
    try:
        start, degree = planner.laid_out(problem, spec, GPUS, allotment, allotment.bound())[:2]
    except InfeasibleError:
        return
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(search, "MOVE_CHUNK", chunk)
        _same_unsplit_moves(problem, spec, start, degree)


@pytest.mark.parametrize("cap", [None, 3_000, 2_000])
def test_unsplit_moves_at_once_break_ties_as_argmin(cap):
    """Equal items on equal ranks (every load tied), beside a group of 4 on ranks 4-7: the least-loaded rank is the
    lowest with token room, a block the first of equal peaks, and with no room anywhere argmin's rank 0."""
    lengths = np.array([1_000] * 8 + [200_000])
    start = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4])
    degree = np.array([1] * 8 + [4])
    problem = replace(make_problem(lengths, 8, cost=COST), max_tokens_per_rank=cap)
    _same_unsplit_moves(problem, ContextParallel(gpus_per_node=GPUS), start, degree)

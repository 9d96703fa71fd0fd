"""The locality deal's orders, the same as the plain sorts: group keys from runs of equal groups where items
ascend; the fallback's pairs (`lap._pair_bytes`) and re-deal orders (`redeal`) by 16-bit radix argsorts."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.locality import partial_plan
from orchmllm.balancers.locality.lap import _pair_bytes
from orchmllm.balancers.locality.partial_plan import FEW_COSTS, RUNS_PER_KEY, SLICED_RUN_KEYS, PartialPlan
from orchmllm.balancers.locality.redeal import _by_key, _dense_ranks, _match_sorted
from orchmllm.balancers.problem import make_problem


def _sorted_keys(state: PartialPlan, groups: np.ndarray, items: np.ndarray | None) -> np.ndarray:
    """The keys as the plain code makes them: group << rank_bits | cost rank, sorted."""
    ranks = state.cost_rank if items is None else state.cost_rank[items]
    return np.sort((groups.astype(np.int64) << state.rank_bits) | ranks)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 3000), st.integers(1, 40), st.sampled_from([1, 7, 300, 2**27]),
       st.booleans(), st.booleans())
def test_group_keys_by_runs_are_the_sorted_keys(seed, size, runs, groups_count, subset, one_cost):
    """Items of one cost (cost rank = index), a few or many, grouped in runs (a sample's frames on its rank), all of
    them or an ascending subset: the keys equal the plain sort's, in its dtype (runs too many: the sort's)."""
    rng = np.random.default_rng(seed)
    lengths = np.full(size, 5) if one_cost else rng.integers(1, rng.choice([3, FEW_COSTS + 1, 50]), size)
    state = PartialPlan(make_problem(lengths, 4), target=0.0)
    run_groups = rng.integers(0, groups_count, runs)
    groups = np.repeat(run_groups, np.diff(np.sort(np.r_[0, rng.integers(0, size, runs - 1), size])))
    items = np.sort(rng.choice(size, rng.integers(1, size + 1), replace=False)) if subset else None
    if items is not None:
        groups = groups[items]
    keys = state.group_keys(groups, items)
    expected = _sorted_keys(state, groups, items)
    assert keys.tolist() == expected.tolist()
    assert keys.dtype == (np.int32 if (int(groups.max()) + 1) << state.rank_bits <= 2**31 else np.int64)


def test_group_keys_take_the_runs_only_for_one_cost_ascending_items_and_few_runs(monkeypatch):
    """The run path serves items of up to FEW_COSTS costs, ascending, short runs and long (and refuses more than
    one run in RUNS_PER_KEY keys: the sort makes those); more costs or unordered items are sorted."""
    calls = []
    real = partial_plan._keys_by_runs
    monkeypatch.setattr(partial_plan, "_keys_by_runs", lambda *args: calls.append(real(*args)) or calls[-1])
    size = 64 * RUNS_PER_KEY
    state = PartialPlan(make_problem(np.full(size, 3), 8), target=0.0)
    few = np.repeat(np.arange(64)[::-1], RUNS_PER_KEY)  # 64 runs
    assert state.group_keys(few, None).tolist() == _sorted_keys(state, few, None).tolist()
    assert calls[-1] is not None
    for run in (RUNS_PER_KEY, SLICED_RUN_KEYS):  # runs gathered by position, or copied run by run
        alternating = np.repeat(np.arange(size // run) % 2, run)  # a group's runs must keep their order
        assert state.group_keys(alternating, None).tolist() == _sorted_keys(state, alternating, None).tolist()
        assert calls[-1] is not None
    many = np.arange(size) % 97  # a run per key
    assert state.group_keys(many, np.arange(size)).tolist() == _sorted_keys(state, many, np.arange(size)).tolist()
    assert len(calls) == 4 and calls[-1] is None
    unordered = np.arange(size)[::-1].copy()
    assert state.group_keys(few, unordered).tolist() == _sorted_keys(state, few, unordered).tolist()
    for costs, path in ((FEW_COSTS, 1), (FEW_COSTS + 1, 0)):  # a few costs listed cost by cost; more are sorted
        mixed = PartialPlan(make_problem(np.arange(size) * costs // size + 1, 8), target=0.0)  # in blocks
        before = len(calls)
        longer = np.repeat(np.arange(32)[::-1], size // 32)  # 32 runs, split by the costs' blocks
        for items in (None, np.arange(3, size)):
            groups = longer if items is None else longer[items]
            assert mixed.group_keys(groups, items).tolist() == _sorted_keys(mixed, groups, items).tolist()
        assert len(calls) == before + 2 * path and (not path or calls[-1] is not None)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 400), st.sampled_from([1, 5, 2560, 2**16, 70_000]))
def test_pair_bytes_are_np_unique_pairs_summed_in_item_order(seed, size, width):
    """`lap._pair_bytes` by two 16-bit radix argsorts (or np.unique from 2**16 on): the distinct pairs ascending
    and their bytes summed in item order, bit for bit and dtype for dtype."""
    rng = np.random.default_rng(seed)
    left, right = rng.integers(0, width, size), rng.integers(0, width, size)
    item_bytes = rng.random(size) * 10.0 ** rng.integers(-3, 12, size)
    unique, inverse = np.unique(left * width + right, return_inverse=True)
    expected = (unique // width, unique % width, np.bincount(inverse, weights=item_bytes))
    for got, want in zip(_pair_bytes(left, right, item_bytes, width), expected):
        assert got.dtype == want.dtype and np.array_equal(got, want)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 300), st.sampled_from([1, 40, 2**15, 2**17, 10**12]),
       st.booleans(), st.booleans())
def test_redeal_orders_are_the_plain_sorts(seed, size, span, identity, shuffled):
    """`redeal`'s orders: dense ranks = np.unique's inverse (table or sort); `_by_key` = the members sorted by
    (key, order) (radix below 2**16, ascending members or not, identity order or not); `_match_sorted` = the
    k-th item of a key to the key's k-th slot, searched item by item."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, span, size)
    assert _dense_ranks(lengths).tolist() == np.unique(lengths, return_inverse=True)[1].tolist()
    assert _dense_ranks(lengths.astype(float)).tolist() == np.unique(lengths, return_inverse=True)[1].tolist()
    keys = rng.integers(0, min(span, 2**40), size)
    everything = np.arange(size)
    order = everything if identity else rng.permutation(size)
    of_order = everything if identity else np.argsort(order)
    members = np.flatnonzero(rng.random(size) < 0.7)
    if shuffled:
        members = rng.permutation(members)
    expected = sorted(members.tolist(), key=lambda item: (keys[item], order[item]))
    assert _by_key(members, keys, order, of_order).tolist() == expected
    slots = np.flatnonzero(rng.random(size) < 0.5)
    items = _by_key(members, keys, order, of_order)
    slots = slots[np.argsort(keys[slots], kind="stable")]
    matched, their_slots = _match_sorted(items, keys, slots, keys)
    plain_items, plain_slots, taken = [], [], {}
    for item in items.tolist():
        candidates = [slot for slot in slots.tolist() if keys[slot] == keys[item]]
        k = taken.get(keys[item], 0)
        if k < len(candidates):
            plain_items.append(item)
            plain_slots.append(candidates[k])
            taken[keys[item]] = k + 1
    assert matched.tolist() == plain_items and their_slots.tolist() == plain_slots

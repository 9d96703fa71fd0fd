"""The locality deal's orders, the same as the plain sorts: group keys by one sort of the packed keys, in int32
where every key fits; the fallback's pairs (`lap._pair_bytes`) and re-deal orders (`redeal`) by 16-bit radix
argsorts."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchmllm.balancers.locality.lap import _pair_bytes
from orchmllm.balancers.locality.partial_plan import PartialPlan
from orchmllm.balancers.locality.redeal import _by_key, _dense_ranks, _match_sorted
from orchmllm.balancers.problem import make_problem


def _sorted_keys(state: PartialPlan, groups: np.ndarray, items: np.ndarray | None) -> np.ndarray:
    """The keys as the plain code makes them: group << rank_bits | cost rank, sorted."""
    ranks = state.cost_rank if items is None else state.cost_rank[items]
    return np.sort((groups.astype(np.int64) << state.rank_bits) | ranks)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 3000), st.integers(1, 40), st.sampled_from([1, 7, 300, 2**27]),
       st.sampled_from(["all", "ascending", "shuffled"]), st.sampled_from([1, 3, 9, 50]))
def test_group_keys_are_the_sorted_keys(seed, size, runs, groups_count, subset, costs):
    """Items of one cost (cost rank = index) or of a few or many, grouped in runs (a sample's frames on its rank),
    all of them or a subset, ascending or not: the keys equal the plain sort's, in int32 where every key fits."""
    rng = np.random.default_rng(seed)
    lengths = np.full(size, 5) if costs == 1 else rng.integers(1, costs + 1, size)
    state = PartialPlan(make_problem(lengths, 4), target=0.0)
    run_groups = rng.integers(0, groups_count, runs)
    groups = np.repeat(run_groups, np.diff(np.sort(np.r_[0, rng.integers(0, size, runs - 1), size])))
    items = None if subset == "all" else np.sort(rng.choice(size, rng.integers(1, size + 1), replace=False))
    if subset == "shuffled":
        items = rng.permutation(items)
    if items is not None:
        groups = groups[items]
    keys = state.group_keys(groups, items)
    expected = _sorted_keys(state, groups, items)
    assert keys.tolist() == expected.tolist()
    assert keys.dtype == (np.int32 if (int(groups.max()) + 1) << state.rank_bits <= 2**31 else np.int64)


def test_group_keys_stay_int32_up_to_the_last_group_that_fits_and_never_wrap():
    """16 items take 5 bits of cost rank: group 2**26 - 1 is the last whose keys fit int32 (its largest key is
    2**31 - 1); one group more takes int64, where an int32 shift would wrap to negative keys and sort them first.
    An empty call gives no keys."""
    state = PartialPlan(make_problem(np.arange(16) % 3 + 1, 4), target=0.0)
    assert state.rank_bits == 5
    for last, dtype in ((2**26 - 1, np.int32), (2**26, np.int64)):
        groups = np.array([last, 0, last, 1] * 4)
        keys = state.group_keys(groups, None)
        assert keys.dtype == dtype and keys.tolist() == _sorted_keys(state, groups, None).tolist()
        assert keys[-1] >> state.rank_bits == last
    assert state.group_keys(np.array([], dtype=np.int64), np.array([], dtype=np.int64)).size == 0


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

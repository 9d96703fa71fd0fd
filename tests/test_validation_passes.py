"""Checks of per-item arrays the planner passes on every call (sources, item bytes) read them without a mask as
large as the items where every entry is good (two reductions); a bad entry is still named as before."""

import tracemalloc

import numpy as np
import pytest

from orchmllm.balancers.validation import as_item_bytes, as_sources


def peak_bytes(call) -> int:
    """Bytes the call held at its peak (numpy's arrays are traced): its temporaries, where it returns its input."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_good_sources_and_bytes_take_no_mask():
    sources, item_bytes = np.arange(200_000) % 64, np.full(200_000, 3.5)  # int64, float64: checked as they are
    assert as_sources(sources, sources.size, 64) is sources and as_item_bytes(item_bytes, item_bytes.size) is item_bytes
    assert peak_bytes(lambda: as_sources(sources, sources.size, 64)) < sources.size // 8
    assert peak_bytes(lambda: as_item_bytes(item_bytes, item_bytes.size)) < item_bytes.size // 8


@pytest.mark.parametrize("bad, index", [(-1, 3), (64, 7), (10**6, 0)])
def test_bad_sources_are_named(bad, index):
    sources = np.arange(10) % 64
    sources[index] = bad
    with pytest.raises(ValueError, match=rf"`sources` must be ranks in \[0, 64\); got {bad} at index {index}"):
        as_sources(sources, sources.size, 64)


@pytest.mark.parametrize("bad, index", [(np.nan, 2), (np.inf, 5), (-np.inf, 0), (-1e-300, 9)])
def test_bad_bytes_are_named(bad, index):
    item_bytes = np.ones(10)
    item_bytes[index] = bad
    with pytest.raises(ValueError, match=rf"`item_bytes` must be finite and non-negative; got .* at index {index}"):
        as_item_bytes(item_bytes, item_bytes.size)


def test_edge_values_pass():
    assert as_item_bytes(np.array([-0.0, 1e308, 1e308]), 3).tolist() == [-0.0, 1e308, 1e308]  # a sum past inf
    assert as_sources(np.zeros(0, dtype=np.int64), 0, 4).size == 0

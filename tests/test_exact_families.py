"""The benchmark families of benchmarks/pcmax_families.py: seeded, on the documented grid, examples run."""

import doctest

import numpy as np
import pytest

from orchmllm.benchmarks import pcmax_families
from orchmllm.benchmarks.pcmax_families import FAMILIES, instances, make_instance


def test_module_examples_run():
    result = doctest.testmod(pcmax_families, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_same_key_gives_the_same_times_and_seeds_differ():
    first, again = make_instance("uniform_1000", 10, 2.5, seed=3), make_instance("uniform_1000", 10, 2.5, seed=3)
    assert np.array_equal(first.times, again.times) and not first.times.flags.writeable
    assert not np.array_equal(first.times, make_instance("uniform_1000", 10, 2.5, seed=4).times)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_ranges_and_grid(family):
    grid = instances(families=(family,))
    assert len(grid) == 24 and {i.num_machines for i in grid} == {5, 10, 20, 30, 40, 50}
    high = {"uniform_100": 100, "uniform_10000": 10000}.get(family, 1000)
    for instance in grid:
        assert instance.num_items == round(instance.ratio * instance.num_machines)
        assert instance.times.dtype == np.int64 and 1 <= instance.times.min() <= instance.times.max() <= high
    if family in ("nonuniform", "few_large"):
        sizes = [np.count_nonzero(i.times >= 900) for i in grid]
        counts = [max(1, round(0.02 * i.num_items)) for i in grid]
        expected = counts if family == "few_large" else [i.num_items - c for i, c in zip(grid, counts)]
        assert sizes == expected


def test_unknown_family_is_named():
    with pytest.raises(ValueError, match="unknown `family` 'uniform'"):
        make_instance("uniform", 5, 2)

"""Booleans among numbers are refused as a bool array is, with the same message (probe58: `balance([True, 3, 8, 1],
2)` planned True as a length of 1, numpy reading the list as integers, while `[True, False]` was refused)."""

import numpy as np
import pytest

from orchmllm import balance
from orchmllm.balancers.validation import as_numbers


@pytest.mark.parametrize("lengths", [[True, 3, 8, 1], [True, False], (1, np.True_), [3.0, True],
                                     np.array([True, 3], dtype=object)],
                         ids=["bool-among-ints", "all-bools", "numpy-bool", "bool-among-floats", "object-array"])
def test_booleans_among_lengths_are_refused_as_a_bool_array_is(lengths):
    with pytest.raises(TypeError, match=r"^`lengths` must hold integers, not booleans$"):
        balance(lengths, 2)


def test_booleans_among_costs_are_refused():
    with pytest.raises(TypeError, match=r"`costs` must hold numbers, not booleans"):
        as_numbers([1.5, True], "costs")


def test_booleans_among_per_item_costs_are_refused():
    with pytest.raises(TypeError, match=r"^`costs` must hold reals, not booleans$"):
        balance([1, 2, 3], 2, costs=[1.0, True, 2.0])


def test_booleans_among_sources_are_refused():
    with pytest.raises(TypeError, match=r"^`sources` must hold rank indices, not booleans$"):
        balance([1, 2, 3], 2, sources=[0, True, 1])


def test_regression_zero_dim_bool_arrays_and_tensors_among_numbers_are_refused():
    """probe59 B1: a 0-d bool array or tensor passed `_holds_bool`, which looked at the items' types only, and
    numpy read it as 1: `[np.array(True), 3, 8, 1]` planned, as did `sources=[0, torch.tensor(True), 1, 0]`."""
    torch = pytest.importorskip("torch")
    for flag in (np.array(True), torch.tensor(True)):
        with pytest.raises(TypeError, match=r"^`lengths` must hold integers, not booleans$"):
            balance([flag, 3, 8, 1], 2)
        with pytest.raises(TypeError, match=r"^`costs` must hold reals, not booleans$"):
            balance([1, 3, 8, 1], 2, costs=[flag, 1.0, 2.0, 1.0])
        with pytest.raises(TypeError, match=r"^`sources` must hold rank indices, not booleans$"):
            balance([1, 3, 8, 1], 2, sources=[0, flag, 1, 0])
    # 0-d arrays and tensors of numbers are still read as their numbers
    assert balance([np.array(3), torch.tensor(4), 8, 1], 2).digest() == balance([3, 4, 8, 1], 2).digest()

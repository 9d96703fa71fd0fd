"""probe55: the exchange's public helpers given what a user may pass by mistake.

`exchange(piece)` (one Piece, not a list) raised "'ExchangeMeta' object has no attribute 'meta'" (a Piece is a
tuple of its fields: its route was read as piece 0), and exchange_with_grad the same; `ExchangeMeta.from_assignment`
with negative or 2-D `counts` raised numpy's "repeats may not contain negative values" / "object too deep for desired
array", and truncated float counts (1.5 -> 1) without a word."""

import numpy as np
import pytest
import torch

from orchmllm.runtime import ExchangeMeta, Piece, exchange, exchange_with_grad

META = ExchangeMeta([0, 0], [0, 0], 0, 1)


@pytest.mark.parametrize("move", [exchange, exchange_with_grad])
def test_regression_one_piece_not_in_a_list_raised_an_attribute_error(move):
    piece = Piece(META, torch.arange(4.0).reshape(2, 2), 1)
    with pytest.raises(TypeError, match=r"`pieces` must be a sequence of Pieces; got one Piece \(pass \[piece\]\)"):
        move(piece)
    with pytest.raises(TypeError, match="`pieces` must be a sequence of Pieces; got a Tensor among them"):
        move([piece, piece.tensor])
    [moved] = move(iter([piece]))  # any iterable of Pieces, as a list
    assert torch.equal(moved, piece.tensor)


@pytest.mark.parametrize("counts, error, message", [
    ([3, -1], ValueError, "`counts` must be non-negative integers; got -1 at index 1"),
    ([[2]], ValueError, r"`counts` must be 1-D, one item count per rank; got shape \(1, 1\)"),
    ([1.5, 0.5], TypeError, "`counts` must hold integers; got dtype float64"),
    (None, TypeError, "`counts` must be a 1-D sequence of item counts, one per rank; got NoneType"),
])
def test_regression_from_assignment_counts_raised_numpy_errors_or_were_truncated(counts, error, message):
    with pytest.raises(error, match=message):
        ExchangeMeta.from_assignment([0, 0], counts, 0)


def test_from_assignment_takes_counts_of_any_integer_kind():
    route = ExchangeMeta.from_assignment(np.array([1, 0, 1]), np.array([2, 1], dtype=np.int32), 1)
    assert route.source_ranks.tolist() == [0, 0, 1] and route.dest_items.tolist() == [0, 2]

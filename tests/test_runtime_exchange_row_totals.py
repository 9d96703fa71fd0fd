"""probe55 N3 (fix56): a Piece's `item_rows` whose total overflows int64.  Two items of 2**62 rows summed to -2**63
and the exchange said "tensor has 2 rows but this rank's 2 items own -9223372036854775808 rows"; a uint64 count of
2**63 wrapped to a negative int64.  Row totals of 2**53 and more (where offsets, counts and their float64 weights stop
being exact) are refused naming `item_rows`, before anything is sent."""

import numpy as np
import pytest
import torch

from orchmllm.runtime import ExchangeMeta, Piece, exchange

META = ExchangeMeta([0, 0], [0, 0], 0, 1)
LIMIT = "`item_rows` must total fewer than 2\\*\\*53 rows over the plan's items"


@pytest.mark.parametrize("rows", [np.array([2**62, 2**62]), np.array([2**63, 1], dtype=np.uint64),
                                  np.array([2**53 - 1, 1]), 2**52, 2**62])
def test_regression_row_totals_beyond_int64_read_as_negative(rows):
    with pytest.raises(ValueError, match=LIMIT):
        exchange([Piece(META, torch.zeros(2, 1), rows)])


def test_row_totals_below_the_limit_still_move():
    rows = np.array([3, 1])
    [moved] = exchange([Piece(META, torch.arange(4.0)[:, None], rows)])
    assert moved[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert META.item_rows(2**52 - 1).tolist() == [2**52 - 1] * 2  # 2**53 - 2 rows in all: accepted

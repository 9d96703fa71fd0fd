"""Exact sums of non-negative numbers: the int64 halves of integers, the 32-bit limbs of floats, else `math.fsum`.

Every plan's loads, bounds and certificates add costs; their sums must be exact (or correctly rounded) so that every
rank computes the same floats whatever the order of the items.
"""

from __future__ import annotations

import math

import numpy as np

ROUND_32 = 1.5 * 2.0**84  # (x + ROUND_32) - ROUND_32: an integer |x| < 2**83 to the nearest multiple of 2**32


def integer_values(values: np.ndarray) -> np.ndarray | None:
    """Non-negative float `values` as int64 when all are integers below 2**63, else None."""
    if not values.size or values.max() >= 2.0**63:
        return None
    integers = values.astype(np.int64)
    return integers if bool(np.all(integers == values)) else None


def rounding_unit(costs: np.ndarray) -> float:
    """The grid a plan's offsets are rounded to: 2**-30 of the binade of the largest of `costs` (sorted descending),
    never below the smallest subnormal (a tiny cost would round it to 0), and 1 where the costs are integers."""
    top = float(costs[0]) if costs.size else 0.0
    unit = math.ldexp(1.0, max(math.frexp(top)[1] - 30, -1074))
    return 1.0 if unit < 1 and integer_values(costs) is not None else unit


def integer_sum(integers: np.ndarray) -> int:
    """The exact sum of non-negative int64 `integers`, as a Python int (no overflow).

    Summed as high and low 32-bit halves, in chunks whose half sums fit int64.
    """
    total = 0
    for start in range(0, integers.size, 2**30):
        chunk = integers[start:start + 2**30]
        total += (int(np.sum(chunk >> 32)) << 32) + int(np.sum(chunk & 0xFFFFFFFF))
    return total


def exact_sum(values: np.ndarray) -> float:
    """`math.fsum(values)`, the correctly rounded sum of non-negative float `values`.

    Integers below 2**63 are summed exactly in int64 as high and low 32-bit halves (each half's sum fits for fewer
    than 2**31 values) and rounded once by `float(int)`; other floats in 32-bit limbs where they allow (`limb_sum`);
    both several times faster than fsum.

    >>> exact_sum(np.array([0.1, 0.2, 0.3])) == math.fsum([0.1, 0.2, 0.3])
    True
    >>> exact_sum(np.array([1e16, 1.0, 1.0, -0.0]))
    1.0000000000000002e+16
    """
    integers = integer_values(values) if values.size < 2**31 else None
    if integers is not None:
        return float(integer_sum(integers))
    total = limb_sum(values)
    return math.fsum(memoryview(values)) if total is None else total


def limb_sum(values: np.ndarray) -> float | None:
    """The correctly rounded sum of non-negative float64 `values` in numpy, where at most 2**20 values span at most
    30 binades (else None): each an integer multiple of 2**(e - 53), e the least positive value's exponent, cut into
    32-bit limbs (float adds of a rounding constant), whose sums are exact in float64; one Python int rounded once
    (~1.5 ms against fsum's 4 ms on 82k costs)."""
    if values.dtype != np.float64 or not 0 < values.size <= 2**20:
        return None
    high = float(values.max())
    if not (float(values.min()) >= 0.0 and 0.0 < high < math.inf):
        return None
    low = math.frexp(float(np.min(values, where=values > 0.0, initial=high)))[1]
    bits = 53 + math.frexp(high)[1] - low
    if bits > 83 or not -900 < low < 900:  # the scale 2**(53 - low) exact; the sum (< 2**(900 + 30 + 20)) normal
        return None
    scaled, total = values * 2.0**(53 - low), 0  # integers below 2**83
    for shift in range(0, bits - 32, 32):
        upper = (scaled + ROUND_32) - ROUND_32
        total += int((scaled - upper).sum()) << shift  # limbs in [-2**31, 2**31]
        scaled = upper * 2.0**-32
    return math.ldexp(float(total + (int(scaled.sum()) << (shift + 32))), low - 53)

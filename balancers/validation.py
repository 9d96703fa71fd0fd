"""One home for the scalar checks of user input: ints, non-negative reals, bools.

`is_int` / `is_real` are the predicates (a bool is neither, numpy scalars are both);
`as_int`, `as_real` and `as_bool` check, canonicalise to a Python scalar and raise
TypeError for the wrong type, ValueError for a value out of range, with messages that
name the argument and the requirement.
"""

from __future__ import annotations

import math
import numbers

import numpy as np


def is_int(value) -> bool:
    """Whether `value` is an integer (Python or numpy) and not a bool.

    >>> is_int(3), is_int(np.int64(3)), is_int(True), is_int(3.0)
    (True, True, False, False)
    """
    return type(value) is int or (not isinstance(value, bool) and isinstance(value, numbers.Integral))


def is_real(value) -> bool:
    """Whether `value` is a real number (int or float, Python or numpy) and not a bool.

    >>> is_real(2.5), is_real(np.float32(1)), is_real(False), is_real("1")
    (True, True, False, False)
    """
    return type(value) in (int, float) or (not isinstance(value, bool) and isinstance(value, numbers.Real))


def as_int(value, name: str, *, minimum: int | None = None, optional: bool = False) -> int | None:
    """`value` as an int, at least `minimum`; None passes through when `optional`.

    >>> as_int(np.int64(4), "num_ranks", minimum=1)
    4
    >>> as_int(0, "num_ranks", minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: `num_ranks` must be >= 1; got 0
    """
    if value is None and optional:
        return None
    if not is_int(value):
        raise TypeError(f"`{name}` must be an int{' or None' if optional else ''}; got {type(value).__name__}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"`{name}` must be >= {minimum}; got {value}")
    return value


def as_real(value, name: str, *, allow_zero: bool = True) -> float:
    """`value` as a finite float >= 0 (> 0 unless `allow_zero`).

    >>> as_real(3, "linear")
    3.0
    >>> as_real(-1.0, "latency_s")
    Traceback (most recent call last):
    ...
    ValueError: `latency_s` must be finite and >= 0; got -1.0
    """
    if not is_real(value):
        raise TypeError(f"`{name}` must be a real number; got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"`{name}` must be finite and {'>= 0' if allow_zero else '> 0'}; got {value}")
    return value


def as_bool(value, name: str) -> bool:
    """`value` as a bool (numpy bools included; ints are not bools).

    >>> as_bool(np.True_, "padded")
    True
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool; got {type(value).__name__}")
    return bool(value)

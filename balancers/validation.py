"""One home for the checks of user input: ints, indices, non-negative reals, bools, source ranks, byte counts.

`is_int` / `is_real` are the predicates (a bool is neither, numpy scalars are both);
`as_int`, `as_real` and `as_bool` check, canonicalise to a Python scalar and raise
TypeError for the wrong type, ValueError for a value out of range, with messages that
name the argument and the requirement.  `SizeLimitError` is the ValueError of an input
beyond one of orchmllm's size limits; `json_value` decodes one line of a user's JSON file.
"""

from __future__ import annotations

import json
import math
import numbers
import sys

import numpy as np


INT64_MAX = 2**63 - 1
EXACT_INTEGERS = 2**53  # integers below it, and their costs f(l) = l, are exact in float64


class SizeLimitError(ValueError):
    """An input beyond a size limit of orchmllm (an exact model's variables, a sampled step's samples).

    The message names the limit and what to use instead; the command reports it as bad
    input (exit 2), and `compare` as an algorithm that does not apply to that stage.
    """


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


def as_rounded_up(value, name: str) -> int:
    """`value` as an int: an integer as it is, a finite real rounded up (a cap or count of whole tokens: rounding
    down could turn a sufficient cap into one that fails; probe31 P31-04: `InfeasibleError(min_cap=6.9)` read 6).

    >>> as_rounded_up(6.9, "min_cap"), as_rounded_up(np.int64(7), "min_cap")
    (7, 7)
    """
    if is_int(value):
        return int(value)
    if not is_real(value) or not math.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number; got {value!r}")
    return math.ceil(value)


def as_index(value, name: str, size: int, size_name: str) -> int:
    """`value` as an int in [0, size): a rank, a micro-batch (`size_name` names the count).

    >>> as_index(5, "rank", 2, "num_ranks")
    Traceback (most recent call last):
    ...
    ValueError: `rank` must be in [0, num_ranks=2); got 5
    """
    value = as_int(value, name)
    if not 0 <= value < size:
        raise ValueError(f"`{name}` must be in [0, {size_name}={size}); got {value}")
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
    try:
        value = float(value)
    except OverflowError:  # an int (or Fraction) beyond float64: 10**400
        raise ValueError(f"`{name}` must be finite and {'>= 0' if allow_zero else '> 0'}; got a number beyond "
                         f"float64 ({type(value).__name__})") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"`{name}` must be finite and {'>= 0' if allow_zero else '> 0'}; got {value}")
    return value + 0.0  # -0.0 as 0.0: ranks configured with either agree (probe59 M4)


def as_array(values, name: str, what: str) -> np.ndarray:
    """`values` as a numpy array; TypeError for a str or None, ValueError for ragged nesting.

    `what` completes "`name` must be a 1-D sequence of ...".

    >>> as_array([[1, 2], [3]], "lengths", "integers")
    Traceback (most recent call last):
    ...
    ValueError: `lengths` must be a 1-D sequence of integers; got a ragged nested sequence
    """
    if isinstance(values, (str, bytes)) or values is None:
        raise TypeError(f"`{name}` must be a 1-D sequence of {what}; got {type(values).__name__}")
    if hasattr(values, "detach") and hasattr(values, "numpy"):
        values = tensor_values(values, name)
    masked = int(np.count_nonzero(np.ma.getmaskarray(values))) if isinstance(values, np.ma.MaskedArray) else 0
    if masked:  # np.asarray reads the data under the mask too
        raise TypeError(f"`{name}` is a masked array with {masked} masked entr{'y' if masked == 1 else 'ies'}, which "
                        f"would be read as values; pass `{name}.compressed()` (without them) or `{name}.filled(value)`")
    try:
        array = np.asarray(values)
    except ValueError:  # numpy: "setting an array element with a sequence"
        raise ValueError(f"`{name}` must be a 1-D sequence of {what}; got a ragged nested sequence") from None
    if array.dtype == object and array.ndim == 0:  # a generator, a set, a mapping: numpy wraps it whole
        raise TypeError(f"`{name}` must be a 1-D sequence of {what}; got {type(values).__name__} "
                        f"(pass a list or an array)")
    if array.dtype == object:
        for index, value in enumerate(array.flat):
            if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**64:
                raise ValueError(f"`{name}` must be {what} within 64 bits; got {value} at index {index}")
        # an object array of Python ints or strs (pandas' `.to_numpy()` of a column) is read as the list of them
        try:
            array = np.asarray(array.tolist()) if array.size else array
        except ValueError:  # numpy: "setting an array element with a sequence" (a column of lists)
            raise ValueError(f"`{name}` must be a 1-D sequence of {what}; got a ragged nested sequence") from None
    return array


def as_numeric_array(values, name: str, what: str) -> np.ndarray:
    """`as_array` of numbers, where a bool among them is refused as a bool array is: "`name` must hold `what`, not
    booleans" (numpy reads `[True, 3, 8]` as integers, 1 for True; probe58: `balance([True, 3, 8, 1], 2)` planned
    True as a length while `[True, False]` was refused).

    >>> as_numeric_array([True, 3, 8], "lengths", "integers")
    Traceback (most recent call last):
    ...
    TypeError: `lengths` must hold integers, not booleans
    """
    array = as_array(values, name, what)
    if array.dtype.kind in "iufc":
        python = values.ravel().tolist() if isinstance(values, np.ndarray) and values.dtype == object else values
        if isinstance(python, (list, tuple)) and _holds_bool(python):
            raise TypeError(f"`{name}` must hold {what}, not booleans")
    return array


def _holds_bool(values: list | tuple) -> bool:
    """Whether a Python sequence (nested lists and tuples too) holds a bool, a numpy bool, or a 0-d array or tensor
    of a bool dtype (probe59 B1: `[np.array(True), 3]` and `[torch.tensor(True), 3]` were read as `[1, 3]`)."""
    kinds = set(map(type, values))
    if bool in kinds or np.bool_ in kinds:
        return True
    arrays = {kind for kind in kinds if hasattr(kind, "dtype") and not issubclass(kind, np.generic)}
    if arrays and any(str(value.dtype) in ("bool", "torch.bool") for value in values if type(value) in arrays):
        return True
    return bool(kinds & {list, tuple}) and any(_holds_bool(value) for value in values if type(value) in (list, tuple))


def tensor_values(tensor, name: str) -> np.ndarray:
    """A torch tensor's values as a numpy array, torch never imported (duck-typed): detached (a tensor
    that requires grad), copied to the CPU (from a GPU too), bfloat16 widened to float32 (exact; numpy has no
    bfloat16).  A tensor without dense values is refused (`check_dense_tensor`)."""
    check_dense_tensor(tensor, name)
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) == "torch.bfloat16":
        tensor = tensor.float()
    return tensor.numpy()


NUMPY_TORCH_DTYPES = frozenset(f"torch.{kind}" for kind in (
    "bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
    "float64", "complex64", "complex128"))  # the dtypes `tensor_values` can read (bfloat16 widened)


def check_dense_tensor(tensor, name: str) -> None:
    """TypeError naming argument `name` where a torch tensor (duck-typed) has no dense values to read: a meta
    tensor (a shape without data), a sparse (or other non-strided) or nested one, or one of a dtype numpy holds
    none of (float8, quantized), where torch's own errors name no argument (probe18 P18-15, probe19 P19-02/11).
    A tensor on a GPU has values: `.cpu()` copies them."""
    if getattr(tensor, "is_nested", False):
        raise TypeError(f"`{name}` is a nested tensor, not a dense one of integers (one per item); pass a dense tensor "
                        f"or a list (a nested batch's lengths: `[item.shape[0] for item in batch.unbind()]`)")
    if str(getattr(tensor, "dtype", "")) not in NUMPY_TORCH_DTYPES:
        raise TypeError(f"`{name}` has dtype {tensor.dtype}, which numpy cannot hold; pass `{name}.to(torch.float32)`, "
                        f"an integer tensor or a list")
    device = getattr(getattr(tensor, "device", None), "type", None)
    if getattr(tensor, "is_meta", False) or device == "meta":
        raise TypeError(f"`{name}` is a meta tensor, which has a shape but no values; pass a tensor with values "
                        f"(dense, on any device) or a list")
    layout = str(getattr(tensor, "layout", "torch.strided"))
    if getattr(tensor, "is_sparse", False) or layout != "torch.strided":
        raise TypeError(f"`{name}` is a tensor of layout {layout}, not a dense one; pass `{name}.to_dense()` or a "
                        f"list")


def check_int64(array: np.ndarray, name: str) -> None:
    """ValueError unless an integer array's values fit int64: a uint64 at or above 2**63, which a cast
    to int64 would wrap to a negative number the user never passed, is named as it is.

    >>> check_int64(np.array([1, 2**63 + 1], dtype=np.uint64), "lengths")
    Traceback (most recent call last):
    ...
    ValueError: `lengths` must fit int64 (below 2**63); got 9223372036854775809 at index 1
    """
    if array.dtype.kind == "u" and array.size and int(array.max()) > INT64_MAX:
        index = int(np.argmax(array > INT64_MAX))
        raise ValueError(f"`{name}` must fit int64 (below 2**63); got {int(array.flat[index])} at index {index}")


def as_non_negative_integers(array: np.ndarray, name: str, *, integral_floats: bool = False,
                             copy: bool = True, float_exact: bool = False) -> np.ndarray:
    """`array` (numpy, any shape) as a C-ordered int64 copy of non-negative integers: the one check of
    integer arrays (lengths, a batch's columns, a rank's metadata).  TypeError for another dtype
    (booleans, objects; floats unless `integral_floats`: then finite whole numbers below 2**53);
    ValueError naming the first negative entry and its index, or a uint64 beyond int64
    (`check_int64`); `float_exact`: every entry below 2**53 too, where its float64 cost is exact.  An empty array
    passes whatever its dtype.  `copy=False` returns a C-ordered int64 array as it is where no writable array holds
    its memory (`frozen`): a copy protects nothing.

    >>> as_non_negative_integers(np.array([2.0, 3.0]), "lengths", integral_floats=True).tolist()
    [2, 3]
    >>> as_non_negative_integers(np.array([[1], [-4]]), "segment_length")
    Traceback (most recent call last):
    ...
    ValueError: `segment_length` must be non-negative integers; got -4 at index (1, 0)
    """
    if array.size:
        if array.dtype.kind == "b":
            raise TypeError(f"`{name}` must hold integers, not booleans")
        if array.dtype == object or array.dtype.kind not in ("iuf" if integral_floats else "iu"):
            raise TypeError(f"`{name}` must hold integers; got dtype {array.dtype}")
        if array.dtype.kind == "f":
            _check_whole(array, name)
        if array.min() < 0:
            _refuse_entry(array, array < 0, name, "must be non-negative integers")
        check_int64(array, name)
        if float_exact and array.dtype.kind in "iu" and array.max() >= EXACT_INTEGERS:  # floats: `_check_whole`
            _refuse_entry(array, array >= EXACT_INTEGERS, name, "must be below 2**53, where float64 costs are exact")
    if not copy and array.dtype == np.int64 and array.flags.c_contiguous and frozen(array):
        return array
    return np.array(array, dtype=np.int64, order="C")


def frozen(array: np.ndarray) -> bool:
    """Whether `array` and the array whose memory it views (if any) are read-only: nobody writes it."""
    base = array.base
    return not array.flags.writeable and (base is None or (isinstance(base, np.ndarray) and not base.flags.writeable))


def _check_whole(array: np.ndarray, name: str) -> None:
    """ValueError unless every float of `array` is a finite whole number below 2**53 (exact in float64)."""
    finite = np.isfinite(array)
    if not finite.all():
        _refuse_entry(array, ~finite, name, "must be finite")
    whole = array == np.floor(array)
    if not whole.all():
        _refuse_entry(array, ~whole, name, "must be non-negative integers")
    if np.any(np.abs(array) >= np.float64(EXACT_INTEGERS)):  # compared in float64: 2**53 overflows float16
        raise ValueError(f"`{name}` must be below 2**53")


def _refuse_entry(array: np.ndarray, bad: np.ndarray, name: str, requirement: str) -> None:
    """ValueError naming `array`'s first entry where `bad` holds, and its index (an int when 1-D)."""
    flat = int(np.flatnonzero(bad)[0])
    index = flat if array.ndim == 1 else tuple(int(i) for i in np.unravel_index(flat, array.shape))
    raise ValueError(f"`{name}` {requirement}; got {array.flat[flat]} at index {index}")


def as_bool(value, name: str) -> bool:
    """`value` as a bool (numpy bools included; ints are not bools).

    >>> as_bool(np.True_, "padded")
    True
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool; got {type(value).__name__}")
    return bool(value)


def _one_per_item(values, num_items: int, name: str, what: str, entry: str) -> np.ndarray:
    """`values` as a 1-D array with one `entry` per item (a sequence of `what`; read by `as_array`)."""
    array = as_numeric_array(values, name, what)
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D; got shape {array.shape}")
    if array.size != num_items:
        raise ValueError(f"`{name}` must have one {entry} per item: {array.size} entries != {num_items} items")
    return array


def as_sources(sources, num_items: int, num_ranks: int, name: str = "sources") -> np.ndarray:
    """Validate source ranks: 1-D integers in [0, num_ranks), one per item; int64 copy.

    >>> as_sources([1, 0, 2.0], 3, 3).tolist()
    [1, 0, 2]
    >>> as_sources([0, 3], 2, 2)
    Traceback (most recent call last):
    ...
    ValueError: `sources` must be ranks in [0, 2); got 3 at index 1
    """
    array = _one_per_item(sources, num_items, name, "rank indices", "rank")
    if array.size and (array.dtype == object or array.dtype.kind not in "iu"):
        if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.floor(array)):
            array = array.astype(np.int64)
        else:
            raise TypeError(f"`{name}` must hold integer ranks; got dtype {array.dtype}")
    check_int64(array, name)
    array = np.ascontiguousarray(array, dtype=np.int64)
    if array.size and (array.min() < 0 or array.max() >= num_ranks):  # two reductions; the masks name the first
        bad = np.flatnonzero((array < 0) | (array >= num_ranks))
        raise ValueError(f"`{name}` must be ranks in [0, {num_ranks}); got {array[bad[0]]} at index {bad[0]}")
    return array


def as_item_bytes(item_bytes, num_items: int, name: str = "item_bytes") -> np.ndarray:
    """Validate per-item byte counts: 1-D finite non-negative numbers; float64 copy."""
    return np.ascontiguousarray(as_non_negative_reals(_one_per_item(item_bytes, num_items, name, "byte counts",
                                                                    "entry"), name))


def as_numbers(values, name: str, what: str = "numbers") -> np.ndarray:
    """`values` (any shape: read by `as_array`, `what` completing its words) as a numpy array of ints or floats:
    TypeError for another dtype (bools, objects, complex, strs); an empty array passes whatever its dtype."""
    array = as_numeric_array(values, name, what)
    if array.size and (array.dtype == object or array.dtype.kind not in "iuf"):
        raise TypeError(f"`{name}` must hold numbers; got dtype {array.dtype}")
    return array


def as_non_negative_reals(values, name: str) -> np.ndarray:
    """`values` (any shape: read by `as_array`) as float64 of finite reals >= 0, ints or floats: TypeError for
    another dtype (bools, objects, complex), ValueError naming the first negative, NaN or infinite entry and its
    index.  An empty array passes whatever its dtype.  Integers are checked by one reduction (`CostModel.item_costs`
    runs on the planners' lengths).

    >>> as_non_negative_reals([3, 0.5], "lengths").tolist()
    [3.0, 0.5]
    >>> as_non_negative_reals([2, -5], "lengths")
    Traceback (most recent call last):
    ...
    ValueError: `lengths` must be finite and non-negative; got -5.0 at index 1
    """
    array = as_numbers(values, name, "finite non-negative reals")
    if not array.size:
        return np.asarray(array, dtype=np.float64)
    with np.errstate(over="ignore"):  # a longdouble beyond float64 becomes inf, refused below
        reals = np.asarray(array, dtype=np.float64)
    if array.dtype.kind == "u" or (array.dtype.kind == "i" and array.min() >= 0) or (  # ints: one reduction
            array.dtype.kind == "f" and reals.min() >= 0 and np.isfinite(reals.max())):  # a NaN fails both
        return reals
    _refuse_entry(reals, ~np.isfinite(reals) | (reals < 0), name, "must be finite and non-negative")


class _RepeatedKey(Exception):
    """A key that one JSON object holds twice (`json_value`)."""


def _once_each(pairs: list) -> dict:
    """A JSON object's (key, value) pairs as a dict; _RepeatedKey for a key given twice (json keeps the last)."""
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        raise _RepeatedKey(next(key for index, (key, _) in enumerate(pairs) if key in dict(pairs[:index])))
    return mapping


def json_value(text: str, where: str, parse_float=float):
    """One JSON value decoded from `text`; ValueError naming `where` (a file and line) for bad JSON,
    an object that gives a key twice (which value counts is up to the reader), an integer past
    Python's digit limit or nesting past its recursion limit.  `parse_float` reads the numbers with a
    fraction or an exponent (`decimal.Decimal`: exactly, as `json.loads` takes it).

    >>> json_value('{"length": ', "lengths.jsonl:2")
    Traceback (most recent call last):
    ...
    ValueError: lengths.jsonl:2: not valid JSON (Expecting value)
    >>> json_value('{"length": 5, "length": 7}', "lengths.jsonl:3")
    Traceback (most recent call last):
    ...
    ValueError: lengths.jsonl:3: key 'length' given twice in one object
    """
    try:
        return json.loads(text, object_pairs_hook=_once_each, parse_float=parse_float)
    except _RepeatedKey as repeated:
        raise ValueError(f"{where}: key {repeated.args[0]!r} given twice in one object") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
    except ValueError:  # int("1" * 5000): more digits than sys.get_int_max_str_digits()
        raise ValueError(f"{where}: a number of more than {sys.get_int_max_str_digits()} digits") from None
    except RecursionError:
        raise ValueError(f"{where}: not valid JSON (nested too deeply)") from None

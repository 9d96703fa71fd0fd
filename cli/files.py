"""Files the `orchmllm` command reads (lengths files, strictly) and writes (plans, CSV rows).

Every bad entry is a UsageError naming the file and line; a file that cannot be written
is a UsageError naming the option and the operating system's reason.

>>> import pathlib, tempfile
>>> path = pathlib.Path(tempfile.mkdtemp()) / "lengths.csv"
>>> _ = path.write_text("\\ufefflength\\n812\\n77\\n")   # a header, after Excel's byte-order mark
>>> load_lengths(path).tolist()
[812, 77]
"""

from __future__ import annotations

import csv
import io
import json
import math
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..balancers.validation import is_real
from .errors import UsageError, one_line

TEXT_ENCODING = "utf-8-sig"  # UTF-8, ignoring the byte-order mark spreadsheets write first
MAX_LENGTH = 2**53  # lengths at or above it are not exact as float64 costs


def _parse_length(text: str, where: str) -> int:
    text = text.strip()
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise UsageError(f"{where}: expected an integer length, got {text!r}") from None
        if not math.isfinite(number) or number != math.floor(number):
            raise UsageError(f"{where}: expected an integer length, got {text!r}") from None
        value = int(number)
    if value < 0:
        raise UsageError(f"{where}: lengths must be non-negative, got {value}")
    if value >= MAX_LENGTH:
        raise UsageError(f"{where}: lengths must be below 2**53, got {value}")
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _pick_column(header: list[str], column: str | None, path: Path) -> int:
    if column is None:
        if len(header) == 1:
            return 0
        raise UsageError(f"{path}: {len(header)} columns {header}; choose one with --column")
    if column not in header:
        raise UsageError(f"{path}: no column {column!r}; columns are {header}")
    return header.index(column)


def _read_csv(path: Path, column: str | None) -> list[int]:
    rows = list(csv.reader(io.StringIO(path.read_text(encoding=TEXT_ENCODING))))
    rows = [(number, row) for number, row in enumerate(rows, start=1) if any(cell.strip() for cell in row)]
    if not rows:
        raise UsageError(f"{path}: no lengths in the file")
    first = [cell.strip() for cell in rows[0][1]]
    has_header = not all(_is_number(cell) for cell in first)
    if has_header:
        index = _pick_column(first, column, path)
        rows = rows[1:]
    elif column is not None:
        raise UsageError(f"{path}: --column {column!r} given but the file has no header line")
    else:
        index = 0
    width = len(first)
    lengths = []
    for number, row in rows:
        if len(row) != width:
            raise UsageError(f"{path}:{number}: expected {width} comma-separated fields, got {len(row)}")
        lengths.append(_parse_length(row[index], f"{path}:{number}"))
    return lengths


def _read_json_lines(path: Path, column: str | None) -> list[int]:
    key = column or "length"
    lengths = []
    for number, line in enumerate(path.read_text(encoding=TEXT_ENCODING).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise UsageError(f"{where}: not valid JSON ({error.msg})") from None
        if isinstance(value, dict):
            if key not in value:
                raise UsageError(f"{where}: object has no key {key!r} (keys: {sorted(value)}); use --column")
            value = value[key]
        if not is_real(value):
            raise UsageError(f"{where}: expected an integer length, got {json.dumps(value)}")
        lengths.append(_parse_length(repr(value), where))
    if not lengths:
        raise UsageError(f"{path}: no lengths in the file")
    return lengths


def _read_npy(path: Path) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise UsageError(f"{path}: not a plain numeric .npy array ({one_line(error)})") from None
    if not isinstance(array, np.ndarray) or array.ndim != 1:
        raise UsageError(f"{path}: expected a 1-D array of lengths, got shape {getattr(array, 'shape', '?')}")
    if array.dtype.kind not in "iuf":
        raise UsageError(f"{path}: expected integer lengths, got dtype {array.dtype}")
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0) | (array != np.floor(array)) | (array >= float(MAX_LENGTH))) \
        if array.dtype.kind == "f" else np.flatnonzero((array < 0) | (array >= MAX_LENGTH))
    if bad.size:
        raise UsageError(f"{path}: index {bad[0]}: lengths must be non-negative integers below 2**53, "
                         f"got {array[bad[0]]}")
    if array.size == 0:
        raise UsageError(f"{path}: no lengths in the file")
    return array.astype(np.int64)


def load_lengths(path, column: str | None = None) -> np.ndarray:
    """Read item lengths from a .csv, .jsonl/.json (JSON lines) or .npy file, strictly.

    CSV: one integer per line, or a header line and `column` (required when there are
    several columns).  JSON lines: one integer or one object per line, taking key
    `column` (default "length").  .npy: a 1-D integer array, loaded without pickle.
    Every entry is checked; raises UsageError naming the file and line of the first bad one.
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"lengths file {str(path)!r} not found")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        if column is not None:
            raise UsageError(f"{path}: --column applies to CSV and JSON lines files, not .npy")
        return _read_npy(path)
    try:
        if suffix == ".csv":
            return np.asarray(_read_csv(path, column), dtype=np.int64)
        if suffix in (".jsonl", ".json", ".ndjson"):
            return np.asarray(_read_json_lines(path, column), dtype=np.int64)
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file") from None
    raise UsageError(f"{path}: unknown file type {suffix!r}; use .csv, .jsonl or .npy")


def require_file(path, what: str) -> None:
    """UsageError unless `path` names an existing file (`what` says which, e.g. "workload file")."""
    if not Path(path).is_file():
        raise UsageError(f"{what} {str(path)!r} not found")


@contextmanager
def writing(option: str, path):
    """Report an OSError while writing `path` (given with `option`) as a one-line UsageError."""
    try:
        yield Path(path)
    except OSError as error:
        reason = error.strerror or one_line(error)
        raise UsageError(f"{option} {str(path)!r}: cannot write ({reason})") from None


def write_rows_csv(rows: list[dict], path, option: str = "--csv") -> None:
    """One CSV line per row (dicts of the same keys), with a header line."""
    with writing(option, path) as target:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


PLAN_SUFFIXES = (".json", ".csv", ".npy")


def check_plan_path(path) -> None:
    """UsageError for an --output file type `save_plan` cannot write (checked before balancing)."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLAN_SUFFIXES:
        raise UsageError(f"--output {str(path)!r}: unknown file type {suffix!r}; use .json, .csv or .npy")


def save_plan(plan, payload_json: str, path) -> None:
    """Write `plan`: .npy (the assignment), .csv (item,rank lines) or .json (`payload_json`)."""
    check_plan_path(path)
    with writing("--output", path) as target:
        target.parent.mkdir(parents=True, exist_ok=True)
        suffix = target.suffix.lower()
        if suffix == ".npy":
            np.save(target, np.asarray(plan.assignment), allow_pickle=False)
        elif suffix == ".csv":
            with target.open("w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["item", "rank"])
                writer.writerows(enumerate(plan.assignment.tolist()))
        else:
            target.write_text(payload_json + "\n")

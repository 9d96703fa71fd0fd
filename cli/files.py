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
import decimal
import io
import json
import math
import os
import re
import reprlib
import shlex
import unicodedata
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..balancers.validation import EXACT_INTEGERS, json_value
from .arguments import require_file, utf8_text
from .errors import UsageError, one_line

TEXT_ENCODING = "utf-8-sig"  # UTF-8, ignoring the byte-order mark spreadsheets write first
ASCII_NUMBER = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # no `1_000`, `+5` nor `５`


def _parse_length(text: str, where: str) -> int:
    """`text` as a length, read exactly: `812`, `812.0`, `8.12e2`, but not `4.9999999999999999` nor `1e-400`,
    which float() would round to 5 and 0 (a decimal holds the text's value); UsageError naming `where`.  Only
    ASCII digits, a point and an exponent make a number (int() and Decimal() also read `1_000`, `+5` and other
    scripts' digits: probe31 P31-06)."""
    text = text.strip()
    if not ASCII_NUMBER.fullmatch(text):
        raise UsageError(f"{where}: expected an integer length, got {SHORT.repr(text)}")
    try:
        value = int(text)
    except ValueError:
        try:
            number = decimal.Decimal(text)
        except decimal.InvalidOperation:
            raise UsageError(f"{where}: expected an integer length, got {SHORT.repr(text)}") from None
        if not number.is_finite() or number != number.to_integral_value():
            raise UsageError(f"{where}: expected an integer length, got {SHORT.repr(text)}")
        if number < 0:
            raise UsageError(f"{where}: lengths must be non-negative, got {SHORT.repr(text)}")
        if number >= EXACT_INTEGERS:  # before int(): `1e999999999` would be a billion digits
            raise UsageError(f"{where}: lengths must be below 2**53, got {SHORT.repr(text)}")
        value = int(number)
    if value < 0:
        raise UsageError(f"{where}: lengths must be non-negative, got {value}")
    if value >= EXACT_INTEGERS:
        raise UsageError(f"{where}: lengths must be below 2**53, got {value}")
    return value


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


DIGIT_LOOKALIKES = str.maketrans("OoIl", "0011")  # letters a number typed by hand may hold for 0 and 1


def _as_seen(text: str) -> str:
    """`text` as a reader sees it: in compatibility form (NFKC: a superscript or fullwidth digit as the
    digit, a fullwidth or small hyphen-minus as '-'), without invisible format characters (zero-width
    space, a second byte-order mark, word joiner: Unicode category Cf), every dash (category Pd: an en
    dash that autocorrect made of '-') and the Unicode minus read as '-'."""
    return "".join("-" if char == "\u2212" or unicodedata.category(char) == "Pd" else char
                   for char in unicodedata.normalize("NFKC", text) if unicodedata.category(char) != "Cf")


def _is_column_name(text: str) -> bool:
    """A header field: not a number, nor what a mistyped number looks like (`8l2`, `-`, `.5x`, `O12`: a
    number but for letters that look like its digits, with a digit among them), as a reader sees it."""
    text = _as_seen(text)
    if not text or _is_number(text) or text[0] in "0123456789+-.":
        return False
    return not (any(char.isdigit() for char in text) and _is_number(text.translate(DIGIT_LOOKALIKES)))


def _has_header(first: list[str], where: str, column: str | None) -> bool:
    """Whether the first line (its stripped fields) is a header of column names, or one that `column`
    (--column) names a field of, with no number among its other fields (the named one may read as one:
    `id,512` with --column 512); UsageError when it is neither names nor numbers, naming its first field
    that is not a column name and the rule it breaks."""
    if all(_is_number(field) for field in first):
        return False
    if all(_is_column_name(field) for field in first) or (
            column in first and not any(_is_number(field) for field in first if field != column)):
        return True
    expected = "expected an integer length or a header line of column names"
    if "" in first:  # neither a name nor a number: what a spreadsheet's empty column leaves
        raise UsageError(f"{where}: field {first.index('') + 1} of {len(first)} is empty (a trailing comma?); "
                         f"{expected}")
    odd = next(field for field in first if field != column and not _is_column_name(field))
    if separated := _not_by_commas(odd):
        raise UsageError(f"{where}: {expected}, got {SHORT.repr(odd)}{separated}")
    mistyped = _is_number(_as_seen(odd).translate(DIGIT_LOOKALIKES))  # `8l2`: fix the length, not name a column
    hint = "" if column is not None or mistyped else f"; --column {shlex.quote(odd)} takes line 1 as the header"
    raise UsageError(f"{where}: {expected}, got {SHORT.repr(odd)} (a column name may not start with a digit, '+', "
                     f"'-' or '.', nor read as a number with O, o, I or l for 0 and 1, as a mistyped 8l2 does{hint})")


def _not_by_commas(text: str) -> str:
    """A note where `text` is numbers separated by something other than a comma (`5 6`, `5;6`, `1\t5`: a
    spreadsheet's CSV in a locale whose separator is ';', a tab-separated file), else ''."""
    numbers = re.split(r"[\s;|]+", _as_seen(text).strip())
    if len(numbers) < 2 or not all(map(_is_number, numbers)):
        return ""
    return (f" ({len(numbers)} numbers separated by something other than a comma: one length per line, or fields "
            f"separated by commas)")


SHORT = reprlib.Repr()  # a long header in one line of an error: its first names, and every name cut short
SHORT.maxlist, SHORT.maxstring = 6, 40


def _columns(header: list[str]) -> tuple[str, str]:
    """`header` for an error line: its first names, and a note of the names it gives more than once."""
    repeated = [f"{SHORT.repr(name)} {count} times" for name, count in Counter(header).most_common(3) if count > 1]
    return SHORT.repr(header), (f" (names given more than once: {', '.join(repeated)})" if repeated else "")


def _pick_column(header: list[str], column: str | None, path: Path) -> int:
    if len(header) == 1 and column is None:
        return 0
    if column is None:
        shown, repeated = _columns(header)
        raise UsageError(f"{path}: {len(header)} columns {shown}; choose one with --column{repeated}")
    if column not in header:
        shown, repeated = _columns(header)
        raise UsageError(f"{path}: no column {SHORT.repr(column)}; the {len(header)} columns are {shown}{repeated}")
    fields = [str(index + 1) for index, name in enumerate(header) if name == column]
    if len(fields) > 1:
        raise UsageError(f"{path}: column {SHORT.repr(column)} appears {len(fields)} times in the header (fields "
                         f"{', '.join(fields[:SHORT.maxlist])}{', ...' if len(fields) > SHORT.maxlist else ''}); "
                         f"--column must name one")
    return header.index(column)


def _text(path: Path) -> str:
    """The file's text; UsageError naming the line of its first NUL character, which no text of lengths holds:
    UTF-16 text without a byte-order mark (every other byte NUL, read as letters between NULs) or a binary file."""
    text = path.read_text(encoding=TEXT_ENCODING)
    if (first := text.find("\0")) >= 0:
        line = text.count("\n", 0, first) + 1
        raise UsageError(f"{path}:{line}: a NUL character (UTF-16 text without a "
                         f"byte-order mark, or a binary file?); lengths files are UTF-8 text: save it as UTF-8")
    return text


def _csv_rows(path: Path) -> list[tuple[int, list[str]]]:
    """The non-blank rows of a CSV file with their line numbers; UsageError naming the line of a bad one."""
    reader = csv.reader(io.StringIO(_text(path)))
    try:
        return [(reader.line_num, row) for row in reader if any(cell.strip() for cell in row)]
    except csv.Error as error:  # a field over csv.field_size_limit(), a NUL byte, ...
        raise UsageError(f"{path}:{reader.line_num}: not a valid CSV line ({one_line(error)})") from None


def _read_csv(path: Path, column: str | None) -> list[int]:
    rows = _csv_rows(path)
    if not rows:
        raise UsageError(f"{path}: no lengths in the file")
    first = [cell.strip() for cell in rows[0][1]]
    width = len(first)
    if _has_header(first, f"{path}:{rows[0][0]}", column):
        if column is None and first[0].startswith("#"):  # `# lengths` was read as a column name (probe55 N7)
            raise UsageError(f"{path}:{rows[0][0]}: {SHORT.repr(first[0])} starts with '#': comment lines are not "
                             f"read; remove it (a header line whose first column name starts with '#' needs "
                             f"--column naming the column of lengths)")
        index = _pick_column(first, column, path)
        header_line, rows = rows[0][0], rows[1:]
        if not rows:
            raise UsageError(f"{path}: no lengths in the file, only a header line")
        if width == 1 and column is None and any(char.isdigit() for char in first[0]):  # `О24`, a Cyrillic О
            warnings.warn(f"{path}:{header_line}: {SHORT.repr(first[0])} read as the column name, not a length (it "
                          f"holds digits); the lengths start on line {rows[0][0]}")
    elif column is not None:
        raise UsageError(f"{path}: --column {column!r} given but the file has no header line")
    elif width > 1:
        raise UsageError(f"{path}:{rows[0][0]}: {width} comma-separated fields and no header line; a file of "
                         f"several columns needs a header line naming them, and --column to choose one")
    else:
        index = 0
    lengths = []
    for number, row in rows:
        if len(row) != width:
            raise UsageError(f"{path}:{number}: expected {width} comma-separated fields, got {len(row)}")
        try:
            lengths.append(_parse_length(row[index], f"{path}:{number}"))
        except UsageError as error:  # `1;5` under a header `id;length`, read as one column (probe55)
            comment = " (comment lines are not read)" if row[0].lstrip().startswith("#") else ""
            raise UsageError(f"{error}{_not_by_commas(row[index]) if width == 1 else ''}{comment}") from None
    return lengths


def _json(text: str, where: str):
    """One JSON value of a lengths file, its non-integer numbers as exact decimals (`_parse_length`)."""
    try:
        return json_value(text, where, parse_float=decimal.Decimal)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _json_entries(path: Path) -> list[tuple[str, object]]:
    """(where, value) of every entry: each line of a JSON lines file, or each element of a `.json` file that
    holds one JSON array (what a `.json` file usually holds: `[5, 4, 3]` over one line or several)."""
    text = _text(path)
    if path.suffix.lower() == ".json" and text.lstrip().startswith("["):
        array = _json(text, f"{path} (a .json file starting with '[' is read as one JSON array)")
        return [(f"{path}: element {index}", value) for index, value in enumerate(array)]
    return [(f"{path}:{number}", _json(line, f"{path}:{number}"))
            for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _read_json_lines(path: Path, column: str | None) -> list[int]:
    key = column or "length"
    lengths = []
    for where, value in _json_entries(path):
        if isinstance(value, dict):
            if key not in value:
                raise UsageError(f"{where}: object has no key {key!r} (keys: {sorted(value)}); use --column")
            value = value[key]
        if isinstance(value, bool) or not isinstance(value, (int, decimal.Decimal)):
            raise UsageError(f"{where}: expected an integer length, got {json.dumps(value)}")
        lengths.append(_parse_length(str(value), where))
    if not lengths:
        raise UsageError(f"{path}: no lengths in the file")
    return lengths


def _check_npy_header(path: Path) -> None:
    """UsageError when the file is not a .npy file of plain values (np.load would speak of pickles and
    `allow_pickle`), or when its header claims other than the bytes the file holds after it: more (checked
    before np.load allocates them: a header of 10**12 items in a 100-byte file) or fewer (two np.save calls
    on one handle, or bytes appended: np.load reads the first array only)."""
    with path.open("rb") as handle:
        if handle.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
            raise UsageError(f"{path}: not a plain numeric .npy array (the file does not start with the .npy "
                             f"header numpy.save writes)")
        handle.seek(0)
        try:
            version = np.lib.format.read_magic(handle)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:
                return  # np.load names the version it cannot read
            shape, _, dtype = read_header(handle)
        except (ValueError, OSError, EOFError):
            return  # np.load reports the broken header
        if dtype.hasobject:
            raise UsageError(f"{path}: not a plain numeric .npy array (it holds Python objects, dtype {dtype})")
        claimed = math.prod(shape) * dtype.itemsize
        held = path.stat().st_size - handle.tell()
    if claimed != held:  # fewer: np.load would read the first array and ignore the rest without a word
        hint = "" if claimed > held else " (several arrays saved into one file?)"
        raise UsageError(f"{path}: the header claims shape {shape}, {claimed} bytes, but the file holds {held} "
                         f"after it{hint}")


def _read_npy(path: Path) -> np.ndarray:
    _check_npy_header(path)
    try:
        array = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise UsageError(f"{path}: not a plain numeric .npy array ({one_line(error)})") from None
    if not isinstance(array, np.ndarray) or array.ndim != 1:
        raise UsageError(f"{path}: expected a 1-D array of lengths, got shape {getattr(array, 'shape', '?')}")
    if array.dtype.kind not in "iuf":
        raise UsageError(f"{path}: expected integer lengths, got dtype {array.dtype}")
    if array.dtype.kind == "f" and array.dtype.itemsize < 8:  # float16 cannot hold 2**53 to compare with
        array = array.astype(np.float64)
    bad = np.flatnonzero(~np.isfinite(array) | (array < 0) | (array != np.floor(array))
                         | (array >= float(EXACT_INTEGERS))) \
        if array.dtype.kind == "f" else np.flatnonzero((array < 0) | (array >= EXACT_INTEGERS))
    if bad.size:
        raise UsageError(f"{path}: index {bad[0]}: lengths must be non-negative integers below 2**53, "
                         f"got {array[bad[0]]}")
    if array.size == 0:
        raise UsageError(f"{path}: no lengths in the file")
    return array.astype(np.int64)


def load_lengths(path, column: str | None = None) -> np.ndarray:
    """Read item lengths from a .csv, .jsonl/.json (JSON lines) or .npy file, strictly.

    CSV: one integer per line, or a header line and `column` (required when there are
    several columns); no comment lines (a first line starting with '#' is refused, not taken
    for a header).  JSON lines: one integer or one object per line, taking key
    `column` (default "length"); a `.json` file may instead hold one JSON array of them.
    .npy: a 1-D integer array, loaded without pickle.
    Every entry is checked; raises UsageError naming the file and line of the first bad one.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`path` must be a str or os.PathLike naming a lengths file; got {type(path).__name__}")
    path = Path(path)
    require_file(path, "lengths file")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        if column is not None:
            raise UsageError(f"{path}: --column applies to CSV and JSON lines files, not .npy")
        return _read_npy(path)
    with utf8_text(path):
        if suffix == ".csv":
            return np.asarray(_read_csv(path, column), dtype=np.int64)
        if suffix in (".jsonl", ".json", ".ndjson"):
            return np.asarray(_read_json_lines(path, column), dtype=np.int64)
    raise UsageError(f"{path}: unknown file type {suffix!r}; use .csv, .jsonl or .npy")


def check_parent(option: str, path, made=None) -> None:
    """UsageError when the directory `path` goes into does not exist (and is not `made`, the
    --plot directory this run makes): a mistyped path must not create directories anywhere."""
    _named(option, path)
    parent = Path(path).parent
    if not parent.exists() and (made is None or parent != Path(made)):
        raise UsageError(f"{option} {str(path)!r}: directory {str(parent)!r} does not exist")


def _named(option: str, path) -> None:
    """UsageError for an empty name (Path('') is '.', the working directory)."""
    if str(path) == "":
        raise UsageError(f"{option} '': the name is empty; name a {'directory' if option == '--plot' else 'file'}")


def check_plot_directory(path) -> None:
    """UsageError when --plot's directory cannot be made: its parent is missing (`check_parent`), or a file
    has its name (the figures would fail after the whole run, "cannot write (File exists)")."""
    check_parent("--plot", path)
    if Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"--plot {str(path)!r} is a file, not a directory; name a directory (made if missing)")


def check_not_input(option: str, path, inputs) -> None:
    """UsageError when the output `path` (given with `option`) is one of the `inputs` files, by any name
    (`./ok.csv`, a link): writing it would replace the input with the output."""
    for source in inputs:
        if source is not None and Path(path).exists() and Path(source).exists() and os.path.samefile(path, source):
            raise UsageError(f"{option} {str(path)!r} is the input file {str(source)!r}; choose another output file")


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
        with target.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


PLAN_SUFFIXES = (".json", ".csv", ".npy")


def check_plan_path(path) -> None:
    """UsageError for an --output file type `save_plan` cannot write, or into a missing directory
    (checked before balancing)."""
    _named("--output", path)
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"--output {str(path)!r} is a directory; name a file ending in .json, .csv or .npy")
    if path.name.lower() in PLAN_SUFFIXES:  # '.json': Path takes a name that starts with a dot for no suffix
        raise UsageError(f"--output {str(path)!r}: no file name before {path.name!r}")
    if path.suffix.lower() not in PLAN_SUFFIXES:
        raise UsageError(f"--output {str(path)!r}: unknown file type {path.suffix.lower()!r}; use .json, .csv or .npy")
    check_parent("--output", path)


def save_plan(plan, payload_json: str, path) -> None:
    """Write `plan`: .npy (the assignment), .csv (item,rank lines) or .json (`payload_json`)."""
    check_plan_path(path)
    with writing("--output", path) as target:
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

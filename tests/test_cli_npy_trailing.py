"""probe56 F4 (fix58): a .npy file with bytes after its array was read partially with exit 0.  Two np.save calls on
one handle (a common way to append) wrote two arrays; np.load read the first and the CLI planned its items only.
The header's claim is now checked against what the file holds after it, both ways (one line, exit 2)."""

import json

import numpy as np

from orchmllm.cli import main


def one_line_error(code, stderr, message):
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0], stderr
    assert message in lines[0], lines[0]


def test_regression_two_arrays_saved_into_one_file(tmp_path, capsys):
    path = tmp_path / "two.npy"
    with path.open("wb") as handle:
        np.save(handle, np.array([5, 4, 3]))
        np.save(handle, np.array([9, 9, 9, 9]))
    one_line_error(main(["plan", str(path), "-D", "2"]), capsys.readouterr().err,
                   "two.npy: the header claims shape (3,), 24 bytes, but the file holds 184 after it (several "
                   "arrays saved into one file?)")


def test_regression_trailing_bytes(tmp_path, capsys):
    path = tmp_path / "trailing.npy"
    np.save(path, np.array([5, 4, 3]))
    with path.open("ab") as handle:
        handle.write(bytes(8))
    one_line_error(main(["plan", str(path), "-D", "2"]), capsys.readouterr().err,
                   "trailing.npy: the header claims shape (3,), 24 bytes, but the file holds 32 after it")


def test_one_array_still_reads(tmp_path, capsys):
    for name, array in (("one.npy", np.array([5, 4, 3])), ("empty_dims.npy", np.arange(1, 8, dtype=np.uint8)),
                        ("fortran.npy", np.asfortranarray(np.array([2.0, 7.0])))):
        np.save(tmp_path / name, array)
        assert main(["plan", str(tmp_path / name), "-D", "2", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["num_items"] == array.size

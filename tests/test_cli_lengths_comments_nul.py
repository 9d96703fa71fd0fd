"""probe55 N7 (fix56): two lengths files the CSV reader misread.  A first line `# lengths` (a comment) was taken for
a header line and dropped without a word; a UTF-16 file without a byte-order mark was read as text of letters
between NUL characters (line 1 a header of them, refused at line 2 as "got '\\x005\\x00'", or line 1 refused as a
mistyped number).  Each is now a one-line error naming the file and line and what to do (exit 2)."""

import json

import pytest

from orchmllm.cli import main


def one_line_error(code, stderr, message):
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0], stderr
    assert message in lines[0], lines[0]


@pytest.mark.parametrize("text", ["# lengths\n5\n6\n", "# lengths, in tokens\n5\n6\n", "#length\n5\n6\n"])
def test_regression_a_comment_first_line_was_taken_for_a_header(text, tmp_path, capsys):
    path = tmp_path / "commented.csv"
    path.write_text(text)
    one_line_error(main(["plan", str(path), "-D", "1"]), capsys.readouterr().err,
                   "starts with '#': comment lines are not read")


def test_a_comment_first_line_is_named_as_one(tmp_path, capsys):
    path = tmp_path / "commented.csv"
    path.write_text("# lengths\n5\n6\n")
    one_line_error(main(["plan", str(path), "-D", "1"]), capsys.readouterr().err,
                   "commented.csv:1: '# lengths' starts with '#': comment lines are not read; remove it")


def test_a_comment_line_among_lengths_is_named_as_one(tmp_path, capsys):
    path = tmp_path / "commented.csv"
    path.write_text("length\n5\n# the rest\n6\n")
    one_line_error(main(["plan", str(path), "-D", "1"]), capsys.readouterr().err,
                   "commented.csv:3: expected an integer length, got '# the rest' (comment lines are not read)")


def test_a_column_named_with_a_hash_is_still_chosen_by_column(tmp_path, capsys):
    """A spreadsheet's `#` column of row numbers: --column names the header's other column, which is read."""
    path = tmp_path / "numbered.csv"
    path.write_text("#,length\n1,5\n2,7\n")
    assert main(["plan", str(path), "-D", "1", "--column", "length", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == 12


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
@pytest.mark.parametrize("name, text", [("header.csv", "length\n5\n6\n"), ("plain.csv", "5\n6\n"),
                                        ("lines.jsonl", "5\n6\n")])
def test_regression_utf16_without_a_byte_order_mark_was_read_as_nul_separated_letters(encoding, name, text, tmp_path,
                                                                                      capsys):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    one_line_error(main(["plan", str(path), "-D", "1"]), capsys.readouterr().err,
                   f"{name}:1: a NUL character (UTF-16 text without a byte-order mark, or a binary file?); "
                   f"lengths files are UTF-8 text: save it as UTF-8")


def test_a_nul_character_later_in_the_file_names_its_line(tmp_path, capsys):
    path = tmp_path / "nul.csv"
    path.write_bytes(b"5\n6\n7\x00\n")
    one_line_error(main(["plan", str(path), "-D", "1"]), capsys.readouterr().err, "nul.csv:3: a NUL character")

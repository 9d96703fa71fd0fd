"""probe55 (the CLI's lengths reader): a CSV whose fields are separated by ';' or tabs (a spreadsheet's CSV in a locale
whose separator is ';') under a header line was refused at line 2 with "expected an integer length, got '1;5'" and no
word of the separator, which the same line without a header gets; both now say so."""

import pytest

from orchmllm.cli.errors import UsageError
from orchmllm.cli.files import load_lengths

SEPARATED = "numbers separated by something other than a comma: one length per line, or fields separated by commas"


@pytest.mark.parametrize("text, line, field", [("id;length\n1;5\n", 2, "'1;5'"), ("id\tlength\n1\t5\n", 2, r"'1\t5'"),
                                               ("1;5\n2;6\n", 1, "'1;5'")])
def test_regression_fields_separated_by_semicolons_under_a_header_were_not_named(tmp_path, text, line, field):
    path = tmp_path / "lengths.csv"
    path.write_text(text)
    with pytest.raises(UsageError) as raised:
        load_lengths(path)
    assert str(raised.value).startswith(f"{path}:{line}: expected an integer length")
    assert f"got {field} (2 {SEPARATED})" in str(raised.value)


def test_a_word_under_a_header_gets_no_separator_note(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("length\nfive\n")
    with pytest.raises(UsageError, match=r"lengths.csv:2: expected an integer length, got 'five'$"):
        load_lengths(path)

"""Regressions of issue 24 in the lengths-file reader (`orchmllm plan FILE`), found by probe13 and fix24d:
each bad file a one-line error naming its line (exit 2), each good one read as written. Named after their cause."""

import json

import pytest

from orchmllm.cli import main


def check_one_line_error(code, stderr, message):
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchmllm") and "error: " in lines[0], stderr
    assert message in lines[0], lines[0]


@pytest.mark.parametrize("text, column, makespan", [("id,512\n1,5\n2,7\n", "512", 12),
                                                    ("512,id\n5,1\n7,2\n", "512", 12),
                                                    ("len,512,x\n1,5,3\n2,7,4\n", "512", 12)])
def test_regression_a_numeric_name_chosen_by_column_raised_stop_iteration(text, column, makespan, tmp_path, capsys):
    """Cause (probe13 P13-03): with `--column 512` naming a field of line 1 that reads as a number, line 1 was no
    header (a number among its fields), and the refusal looked for a field other than the chosen one that is not a
    column name, found none and died with a raw StopIteration (exit 1).  The field `--column` names makes line 1
    the header unless another of its fields is a number (README), so this line 1 is the header."""
    path = tmp_path / "numeric_name.csv"
    path.write_text(text)
    assert main(["plan", str(path), "-D", "1", "--column", column, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == makespan


def test_a_line_of_numbers_is_no_header_even_when_column_names_one(tmp_path, capsys):
    """Line 1 of numbers only stays a line of lengths: `--column` then names no header."""
    path = tmp_path / "numbers.csv"
    path.write_text("1,512\n2,5\n")
    check_one_line_error(main(["plan", str(path), "-D", "1", "--column", "512"]), capsys.readouterr().err,
                         "numbers.csv: --column '512' given but the file has no header line")

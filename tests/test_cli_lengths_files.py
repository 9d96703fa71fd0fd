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


@pytest.mark.parametrize("name, text, shown", [
    ("rounds_up.csv", "4.9999999999999999\n3\n",
     "rounds_up.csv:1: expected an integer length, got '4.9999999999999999'"),
    ("underflows.csv", "length\n1e-400\n3\n", "underflows.csv:2: expected an integer length, got '1e-400'"),
    ("half.csv", "9007199254740991.5\n", "half.csv:1: expected an integer length, got '9007199254740991.5'"),
    ("rounds_up.jsonl", "3\n4.9999999999999999\n", "rounds_up.jsonl:2: expected an integer length, got "
                                                     "'4.9999999999999999'"),
    ("rounds_down.jsonl", '{"length": 5.0000000000000001}\n', "rounds_down.jsonl:1: expected an integer length"),
    ("underflows.json", "[3, 1e-400]\n", "underflows.json: element 1: expected an integer length, got '1E-400'"),
    ("overflows.jsonl", "1e400\n", "overflows.jsonl:1: lengths must be below 2**53, got '1E+400'")])
def test_regression_a_length_within_float_rounding_of_an_integer_was_read_as_it(name, text, shown, tmp_path, capsys):
    """Cause (fix24d F24-04): lengths that are not integers were read through float(), which rounds: CSV or JSON
    `4.9999999999999999` was planned as 5 and `1e-400` as 0 with exit 0, `9007199254740991.5` refused as "got
    9007199254740992" and JSON `1e400` as "got 'inf'".  The text's exact decimal value is read now."""
    path = tmp_path / name
    path.write_text(text)
    check_one_line_error(main(["plan", str(path), "-D", "2"]), capsys.readouterr().err, shown)


@pytest.mark.parametrize("text", ["812.0\n77\n", "8.12e2\n77\n", "length\n8.120E+2\n77\n", "[812.0, 77]\n"])
def test_integers_written_with_a_fraction_or_an_exponent_are_read(text, tmp_path, capsys):
    path = tmp_path / ("lengths.json" if text.startswith("[") else "lengths.csv")
    path.write_text(text)
    assert main(["plan", str(path), "-D", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == 889


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_a_time_limit_past_max_time_limit_is_one_line_naming_the_flag(command, tmp_path, capsys):
    """--time-limit beyond the library's MAX_TIME_LIMIT (fix24d F24-12) is refused as the flag, not a traceback."""
    path = tmp_path / "lengths.csv"
    path.write_text("5\n4\n3\n")
    args = ["plan", str(path), "-D", "2"] if command == "plan" else ["compare", "--lengths", str(path), "-D", "2"]
    check_one_line_error(main([*args, "--time-limit", "1e308"]), capsys.readouterr().err,
                         "--time-limit: `time_limit` must be at most MAX_TIME_LIMIT = 1e+09 seconds (about 32 "
                         "years; solvers turn it into a work budget); got 1e+308")

"""probe56 N5 (fix58): option values the CLI read differently from its lengths files.  `-D ٢` (another script's
digit: int() reads it) planned over 2 ranks although lengths files refuse such digits; `-o ""` was reported as
"--output '.' is a directory".  Each is now a one-line error naming the option (exit 2)."""

import pytest

from orchmllm.cli import main


def one_line_error(code, stderr, message):
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "error: " in lines[0], stderr
    assert message in lines[0], lines[0]


@pytest.fixture
def lengths(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("5\n6\n7\n")
    return str(path)


@pytest.mark.parametrize("options, message", [
    (["-D", "\u0662"], "argument -D/--ranks: invalid int value: '\u0662' (the digits 0-9 only)"),
    (["-D", "\uff12"], "argument -D/--ranks: invalid int value: '\uff12' (the digits 0-9 only)"),
    (["-D", "2", "--time-limit", "\u0661"], "argument --time-limit: invalid float value: '\u0661'"),
    (["-D", "2", "--cost", "0,\u0661,0"], "--cost must be three numbers PER_ITEM,LINEAR,QUADRATIC (the digits 0-9"),
])
def test_regression_other_scripts_digits_in_plan_options(options, message, lengths, capsys):
    one_line_error(main(["plan", lengths, *options]), capsys.readouterr().err, message)


def test_regression_other_scripts_digits_in_a_list(lengths, capsys):
    one_line_error(main(["compare", "--lengths", lengths, "-D", "2,\u0664"]), capsys.readouterr().err,
                   "--ranks must be comma-separated integers of the digits 0-9 only, e.g. 64,512; got '2,\u0664'")


@pytest.mark.parametrize("command, message", [
    (["plan", "{lengths}", "-D", "2", "-o", ""], "--output '': the name is empty; name a file"),
    (["compare", "--lengths", "{lengths}", "-D", "2", "--csv", ""], "--csv '': the name is empty; name a file"),
])
def test_regression_an_empty_output_name(command, message, lengths, capsys):
    one_line_error(main([part.format(lengths=lengths) for part in command]), capsys.readouterr().err, message)


def test_ascii_values_still_read(lengths, capsys):
    assert main(["plan", lengths, "-D", "2", "--time-limit", "1.5", "--cost", "0,1,0", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("makespan 11, lower bound 11")

"""Regressions of issue 24: inputs the `orchmllm` command misread or crashed on, each now a one-line
error naming the input (exit 2); a closed stdout ends quietly (an early Ctrl-C: test_cli_interrupts.py).
Named after their cause."""

import json
import os
import pickle
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

from orchmllm.cli import main


def check_one_line_error(code, stderr, message):
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchmllm") and "error: " in lines[0], stderr
    assert message in lines[0], lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("inputs")
    (tmp / "good.csv").write_text("3\n4\n5\n6\n")
    (tmp / "index_length.csv").write_text("0,812\n1,77\n2,300\n")
    (tmp / "typo.csv").write_text("8l2\n77\n300\n")
    (tmp / "typo_letter_o.csv").write_text("O12\n77\n300\n")
    (tmp / "wl64.jsonl").write_text('{"text": 212, "segments": [{"modality": "image", "length": 1024, '
                                    '"tokens": 256}]}\n'
                                    * 64)
    (tmp / "length_l.csv").write_text("l\n77\n300\n")
    (tmp / "repeated_key.jsonl").write_text('{"length": 5}\n{"length": 5, "length": 7}\n')
    (tmp / "mixed_header.csv").write_text("length,7\n5,1\n")
    (tmp / "header_only.csv").write_text("length\n")
    (tmp / "long_field.csv").write_text("3\n" + "1" * 140_000 + "\n")
    (tmp / "many_digits.jsonl").write_text("3\n" + "1" * 5000 + "\n")
    (tmp / "deep.jsonl").write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with (tmp / "huge_header.npy").open("wb") as handle:
        np.lib.format.write_array_header_1_0(handle, {"descr": "<i8", "fortran_order": False, "shape": (10**12,)})
        handle.write(bytes(64))
    np.savetxt(tmp / "4000.csv", np.random.default_rng(0).integers(1, 4000, 4000), fmt="%d")
    (tmp / "deep_sample.jsonl").write_text('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (tmp / "huge_text.jsonl").write_text('{"text": 99999999999999999999999}\n')
    (tmp / "hello.npy").write_bytes(b"hello")
    (tmp / "pickled.npy").write_bytes(pickle.dumps([3, 4, 5]))
    np.save(tmp / "objects.npy", np.array([3, "4"], dtype=object), allow_pickle=True)
    (tmp / "directory.csv").mkdir()
    os.mkfifo(tmp / "fifo.csv")
    (tmp / "trailing_comma.csv").write_text("5,\n4,\n")
    (tmp / "utf16.csv").write_text("length\n5\n4\n", encoding="utf-16")
    (tmp / "latin1.csv").write_bytes("longueur_\xe9\n5\n4\n".encode("latin-1"))
    (tmp / "pretty.json").write_text('[\n  5,\n  {"length": 4},\n  3\n]\n')
    (tmp / "array_of_lists.json").write_text("[5, [4, 3]]\n")
    (tmp / "wl_utf16.jsonl").write_text('{"text": 212}\n', encoding="utf-16")
    (tmp / "a_file").write_text("")
    (tmp / "arrays_per_line.json").write_text("[5, 4]\n[3]\n")
    (tmp / "digit_first_name.csv").write_text("1st_len\n5\n4\n")
    (tmp / "id_l1.csv").write_text("id,l1\n0,5\n1,4\n")
    (tmp / "twice.csv").write_text("a,a\n5,4\n")
    (tmp / "digit_first_and_b.csv").write_text("1st_len,b\n5,3\n4,2\n")
    return tmp


CASES = {
    # CSV rows of index,length without a header balanced the indices, with exit 0
    "csv of two columns without a header": (
        ["plan", "{tmp}/index_length.csv", "-D", "2"],
        "index_length.csv:1: 2 comma-separated fields and no header line; a file of several columns needs a header"),
    # a typo on line 1 was taken for a header and that item silently dropped
    "csv whose first line is a mistyped number": (
        ["plan", "{tmp}/typo.csv", "-D", "2"],
        "typo.csv:1: expected an integer length or a header line of column names, got '8l2'"),
    # probe6 P6-11: a number typed with a letter O for its 0 was still a column name, and its item dropped
    "csv whose first line is a number with a letter for a digit": (
        ["plan", "{tmp}/typo_letter_o.csv", "-D", "2"],
        "typo_letter_o.csv:1: expected an integer length or a header line of column names, got 'O12'"),
    # probe10 P10-06: a name the reader takes for a mistyped number was refused without the rule it breaks
    "csv header of a name starting with a digit": (
        ["plan", "{tmp}/digit_first_name.csv", "-D", "2"],
        "digit_first_name.csv:1: expected an integer length or a header line of column names, got '1st_len' (a column "
        "name may not start with a digit, '+', '-' or '.', nor read as a number with O, o, I or l for 0 and 1, as a "
        "mistyped 8l2 does; --column 1st_len takes line 1 as the header)"),
    # probe10 P10-06: a header naming the chosen column twice planned the first one's lengths, no word said
    "csv header naming the chosen column twice": (
        ["plan", "{tmp}/twice.csv", "-D", "2", "--column", "a"],
        "twice.csv: column 'a' appears 2 times in the header (fields 1, 2); --column must name one"),
    # probe6 P6-11: an object giving a key twice was read with the last value, no word said
    "json line with a key given twice": (
        ["plan", "{tmp}/repeated_key.jsonl", "-D", "2"],
        "repeated_key.jsonl:2: key 'length' given twice in one object"),
    "csv whose first line mixes names and numbers": (
        ["plan", "{tmp}/mixed_header.csv", "-D", "2", "--column", "length"],
        "mixed_header.csv:1: expected an integer length or a header line of column names, got '7'"),
    # probe8 P8-04: a spreadsheet's trailing comma blamed the length before it, a UTF-16 or Latin-1 file was "not a
    # text file", and a JSON array (a .json file's usual content) was refused as bad JSON lines
    "csv of lengths with a trailing comma": (
        ["plan", "{tmp}/trailing_comma.csv", "-D", "2"],
        "trailing_comma.csv:1: field 2 of 2 is empty (a trailing comma?); expected an integer length or a header line"),
    "csv in UTF-16": (["plan", "{tmp}/utf16.csv", "-D", "2"],
                      "utf16.csv: UTF-16 text (its byte-order mark says so); save it as UTF-8 (a spreadsheet's "
                      "CSV UTF-8)"),
    "csv in Latin-1": (["plan", "{tmp}/latin1.csv", "-D", "2"],
                       "latin1.csv: not UTF-8 text (byte 0xe9 at offset 9); save it as UTF-8"),
    "workload file in UTF-16": (["simulate", "--gpus", "1", "--samples-per-rank", "1", "--workload-file",
                                 "{tmp}/wl_utf16.jsonl"], "wl_utf16.jsonl: UTF-16 text (its byte-order mark says so)"),
    "json file of an array per line": (["plan", "{tmp}/arrays_per_line.json", "-D", "2"],
                                       "arrays_per_line.json (a .json file starting with '[' is read as one JSON "
                                       "array): not valid JSON (Extra data)"),
    "json array holding a list": (["plan", "{tmp}/array_of_lists.json", "-D", "2"],
                                  "array_of_lists.json: element 1: expected an integer length, got [4, 3]"),
    # the balancers' ValueError on item bytes escaped with a traceback
    "negative bytes per token": (["plan", "{tmp}/good.csv", "-D", "2", "--algorithm", "lpt+locality",
                                  "--bytes-per-token", "-1"], "--bytes-per-token: `bytes_per_token` must be finite"),
    "nan bytes per token": (["plan", "{tmp}/good.csv", "-D", "2", "--bytes-per-token", "nan"],
                            "--bytes-per-token: `bytes_per_token` must be finite and >= 0; got nan"),
    "infinite bytes per token": (["compare", "--lengths", "{tmp}/good.csv", "-D", "2", "--bytes-per-token", "inf"],
                                 "--bytes-per-token: `bytes_per_token` must be finite and >= 0; got inf"),
    "bytes per token overflowing an item's bytes": (
        ["plan", "{tmp}/good.csv", "-D", "2", "--algorithm", "lpt+locality", "--bytes-per-token", "1e308"],
        "--bytes-per-token: `bytes_per_token` = 1e+308 times the longest length 6 overflows float64"),
    # a cost model overflowing float64 on the file's items: compare ended in a traceback, plan did not name --cost
    "compare cost overflowing float64": (
        ["compare", "--lengths", "{tmp}/good.csv", "-D", "2", "--cost", "1e308,1e308,1e308", "--algorithms", "lpt"],
        "--cost '1e308,1e308,1e308': `cost` CostModel(per_item=1e+308, linear=1e+308, quadratic=1e+308) gives item 0 "
        "(length 3) the cost inf"),
    "plan cost overflowing float64": (["plan", "{tmp}/good.csv", "-D", "2", "--cost", "0,0,1e308"],
                                      "--cost '0,0,1e308': `cost` CostModel(per_item=0.0, linear=0.0, "
                                      "quadratic=1e+308) gives item 0 (length 3) the cost inf"),
    "csv of a header line only": (["plan", "{tmp}/header_only.csv", "-D", "2"],
                                  "header_only.csv: no lengths in the file, only a header line"),
    # the balancers refused a padded-only algorithm on an unpadded file with a traceback
    "padded algorithm on an unpadded file": (
        ["plan", "{tmp}/good.csv", "-D", "2", "--algorithm", "padded"],
        "--algorithm padded: algorithm 'padded' balances padded batches only; add --padded, or choose one of "
        "identity, lpt,"),
    "padded+locality on an unpadded file": (
        ["plan", "{tmp}/good.csv", "-D", "8", "--algorithm", "padded+locality"],
        "--algorithm padded+locality: algorithm 'padded' balances padded batches only; add --padded"),
    # sizes: numpy's OverflowError, the balancers' ValueError, or allocations that could never fit
    "ranks beyond int64": (["plan", "{tmp}/good.csv", "-D", str(10**30)],
                           f"--ranks {10**30}: `num_ranks` must be at most 2**20 = 1048576"),
    "compare ranks beyond the cap": (["compare", "--ranks", "2097152"],
                                     "--ranks 2097152: `num_ranks` must be at most 2**20 = 1048576"),
    "ilp model beyond its size limit": (
        ["plan", "{tmp}/4000.csv", "-D", "16", "--algorithm", "ilp"],
        "algorithm 'ilp' needs 63880 binaries for 4000 items × 16 ranks, over MAX_BINARIES=25000; use 'auto'"),
    "csv field beyond the csv reader's limit": (["plan", "{tmp}/long_field.csv", "-D", "2"],
                                                "long_field.csv:2: not a valid CSV line (field larger than field "
                                                "limit (131072))"),
    "json integer of 5000 digits": (["plan", "{tmp}/many_digits.jsonl", "-D", "2"],
                                    "many_digits.jsonl:2: a number of more than 4300 digits"),
    "json nested 10**5 deep": (["plan", "{tmp}/deep.jsonl", "-D", "2"],
                               "deep.jsonl:1: not valid JSON (nested too deeply)"),
    "npy header claiming 10**12 items": (["plan", "{tmp}/huge_header.npy", "-D", "2"],
                                         "huge_header.npy: the header claims shape (1000000000000,), 8000000000000 "
                                         "bytes, but the file holds 64 after it"),
    # np.load's text spoke of pickled data and allow_pickle for any file without the .npy header
    "npy file holding text": (["plan", "{tmp}/hello.npy", "-D", "2"],
                              "hello.npy: not a plain numeric .npy array (the file does not start with the .npy "
                              "header numpy.save writes)"),
    "npy file holding a pickle": (["plan", "{tmp}/pickled.npy", "-D", "2"],
                                  "pickled.npy: not a plain numeric .npy array (the file does not start"),
    "npy array of objects": (["plan", "{tmp}/objects.npy", "-D", "2"],
                             "objects.npy: not a plain numeric .npy array (it holds Python objects, dtype object)"),
    # the balancers' argument name, not the option the user typed
    "cap of zero tokens": (["plan", "{tmp}/good.csv", "-D", "2", "--max-tokens", "0"],
                           "error: --max-tokens 0: `max_tokens_per_rank` must be >= 1; got 0"),
    "padded cap below every plan": (["plan", "{tmp}/good.csv", "-D", "2", "--padded", "--max-tokens", "10"],
                                    "error: --max-tokens 10: no padded plan fits max_tokens_per_rank=10"),
    "simulate zero samples per rank": (["simulate", "--gpus", "8", "--samples-per-rank", "0"],
                                       "error: --samples-per-rank must be >= 1; got 0"),
    "simulate a micro-batch budget below an item": (
        ["simulate", "--gpus", "8", "--max-tokens-per-microbatch", "16"],
        "error: --max-tokens-per-microbatch 16: item "),
    "simulate a billion gpus": (["simulate", "--gpus", str(10**9)],
                                "--gpus 1000000000: `num_ranks` must be at most 2**20 = 1048576"),
    "simulate micro-batched on a billion gpus": (
        ["simulate", "--gpus", str(10**9), "--max-tokens-per-microbatch", "16384"],
        "--gpus 1000000000: `num_ranks` must be at most 2**20"),
    "simulate a batch beyond the samples cap": (
        ["simulate", "--gpus", "1048576", "--samples-per-rank", "8"],
        "--samples-per-rank 8: 1048576 ranks × 8 samples per rank make 8388608 samples, beyond 2**22 = 4194304"),
    "compare 10**8 items per rank": (
        ["compare", "-D", "8", "--items-per-rank", "100000000"],
        "--items-per-rank 100000000: 8 ranks × 100000000 samples per rank make 800000000 samples, beyond 2**22"),
    # found by a probe of our own: numpy's "expected non-negative integer", max() of no strategies, the
    # json module's RecursionError, Batch's TypeError on an int64 overflow
    "negative seed": (["compare", "-D", "8", "--seed", "-1"], "--seed must be >= 0; got -1"),
    "simulate negative seed": (["simulate", "--gpus", "8", "--seed", "-1"], "--seed must be >= 0; got -1"),
    "no strategies": (["simulate", "--gpus", "8", "--strategies", ","], "--strategies must list at least one name"),
    "no algorithms": (["compare", "-D", "8", "--algorithms", ","], "--algorithms: name at least one algorithm"),
    "workload line nested 10**5 deep": (
        ["compare", "-D", "1", "--items-per-rank", "1", "--workload-file", "{tmp}/deep_sample.jsonl"],
        "deep_sample.jsonl: line 1: not valid JSON (nested too deeply)"),
    "workload text beyond int64": (
        ["simulate", "--gpus", "1", "--samples-per-rank", "1", "--workload-file", "{tmp}/huge_text.jsonl"],
        "huge_text.jsonl: line 1: the sample 'text' must be below 2**53; got 99999999999999999999999"),
    # -o created the missing directories (at the filesystem root) and exited 0
    "output into a missing directory": (["plan", "{tmp}/good.csv", "-D", "2", "-o", "{tmp}/missing/dir/p.json"],
                                        "--output '{tmp}/missing/dir/p.json': directory '{tmp}/missing/dir' does "
                                        "not exist"),
    # a directory or a bare suffix as --output read "unknown file type ''"
    "output that is a directory": (["plan", "{tmp}/good.csv", "-D", "2", "-o", "{tmp}"],
                                   "--output '{tmp}' is a directory; name a file ending in .json, .csv or .npy"),
    "output that is a bare suffix": (["plan", "{tmp}/good.csv", "-D", "2", "-o", "{tmp}/.json"],
                                     "--output '{tmp}/.json': no file name before '.json'"),
    "csv into a missing directory": (["compare", "--lengths", "{tmp}/good.csv", "-D", "2", "--algorithms", "lpt",
                                      "--csv", "{tmp}/missing/rows.csv"],
                                     "--csv '{tmp}/missing/rows.csv': directory '{tmp}/missing' does not exist"),
    # --plot naming a file: "cannot write (File exists)" after the whole run
    "compare plot directory that is a file": (
        ["compare", "--lengths", "{tmp}/good.csv", "-D", "2", "--algorithms", "lpt", "--plot", "{tmp}/a_file"],
        "--plot '{tmp}/a_file' is a file, not a directory"),
    "simulate plot directory that is a file": (["simulate", "--gpus", "8", "--plot", "{tmp}/a_file"],
                                               "--plot '{tmp}/a_file' is a file, not a directory"),
    # probe3 UE4: a directory, a FIFO or /dev/null as the lengths file was "not found"
    "lengths file that is a directory": (["plan", "{tmp}/directory.csv", "-D", "2"],
                                         "lengths file '{tmp}/directory.csv' is a directory, not a regular file"),
    "lengths file that is a FIFO": (["plan", "{tmp}/fifo.csv", "-D", "2"],
                                    "lengths file '{tmp}/fifo.csv' is a FIFO, not a regular file"),
    "lengths file /dev/null": (["compare", "--lengths", "/dev/null", "-D", "2"],
                               "lengths file '/dev/null' is a character device, not a regular file"),
    # probe3 UE3: simulate blamed --gpus for an unknown strategy or workload
    "simulate unknown strategy": (["simulate", "--gpus", "8,16", "--strategies", "nope"],
                                  "error: --strategies: unknown strategy 'nope'; choose from"),
    "simulate unknown workload": (["simulate", "--gpus", "8", "--workload", "nope"],
                                  "error: --workload nope: unknown workload 'nope'; choose one of"),
    "compare unknown workload": (["compare", "-D", "8", "--workload", "nope"],  # said without the flag
                                 "error: --workload nope: unknown workload 'nope'; choose one of"),
    # probe3 UE5: workload options beside a lengths file were accepted and ignored, exit 0
    "compare lengths file with items per rank": (
        ["compare", "--lengths", "{tmp}/good.csv", "-D", "2", "--items-per-rank", "5"],
        "error: --items-per-rank applies to workloads, not --lengths files"),
    "compare lengths file with a model": (
        ["compare", "--lengths", "{tmp}/good.csv", "-D", "2", "--model", "10b", "--items-per-rank", "5"],
        "error: --model and --items-per-rank apply to workloads, not --lengths files"),
    # probe3 UE10: nothing to split, so the demo's split check failed by construction after 40 s (exit 1)
    "demo giants at degree 1": (["demo", "--workload", "giants", "--context-parallel", "1", "--ranks", "2"],
                                "error: --context-parallel 1: the giants workload needs a degree above 1"),
    "demo giants on one rank": (["demo", "--workload", "giants", "--ranks", "1"],
                                "error: --ranks 1: the giants workload splits an item over 2 or more ranks"),
    # the demo's own checks named its argument (`max_tokens_per_microbatch`, `seed`), not the flag
    "demo budget below the longest sample": (["demo", "--max-tokens-per-microbatch", "1"],
                                             "error: --max-tokens-per-microbatch 1: `max_tokens_per_microbatch` must "
                                             "hold the longest sample"),
    "demo negative seed": (["demo", "--seed", "-1"], "error: --seed must be >= 0; got -1"),
    "demo giants with no degrees": (["demo", "--workload", "giants", "--context-parallel", ""],
                                    "error: --context-parallel must list at least one integer; got ''"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_is_one_line_naming_it_with_exit_2(case, files, capsys):
    args, message = CASES[case]
    code = main([arg.format(tmp=files) for arg in args])
    check_one_line_error(code, capsys.readouterr().err, message.format(tmp=files))


def test_a_column_named_with_letters_that_look_like_digits_is_still_a_header(files, capsys):
    """`l` (for length) holds no digit: a column name, not a mistyped 1."""
    assert main(["plan", str(files / "length_l.csv"), "-D", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_items"] == 2
    assert not (files / "missing").exists()


@pytest.mark.parametrize("file, column, makespan", [("id_l1.csv", "l1", 9), ("digit_first_name.csv", "1st_len", 9),
                                                     ("digit_first_and_b.csv", "b", 5)])
def test_regression_a_column_named_by_column_was_refused_as_a_mistyped_number(file, column, makespan, files, capsys):
    """Cause: line 1 was a header only if every field passed the reader's column-name rule, which refuses what
    could be a mistyped number (`l1`), so `--column l1` naming a field of line 1 was refused (probe10 P10-06), and
    so was `--column b` beside a `1st_len` (P10-17, whose refusal offered `--column 1st_len`, the other column).
    A field that `--column` names makes line 1 the header, unless another field of it is a number."""
    assert main(["plan", str(files / file), "-D", "1", "--column", column, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == makespan


@pytest.mark.parametrize("command,output", [("plan", "-o ok.csv"), ("plan", "--output ./ok.csv"),
                                            ("plan", "-o link.csv"), ("compare", "--csv ok.csv")])
def test_output_file_that_is_the_input_file_is_refused(command, output, tmp_path, monkeypatch, capsys):
    # -o ok.csv replaced the lengths file ok.csv with the plan, exit 0
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ok.csv").write_text("length\n5\n3\n4\n")
    (tmp_path / "link.csv").symlink_to(tmp_path / "ok.csv")
    source = ["plan", "ok.csv"] if command == "plan" else ["compare", "--lengths", "ok.csv", "--algorithms", "lpt"]
    code = main([*source, "-D", "2", *output.split()])
    option, path = output.split()
    option = {"-o": "--output"}.get(option, option)
    check_one_line_error(code, capsys.readouterr().err, f"{option} {path!r} is the input file 'ok.csv'")
    assert (tmp_path / "ok.csv").read_text() == "length\n5\n3\n4\n"


def test_csv_header_of_names_and_a_single_column_still_read(tmp_path, capsys):
    (tmp_path / "named.csv").write_text("length\n5\n6\n")
    (tmp_path / "plain.csv").write_text("5\n6\n7e0\n")
    (tmp_path / "columns.csv").write_text("index,length\n0,5\n1,6\n")
    for args in (["named.csv"], ["plain.csv"], ["columns.csv", "--column", "length"]):
        assert main(["plan", str(tmp_path / args[0]), *args[1:], "-D", "1", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["makespan"] == (18 if args[0] == "plain.csv" else 11)


def test_regression_a_json_array_in_a_json_file_was_refused_as_bad_json_lines(files, capsys):
    """Cause: `.json` files were read as JSON lines only, so an array over several lines (what a `.json` file
    usually holds) was "not valid JSON (Expecting value)" at its `[` (probe8 P8-04)."""
    assert main(["plan", str(files / "pretty.json"), "-D", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["num_items"] == 3 and sorted(plan["tokens"]) == [5, 7]  # 5 | 4 + 3


def test_regression_plan_printed_a_row_per_rank_for_a_million_ranks(files, capsys):
    """Cause: `plan FILE -D 1048576` (the largest D it takes) printed a table row per rank, about 2 ms each:
    half an hour of output after a 0.1 s plan.  Beyond 64 ranks the table shows the 32 heaviest and the 32
    lightest, heaviest first, and says so."""
    assert main(["plan", str(files / "good.csv"), "-D", "200"]) == 0
    out = capsys.readouterr().out
    assert "64 of 200 ranks shown: the 32 heaviest and the 32 lightest, by load (all of them: --json or -o FILE)" in out
    rows = [re.findall(r"[\d.]+", line) for line in out.splitlines() if re.fullmatch(r"\W*(\d[\d.]*\W+){5}", line)]
    loads = [float(row[3]) for row in rows]
    assert len(rows) == 64 and rows[0][2] == "6" and loads == sorted(loads, reverse=True)  # the heaviest first


def test_float16_npy_is_read_without_an_overflow_warning(tmp_path, capsys):
    """2**53, the bound a length is checked against, overflowed float16 with a RuntimeWarning on stderr."""
    np.save(tmp_path / "half.npy", np.array([3, 4, 5], dtype=np.float16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["plan", str(tmp_path / "half.npy"), "-D", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["makespan"] == 12


def test_compare_reports_an_ilp_too_large_for_a_stage_as_not_applicable(files, capsys):
    """compare --algorithms ilp,lpt on 4000 items × 16 ranks ended in the ILP's ValueError traceback."""
    assert main(["compare", "--lengths", str(files / "4000.csv"), "-D", "16", "--algorithms", "ilp,lpt",
                 "--json"]) == 0
    rows = {row["algorithm"]: row for row in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["ilp"]["makespan"] is None and "over MAX_BINARIES=25000" in rows["ilp"]["note"]
    assert rows["lpt"]["makespan"] > 0


def test_plot_directory_is_made_but_its_parent_must_exist(files, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    target = tmp_path / "missing" / "plots"
    code = main(["compare", "--lengths", str(files / "good.csv"), "-D", "2", "--algorithms", "lpt",
                 "--plot", str(target)])
    check_one_line_error(code, capsys.readouterr().err, f"--plot {str(target)!r}: directory "
                                                        f"{str(target.parent)!r} does not exist")
    assert not target.parent.exists()


def run_with_closed_stdout(args):
    code = ("import os, sys\n"
            "read_end, write_end = os.pipe()\n"
            "os.close(read_end)  # the reader is gone, as `head -c 10` is once it has its bytes\n"
            "os.dup2(write_end, sys.stdout.fileno())\n"
            "from orchmllm.cli import main\n"
            f"sys.exit(main({args!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_table_printed_to_a_closed_stdout_ends_quietly_with_exit_141(files):
    """`plan ... | head -c 10` exited 1 with no message: rich's console turned the broken pipe into exit 1."""
    result = run_with_closed_stdout(["plan", str(files / "good.csv"), "-D", "2"])
    assert result.returncode == 141 and result.stderr == "", result.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args", [["plan", "{tmp}/good.csv", "-D", "2"],
                                  ["plan", "{tmp}/good.csv", "-D", "2", "--json"],
                                  ["compare", "--lengths", "{tmp}/good.csv", "-D", "2", "--algorithms", "lpt"]],
                         ids=["plan table", "plan json", "compare table"])
def test_stdout_on_a_full_device_is_one_line_and_exit_2(files, args):
    """Cause: rich's console and print_json wrote to stdout unguarded: a full disk ended in a 14-24 line OSError
    traceback, exit 1, where --output's and --csv's said "cannot write (No space left on device)" (probe3 CR2)."""
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "orchmllm", *(arg.format(tmp=files) for arg in args)],
                                stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    check_one_line_error(result.returncode, result.stderr, "cannot write to standard output (No space left on device)")


@pytest.mark.parametrize("args", [["plan", "{tmp}/good.csv", "-D", "2"],
                                  ["plan", "{tmp}/good.csv", "-D", "2", "--json"],
                                  ["plan", "{tmp}/good.csv", "-D", "2", "-q", "-o", "{tmp}/closed.json"]],
                         ids=["plan table", "plan json", "plan to a file"])
def test_regression_a_stdout_closed_at_start_up_was_a_traceback(files, args):
    """Cause: `orchmllm plan ... >&-` (fd 1 closed: `sys.stdout` is None) ended in a 20-line AttributeError
    traceback ('NoneType' object has no attribute 'isatty' / 'write'), exit 1 (probe17 P17-01)."""
    result = subprocess.run([sys.executable, "-m", "orchmllm", *(arg.format(tmp=files) for arg in args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
                            preexec_fn=lambda: os.close(1))
    check_one_line_error(result.returncode, result.stderr, "cannot write to standard output (it is closed)")


def test_csv_named_as_a_figure_of_the_plot_directory_is_refused(files, tmp_path, capsys):
    """Cause: `compare --plot DIR --csv DIR/loads.png` wrote the CSV, then the figure over it, exit 0."""
    pytest.importorskip("matplotlib")
    code = main(["compare", "--lengths", str(files / "good.csv"), "-D", "2", "--algorithms", "lpt",
                 "--plot", str(tmp_path / "out"), "--csv", str(tmp_path / "out" / "loads.png")])
    check_one_line_error(code, capsys.readouterr().err, f"--csv '{tmp_path / 'out' / 'loads.png'}' is a figure --plot "
                                                        f"writes into '{tmp_path / 'out'}'; choose another name")
    assert not (tmp_path / "out").exists()


def test_simulator_refuses_sizes_that_cannot_fit_before_sampling():
    """The API path of `simulate --gpus 10**9`: sampling 28 values per GPU asked numpy for 209 GiB."""
    from orchmllm.balancers.validation import SizeLimitError
    from orchmllm.study.simulator import check_simulation, run_simulation

    with pytest.raises(ValueError, match=r"`num_ranks` must be at most 2\*\*20 = 1048576"):
        run_simulation(gpus=10**9)
    with pytest.raises(SizeLimitError, match=r"1048576 ranks × 8 samples per rank make 8388608 samples, beyond "
                                             r"2\*\*22 = 4194304"):
        check_simulation(gpus=2**20, samples_per_rank=8)


# probe4 (issue 24): options taken silently, blamed on another flag, or without a size limit; each case is named
# after its cause, and each failed before its fix (exit 0, or another flag in the message, or a hang)
OPTION_CASES = {
    # P4-04: the pipeline's (default) micro-batch budget was blamed on --gpus
    "pipeline default budget blamed on gpus": (
        ["simulate", "--gpus", "16", "--pipeline-stages", "4", "--workload", "long"],
        "error: --max-tokens-per-microbatch 16384 (the default with --pipeline-stages): item "),
    "pipeline budget blamed on gpus": (
        ["simulate", "--gpus", "16", "--pipeline-stages", "4", "--workload", "long", "--max-tokens-per-microbatch",
         "1"], "error: --max-tokens-per-microbatch 1: item "),
    # P4-05: pipeline flags without --pipeline-stages (or the interleaved schedule) were ignored, exit 0
    "schedule without pipeline stages ignored": (["simulate", "--gpus", "16", "--schedule", "gpipe"],
                                                 "error: --schedule gpipe applies only with --pipeline-stages"),
    "virtual stages without pipeline stages ignored": (
        ["simulate", "--gpus", "16", "--virtual-stages", "2"],
        "error: --virtual-stages 2 applies only with --schedule interleaved"),
    "virtual stages with 1f1b ignored": (
        ["simulate", "--gpus", "16", "--pipeline-stages", "2", "--schedule", "1f1b", "--virtual-stages", "3"],
        "error: --virtual-stages 3 applies only with --schedule interleaved"),
    # P4-05: an empty entry of a list of integers was dropped
    "empty degree dropped": (["simulate", "--gpus", "16", "--context-parallel", "1,,2"],
                             "error: --context-parallel must be comma-separated integers with none empty"),
    # P4-03: nothing bounded the model chunks, a million virtual stages ran for minutes
    "a million virtual stages unbounded": (
        ["simulate", "--gpus", "16", "--pipeline-stages", "2", "--schedule", "interleaved", "--virtual-stages",
         "1000000"], "error: --virtual-stages 1000000: `virtual_stages`=1000000 × `stages`=2 model chunks must be "
                     "at most MAX_MODEL_CHUNKS = 128"),
    # P4-16: --gpus-per-node 0 was blamed on --ranks
    "gpus per node zero blamed on ranks": (
        ["plan", "{tmp}/good.csv", "-D", "2", "--gpus-per-node", "0", "--algorithm", "lpt+locality"],
        "error: --gpus-per-node must be >= 1; got 0"),
    # P4-16: options of another mode accepted and ignored, exit 0
    "plan gpus per node without locality ignored": (
        ["plan", "{tmp}/good.csv", "-D", "2", "--gpus-per-node", "4"],
        "error: --gpus-per-node applies only with a +locality algorithm"),
    "plan bytes per token without locality ignored": (
        ["plan", "{tmp}/good.csv", "-D", "2", "--bytes-per-token", "5"],
        "error: --bytes-per-token applies only with a +locality algorithm"),
    "compare bytes per token on a workload ignored": (
        ["compare", "-D", "8", "--bytes-per-token", "-1"], "error: --bytes-per-token applies to --lengths files"),
    "compare column on a workload ignored": (["compare", "-D", "8", "--column", "x"],
                                             "error: --column applies to --lengths files"),
    # P4-16: argparse read '-1,1,0' as an option and said only 'expected one argument'
    "negative value read as an option": (
        ["plan", "{tmp}/good.csv", "-D", "2", "--cost", "-1,1,0"],
        "argument --cost: expected one argument (a value that starts with '-' goes after '=': --cost=-VALUE)"),
    # P4-20: --gpus-per-node 0 reached `ranks % gpus_per_node` after the torch import: ZeroDivisionError, exit 1
    "demo gpus per node zero divided by zero": (
        ["demo", "--gpus-per-node", "0", "--transport", "hierarchical", "--ranks", "2", "--steps", "1"],
        "error: --gpus-per-node must be >= 1; got 0"),
    "demo gpus per node with the flat transport ignored": (
        ["demo", "--gpus-per-node", "2", "--ranks", "2", "--steps", "1"],
        "error: --gpus-per-node applies only with --transport hierarchical"),
    # the giants demo ran its own steps and ignored the mixed demo's --transport / --algorithm / --costs / --repeats
    "demo giants with a transport ignored": (
        ["demo", "--workload", "giants", "--ranks", "2", "--steps", "1", "--transport", "hierarchical"],
        "error: --transport hierarchical is not available with --workload giants"),
    # P6-08: --samples-per-rank had no upper limit: 10**8 'warming up' for minutes, the gloo ranks spawned
    "demo samples per rank unbounded": (
        ["demo", "--samples-per-rank", "100000000", "--ranks", "2", "--steps", "1"],
        "error: --samples-per-rank must be at most MAX_SAMPLES_PER_RANK = 1024 (the demo draws and trains every "
        "sample on the CPU; the default 16 take minutes); got 100000000"),
    # probe7 P7-03: a workload file too short for the step named --workload (not passed) or no flag at all
    "simulate samples per rank beyond the workload file": (
        ["simulate", "--gpus", "8", "--workload-file", "{tmp}/wl64.jsonl", "--samples-per-rank", "9"],
        "error: --samples-per-rank 9: workload file {tmp}/wl64.jsonl has 64 samples; 8 ranks × 9 samples per rank "
        "need 72: at most 8 per rank on 8 ranks"),
    # probe27 P27-05: fewer samples than ranks, no --samples-per-rank: named --workload default (not passed)
    "simulate workload file with fewer samples than ranks": (
        ["simulate", "--gpus", "128", "--strategies", "none", "--workload-file", "{tmp}/wl64.jsonl"],
        "error: --workload-file {tmp}/wl64.jsonl: workload file {tmp}/wl64.jsonl has 64 samples; 128 ranks × 1 "
        "samples per rank need 128: fewer than one per rank on 128 ranks"),
    "compare default items per rank beyond the workload file": (
        ["compare", "--workload-file", "{tmp}/wl64.jsonl", "-D", "8"],
        "error: --items-per-rank 16 (the default): workload file {tmp}/wl64.jsonl has 64 samples"),
    "demo giants samples per rank unbounded": (
        ["demo", "--workload", "giants", "--samples-per-rank", "1025", "--ranks", "2", "--steps", "1"],
        "error: --samples-per-rank must be at most MAX_SAMPLES_PER_RANK = 1024"),
}


@pytest.mark.parametrize("case", list(OPTION_CASES), ids=list(OPTION_CASES))
def test_regression_options_ignored_blamed_on_another_flag_or_unbounded(case, files, capsys):
    args, message = OPTION_CASES[case]
    check_one_line_error(main([arg.format(tmp=files) for arg in args]), capsys.readouterr().err,
                         message.format(tmp=files))


def test_regression_pipeline_model_chunks_had_no_size_limit():
    """P4-03: `Pipeline(stages=10**4)` planned for 40 s, virtual_stages=10**6 for minutes; now refused when built."""
    from orchmllm import Pipeline
    from orchmllm.balancers.validation import SizeLimitError

    with pytest.raises(SizeLimitError, match=r"`stages`=129 model chunks must be at most MAX_MODEL_CHUNKS = 128"):
        Pipeline(stages=129)
    with pytest.raises(SizeLimitError, match=r"`virtual_stages`=65 × `stages`=2 model chunks must be at most"):
        Pipeline(stages=2, schedule="interleaved", virtual_stages=65)
    assert Pipeline(stages=64, schedule="interleaved", virtual_stages=2).virtual_stages == 2


def test_regression_demo_options_took_gpus_per_node_zero():
    """P4-20: DemoOptions(gpus_per_node=0) was taken, and the run divided by it."""
    pytest.importorskip("torch")
    from orchmllm.runtime.demo import DemoOptions

    with pytest.raises(ValueError, match=r"`gpus_per_node` must be an int >= 1 or None; got 0"):
        DemoOptions(transport="hierarchical", gpus_per_node=0)


@pytest.mark.parametrize("name", ["typo.csv", "typo_letter_o.csv"])
def test_regression_a_mistyped_length_on_line_1_was_offered_the_column_that_drops_it(name, files, capsys):
    """Cause (review7 R7-06): the refusal of `8l2` (or `O12`) on line 1 suggested `--column 8l2`, which takes the
    mistyped length for a header and drops that item, the silent misread issue 24 names; a field that reads as a
    number with letters for digits gets no such hint."""
    assert main(["plan", str(files / name), "-D", "2"]) == 2
    error = capsys.readouterr().err
    assert "expected an integer length" in error and "--column" not in error


@pytest.mark.parametrize("first, shown", [("\u200b5", r"'\u200b5'"), ("\ufeff\ufeff5", r"'\ufeff5'"),
                                          ("\u22125", "'\u22125'"), ("\u20605", r"'\u20605'"),
                                          ("\u20135", "'\u20135'"), ("\uff0d5", "'\uff0d5'"),
                                          ("\ufe635", "'\ufe635'"), ("\u2075", "'\u2075'")],
                         ids=["zero-width space", "second byte-order mark", "unicode minus", "word joiner", "en dash",
                              "fullwidth hyphen-minus", "small hyphen-minus", "superscript digit"])
def test_regression_an_invisible_character_or_unicode_minus_made_line_1_a_header(first, shown, tmp_path, capsys):
    """Cause (probe12 P12-02, review8 R8-12): the header test took a number holding an invisible format character
    (U+200B, a second BOM, U+2060, as concatenated exports write), a Unicode minus, a dash or a hyphen-minus other
    than '-' (an en dash autocorrect typed, a fullwidth or small one) or a superscript digit for a column name,
    and the item on line 1 was dropped with exit 0; on any other line the same bytes were refused."""
    path = tmp_path / "lengths.csv"
    path.write_text(f"{first}\n6\n7\n", encoding="utf-8")
    code = main(["plan", str(path), "-D", "2"])
    check_one_line_error(code, capsys.readouterr().err, f"lengths.csv:1: expected an integer length or a header "
                                                        f"line of column names, got {shown} (a column name may not")


@pytest.mark.parametrize("first", ["5 6", "5\x0c6", "5\u20286", "5;6"], ids=["space", "form feed", "line separator",
                                                                           "semicolon"])
def test_regression_numbers_not_separated_by_commas_on_line_1_were_offered_as_a_column(first, tmp_path, capsys):
    """Cause (probe12 P12-03): a line 1 of numbers separated by a space, a form feed, U+2028 or a semicolon is one
    field that is not a column name, and its refusal offered `--column 5 6`, a name its own rule forbids, which
    a shell reads as two arguments."""
    path = tmp_path / "lengths.csv"
    path.write_text(f"{first}\n7\n8\n", encoding="utf-8")
    assert main(["plan", str(path), "-D", "2"]) == 2
    error = capsys.readouterr().err
    check_one_line_error(2, error, f"lengths.csv:1: expected an integer length or a header line of column names, "
                                   f"got {first!r} (2 numbers separated by something other than a comma: one length "
                                   f"per line, or fields separated by commas)")
    assert "--column" not in error


def test_column_hint_for_a_name_starting_with_a_digit_is_quoted_for_the_shell(tmp_path, capsys):
    """The hint after a header field that starts with a digit is a shell argument: quoted where it holds a space."""
    path = tmp_path / "lengths.csv"
    path.write_text("1st len,b\n5,3\n4,2\n")
    assert main(["plan", str(path), "-D", "2"]) == 2
    assert "; --column '1st len' takes line 1 as the header)" in capsys.readouterr().err
    assert main(["plan", str(path), "-D", "2", "--column", "1st len", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_items"] == 2


@pytest.mark.parametrize("column, message", [
    (None, "10001 columns ['a', 'a', 'a', 'a', 'a', 'a', ...]; choose one with --column (names given more than "
           "once: 'a' 10000 times)"),
    ("c", "no column 'c'; the 10001 columns are ['a', 'a', 'a', 'a', 'a', 'a', ...] (names given more than once: "
          "'a' 10000 times)"),
    ("a", "column 'a' appears 10000 times in the header (fields 1, 2, 3, 4, 5, 6, ...); --column must name one")])
def test_regression_a_header_of_many_columns_was_listed_whole_in_one_line(column, message, tmp_path, capsys):
    """Cause (probe12 P12-04): the refusal of a header of 10 001 columns listed every name (50 kB on one line), and
    said nothing of 10 000 of them being the same name."""
    path = tmp_path / "wide.csv"
    path.write_text("a," * 10_000 + "b\n" + "5," * 10_000 + "5\n")
    assert main(["plan", str(path), "-D", "2"] + ([] if column is None else ["--column", column])) == 2
    error = capsys.readouterr().err
    check_one_line_error(2, error, f"wide.csv: {message}")
    assert len(error) < 400


def test_regression_a_one_column_header_holding_digits_dropped_its_line_silently(tmp_path, capsys):
    """Cause (review8 R8-16): lookalike letters are open-ended (`О24` with a Cyrillic О is not a mistyped number by
    DIGIT_LOOKALIKES), so a one-column file's line 1 holding digits was taken for the column name, its item left
    the plan with exit 0 and no word; now a one-line note names line 1 and where the lengths start."""
    path = tmp_path / "lengths.csv"
    path.write_text("\u041e24\n7\n8\n", encoding="utf-8")
    assert main(["plan", str(path), "-D", "2", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["num_items"] == 2
    assert captured.err == (f"orchmllm: UserWarning: {path}:1: '\u041e24' read as the column name, not a length (it "
                            f"holds digits); the lengths start on line 2\n")
    path.write_text("length\n7\n8\n")
    assert main(["plan", str(path), "-D", "2", "--json"]) == 0 and capsys.readouterr().err == ""

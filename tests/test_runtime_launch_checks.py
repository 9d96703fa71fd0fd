"""`run_processes` refuses, before any rank starts, what "spawn" and "forkserver" ranks could not receive: a `fn`
they cannot import (a partial's function too), and `args` that do not pickle; each refusal names what and why."""

import subprocess
import sys


def run_python(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)


def test_regression_a_partial_of_a_function_of_a_file_less_main_ranks_could_not_import_was_not_named():
    """Cause (probe19 P19-05): the check of a main module without a file (`python -c`, a script on stdin) read
    `fn.__module__`, which for a functools.partial is 'functools': the partial pickled `__main__.job` by reference
    at the start, every rank failed to import it and each outcome said only that it exited.  The partial's
    function is now named, refused before any rank starts."""
    code = ("import functools\nfrom orchmllm.runtime.launch import run_processes\n"
            "def job(scale, rank, world):\n    return rank * scale\n"
            "run_processes(functools.partial(job, 3), 2, start_method='spawn', timeout_s=60)\n")
    done = run_python("-c", code)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == (
        "TypeError: start_method='spawn' imports `fn` in every rank, and 'job' (the function of the partial `fn`) is "
        "defined in a main module that has no file to import (a script on stdin, `python -c`, a notebook): define "
        "it in an importable module, or use start_method='fork'"), done.stderr

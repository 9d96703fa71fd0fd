"""The `orchmllm` command: compare balancers, simulate a cluster, run the demo, plan a file.

Its parser (whose description is this docstring's first line), its stdout, and its errors reported
as `orchmllm.cli` says.  `orchmllm.cli.main` imports this module inside its Ctrl-C handler, so that
nothing the command loads (argparse, numpy, the subcommands) can be interrupted into a traceback.
The parser (`parsers`) and the options' own checks (`prechecks`) need none of the solvers: only then does
the subcommand's module load numpy, scipy and the balancers, so that a refusal is quick (issue 24).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import warnings
from contextlib import contextmanager
from importlib import import_module

from .errors import (EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, ArgumentParser,
                     MissingDependencyError, PluginFailure, UsageError, one_line)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of the `orchmllm` command and its subcommands.

    Its modules are imported here, not at module import, so that `run` catches a Ctrl-C during these
    imports too (`_interrupts_deferred`); none of them loads numpy or a solver (`parsers`).
    """
    from .. import __version__
    from .parsers import add_parsers

    parser = ArgumentParser(prog="orchmllm", description=__doc__.split("\n")[0],
                            epilog="run `orchmllm COMMAND --help` for the options and examples of each command",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"orchmllm {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_parsers(commands)
    return parser


@contextmanager
def _interrupts_deferred():
    """A Ctrl-C during the block (the parsers' and subcommands' imports) recorded and raised as KeyboardInterrupt once
    it is done: numpy's C-extension initialisation turns an interrupt inside it into an ImportError telling the user
    that numpy is badly installed.  Only where Python handles SIGINT (the main thread, SIGINT not ignored)."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous in (signal.SIG_IGN, None):
        yield
        return
    received = []
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    except SystemExit:  # argparse's --help/--version exit: a Ctrl-C received first still ends the command
        if received:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


@contextmanager
def _stdout_errors():
    """A failed write to stdout (a full disk, an I/O error) as a UsageError; a closed pipe stays a BrokenPipeError."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as error:
        raise UsageError(f"cannot write to standard output ({error.strerror or one_line(error)})") from None


CLOSED_STDOUT = "cannot write to standard output (it is closed)"


class _Stdout:
    """The command's stdout (every table and JSON goes through it), whose failed writes say so in one line
    (`_stdout_errors`) instead of a traceback: as `--output`'s and `--csv`'s do.  A stdout closed before the
    command started (`orchmllm plan ... >&-`: `sys.stdout` is None) is such a failure at its first use."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        if self._stream is None:
            raise UsageError(CLOSED_STDOUT)
        return getattr(self._stream, name)

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def write(self, text: str) -> int:
        if self._stream is None:
            raise UsageError(CLOSED_STDOUT)
        with _stdout_errors():
            return self._stream.write(text)

    def flush(self) -> None:
        if self._stream is not None:  # nothing written, nothing to flush
            with _stdout_errors():
                self._stream.flush()


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush does not fail on the closed pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """`warnings.showwarning` for the command: one line on stderr, no source line of whichever orchmllm line
    happened to trigger it (a plugin entry point skipped while the parser lists the algorithms)."""
    print(f"orchmllm: {category.__name__}: {one_line(message)}", file=sys.stderr if file is None else file)


def run(argv=None) -> int:
    """The command `orchmllm.cli.main` runs; returns the exit code.

    Only a UsageError (bad arguments or input files) or a missing optional dependency is
    reported as one line with exit 2; any other exception is a bug and propagates with
    its traceback (exit 1).  Warnings print as one line each (`_one_line_warning`).
    """
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        return _run(argv)


def _run(argv) -> int:
    """`run` itself: the command run, its errors reported as `run` says."""
    command, stdout = "orchmllm", sys.stdout
    try:
        with _interrupts_deferred():  # parsing imports too: the help's lists, --schedule's choices
            parser = build_parser()
            args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError("choose a command: compare, simulate, demo or plan (see `orchmllm --help`)")
        command = f"orchmllm {args.command}"
        with _interrupts_deferred():
            from .prechecks import precheck
        precheck(args)
        with _interrupts_deferred():  # numpy, scipy, the balancers: after the options' own checks
            handler = import_module(f".{args.command}", __package__).run
        sys.stdout = _Stdout(stdout)
        code = handler(args)
        sys.stdout.flush()  # what is still buffered fails here, reported, not in the interpreter's last flush
        return code
    except (UsageError, MissingDependencyError) as error:
        print(f"{command}: error: {one_line(error)}", file=sys.stderr)
        return EXIT_USAGE
    except PluginFailure as error:
        print(f"{command}: error: {one_line(error)}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        sys.stdout = stdout

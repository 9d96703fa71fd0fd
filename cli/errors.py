"""What the `orchmllm` command reports as a user's mistake (exit 2) rather than a bug (exit 1).

Only argument and file validation raise `UsageError`; a ValueError or TypeError from
inside orchmllm is a bug and keeps its traceback.  `usage_errors(what)` turns the
ValueError of one named validation call (a library validator checking user input) into a
UsageError, so the conversion stays as narrow as the check.

>>> with usage_errors("--gpus 0"):
...     raise ValueError("`gpus` must be a positive int; got 0")
Traceback (most recent call last):
...
orchmllm.cli.errors.UsageError: --gpus 0: `gpus` must be a positive int; got 0
"""

from __future__ import annotations

import argparse
import re
from contextlib import contextmanager

EXIT_OK = 0
EXIT_FAILED = 1  # the demo's checks failed, a plugin algorithm failed (one line), or a bug in orchmllm (a traceback)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a reader closing the pipe early gives a C tool


class UsageError(Exception):
    """Bad input from the command line or an input file; reported in one line, exit 2."""


class PluginFailure(Exception):
    """A plugin algorithm (another package's) raised or returned a broken plan; reported in one line naming it,
    exit 1: not orchmllm's bug, so no traceback of orchmllm's."""


class MissingDependencyError(ImportError):
    """An optional dependency (matplotlib for plots, torch for the demo) is not installed."""


def one_line(error: BaseException) -> str:
    """The message of `error` on one line (its type name when it has none)."""
    return " ".join(str(error).split()) or type(error).__name__


def naming_flag(error: BaseException, flags: dict[str, str], what: str = "") -> str:
    """The one-line message of `error`, led by the command-line flag of the first API argument it names
    (`flags` maps `max_tokens_per_rank` to "--max-tokens 0"), else by `what` (when given): for a call
    that checks several arguments at once.

    >>> naming_flag(ValueError("`max_tokens_per_rank` must be >= 1; got 0"), {"max_tokens_per_rank": "--max-tokens 0"})
    '--max-tokens 0: `max_tokens_per_rank` must be >= 1; got 0'
    """
    message = one_line(error)
    lead = next((flags[name] for name in re.findall(r"\w+", message) if name in flags), what)
    return f"{lead}: {message}" if lead else message


@contextmanager
def usage_errors(what: str = "", flags: dict[str, str] | None = None):
    """Report a ValueError/TypeError of the validation inside this block as a UsageError about `what`,
    or about the flag of the first API argument it names (`flags`, see `naming_flag`)."""
    try:
        yield
    except (ValueError, TypeError) as error:
        raise UsageError(naming_flag(error, flags or {}, what)) from None


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (via UsageError) instead of usage + exit."""

    def error(self, message):
        flag = re.fullmatch(r"argument ([-\w]+)\S*: expected one argument", message)
        if flag:  # `--cost -1,1,0`: argparse reads a value that starts with '-' as an option
            message += f" (a value that starts with '-' goes after '=': {flag[1]}=-VALUE)"
        raise UsageError(f"{message} (see `{self.prog} --help`)")

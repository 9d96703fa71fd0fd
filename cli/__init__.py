"""The `orchmllm` command: compare balancers, simulate a cluster, run the demo, plan a file.

Exit codes scripts can rely on: 0 success; 2 bad input or a missing optional dependency
(a one-line message on stderr names the problem and what to do about it); 1 when the
demo's checks fail, a plugin algorithm fails (one line naming it), or for a bug in orchmllm
itself (then with a traceback); 130
interrupted; 141 when the reader of stdout closed it early (`orchmllm compare --json | head`).

`main` runs `command` (the parser and the run), which it imports inside its Ctrl-C handler: this
module imports nothing else, so a Ctrl-C while the command loads is one line.  One
module per subcommand (`compare`, `simulate`, `demo`, `plan`) with its `run`, imported only once the
options passed the checks that need no solver: `parsers` builds every parser and `prechecks` refuses what
the options alone show wrong, neither importing numpy, scipy, the balancers or torch (a refusal is quick);
`arguments` and `files` validate what the user gives (raising `errors.UsageError`), `render` prints tables
and JSON, `plots` draws the figures.
"""

import sys
from importlib import import_module

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_INTERRUPTED", "EXIT_USAGE", "UsageError", "build_parser", "main"]

_HOME = {"EXIT_BROKEN_PIPE": "errors", "EXIT_INTERRUPTED": "errors", "EXIT_USAGE": "errors", "UsageError": "errors",
         "build_parser": "command"}


def main(argv=None) -> int:
    """Entry point of the `orchmllm` console script; returns the exit code (`command.run`).

    A Ctrl-C before `run` reports it itself (while argparse or the command's own modules import,
    a few ms that printed a traceback through the console script) is the same one line, exit 130.
    """
    try:
        from .command import run
        return run(argv)
    except KeyboardInterrupt:
        print("orchmllm: interrupted", file=sys.stderr)
        return 130  # errors.EXIT_INTERRUPTED, not imported before this handler


def __getattr__(name: str):
    """The CLI's other public names, imported on first use (PEP 562) so that `main` imports first."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_HOME[name]}", __name__), name)

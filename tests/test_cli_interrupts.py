"""Regressions of issue 24: a Ctrl-C while the `orchmllm` command starts is one line, exit 130, through
`python -m orchmllm` and through the console script, never a traceback through orchmllm's frames."""

import signal
import subprocess
import sys

import pytest

from orchmllm.cli import main


CONSOLE_SCRIPT = "import sys; from orchmllm.cli import main; sys.exit(main())"  # what pip's `orchmllm` script runs


# Imports of the command's start-up after which the sweep sends its Ctrl-C (`-X importtime` reports each import
# as it completes, so the signal lands in what comes next): the stdlib modules the command loads first (argparse's
# gettext, signal), numpy.  Not the package itself: what follows it is the import machinery's (runpy finding
# __main__, `from ... import main`), microseconds before any line of orchmllm can catch anything.
START_UP_IMPORTS = ["gettext", "signal", "numpy"]


def _interrupted_after(arguments: list[str], after: str) -> tuple[int, list[str]]:
    """The exit code and stderr lines (import times left out) of `python -X importtime ARGUMENTS` sent a Ctrl-C once
    it reports the import of `after`."""
    process = subprocess.Popen([sys.executable, "-X", "importtime", *arguments],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        if line.split("|")[-1].strip() == after:
            break
    else:
        pytest.fail(f"the command ended without importing {after}")
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=60)
    return process.returncode, [line for line in rest.splitlines() if not line.startswith("import time:")]


@pytest.mark.parametrize("after", START_UP_IMPORTS)
@pytest.mark.parametrize("launcher", [["-m", "orchmllm"], ["-c", CONSOLE_SCRIPT]], ids=["python -m", "console script"])
def test_interrupt_during_start_up_imports_is_one_line_and_exit_130(launcher, after):
    """Ctrl-C while `import orchmllm` loaded numpy and scipy printed a 52-line traceback; a Ctrl-C during the
    stdlib imports atop cli/__init__.py still did through the console script (probe7 P7-01's residual window,
    a few ms: that module now imports nothing before `main` runs)."""
    code, messages = _interrupted_after([*launcher, "compare", "-D", "8"], after)
    assert code == 130, messages
    assert len(messages) == 1 and messages[0] in ("orchmllm: interrupted", "orchmllm compare: interrupted"), messages


@pytest.mark.parametrize("argv, after", [(["compare", "--help"], "hmac"),
                                         (["simulate", "--schedule", "1f1b", "--gpus", "0"], "numpy.ctypeslib")])
def test_regression_an_interrupt_while_parsing_imported_killed_the_process(argv, after):
    """Cause: 4fe2db4 moved the imports of the help's lists and of --schedule's choices into `parse_args`, outside
    `_interrupts_deferred`: a Ctrl-C there printed the one line and then the process died by SIGINT (returncode
    -2; probe51).  A --help that exits after the Ctrl-C is an interrupt too."""
    assert _interrupted_after(["-m", "orchmllm", *argv], after) == (130, ["orchmllm: interrupted"])


def test_regression_an_interrupt_inside_numpy_s_import_was_reported_as_a_bad_numpy_install(monkeypatch, capsys):
    """Cause: a Ctrl-C landing in numpy's C-extension initialisation (under `build_parser`'s imports) becomes numpy's
    ImportError "Importing the numpy C-extensions failed ... bad install", which `main` did not take for an
    interrupt: 57 lines, exit 1 (probe6 P6-06).  The interrupt is now recorded during the imports, raised after."""
    import orchmllm.cli.command as command
    build_parser = command.build_parser

    def interrupted_inside_an_extension():
        try:
            signal.raise_signal(signal.SIGINT)  # Python's handler raises KeyboardInterrupt here, which an ...
        except KeyboardInterrupt as error:  # ... extension's initialisation turns into an ImportError
            raise ImportError("Importing the numpy C-extensions failed.") from error
        return build_parser()
    monkeypatch.setattr(command, "build_parser", interrupted_inside_an_extension)
    assert main(["compare", "-D", "8"]) == 130
    assert capsys.readouterr().err.splitlines() == ["orchmllm: interrupted"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("module", ["orchmllm.cli.errors", "argparse"])
@pytest.mark.parametrize("launcher", ["runpy.run_module('orchmllm', run_name='__main__')",
                                      "from orchmllm.cli import main; sys.exit(main())"],
                         ids=["python -m", "console script"])
def test_regression_an_interrupt_while_the_cli_module_imported_printed_a_traceback(launcher, module):
    """Cause: a Ctrl-C during the stdlib and orchmllm imports atop cli/__init__.py, before main's handler,
    printed a traceback through orchmllm's frames: under `python -m orchmllm` (probe7 P7-01), and still through
    the console script after __main__ caught it (the residual window).  An import hook interrupts `module`."""
    script = ("import runpy, sys\n"
              "class Interrupt:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              f"        if name == {module!r}:\n"
              "            raise KeyboardInterrupt\n"
              "sys.meta_path.insert(0, Interrupt())\n"
              "sys.argv = ['orchmllm', 'compare', '-D', '8']\n"
              f"{launcher}\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (130, "orchmllm: interrupted\n"), done.stderr

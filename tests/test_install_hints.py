"""Every `pip install` command the package shows (README, docstrings, error messages) can work:
orchmllm is installed from its repository, not from an index."""

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
REQUIREMENTS = {re.match(r"[A-Za-z0-9_.-]+", spec).group(): spec for specs in EXTRAS.values() for spec in specs}
COMMAND = re.compile(r"pip install (-e )?['\"]?([^'\"\s`)]+)")


def shown_files():
    return [path for path in (*ROOT.glob("*.md"), *ROOT.rglob("*.py"))
            if not {"tests", "benchmarks", ".git"} & set(path.relative_to(ROOT).parts)]


def install_commands():
    return [(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}", bool(match.group(1)),
             match.group(2)) for path in shown_files() for text in [path.read_text()]
            for match in COMMAND.finditer(text)]


def test_the_hints_are_found():
    where = {place.split(":")[0] for place, _, _ in install_commands()}
    assert {"README.md", "runtime/__init__.py", "cli/demo.py", "cli/plots.py"} <= where


@pytest.mark.parametrize("place, editable, target", install_commands(), ids=lambda value: str(value))
def test_regression_install_hints_named_orchmllm_extras_no_index_serves(place, editable, target):
    """Cause: `pip install 'orchmllm[runtime]'` (and `[testing]`, `[plot]`) asked an index for a
    package that is installed from its repository; pip found nothing."""
    assert not target.startswith("orchmllm"), f"{place}: {target}"
    if target.startswith("."):
        assert editable, f"{place}: {target}"
        extras = re.fullmatch(r"\.(?:\[([a-z,]+)\])?", target)
        assert extras, f"{place}: {target}"
        assert set(filter(None, (extras.group(1) or "").split(","))) <= set(EXTRAS), f"{place}: {target}"
    else:  # a third-party requirement: the one pyproject names, or an exact pin
        name = re.match(r"[A-Za-z0-9_.-]+", target).group()
        assert name in REQUIREMENTS, f"{place}: {target}"
        assert target == REQUIREMENTS[name] or target.startswith(f"{name}=="), f"{place}: {target}"

"""The `>>>` examples in the public docstrings, run as tests (one test per module that has any)."""

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import orchmllm

SKIP_WITHOUT = {"orchmllm.runtime": "torch", "orchmllm.cli.plots": "matplotlib", "orchmllm.testing": "hypothesis"}


def modules_with_examples():
    names = ["orchmllm"] + [info.name for info in pkgutil.walk_packages(orchmllm.__path__, "orchmllm.")
                            if not info.name.startswith(("orchmllm.tests", "orchmllm.benchmarks", "orchmllm.examples"))
                            and info.name != "orchmllm.__main__"]
    found = []
    for name in names:
        needs = next((package for prefix, package in SKIP_WITHOUT.items() if name.startswith(prefix)), None)
        if needs is not None and importlib.util.find_spec(needs) is None:
            continue
        module = importlib.import_module(name)
        if doctest.DocTestFinder().find(module) and any(test.examples for test in doctest.DocTestFinder().find(module)):
            found.append(name)
    return found


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.attempted > 0 and result.failed == 0, (
        f"{result.failed} of {result.attempted} examples failed in {name}")

"""`run_processes` refuses, before any rank starts, what "spawn" and "forkserver" ranks could not receive: a `fn`
they cannot import (a partial's function too), and `args` that do not pickle; each refusal names what and why.
A main module without a file (`python -c`): test_runtime_faults' file-less main test, all three kinds of `fn`."""

import json
import operator
import re

import pytest
import torch

from orchmllm.runtime.launch import run_processes


GUARDED_SCRIPT = '''from orchmllm.runtime.launch import run_processes


def top_level_job(rank, world):
    return rank + 10


if __name__ == "__main__":
    def job(rank, world):
        return rank

    print([outcome.value for outcome in run_processes(top_level_job, 1, start_method="spawn", timeout_s=60)])
    run_processes(job, 2, start_method="spawn", timeout_s=60)
'''


IN_A_FILE = """import json, subprocess, sys, tempfile
from pathlib import Path
with tempfile.TemporaryDirectory() as folder:
    script = Path(folder) / "guarded.py"
    script.write_text(sys.argv[1])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
print(json.dumps({"script": str(script), "returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}))
"""
EARLY = {"guarded script": ("-c", IN_A_FILE, GUARDED_SCRIPT)}  # conftest's started_early: the script in a file


@pytest.mark.early("guarded script")
def test_regression_a_function_defined_under_the_main_guard_failed_to_import_in_every_spawned_rank(started_early):
    """Cause (probe19 P19-13): a `fn` defined under `if __name__ == "__main__":` of a script pickles by name, but
    spawned ranks run the script as '__mp_main__', skipping that block: each failed to import it and its outcome
    said only that it exited.  Now refused before any rank starts; a function at the script's top level runs."""
    wrapper = started_early("guarded script")
    assert wrapper.returncode == 0, wrapper.stderr
    done = json.loads(wrapper.stdout)  # the script's run
    assert done["returncode"] == 1 and done["stdout"] == "[10]\n", done
    assert done["stderr"].strip().splitlines()[-1] == (
        f"TypeError: start_method='spawn' imports `fn` in every rank by its name, and 'job' is defined under "
        f"`if __name__ == '__main__':` in {done['script']}, which the ranks skip (they run the script as "
        f"'__mp_main__'): `fn` must be importable, so define it at the script's top level, outside that block, or "
        f"use start_method='fork'"), done["stderr"]


class Holder:
    def __init__(self, tensor):
        self.tensor = tensor


def test_regression_a_tensor_of_an_autograd_graph_in_args_raised_torchs_pickling_error():
    """Cause (probe19 P19-10): under "spawn" a non-leaf tensor that requires grad among `args` raised torch's raw
    RuntimeError "Cowardly refusing to serialize non-leaf tensor..." from the first rank's start, naming no
    argument.  Now refused before any rank starts, naming the argument (in a list or dict too) and `.detach()`;
    one inside another object is named as `args` that do not pickle."""
    computed = torch.ones(2, requires_grad=True) * 2
    for args, path in (((1, computed), "args[1]"), (([torch.ones(1), {"x": computed}],), "args[0][1]['x']")):
        with pytest.raises(TypeError, match=rf"^`{re.escape(path)}` is a tensor that requires grad and was computed "
                                            rf"by an op \(not a leaf\): start_method='spawn' pickles `args` into every "
                                            rf"rank, and an autograd graph cannot cross processes; pass "
                                            rf"`{re.escape(path)}.detach\(\)` \(its values\), or use "
                                            rf"start_method='fork'$"):
            run_processes(operator.mul, 1, args=args, start_method="spawn")
    with pytest.raises(TypeError, match=r"^start_method='spawn' could not pickle `fn` or `args` into rank 0 "
                                        r"\(RuntimeError: Cowardly refusing"):
        run_processes(operator.mul, 1, args=(Holder(computed),), start_method="spawn")

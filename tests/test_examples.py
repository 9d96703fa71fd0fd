"""The examples and the README's runnable snippets, each run as a subprocess and its output checked: each
started when collection ends (`EARLY`, conftest's `started_early`), in the background of the tests before it."""

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


EARLY_OPTIONS = dict(cwd=ROOT)  # conftest's `started_early`: the examples' commands run where the examples are


def output(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def floats_after(text: str, label: str) -> list[float]:
    return [float(value) for value in re.findall(rf"{label} ([0-9.]+)", text)]


@pytest.mark.early("custom sampler")
def test_custom_sampler_balances_every_step(started_early):
    out = output(started_early("custom sampler"))
    as_sampled, balanced = floats_after(out, "as sampled"), floats_after(out, "post-balanced")
    bounds = floats_after(out, "makespan / lower bound")
    assert len(as_sampled) == len(balanced) == len(bounds) == 3
    assert all(1.0 <= after <= before for before, after in zip(as_sampled, balanced))
    assert all(1.0 <= bound < 1.05 for bound in bounds)
    assert "rank 0 of the last step holds samples [" in out


@pytest.mark.early("calibration")
def test_calibrate_cost_model_fits_and_balances(started_early):
    out = output(started_early("calibration"))
    fitted = re.search(r"fitted f\(l\) = (\S+) \+ (\S+)\*l \+ (\S+)\*l\^2 seconds", out)
    assert fitted and all(float(value) >= 0 for value in fitted.groups())
    assert len(re.findall(r"l=\s*\d+\s+measured", out)) == 9
    slowest = re.search(r"slowest rank ([0-9.]+) ms \(as sampled ([0-9.]+) ms, lower bound ([0-9.]+) ms\)", out)
    after, before, bound = map(float, slowest.groups())
    assert bound <= after <= before


def check_training_output(out: str, ranks: int) -> None:
    ratios = re.findall(r"max/mean ([0-9.]+) -> ([0-9.]+)", out)
    assert len(ratios) == 3
    assert all(1.0 <= float(after) <= float(before) for before, after in ratios)
    losses = [float(value) for value in re.findall(r"loss ([0-9.]+)", out)]
    assert len(losses) == 3 and all(0 < loss < 10 for loss in losses)
    diff, largest = map(float, re.search(rf"max \|diff\| (\S+) \(largest gradient (\S+)\) on {ranks} ranks",
                                         out).groups())
    assert largest > 0 and diff <= 1e-5 * largest  # sums commute: balancing changes only rounding


@pytest.mark.early("training")
def test_training_loop_with_the_dispatcher(started_early):
    check_training_output(output(started_early("training")), ranks=4)


@pytest.mark.early("training under torchrun")
def test_regression_training_example_under_torchrun_exited_1_after_training(started_early):
    """Cause: `import torch._dynamo` inside main() made `torch` a local name there, so the
    torchrun branch's `torch.distributed.destroy_process_group()` raised UnboundLocalError."""
    check_training_output(output(started_early("training under torchrun")), ranks=2)


def readme_snippets() -> list[tuple[str, str]]:
    """Every runnable ```python block of the README with what the README says it prints ('' where it says not)."""
    text = (ROOT / "README.md").read_text()
    return [(block, printed) for block, printed in re.findall(r"```python\n(.*?)```(?:\n\nIt prints `([^`]*)`)?", text,
                                                             re.S) if block.startswith("import ")]


@pytest.mark.parametrize("snippet, printed", [pytest.param(snippet, printed, marks=pytest.mark.early(snippet))
                                               for snippet, printed in readme_snippets()],
                         ids=lambda value: value.splitlines()[-1][:40] if value else "")
def test_readme_snippet_runs(snippet, printed, started_early):
    """Each runnable block runs; where the README says what it prints, it prints that (the pipeline block's figures
    had drifted from what it printed, probe8 P8-09)."""
    out = output(started_early(snippet))
    assert not printed or out.strip() == printed, out


def test_readme_has_runnable_snippets_and_the_quick_start():
    assert len(readme_snippets()) >= 2 and sum(bool(printed) for _, printed in readme_snippets()) >= 2
    text = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci in text  # the README's test command is exactly the CI command
    assert "python3.11 -m pip install -e . && orchmllm compare" in text


@pytest.mark.early("fsdp2 under torchrun")
def test_multimodal_fsdp2_example_under_torchrun_matches_one_float64_pass(started_early):
    """Encoders, token embedding and LLM each `fully_shard`ed, the root too, the runtime inside the
    root's forward: step 0's gradients equal one pass over the global batch in one process."""
    out = output(started_early("fsdp2 under torchrun"))
    losses = [float(value) for value in re.findall(r"step \d: loss ([0-9.]+)", out)]
    assert len(losses) == 3 and all(0 < loss < 10 for loss in losses)
    balance = [tuple(map(float, pair)) for pair in re.findall(r"(?:vision|audio|llm) ([0-9.]+) -> ([0-9.]+)", out)]
    assert len(balance) == 9 and all(before >= 1.0 and after >= 1.0 for before, after in balance)
    assert sum(after for _, after in balance) < sum(before for before, _ in balance)
    diff, largest = map(float, re.search(r"max \|diff\| (\S+) \(largest gradient (\S+)\) on 3 ranks", out).groups())
    assert largest > 0 and diff <= 1e-12 * largest


def code_lines(text: str) -> list[str]:
    """Non-blank lines without comments or indentation."""
    return [line.split("  #")[0].strip() for line in text.splitlines() if line.split("  #")[0].strip()]


def test_readme_fsdp2_pattern_is_the_example_the_tests_run():
    """The README's multi-stage pattern (`text_embedding=llm.embed` with only `fully_shard(llm)`)
    failed under FSDP2 with "mixed torch.Tensor and DTensor": its lines are now the example's, in order."""
    text = (ROOT / "README.md").read_text()
    block = next(block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "fully_shard(model)" in block)
    example = code_lines((ROOT / "examples" / "train_multimodal_fsdp.py").read_text())
    position = 0
    for line in code_lines(block):
        if line.startswith(("import ", "from ")):
            assert line in example, line
            continue
        assert line in example[position:], f"README line not in the example (in order): {line}"
        position = example.index(line, position) + 1


def module_names(source: str) -> set[str]:
    """The names the imports of `source` bind (`torch`, `nn`, `F`, ...)."""
    return {alias.asname or alias.name.split(".")[0] for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


def test_regression_the_readme_fsdp2_block_used_torch_without_importing_it():
    """Cause: the block annotated `-> tuple[torch.Tensor, torch.Tensor]` but imported only `from torch import nn` and
    `torch.nn.functional as F`: a copy failed with NameError at its first class (probe8 P8-09).  Every module its
    example imports that the block uses (`name.attribute`) is imported in the block too."""
    text = (ROOT / "README.md").read_text()
    block = next(block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "fully_shard(model)" in block)
    modules = module_names((ROOT / "examples" / "train_multimodal_fsdp.py").read_text())
    used = {node.value.id for node in ast.walk(ast.parse(block))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)}
    assert (used & modules) - module_names(block) == set()


def test_regression_readme_micro_batch_snippet_gave_the_model_no_sample_lengths():
    """Cause: the snippet called `loss_sum(model, micro.data)`: packed attention needs each
    sample's length, which it did not show.  The snippet runs here as written, on one process,
    and the model sees every sample's tokens with their lengths."""
    import torch
    from torch import nn

    text = (ROOT / "README.md").read_text()
    snippet = next(block for block in re.findall(r"```python\n(.*?)```", text, re.S)
                   if "dispatcher.microbatches(plan, moved)" in block)

    class PackedModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Embedding(11, 11)
            self.seen = []

        def forward(self, ids, lengths):
            self.seen += [part.tolist() for part in ids.split(lengths.tolist())]
            return self.head(ids)

    lengths = [5, 1, 7]
    ids = torch.arange(sum(lengths)) % 11
    model = PackedModel()
    exec(snippet, {"local_lengths": lengths, "local_loss_tokens": lengths, "model": model,
                   "batch": {"input_ids": ids, "labels": ids.roll(-1)}})
    assert sorted(model.seen) == sorted(part.tolist() for part in ids.split(lengths))
    assert all(p.grad is not None for p in model.parameters())


def slowed_toolkit_block() -> str:
    """The README's toolkit block with every draw slowed as a busy machine slows it."""
    snippet = next(block for block, _ in readme_snippets() if "@given(problems(" in block)
    return ("import time\nimport orchmllm.testing as testing\ndrawn = testing.problems\n"
            "testing.problems = lambda **options: drawn(**options).map(lambda case: time.sleep(0.15) or case)\n"
            + snippet)


@pytest.mark.early("slowed toolkit block")
def test_regression_the_readme_toolkit_block_failed_hypothesis_s_health_check_on_a_busy_machine(started_early):
    """Cause: the block built its own `settings` without suppressing Hypothesis's `too_slow` health check, which
    the toolkit's draws (whole cases) fail on a loaded machine: FailedHealthCheck in 2 runs of 3 at load 12
    (probe10 P10-05).  Here every draw is slowed (`slowed_toolkit_block`)."""
    output(started_early("slowed toolkit block"))


TORCHRUN = ["-m", "torch.distributed.run", "--standalone"]
EARLY = {"custom sampler": ("examples/custom_sampler.py",),  # conftest's `started_early`
         "calibration": ("examples/calibrate_cost_model.py",),
         "training": ("examples/train_with_dispatcher.py",),
         "training under torchrun": (*TORCHRUN, "--nproc-per-node", "2", "examples/train_with_dispatcher.py"),
         "fsdp2 under torchrun": (*TORCHRUN, "--nproc-per-node", "3", "examples/train_multimodal_fsdp.py"),
         "slowed toolkit block": ("-c", slowed_toolkit_block()),
         **{snippet: ("-c", snippet) for snippet, _ in readme_snippets()}}

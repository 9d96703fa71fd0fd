"""BalancedDistributedSampler: every sample once per epoch, the global batch split exactly,
the same shares in separate processes, and balanced work on the default mix."""

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from orchmllm.runtime.sampler import BalancedDistributedSampler  # noqa: E402
from orchmllm.study.workloads import sample_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPLICAS, EPOCHS, GLOBAL_BATCH = 4, 3, 64


def default_mix_lengths(count, seed=0):
    return sample_workload("default", 1, count, seed=seed).sample_llm_length


def samplers(lengths, **options):
    return [BalancedDistributedSampler(lengths, num_replicas=REPLICAS, rank=rank, **options) for rank in range(REPLICAS)]


def epoch_shares(ranks, epoch):
    for sampler in ranks:
        sampler.set_epoch(epoch)
    return [list(sampler) for sampler in ranks]  # [rank][step] -> indices


@pytest.mark.parametrize("size, drop_last", [(640, True), (650, False), (650, True)],
                         ids=["divisible", "remainder-balanced", "remainder-dropped"])
def test_every_index_once_per_epoch_and_each_step_is_its_global_batch(size, drop_last):
    lengths = default_mix_lengths(size)
    ranks = samplers(lengths, global_batch_size=GLOBAL_BATCH, seed=7, drop_last=drop_last)
    orders = []
    for epoch in range(EPOCHS):
        shares = epoch_shares(ranks, epoch)
        batches = ranks[0].global_batches()
        assert all(len(rank_shares) == len(ranks[0]) == len(batches) for rank_shares in shares)
        for step, batch in enumerate(batches):
            union = sorted(index for rank_shares in shares for index in rank_shares[step])
            assert union == sorted(batch.tolist())  # no index twice, none lost
        seen = sorted(index for rank_shares in shares for step in rank_shares for index in step)
        expected = size - (size % GLOBAL_BATCH if drop_last else 0)
        assert len(seen) == len(set(seen)) == expected
        if expected == size:
            assert seen == list(range(size))
        orders.append(np.concatenate(batches).tolist())
    assert orders[0] != orders[1] != orders[2]  # set_epoch reshuffles


def test_load_is_balanced_at_16_samples_per_rank_on_the_default_mix():
    lengths = default_mix_lengths(40 * GLOBAL_BATCH, seed=1)
    ranks = samplers(lengths, global_batch_size=16 * REPLICAS)
    ratios = []
    for step in zip(*ranks):
        loads = np.array([lengths[share].sum() for share in step], dtype=np.float64)
        ratios.append(loads.max() / loads.mean())
    as_sampled = lengths[np.concatenate(ranks[0].global_batches())].reshape(-1, REPLICAS, 16).sum(axis=2)
    assert max(ratios) <= 1.01
    assert np.mean(as_sampled.max(axis=1) / as_sampled.mean(axis=1)) > 1.05  # there was imbalance to remove


@pytest.mark.parametrize("size, drop_last, budget", [(320, True, 6000), (330, False, 4096)],
                         ids=["divisible-T6000", "remainder-balanced-T4096"])
def test_microbatch_mode_yields_every_index_once_in_the_same_m_cells_within_t(size, drop_last, budget):
    lengths = np.minimum(default_mix_lengths(size), budget)
    ranks = samplers(lengths, global_batch_size=GLOBAL_BATCH, seed=3, drop_last=drop_last,
                     max_tokens_per_microbatch=budget)
    for epoch in range(EPOCHS):
        shares = epoch_shares(ranks, epoch)  # [rank][micro-batch of the epoch] -> indices
        counts = [sampler.microbatches_per_step() for sampler in ranks]
        assert all(count == counts[0] for count in counts)  # the same M on every rank, step by step
        assert all(len(rank_shares) == sum(counts[0]) == len(ranks[0]) for rank_shares in shares)
        assert max(counts[0]) > 1  # the budget does split steps
        starts = np.cumsum([0] + counts[0])
        for step, batch in enumerate(ranks[0].global_batches()):
            cells = [rank_shares[starts[step]:starts[step + 1]] for rank_shares in shares]
            assert all(int(lengths[cell].sum()) <= budget for rank_cells in cells for cell in rank_cells)
            union = sorted(index for rank_cells in cells for cell in rank_cells for index in cell)
            assert union == sorted(batch.tolist())
        seen = sorted(index for rank_shares in shares for cell in rank_shares for index in cell)
        assert len(seen) == len(set(seen)) == size - (size % GLOBAL_BATCH if drop_last else 0)


def test_microbatch_mode_beats_the_unbalanced_cells_of_the_random_split():
    """Each step's Σ_m max_r cell tokens is within 5 % of its bound and below what the sampled split would give."""
    lengths = default_mix_lengths(8 * GLOBAL_BATCH, seed=2)
    sampler = samplers(lengths, global_batch_size=GLOBAL_BATCH, max_tokens_per_microbatch=8192)[0]
    plans = [sampler.plan(batch) for batch in sampler.global_batches()]
    assert all(plan.step_cost <= 1.05 * plan.lower_bound for plan in plans)


SHARES_OF_ONE_RANK = """
import json, sys
import numpy as np
from orchmllm.runtime.sampler import BalancedDistributedSampler
from orchmllm.study.workloads import sample_workload
rank = int(sys.argv[1])
lengths = sample_workload("default", 1, 256, seed=0).sample_llm_length
shares = {}
for budget in json.loads(sys.argv[2]):
    sampler = BalancedDistributedSampler(lengths, num_replicas=4, rank=rank, global_batch_size=64, seed=11,
                                         max_tokens_per_microbatch=budget)
    shares[str(budget)] = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        shares[str(budget)].append(list(sampler))
json.dump(shares, sys.stdout)
"""
BUDGETS = [None, 8192]  # whole shares, and micro-batches within 8192 tokens


def test_separate_processes_compute_the_same_shares():
    """Four processes, each with its own hash seed, each computing only its own rank's shares and micro-batches."""
    children = [subprocess.Popen([sys.executable, "-c", SHARES_OF_ONE_RANK, str(rank), json.dumps(BUDGETS)],
                                 stdout=subprocess.PIPE, env={**os.environ, "PYTHONHASHSEED": str(rank + 1),
                                                              "PYTHONPATH": os.pathsep.join(sys.path)}, cwd=ROOT)
                for rank in range(REPLICAS)]
    outputs = [json.loads(child.communicate(timeout=240)[0]) for child in children]
    assert all(child.returncode == 0 for child in children)
    for budget in BUDGETS:
        theirs = [output[str(budget)] for output in outputs]
        ranks = samplers(default_mix_lengths(256), global_batch_size=GLOBAL_BATCH, seed=11,
                         max_tokens_per_microbatch=budget)
        for epoch in range(EPOCHS):
            assert [shares[epoch] for shares in theirs] == epoch_shares(ranks, epoch)
        for epoch in range(EPOCHS):
            seen = sorted(i for shares in theirs for step in shares[epoch] for i in step)
            assert seen == list(range(256))


@pytest.mark.parametrize("options, error, message", [
    (dict(rank=4), ValueError, r"`rank` must be in \[0, num_replicas=4\); got 4"),
    (dict(global_batch_size=3), ValueError, r"`global_batch_size` must be >= 4; got 3"),
    (dict(global_batch_size=200), ValueError, r"`global_batch_size` 200 exceeds the 100 samples"),
    (dict(num_replicas=8, global_batch_size=32, drop_last=False), ValueError,
     r"drop_last=False leaves a last global batch of 4 samples \(100 % 32\) for 8 replicas"),
    (dict(num_replicas=2.0), TypeError, r"`num_replicas` must be an int; got float"),
    (dict(drop_last="no"), TypeError, r"`drop_last` must be a bool; got str"),
    (dict(max_tokens_per_microbatch=99), ValueError,
     r"`max_tokens_per_microbatch`=99 is below the 100 tokens of sample 99; every sample must fit one micro-batch"),
    (dict(max_tokens_per_microbatch=0), ValueError, r"`max_tokens_per_microbatch` must be >= 1; got 0"),
], ids=["rank", "batch-below-replicas", "batch-above-dataset", "remainder-below-replicas", "float-replicas",
        "drop-last-str", "budget-below-a-sample", "budget-zero"])
def test_bad_arguments_are_rejected_naming_them(options, error, message):
    arguments = dict(num_replicas=REPLICAS, rank=0, global_batch_size=16)
    arguments.update(options)
    with pytest.raises(error, match=message):
        BalancedDistributedSampler(np.arange(1, 101), **arguments)


def test_microbatches_per_step_needs_a_token_budget():
    sampler = BalancedDistributedSampler(np.arange(1, 101), num_replicas=REPLICAS, rank=0, global_batch_size=16)
    with pytest.raises(ValueError, match="`microbatches_per_step` needs `max_tokens_per_microbatch`"):
        sampler.microbatches_per_step()


def run_example(name):
    result = subprocess.run([sys.executable, f"examples/{name}"], capture_output=True, text=True, timeout=300,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_ddp_example_trains_on_balanced_shares_over_gloo():
    out = run_example("train_with_balanced_sampler.py")
    before, after, worst = map(float, re.search(
        r"max/mean: random split ([0-9.]+) -> balanced shares ([0-9.]+) \(worst step ([0-9.]+)\)", out).groups())
    assert after <= worst <= 1.01 < before
    assert "every sample exactly once per epoch: True" in out
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+)", out).groups())
    assert 0 < last < first < 10


def test_hf_trainer_example_runs_and_says_whether_the_trainer_was_built():
    out = run_example("hf_trainer_balanced_sampler.py")
    steps = re.search(r"rank 0 of 4: (\d+) steps, samples per step \[([0-9, ]+)\]", out)
    assert steps and int(steps.group(1)) == 4
    trainer_built = "BalancedTrainer overrides get_train_dataloader" in out
    assert trainer_built != ("transformers is not installed: the Trainer subclass was skipped" in out)


def test_hf_trainer_subclass_builds_the_balanced_dataloader():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from hf_trainer_balanced_sampler import make_trainer_class
    finally:
        sys.path.remove(str(ROOT / "examples"))
    assert make_trainer_class().get_train_dataloader.__qualname__.startswith("make_trainer_class.")

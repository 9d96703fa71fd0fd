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

import torch.distributed as dist  # noqa: E402

from orchmllm.balancers import CostModel  # noqa: E402
from orchmllm.runtime import ConfigMismatchError  # noqa: E402
from orchmllm.runtime.launch import run_processes  # noqa: E402
from orchmllm.runtime.sampler import BalancedDistributedSampler  # noqa: E402
from orchmllm.study.workloads import sample_workload  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
REPLICAS, EPOCHS, GLOBAL_BATCH = 4, 3, 64


def default_mix_lengths(count, seed=0):
    return sample_workload("default", 1, count, seed=seed).sample_llm_length


def samplers(lengths, **options):
    return [BalancedDistributedSampler(lengths, num_replicas=REPLICAS, rank=rank, **options)
            for rank in range(REPLICAS)]


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


SHARES_OF_SOME_RANKS = """
import json, sys
import numpy as np
from orchmllm.runtime.sampler import BalancedDistributedSampler
from orchmllm.study.workloads import sample_workload
lengths = sample_workload("default", 1, 256, seed=0).sample_llm_length
shares = {}
for rank in json.loads(sys.argv[1]):
    for budget in json.loads(sys.argv[2]):
        sampler = BalancedDistributedSampler(lengths, num_replicas=4, rank=rank, global_batch_size=64, seed=11,
                                             max_tokens_per_microbatch=budget)
        shares[f"{rank} {budget}"] = []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            shares[f"{rank} {budget}"].append(list(sampler))
json.dump(shares, sys.stdout)
"""
BUDGETS = [None, 8192]  # whole shares, and micro-batches within 8192 tokens


PROCESS_RANKS = [[2, 0], [3, 1]]  # the ranks each process computes, in this order, a sampler each


EARLY_OPTIONS = dict(cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
"""conftest's `started_early`: processes run where the examples are, seeing this process's modules."""
EARLY = {
    **{f"shares {seed}": dict(args=("-c", SHARES_OF_SOME_RANKS, json.dumps(ranks), json.dumps(BUDGETS)),
                              env={**EARLY_OPTIONS["env"], "PYTHONHASHSEED": str(seed)})
       for seed, ranks in enumerate(PROCESS_RANKS, start=1)},
    "ddp example": ("examples/train_with_balanced_sampler.py",),
    "ddp example under torchrun": ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                   "examples/train_with_balanced_sampler.py"),
    "hf example": ("examples/hf_trainer_balanced_sampler.py",)}


@pytest.mark.early("shares 1")
@pytest.mark.early("shares 2")
def test_separate_processes_compute_the_same_shares(started_early):
    """Two processes, each with its own hash seed (and this one's, a third), each rank's sampler computing only its
    own rank's shares and micro-batches.  Each process starts by importing torch (most of its time): two, not one
    per rank."""
    outputs = {}
    for seed in range(1, len(PROCESS_RANKS) + 1):
        child = started_early(f"shares {seed}")
        assert child.returncode == 0, child.stderr
        outputs.update(json.loads(child.stdout))
    for budget in BUDGETS:
        theirs = [outputs[f"{rank} {budget}"] for rank in range(REPLICAS)]
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
    # it advised "pass padded=True", an argument the sampler does not have, at the first iter()
    (dict(algorithm="padded"), ValueError, r"`algorithm` 'padded' balances padded batches only; the sampler balances"),
    (dict(algorithm="nope"), ValueError, r"unknown `algorithm` 'nope'"),
    (dict(algorithm="lpt", max_tokens_per_microbatch=200), ValueError, r"unknown `algorithm` 'lpt'"),
], ids=["rank", "batch-below-replicas", "batch-above-dataset", "remainder-below-replicas", "float-replicas",
        "drop-last-str", "budget-below-a-sample", "budget-zero", "padded-only-algorithm", "unknown-algorithm",
        "balancer-as-microbatch-algorithm"])
def test_bad_arguments_are_rejected_naming_them(options, error, message):
    arguments = dict(num_replicas=REPLICAS, rank=0, global_batch_size=16)
    arguments.update(options)
    with pytest.raises(error, match=message):
        BalancedDistributedSampler(np.arange(1, 101), **arguments)


def test_microbatches_per_step_needs_a_token_budget():
    sampler = BalancedDistributedSampler(np.arange(1, 101), num_replicas=REPLICAS, rank=0, global_batch_size=16)
    with pytest.raises(ValueError, match="`microbatches_per_step` needs `max_tokens_per_microbatch`"):
        sampler.microbatches_per_step()


def output(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def check_sampler_example(out, ranks):
    assert f"{ranks} ranks, " in out
    before, after, worst = map(float, re.search(
        r"max/mean: random split ([0-9.]+) -> balanced shares ([0-9.]+) \(worst step ([0-9.]+)\)", out).groups())
    assert after <= worst <= 1.01 < before
    assert "every sample exactly once per epoch: True" in out
    first, last = map(float, re.search(r"loss ([0-9.]+) -> ([0-9.]+)", out).groups())
    assert 0 < last < first < 10


@pytest.mark.early("ddp example")
def test_ddp_example_trains_on_balanced_shares_over_gloo(started_early):
    check_sampler_example(output(started_early("ddp example")), ranks=4)


@pytest.mark.early("ddp example under torchrun")
def test_regression_the_sampler_example_under_torchrun_started_local_ranks_of_its_own(started_early):
    """Cause: `main()` asked `is_distributed()`, false under torchrun until the process group is made, so
    every torchrun rank spawned 4 local ranks of its own, which failed at their rendezvous (probe7 P7-07)."""
    check_sampler_example(output(started_early("ddp example under torchrun")), ranks=2)


@pytest.mark.early("hf example")
def test_hf_trainer_example_runs_and_says_whether_the_trainer_was_built(started_early):
    out = output(started_early("hf example"))
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


LENGTHS_48 = np.arange(1, 49) * 7 % 61 + 1


def _lengths_one_sample_longer(rank):
    return np.append(LENGTHS_48, 5) if rank == 1 else LENGTHS_48


def _lengths_one_length_off(rank):
    lengths = LENGTHS_48.copy()
    lengths[17] += rank == 1
    return lengths


# What process 1 of 3 passes differently (a function of the process's rank); the other options agree.
DISAGREEMENTS = {
    "agree": dict(),
    "one sample longer": dict(lengths=_lengths_one_sample_longer),
    "one sample's length": dict(lengths=_lengths_one_length_off),
    "seed": dict(seed=lambda rank: 5 if rank == 1 else 0),
    "cost model": dict(cost=lambda rank: CostModel(quadratic=1e-3) if rank == 1 else None),
    "algorithm": dict(algorithm=lambda rank: "lpt" if rank == 1 else "auto"),
    "budget": dict(max_tokens_per_microbatch=lambda rank: 200 if rank == 1 else 400),
    "epoch": dict(epoch=lambda rank: 1 if rank == 1 else 0),
    "rank": dict(rank=lambda rank: 0 if rank == 1 else rank),
    "opt-out, seed": dict(seed=lambda rank: 5 if rank == 1 else 0, check_agreement=lambda rank: False),
}


def disagreeing_sampler_job(rank, size):
    """Every case on one gloo group of 3 processes; each process returns what it yielded or raised."""
    outcomes = {}
    for case, odd in DISAGREEMENTS.items():
        options = dict(lengths=LENGTHS_48, rank=rank, seed=0, epoch=0, global_batch_size=12)
        options.update({key: choose(rank) for key, choose in odd.items()})
        epoch = options.pop("epoch")
        sampler = BalancedDistributedSampler(options.pop("lengths"), num_replicas=size, **options)
        sampler.set_epoch(epoch)
        try:
            outcomes[case] = ("ok", list(sampler), [batch.tolist() for batch in sampler.global_batches()])
        except ConfigMismatchError as error:
            outcomes[case] = (type(error).__name__, str(error))
    # Only processes 0 and 1 iterate: their sampler checks on their own group, process 2 stays out.
    pair = dist.new_group([0, 1])
    if rank < 2:
        outcomes["subgroup"] = ("ok", list(BalancedDistributedSampler(LENGTHS_48, num_replicas=2, rank=rank,
                                                                      global_batch_size=12, group=pair)))
    return outcomes


@pytest.fixture(scope="module")
def disagreement_outcomes():
    outcomes = run_processes(disagreeing_sampler_job, 3, timeout_s=120, collective_timeout_s=30)
    assert all(outcome.ok for outcome in outcomes), [outcome.error for outcome in outcomes]
    return [outcome.value for outcome in outcomes]


@pytest.mark.parametrize("case, settings", [
    ("one sample longer", ["len(lengths)", "lengths"]),
    ("one sample's length", ["lengths"]),
    ("seed", ["seed"]),
    ("cost model", ["cost"]),
    ("algorithm", ["algorithm"]),
    ("budget", ["max_tokens_per_microbatch"]),
    ("epoch", ["epoch"]),
])
def test_ranks_that_disagree_on_a_setting_all_raise_naming_it(disagreement_outcomes, case, settings):
    """Cause: each rank planned its own batches unchecked, so the shares silently duplicated, dropped or
    invented samples; the check once per epoch names the setting and the odd rank on every rank."""
    for rank, outcomes in enumerate(disagreement_outcomes):
        kind, message = outcomes[case]
        assert kind == "ConfigMismatchError"
        assert re.match(rf"BalancedDistributedSampler configuration differs across ranks \(seen from rank {rank}\): "
                        rf"ranks \[1\] disagree with ranks \[0, 2\] \(.*\); settings that differ: `", message)
        named = re.findall(r"`([^`]+)` \(ranks \[0, 2\]: [^;]*; ranks \[1\]: [^)]*\)", message)
        assert named == settings, message
        assert message.endswith("else the shares duplicate or drop samples")


def test_the_disagreeing_values_are_shown(disagreement_outcomes):
    messages = {case: disagreement_outcomes[0][case][1] for case in ("seed", "cost model", "one sample's length")}
    assert "(ranks [0, 2]: 0; ranks [1]: 5)" in messages["seed"]
    assert ("(ranks [0, 2]: CostModel(per_item=0.0, linear=1.0, quadratic=0.0); "
            "ranks [1]: CostModel(per_item=0.0, linear=1.0, quadratic=0.001))") in messages["cost model"]
    total = int(LENGTHS_48.sum())
    assert re.search(rf"ranks \[0, 2\]: 48 lengths summing to {total}, sha256 [0-9a-f]{{12}}; "
                     rf"ranks \[1\]: 48 lengths summing to {total + 1}, sha256 [0-9a-f]{{12}}\)",
                     messages["one sample's length"])


def test_two_processes_with_one_rank_all_raise_naming_them(disagreement_outcomes):
    for rank, outcomes in enumerate(disagreement_outcomes):
        assert outcomes["rank"] == ("ConfigMismatchError", (
            "BalancedDistributedSampler's `rank`: the 3 processes of the group must hold every rank in "
            f"[0, num_replicas=3) equally often (seen from rank {rank}: rank 0: processes [0, 1], rank 1: processes "
            "[]); every rank must pass the same dataset and options (and call set_epoch alike), else the shares "
            "duplicate or drop samples"))


def test_ranks_that_agree_yield_each_step_of_their_global_batch_once(disagreement_outcomes):
    ranks = [outcomes["agree"] for outcomes in disagreement_outcomes]
    assert all(kind == "ok" for kind, _, _ in ranks)
    batches = ranks[0][2]
    for step, batch in enumerate(batches):
        assert sorted(index for _, shares, _ in ranks for index in shares[step]) == sorted(batch)
    assert sorted(index for batch in batches for index in batch) == list(range(48))


def test_opting_out_skips_the_check_and_its_silent_loss(disagreement_outcomes):
    """With check_agreement=False the ranks are trusted: here rank 1's other seed loses and duplicates samples."""
    ranks = [outcomes["opt-out, seed"] for outcomes in disagreement_outcomes]
    assert all(kind == "ok" for kind, _, _ in ranks)
    seen = [index for _, shares, _ in ranks for step in shares for index in step]
    assert len(set(seen)) < 48 < len(seen)  # samples lost, others yielded twice


def test_the_check_runs_on_the_group_given(disagreement_outcomes):
    shares = [outcomes["subgroup"][1] for outcomes in disagreement_outcomes[:2]]
    assert "subgroup" not in disagreement_outcomes[2]
    assert sorted(index for rank_shares in shares for step in rank_shares for index in step) == list(range(48))


def dead_peer_sampler_job(rank, size):
    """Rank 1 exits before iterating; rank 0 reports what its epoch check raised."""
    from orchmllm.runtime import PeerFailureError
    if rank == 1:
        os._exit(0)
    sampler = BalancedDistributedSampler(np.arange(1, 17), num_replicas=2, rank=rank, global_batch_size=4)
    try:
        return len(list(sampler))
    except PeerFailureError as error:
        return str(error)


def test_regression_the_sampler_s_epoch_check_with_a_dead_peer_raised_gloo_s_raw_error():
    """Cause: the epoch agreement's all-gather was the one collective not wrapped: gloo's "Connection reset by
    peer" named neither the sampler nor its collective."""
    outcomes = run_processes(dead_peer_sampler_job, 2, timeout_s=60, collective_timeout_s=10)
    assert outcomes[0].ok, outcomes[0].error
    assert outcomes[0].value.startswith("rank 0: the BalancedDistributedSampler's epoch agreement all-gather (every "
                                        "process of `group` iterates the sampler, or passes check_agreement=False) "
                                        "over 2 ranks failed; a peer died"), outcomes[0].value


def test_regression_the_sampler_s_own_lengths_made_writable_and_edited_kept_the_old_plans():
    """Cause (probe11 P11-05, probe12 P12-L1 = review8 R8-09): the plans were kept while `lengths` was the same
    read-only array, so the sampler's own copy made writable again and edited after first use (then locked again
    or not) kept the old plan: micro-batches of 158 tokens against a budget of 80.  Its copy is now over immutable
    bytes: it cannot be made writable again."""
    sampler = BalancedDistributedSampler(list(range(5, 69)), num_replicas=2, rank=0, global_batch_size=16,
                                         max_tokens_per_microbatch=80)
    first = [list(micro) for micro in sampler]
    for given in (sampler.lengths, np.frombuffer(sampler.lengths.tobytes(), dtype=np.int64).copy()):
        given.flags.writeable = False  # a read-only array of the user's, given as the lengths, is copied too
        sampler.lengths = given
        assert [list(micro) for micro in sampler] == first
        with pytest.raises(ValueError, match="cannot set WRITEABLE flag to True"):
            sampler.lengths.flags.writeable = True
    assert max(int(sampler.lengths[micro].sum()) for micro in first) <= 80


def another_solver_job(rank, size, batch_size):
    """Ranks whose `algorithm` of one name plans differently (rank 1's mirrors the ranks, as another version of a
    plugin or of orchmllm may; on batches of other than 15 items only, with `batch_size` 15: on the epoch's
    incomplete last batch): what iterating the sampler raised."""
    from orchmllm import register_algorithm
    from orchmllm.balancers import ALGORITHMS

    lpt = ALGORITHMS["lpt"].kernel
    register_algorithm("test_versioned_lpt", lambda problem: lpt(problem) if rank == 0 or (
        batch_size == 15 and problem.lengths.size == 15) else
        lpt(problem)._replace(assignment=problem.num_ranks - 1 - lpt(problem).assignment))
    lengths = np.random.default_rng(0).integers(5, 40, 64)
    sampler = BalancedDistributedSampler(lengths, num_replicas=size, rank=rank, global_batch_size=batch_size,
                                         algorithm="test_versioned_lpt", drop_last=False)
    try:
        return len(list(sampler))
    except ConfigMismatchError as error:
        return str(error)


@pytest.mark.parametrize("batch_size", [16, 15], ids=["every step", "the last step"])
def test_regression_ranks_whose_solver_differs_under_one_algorithm_name_passed_the_epoch_check(batch_size):
    """Cause (probe12 P12-07): the epoch check fingerprinted the algorithm's name, so ranks running another version
    of it (a cluster half-upgraded) passed and their shares duplicated half the samples and dropped the other half
    (64 yielded, 32 distinct); P12-12: only on the epoch's incomplete last batch, 2 twice and 2 never.  A digest of
    each rank's plans of the epoch (every step's: fix58) now rides with the settings."""
    outcomes = run_processes(another_solver_job, 2, args=(batch_size,), timeout_s=90, collective_timeout_s=30)
    for outcome in outcomes:
        assert outcome.ok, outcome.error
        assert "settings that differ: `plans of the epoch`" in outcome.value, outcome.value
        assert "(only the plans differ: another orchmllm version or algorithm implementation on some ranks, or an " \
               "algorithm whose plans depend on the process" in outcome.value, outcome.value


def overflowing_cost_job(rank, size):
    """Rank 1 plans with a cost that overflows float64 (a setting the ranks disagree on): what iterating raised."""
    cost = CostModel(quadratic=1e305) if rank == 1 else None
    sampler = BalancedDistributedSampler(np.arange(1, 65), num_replicas=size, rank=rank, global_batch_size=16,
                                         cost=cost)
    try:
        return len(list(sampler))
    except ConfigMismatchError as error:
        return f"ConfigMismatchError: {error} (from {type(error.__cause__).__name__})"


def test_regression_a_rank_whose_settings_made_planning_fail_left_the_agreement_gather():
    """Cause (review8 R8-21): the epoch check planned (its plans' digest) before its all-gather, so a rank whose
    differing setting made planning fail (a cost overflowing float64) raised alone and its peer died in the
    gather ("a peer died").  The failing rank joins the gather with "planning failed" for a digest, and every rank
    names the setting that differs."""
    outcomes = run_processes(overflowing_cost_job, 2, timeout_s=90, collective_timeout_s=30)
    for outcome in outcomes:
        assert outcome.ok, outcome.error
        assert outcome.value.startswith("ConfigMismatchError") and "settings that differ: `cost`" in outcome.value, \
            outcome.value
    assert outcomes[1].value.endswith("(from ValueError)") and outcomes[0].value.endswith("(from NoneType)")


def late_setting_job(rank, size, setting, value):
    """Rank 1 sets `setting` to an invalid `value` after construction (a public attribute): what iterating raised."""
    sampler = BalancedDistributedSampler(np.arange(1, 65), num_replicas=size, rank=rank, global_batch_size=16,
                                         max_tokens_per_microbatch=200)
    if rank == 1:
        setattr(sampler, setting, value)
    try:
        return len(list(sampler))
    except ConfigMismatchError as error:
        return f"ConfigMismatchError: {error} (from {type(error.__cause__).__name__})"


@pytest.mark.parametrize("setting, value", [("max_tokens_per_microbatch", 10), ("algorithm", "ilp")])
def test_regression_a_setting_made_invalid_after_construction_on_one_rank_left_the_agreement_gather(setting, value):
    """Cause (probe13 P13-11): `__iter__` checked the settings before the epoch check's all-gather, so a rank whose
    setting was made invalid after construction raised alone and its peer died in the gather ("a peer died").
    The check runs in the failure path that joins the gather: every rank names the setting that differs."""
    outcomes = run_processes(late_setting_job, 2, args=(setting, value), timeout_s=90, collective_timeout_s=30)
    for outcome in outcomes:
        assert outcome.ok, outcome.error
        assert outcome.value.startswith("ConfigMismatchError") and f"settings that differ: `{setting}`" in \
            outcome.value, outcome.value
    assert outcomes[1].value.endswith("(from ValueError)") and outcomes[0].value.endswith("(from NoneType)")


@pytest.mark.parametrize("copy_of", ["pickle", "deepcopy"])
def test_regression_a_copied_sampler_s_lengths_edited_in_place_kept_the_old_plans(copy_of):
    """Cause (probe13 P13-08): a pickled or deep-copied sampler's `lengths` came back writable while its kept plans
    still knew the array by identity, so lengths edited in place planned nothing anew (micro-batches of 316 tokens
    against a budget of 80).  A writable `lengths` is taken as new lengths: checked, locked and planned again."""
    import copy
    import pickle
    lengths = np.random.default_rng(0).integers(5, 40, 64)
    sampler = BalancedDistributedSampler(lengths, num_replicas=2, rank=0, global_batch_size=16,
                                         max_tokens_per_microbatch=80)
    list(sampler)
    copied = pickle.loads(pickle.dumps(sampler)) if copy_of == "pickle" else copy.deepcopy(sampler)
    copied.lengths[:] = 79
    micros = list(copied)
    assert micros and max(int(copied.lengths[list(micro)].sum()) for micro in micros) <= 80
    assert not copied.lengths.flags.writeable


GROUP_MESSAGE = r"^`group` must be a torch.distributed ProcessGroup, or None for the default group; got "


def group_of_ranks_job(rank, size):
    """A sampler whose `group` is set to a list of ranks after it was built, then a correct one whose
    `microbatches(loader, group=)` gets the list: what each raised."""
    lengths = np.random.default_rng(0).integers(1, 100, 64)
    sampler = BalancedDistributedSampler(lengths, num_replicas=size, rank=rank, global_batch_size=8,
                                         max_tokens_per_microbatch=200)
    sampler.group, raised = list(range(size)), []
    for call in (lambda: next(iter(sampler)), lambda: next(iter(sampler.microbatches([[0]] * len(sampler),
                                                                                     group=list(range(size)))))):
        try:
            call()
            raised.append("accepted")
        except Exception as error:  # noqa: BLE001
            raised.append(f"{type(error).__name__}: {error}")
        sampler.group = None
    return raised


def test_regression_a_sampler_group_of_ranks_died_in_torch():
    """Cause (probe16 P16-09): `BalancedDistributedSampler(group=[0, 1])` (ranks, a name or an int instead of a
    ProcessGroup) was accepted, and its first `iter` (the epoch agreement all-gather) died in torch's "'list' object
    has no attribute 'size'" on every rank; `microbatches(loader, group=[0, 1])` in the model check the same.  The
    dispatcher's check (P15-20) now serves the sampler: a TypeError naming `group` when built, at `iter` (a group
    set after), and in `microbatches`."""
    with pytest.raises(TypeError, match=GROUP_MESSAGE + r"list \(ranks: make their group with dist.new_group"):
        BalancedDistributedSampler([5, 3, 2, 4], num_replicas=2, rank=0, global_batch_size=2, group=[0, 1])
    with pytest.raises(TypeError, match=GROUP_MESSAGE + "str"):
        BalancedDistributedSampler([5, 3, 2, 4], num_replicas=2, rank=0, global_batch_size=2, group="world")
    outcomes = run_processes(group_of_ranks_job, 2, timeout_s=60, collective_timeout_s=30)
    for outcome in outcomes:
        assert outcome.ok, outcome.error
        assert all(re.match("TypeError: " + GROUP_MESSAGE[1:] + "list", message) for message in outcome.value), \
            outcome.value


def test_regression_a_loader_yielding_out_of_order_was_paired_with_the_plans_micro_batches_by_position():
    """Cause (probe16 P16-12, SW): `microbatches(loader)` pairs the loader's batches with the plan's micro-batches
    in order, and a DataLoader with workers and in_order=False (torch's opt-in for throughput) yields them as they
    finish: 27 of an epoch's 37 micro-batches carried another one's samples (their lengths, step tokens, `is_last`),
    no error.  Such a loader is refused naming in_order; with in_order=True (the default) it is taken."""
    from torch.utils.data import DataLoader
    sampler = BalancedDistributedSampler(np.arange(1, 33), num_replicas=1, rank=0, global_batch_size=8,
                                         max_tokens_per_microbatch=64)
    loader = DataLoader(list(range(32)), batch_sampler=sampler, num_workers=1, in_order=False,
                        collate_fn=lambda indices: indices)
    with pytest.raises(ValueError, match=r"^`loaded` may yield its batches out of order \(a DataLoader with workers "
                                         r"and in_order=False\).* build the DataLoader with in_order=True"):
        sampler.microbatches(loader)
    loader = DataLoader(list(range(32)), batch_sampler=sampler, collate_fn=lambda indices: indices)
    assert all(micro.data == micro.items.tolist() for micro in sampler.microbatches(loader))

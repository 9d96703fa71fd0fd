"""probe56 F5/F6 (fix58): the sampler's once-per-epoch agreement check on 2 gloo ranks.

F5: without a budget it digested the first and last steps' plans only, so an algorithm planning apart on a middle
step (a plugin whose plans depend on the process) passed the check and the shares duplicated and dropped samples
with no error.  Every step's plan is digested now (the epoch is planned once, at `iter`, its shares kept).
F6: a rank whose planning failed made every rank raise "only the plans differ: another orchmllm version ...", the
cause known to the failing rank only.  Every rank now names the failing ranks and their error."""

import numpy as np
import pytest

pytest.importorskip("torch")

from orchmllm.runtime import ConfigMismatchError  # noqa: E402
from orchmllm.runtime.launch import run_processes  # noqa: E402
from orchmllm.runtime.sampler import BalancedDistributedSampler  # noqa: E402

LENGTHS = np.random.default_rng(7).integers(1, 500, 40)


def round_robin(problem):
    from orchmllm.balancers.problem import KernelResult

    return KernelResult(np.arange(problem.num_items) % problem.num_ranks)


def outcome_of(sampler):
    """The epoch's shares, or the error iterating raised (with its cause's type)."""
    try:
        return [sorted(share) for share in sampler]
    except ConfigMismatchError as error:
        return f"{error} (from {type(error.__cause__).__name__})"


def agreement_job(rank, size):
    """Two epochs' checks: an algorithm planning apart on a middle step on rank 1 only; one raising on rank 1."""
    from orchmllm import register_algorithm
    from orchmllm.balancers.problem import KernelResult

    sampler = BalancedDistributedSampler(LENGTHS, num_replicas=size, rank=rank, global_batch_size=8,
                                         algorithm="lpt")
    middle = sorted(LENGTHS[sampler.global_batches()[2]].tolist())  # step 2 of 5

    def apart_on_the_middle_step(problem):
        plan = round_robin(problem)
        if rank == 1 and sorted(problem.lengths.tolist()) == middle:
            return KernelResult(problem.num_ranks - 1 - plan.assignment)
        return plan

    def raising_on_rank_1(problem):
        if rank == 1:
            raise ZeroDivisionError("rank 1's plugin bug")
        return round_robin(problem)

    register_algorithm("test_fix58_apart", apart_on_the_middle_step)
    register_algorithm("test_fix58_raising", raising_on_rank_1)
    register_algorithm("test_fix58_round_robin", round_robin)
    samplers = [BalancedDistributedSampler(LENGTHS, num_replicas=size, rank=rank, global_batch_size=8,
                                           algorithm=algorithm)
                for algorithm in ("test_fix58_apart", "test_fix58_raising", "test_fix58_round_robin", "lpt")]
    if rank == 1:
        samplers[-1].algorithm = "ilp"  # a setting made invalid after construction: its planning fails too
    return [outcome_of(sampler) for sampler in samplers]


@pytest.fixture(scope="module")
def outcomes():
    results = run_processes(agreement_job, 2, timeout_s=90, collective_timeout_s=20)
    for result in results:
        assert result.ok, result.error
    return [result.value for result in results]


def test_regression_an_algorithm_planning_apart_on_a_middle_step_passed_the_check(outcomes):
    for rank, (apart, *_) in enumerate(outcomes):
        assert isinstance(apart, str), apart  # it yielded shares that duplicated and dropped samples
        assert f"configuration differs across ranks (seen from rank {rank}): ranks [1] disagree with ranks [0]" in \
            apart and "settings that differ: `plans of the epoch` (ranks [0]: '" in apart, apart
        assert "or an algorithm whose plans depend on the process: a plugin should pass " \
               "`orchmllm.testing.check_conformance`" in apart, apart


def test_regression_a_rank_whose_planning_failed_was_blamed_on_versions(outcomes):
    for rank, (_, raising, *_) in enumerate(outcomes):
        assert raising.startswith(f"BalancedDistributedSampler's planning of the epoch failed (seen from rank {rank}): "
                                  f"ranks [1]: RuntimeError: algorithm 'test_fix58_raising' raised ZeroDivisionError: "
                                  f"rank 1's plugin bug (ranks [0] planned it)"), raising
        assert "another orchmllm version" not in raising and "every rank must pass" not in raising, raising
        assert raising.endswith("(from RuntimeError)" if rank == 1 else "(from NoneType)"), raising


def test_ranks_that_plan_alike_share_every_sample_once(outcomes):
    shares = [alike for _, _, alike, _ in outcomes]
    assert all(isinstance(rank_shares, list) for rank_shares in shares), shares
    seen = sorted(index for rank_shares in shares for share in rank_shares for index in share)
    assert seen == list(range(LENGTHS.size))


def test_the_shares_are_the_epoch_plans_shares():
    """One process, every rank: the shares kept at `iter` are each step's plan's (as planned step by step)."""
    for rank in range(3):
        sampler = BalancedDistributedSampler(LENGTHS, num_replicas=3, rank=rank, global_batch_size=9, drop_last=False)
        expected = [batch[sampler.plan(batch).items_of(rank)].tolist() for batch in sampler.global_batches()]
        assert list(sampler) == expected and len(expected) == len(sampler) == 5
        sampler.set_epoch(1)
        assert list(sampler) != expected


def test_a_setting_that_fails_planning_is_named_with_the_failure(outcomes):
    for rank, (*_, invalid) in enumerate(outcomes):
        assert invalid.startswith(f"BalancedDistributedSampler's planning of the epoch failed (seen from rank {rank}): "
                                  f"ranks [1]: ValueError: `algorithm` 'ilp' is an exact solver"), invalid
        assert "(ranks [0] planned it); settings that differ: `algorithm` (ranks [0]: 'lpt'; ranks [1]: 'ilp')" in \
            invalid and "every rank must pass the same dataset and options" in invalid, invalid

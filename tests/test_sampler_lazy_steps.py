"""Where the agreement check does not run (no process group, or check_agreement=False), the sampler plans each
step as it is taken, as before 44ac13a (rev56 R17, probe57 S1: the whole epoch was planned before the first batch,
3.7-5 s at a few hundred steps); the check's path plans the epoch ahead for its digest
(tests/test_sampler_agreement_steps.py)."""

import numpy as np
import pytest

from orchmllm.runtime.sampler import BalancedDistributedSampler

STEPS = 6


def _sampler(check_agreement, budget=None):
    lengths = np.random.default_rng(11).integers(1, 512, STEPS * 32)
    return BalancedDistributedSampler(lengths, num_replicas=4, rank=1, global_batch_size=32, seed=3,
                                      check_agreement=check_agreement, max_tokens_per_microbatch=budget)


@pytest.mark.parametrize("check_agreement", [True, False])
def test_regression_the_first_batch_plans_one_step_only(monkeypatch, check_agreement):
    sampler, calls = _sampler(check_agreement), []
    planned = BalancedDistributedSampler.plan
    monkeypatch.setattr(BalancedDistributedSampler, "plan", lambda self, batch: calls.append(1) or planned(self, batch))
    shares = iter(sampler)
    first = next(shares)
    assert len(calls) == 1
    rest = list(shares)
    assert len(calls) == STEPS
    expected = [batch[planned(sampler, batch).items_of(1)].tolist() for batch in sampler.global_batches()]
    assert [first, *rest] == expected


def test_the_shares_are_those_of_the_epochs_plans_with_a_budget_too():
    sampler = _sampler(False, budget=2048)
    expected = [batch[plan.items_of(1, micro)].tolist() for batch in sampler.global_batches()
                for plan in [sampler.plan(batch)] for micro in range(plan.num_microbatches)]
    assert list(sampler) == expected

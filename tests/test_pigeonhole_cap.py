"""The pigeonhole token cap (`bounds.pigeonhole_cap`): a cap every unpadded plan needs, so a heuristic that finds
no room under a cap below it says that no plan fits instead of pointing at another algorithm (probe21: five images
longer than half the cap on four ranks were refused as "`lpt` found no rank ... try algorithm='ilp'")."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from orchmllm import Batch, CostModel, Orchestrator, Sample, Segment, Stage, Topology, balance
from orchmllm.balancers.bounds import pigeonhole_cap
from orchmllm.balancers.problem import InfeasibleError


def least_cap(lengths, num_ranks):
    """Brute force: the least largest rank tokens over every assignment."""
    return min(np.bincount(assignment, weights=lengths, minlength=num_ranks).max()
               for assignment in itertools.product(range(num_ranks), repeat=len(lengths)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=7), st.integers(1, 3))
def test_the_bound_never_exceeds_the_least_cap(lengths, num_ranks):
    needed, k = pigeonhole_cap(np.array(lengths), num_ranks)
    assert max(lengths) <= needed <= least_cap(np.array(lengths), num_ranks)
    assert len(lengths) > k * num_ranks


def test_the_bound_is_met_where_the_pairs_decide():
    # 5 items above half the cap on 4 ranks: two share a rank, 530 + 536 = 1066 > 900 (the probe's batch).
    assert pigeonhole_cap(np.array([701, 530, 536, 640, 205, 296, 644]), 4) == (1066, 1)
    assert pigeonhole_cap(np.array([9, 1, 1]), 4) == (9, 0)  # fewer items than ranks: the longest


@pytest.mark.parametrize("algorithm", ["lpt", "auto", "karmarkar_karp", "multifit", "exact"])
def test_regression_a_provably_infeasible_cap_is_refused_as_such(algorithm):
    lengths = [701, 530, 536, 640, 205, 296, 644]
    with pytest.raises(InfeasibleError, match=r"^no plan fits max_tokens_per_rank=900 on 4 ranks: of the 5 longest "
                                              r"items some rank holds 2, at least 1066 tokens; a cap of at least 1066 "
                                              r"is needed$") as caught:
        balance(lengths, 4, max_tokens_per_rank=900, algorithm=algorithm)
    assert caught.value.min_cap == 1066 and caught.value.heuristic is None
    assert balance(lengths, 4, max_tokens_per_rank=1066, algorithm="ilp").tokens.max() == 1066


def test_regression_ilp_refuses_a_provably_infeasible_cap_before_building_its_model():
    """rev15 R15-08: at 3065 items on 64 ranks 'ilp' answered SizeLimitError "... binaries; use 'auto'" where the
    pigeonhole bound proves that no plan fits (its size check ran before any bound).  Models within the size limit keep
    the exact smallest cap (test_ilp)."""
    lengths = np.concatenate((np.full(65, 10000), np.random.default_rng(3).integers(1, 50, 3000)))
    with pytest.raises(InfeasibleError, match=r"^no plan fits max_tokens_per_rank=19999 on 64 ranks") as caught:
        balance(lengths, 64, costs=lengths ** 1.3, algorithm="ilp", max_tokens_per_rank=19999)
    assert caught.value.min_cap == 20000 and caught.value.heuristic is None


def test_regression_an_encoder_cap_no_plan_meets_is_not_blamed_on_lpt():
    stages = (Stage("vision", "image", CostModel(linear=2.0), max_tokens_per_rank=900),
              Stage("llm", "llm", CostModel()))
    batch = Batch.from_samples([Sample(10, (Segment("image", length, 4),), source=i % 4)
                                for i, length in enumerate([701, 530, 536, 640, 205, 296, 644])], 4)
    with pytest.raises(InfeasibleError, match="no plan fits max_tokens_per_rank=900 on 4 ranks"):
        Orchestrator(stages, Topology(1, 4)).plan(batch)


def test_regression_equal_counts_refuses_a_provably_infeasible_cap_as_such():
    """rev15 R15-01: the equal-count lpt still read "it fits under a cap of 1066, and a smaller cap may still be
    feasible" where 1066 is the least cap any plan needs."""
    with pytest.raises(InfeasibleError, match=r"^no plan fits max_tokens_per_rank=900 on 4 ranks: of the 5 longest "
                                              r"items some rank holds 2, at least 1066 tokens"):
        balance([701, 530, 536, 640, 205, 296, 644], 4, max_tokens_per_rank=900, equal_counts=True)


def test_regression_equal_counts_under_a_cap_its_own_plan_meets_is_not_refused():
    """probe22 P22-17: auto with equal_counts refused a cap (68) that its own uncapped plan (tokens [68, 66])
    meets: its capped equal-count LPT found no room, and it fell back without trying that plan."""
    lengths = [15, 31, 15, 31, 32, 3, 7]
    free = balance(lengths, 2, equal_counts=True)
    assert free.tokens.max() == 68
    capped = balance(lengths, 2, equal_counts=True, max_tokens_per_rank=68)
    assert capped.tokens.max() <= 68 and sorted(np.bincount(capped.assignment, minlength=2)) == [3, 4]


def test_regression_auto_under_a_cap_its_own_plan_meets_is_not_refused():
    """probe22 P22-17 (c42): auto's plan holds [89, 94, 94] tokens; with max_tokens_per_rank=94 no start fit the
    cap and the capped LPT it fell back to found no room."""
    lengths = [13, 35, 47, 35, 52, 24, 47, 24]
    assert balance(lengths, 3).tokens.max() == 94
    assert balance(lengths, 3, max_tokens_per_rank=94).tokens.max() <= 94


@pytest.mark.parametrize("algorithm", ["lpt", "karmarkar_karp", "multifit", "slack"])
def test_regression_with_sources_a_cap_the_same_calls_plan_meets_is_not_refused(algorithm):
    """probe23 P23-09: the communication-aware pass re-deals the kernel's plan, so `balance(..., sources=)` without a
    cap can meet a cap its kernel's capped greedy refuses (lpt on 86 of 400 tiny instances): [82, 42, 47, 81, 67] on
    2 ranks planned tokens [163, 156], and max_tokens_per_rank=163 was refused ("lpt fits under a cap of 171")."""
    rng = np.random.default_rng(7)
    for _ in range(150):
        num_ranks = int(rng.choice([2, 3, 4]))
        lengths = rng.integers(1, 100, int(rng.integers(num_ranks + 1, 4 * num_ranks + 2)))
        sources = rng.integers(0, num_ranks, lengths.size)
        cap = int(balance(lengths, num_ranks, algorithm=algorithm, sources=sources).tokens.max())
        plan = balance(lengths, num_ranks, algorithm=algorithm, sources=sources, max_tokens_per_rank=cap)
        assert plan.tokens.max() <= cap

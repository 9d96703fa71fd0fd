"""'exact' and 'ilp' under `equal_counts`: the assignment model with count rows (q <= items on a rank <= q + 1),
from the equal-count plan, against brute force — optimal plans, honest refusals naming the smallest cap that works
(probe23 P23-02: auto, lpt and karmarkar_karp all refused the equal-count optimum's own tokens as a cap on 15 of 400
tiny instances, and no algorithm that takes `equal_counts` could then give the plan)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from orchmllm import balance
from orchmllm.balancers.problem import InfeasibleError
from orchmllm.testing import brute_force


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 30), min_size=2, max_size=8), num_ranks=st.integers(2, 3),
       padded=st.booleans(), slack=st.integers(-3, 2), algorithm=st.sampled_from(["exact", "ilp"]))
def test_equal_count_exact_plans_match_brute_force_under_caps(lengths, num_ranks, padded, slack, algorithm):
    free = brute_force(lengths, num_ranks, padded=padded, equal_counts=True)
    cap = int(max(np.bincount(free.assignment, weights=lengths, minlength=num_ranks))) + slack
    oracle = brute_force(lengths, num_ranks, padded=padded, equal_counts=True, max_tokens_per_rank=cap)
    if not oracle.feasible:
        with pytest.raises(InfeasibleError) as caught:
            balance(lengths, num_ranks, padded=padded, equal_counts=True, max_tokens_per_rank=cap, algorithm=algorithm)
        least = min(_most_tokens(lengths, a, num_ranks, padded) for a in _equal_count_plans(len(lengths), num_ranks))
        assert caught.value.min_cap <= least  # a cap no plan needs is never named as needed
        return
    plan = balance(lengths, num_ranks, padded=padded, equal_counts=True, max_tokens_per_rank=cap, algorithm=algorithm)
    counts = np.bincount(plan.assignment, minlength=num_ranks)
    assert counts.max() - counts.min() <= 1 and plan.tokens.max() <= cap
    assert plan.makespan == oracle.makespan and str(plan.status) == "optimal"


def _most_tokens(lengths, assignment, num_ranks, padded):
    """A plan's largest rank tokens: the sum, or count x longest when padded."""
    lengths = np.asarray(lengths)
    if not padded:
        return int(np.bincount(assignment, weights=lengths, minlength=num_ranks).max())
    return max(int((assignment == r).sum() * lengths[assignment == r].max(initial=0)) for r in range(num_ranks))


def _equal_count_plans(n, num_ranks):
    q = n // num_ranks
    for assignment in itertools.product(range(num_ranks), repeat=n):
        counts = np.bincount(assignment, minlength=num_ranks)
        if counts.min() >= q and counts.max() <= q + 1:
            yield np.array(assignment)


def test_regression_the_equal_count_optimum_under_its_own_tokens_as_a_cap():
    lengths = [13, 16, 9, 6, 13, 13, 8]  # optimum 39: {13, 13, 13} | {16, 9, 6, 8}; auto's plan 40
    for algorithm in ("exact", "auto"):  # auto refused it, naming 'exact', until the MILP decided tiny caps (P26-05)
        plan = balance(lengths, 2, equal_counts=True, max_tokens_per_rank=39, algorithm=algorithm)
        assert plan.makespan == 39 and str(plan.status) == "optimal" and sorted(np.bincount(plan.assignment)) == [3, 4]


def test_regression_a_padded_equal_count_refusal_names_the_least_cap():
    # [1, 2, 3] on 2 ranks, padded: {3} | {1, 2} holds max(3, 2 x 2) = 4 tokens; the refusal named 6 (the runs
    # dealt longest first, {3, 2} | {1}) as the least cap that could work
    with pytest.raises(InfeasibleError, match="the smallest cap that works is 4$") as caught:
        balance([1, 2, 3], 2, padded=True, equal_counts=True, max_tokens_per_rank=3)
    assert caught.value.min_cap == 4 and caught.value.heuristic is None


def test_regression_exact_over_the_models_size_plans_and_refuses_as_itself():
    """rev16 R16-07 / probe24 P24-07: over the MILP's size, 'exact' under equal counts raised SizeLimitError naming
    'ilp' and "use 'auto'" on every instance, even where auto's equal-count plan meets the bound, while auto's
    refusal pointed at 'exact'.  It now returns that plan (optimal where it meets the bound) and refuses a cap the
    plan overflows as a heuristic that gave up, naming itself (in a sentence: probe25 P25-06
    read "auto's overflow it")."""
    lengths = np.random.default_rng(2000).integers(100, 5000, 2000)
    plan = balance(lengths, 64, equal_counts=True, algorithm="exact")
    auto = balance(lengths, 64, equal_counts=True)
    assert plan.makespan == auto.makespan and str(plan.status) == str(auto.status)
    lengths = np.random.default_rng(0).integers(100, 20000, 1000)
    with pytest.raises(InfeasibleError, match=r"^algorithm 'exact' found no equal-count plan under "
                                              r"max_tokens_per_rank=161995: auto's equal-count plans overflow it, "
                                              r"and the MILP .* over its size limit") as caught:
        balance(lengths, 64, equal_counts=True, max_tokens_per_rank=161995, algorithm="exact")
    assert caught.value.heuristic == "exact"


def test_regression_auto_refused_tiny_equal_count_caps_a_plan_meets():
    """probe26 P26-05: equal-count LPT gave up on [8, 35, 29] on 2 ranks under a cap of 38 (no second item fits
    beside 35 once 29 and 8 split), and auto refused, as it did 90 of 269 feasible tiny instances; the MILP with
    the count rows now decides such small caps: [8, 29] and [35], optimal."""
    plan = balance([8, 35, 29], 2, costs=[10.0, 9.0, 11.0], max_tokens_per_rank=38, equal_counts=True)
    assert plan.assignment.tolist() == [0, 1, 0] and plan.makespan == 21.0 and str(plan.status) == "optimal"


def test_the_tiny_milp_runs_to_the_end_whatever_the_users_time_limit(monkeypatch):
    """review R18-08: a search a user's small `time_limit` stops by the clock could end otherwise on another rank;
    the tiny equal-count MILP gets at least the default limit (it takes milliseconds)."""
    from orchmllm.balancers.constraints import equal_counts
    from orchmllm.balancers.exact.ilp import DEFAULT_TIME_LIMIT

    limits, search = [], equal_counts.search
    monkeypatch.setattr(equal_counts, "search", lambda problem, start, limit, *nodes: limits.append(limit)
                        or search(problem, start, limit, *nodes))
    plan = balance([8, 35, 29], 2, costs=[10.0, 9.0, 11.0], max_tokens_per_rank=38, equal_counts=True, time_limit=1e-4)
    assert limits == [DEFAULT_TIME_LIMIT] and str(plan.status) == "optimal"

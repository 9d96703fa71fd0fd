"""balance_microbatches at the edges of its input: exact token sums, finite step costs, size caps."""

import math
import time
import warnings

import numpy as np
import pytest

from orchmllm import InfeasibleError, Pipeline, balance_microbatches
from orchmllm.balancers.microbatch.api import MAX_CELLS


@pytest.mark.parametrize("budget, padded, match", [
    (2**62, False, f"`lengths` sum to {1025 * (2**53 - 1)} tokens, beyond int64"),
    (2**63 - 1, True, r"`lengths`: 1025 items padded to the longest \(9007199254740991\) hold .* beyond int64"),
])
def test_regression_token_sums_beyond_int64_wrapped_around(budget, padded, match):
    """Cause: `make_microbatch_problem` never called `check_token_range` (as `balance` does), so
    two items of 2**62 tokens shared a cell of budget 2**62 whose int64 sum read -2**63 (lengths are below 2**53
    now: 1025 of the longest sum beyond int64)."""
    with pytest.raises(ValueError, match=match):
        balance_microbatches([2**53 - 1] * 1025, 2, max_tokens_per_microbatch=budget, padded=padded)


def test_budget_beyond_int64_is_rejected():
    with pytest.raises(ValueError, match=r"`max_tokens_per_microbatch` must be at most 2\*\*63 - 1"):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=2**63)


@pytest.mark.parametrize("algorithm", ["auto", "exact", "greedy", "cells"])
def test_regression_float_token_sums_rounded_a_cell_over_the_budget(algorithm):
    """Cause: cell tokens were float bincounts, rounded beyond 2**53, so the local search and the
    plan's own check saw cells of T + 1 tokens as fitting in T = 2**54 (lengths are below 2**53 now)."""
    budget = 2**54
    lengths = [5, 6, 6, 2**53 - 3, 2**53 - 7, 2**53 - 1, 2**53 - 1, 2**53 - 5]
    plan = balance_microbatches(lengths, 2, max_tokens_per_microbatch=budget,
                                costs=[5., 4., 3., 4., 5., 7., 6., 2.], algorithm=algorithm)
    for m in range(plan.num_microbatches):
        for r in range(2):
            held = sum(lengths[i] for i in plan.items_of(r, m).tolist())  # Python ints: exact
            assert held == int(plan.cell_tokens[m, r]) <= budget


@pytest.mark.parametrize("options", [{}, {"num_microbatches": 3}])
def test_regression_large_overhead_gave_an_infinite_optimal_step_cost(options):
    """Cause: 3 · 6e307 overflows float64; the plan said step_cost = lower_bound = inf, optimal."""
    with pytest.raises(ValueError, match=r"step cost of 3 micro-batches is beyond float64.*`microbatch_overhead`"):
        balance_microbatches([8, 8, 8], 1, max_tokens_per_microbatch=8, microbatch_overhead=6e307, **options)


def test_step_cost_whose_partial_sums_overflow_is_rejected():
    """fsum raises OverflowError on an intermediate overflow; that too is a step cost beyond float64."""
    with pytest.raises(ValueError, match=r"step cost of 2 micro-batches is beyond float64.*scale `costs`"):
        balance_microbatches([8, 8], 1, max_tokens_per_microbatch=8, costs=[4e307, 4e307], microbatch_overhead=5e307)


def test_num_ranks_is_capped_as_in_balance():
    with pytest.raises(ValueError, match=r"`num_ranks` must be at most 2\*\*20 = 1048576 .*got 1000000000000"):
        balance_microbatches([1, 2], 10**12, max_tokens_per_microbatch=8)


@pytest.mark.parametrize("count", [10**9, 2**63])
def test_num_microbatches_is_capped_by_the_cells_a_plan_holds(count):
    most = MAX_CELLS // 2
    with pytest.raises(ValueError, match=rf"`num_microbatches`={count} on 2 ranks makes {2 * count} cells, beyond "
                                         rf"2\*\*22 = {MAX_CELLS} .*at most {most} micro-batches on 2 ranks"):
        balance_microbatches([1, 2], 2, max_tokens_per_microbatch=8, num_microbatches=count)


def test_free_num_microbatches_needing_too_many_cells_is_rejected():
    lengths = np.ones(MAX_CELLS + 1, dtype=np.int64)
    with pytest.raises(ValueError, match=r"`max_tokens_per_microbatch`=1 is too small .* at least 4194305 "
                                         r"micro-batches, 4194305 cells, beyond 2\*\*22"):
        balance_microbatches(lengths, 1, max_tokens_per_microbatch=1)


@pytest.mark.parametrize("algorithm", ["auto", "greedy", "cells", "exact"])
def test_regression_too_few_microbatches_named_a_count_that_does_not_fit(algorithm):
    """Cause: the error named the bin-packing bound (3) as the count needed, and at 3 it said
    "7 micro-batches always fit"; 3 are proven too few, 4 fit, and a free M takes 4.  Since the count bound
    (two items of 4 a cell of 10: probe22 P22-03) the bound itself is 4."""
    kwargs = dict(max_tokens_per_microbatch=10, algorithm=algorithm)
    with pytest.raises(InfeasibleError, match=r"`num_microbatches`=1 is too few: the items need at least 4 cells .* "
                                              r"at least 4 micro-batches on 1 ranks; 4 fit, the fewest possible$"
                       ) as error:
        balance_microbatches([4] * 7, 1, num_microbatches=1, **kwargs)
    assert error.value.min_cap == 4
    with pytest.raises(InfeasibleError, match=r"`num_microbatches`=3 is too few: .* at least 4 micro-batches on 1 "
                                              r"ranks; 4 fit, the fewest possible$") as error:
        balance_microbatches([4] * 7, 1, num_microbatches=3, **kwargs)
    assert error.value.min_cap == 4 == balance_microbatches([4] * 7, 1, **kwargs).num_microbatches
    lengths = [9, 5, 4, 4, 4, 3]  # the bound says 3, exhaustive search says 4
    with pytest.raises(InfeasibleError, match=r"`num_microbatches`=1 is too few: .* at least 3 micro-batches on 1 "
                                              r"ranks; 4 fit, the fewest possible \(exhaustive search: 3 do not\)$"):
        balance_microbatches(lengths, 1, num_microbatches=1, **kwargs)
    with pytest.raises(InfeasibleError, match=rf"`num_microbatches`=3: algorithm '{algorithm}' found no packing of "
                                              r"the items into 3 × 1 cells of 10 tokens \(none exists: exhaustive "
                                              r"search\); 4 fit, the fewest possible") as error:
        balance_microbatches(lengths, 1, num_microbatches=3, **kwargs)
    assert error.value.min_cap == 4 == balance_microbatches(lengths, 1, **kwargs).num_microbatches


def test_too_few_microbatches_at_the_bound_says_the_bound_is_met():
    with pytest.raises(InfeasibleError, match=r"at least 2 micro-batches on 2 ranks; 2 fit, the fewest possible$"):
        balance_microbatches([6, 6, 6, 6, 1], 2, max_tokens_per_microbatch=10, num_microbatches=1)


def test_regression_a_heuristic_that_packs_nothing_implied_infeasibility():
    """Cause: greedy's failure at M = 1 read as "no packing"; exact finds one at 1."""
    kwargs = dict(max_tokens_per_microbatch=4, costs=[4., 5., 4., 1., 3.], microbatch_overhead=0.5,
                  num_microbatches=1)
    with pytest.raises(InfeasibleError, match=r"algorithm 'greedy' found no packing of the items into 1 × 2 cells of "
                                              r"4 tokens, though one exists \(exhaustive search\): try "
                                              r"algorithm='exact'") as error:
        balance_microbatches([1, 2, 0, 0, 4], 2, algorithm="greedy", **kwargs)
    assert error.value.min_cap == 1
    assert balance_microbatches([1, 2, 0, 0, 4], 2, algorithm="exact", **kwargs).num_microbatches == 1


@pytest.mark.parametrize("rank, microbatch, error, match", [
    (5, 0, ValueError, r"`rank` must be in \[0, num_ranks=2\); got 5"),
    (-1, 0, ValueError, r"`rank` must be in \[0, num_ranks=2\); got -1"),
    ("0", 0, TypeError, "`rank` must be an int; got str"),
    (True, 0, TypeError, "`rank` must be an int; got bool"),
    (0, 2, ValueError, r"`microbatch` must be in \[0, num_microbatches=2\); got 2"),
    (0, 1.0, TypeError, "`microbatch` must be an int; got float"),
])
def test_regression_items_of_out_of_range_or_not_an_int_gave_an_empty_cell(rank, microbatch, error, match):
    """Cause: `items_of` compared the arrays with any value: rank 5 of 2 gave [] and True gave rank 1."""
    plan = balance_microbatches([6, 5, 4, 3, 2, 2], 2, max_tokens_per_microbatch=8)
    with pytest.raises(error, match=match):
        plan.items_of(rank, microbatch)


@pytest.mark.parametrize("num_microbatches", [3, None])
def test_regression_exact_search_overshot_its_time_limit_38_fold(num_microbatches):
    """Cause: the exact search's node budget used WORK_PER_SECOND (numpy operations), ~38x the
    cells its Python loop visits per second, and every M tried had the whole limit; it now
    converts at CELLS_PER_SECOND and the M tried share the limit (0.2 s took ~7 s)."""
    lengths = np.random.default_rng(0).integers(1, 1000, 40)
    start = time.perf_counter()
    plan = balance_microbatches(lengths, 4, max_tokens_per_microbatch=2000, algorithm="exact", time_limit=0.2,
                                num_microbatches=num_microbatches)
    assert time.perf_counter() - start < 2.0
    assert plan.num_microbatches == 3 and plan.gap < 0.02


@pytest.mark.parametrize("options", [{}, {"num_microbatches": 2}])
def test_regression_pipeline_planned_a_step_cost_beyond_float64_into_numpy(options):
    """Cause (probe12 P12-01): with `pipeline`, the schedule's planner ran its cells with the mean replica time
    Σ c / D + M · 1e308 = inf, and LPT died in numpy ("zero-size array to reduction operation minimum") before
    the plain path's check of the step cost."""
    lengths = np.random.default_rng(0).integers(256, 4096, 62)
    with pytest.raises(ValueError, match=r"step cost of 2 micro-batches is beyond float64.*`microbatch_overhead`"):
        balance_microbatches(lengths, 8, max_tokens_per_microbatch=16384, microbatch_overhead=1e308,
                             pipeline=Pipeline(stages=2), **options)


@pytest.mark.parametrize("overhead", [1e300, 1e306, 2e307])
def test_regression_a_pipeline_step_beyond_float64_reported_a_nan_busy_fraction(overhead):
    """Cause (fix24c's note after P12-01): with `pipeline`, a step cost finite without it but not through the
    schedule's sums (M + P·v steps a chunk, summed over replicas) gave a finite plan whose `busy_fraction` was nan
    (or 0.0) and overflow warnings from the bound; it is refused like the plain path's overflow."""
    lengths = np.random.default_rng(0).integers(1, 1000, 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        if overhead < 1e301:
            step = balance_microbatches(lengths, 4, max_tokens_per_microbatch=4000, microbatch_overhead=overhead,
                                        pipeline=Pipeline(stages=4)).pipeline
            assert 0 < step.busy_fraction <= 1 and math.isfinite(step.lower_bound)
            return
        with pytest.raises(ValueError, match=r"the pipeline's step of \d+ micro-batches over 4 model chunks on 4 "
                                             r"replicas is beyond float64"):
            balance_microbatches(lengths, 4, max_tokens_per_microbatch=4000, microbatch_overhead=overhead,
                                 pipeline=Pipeline(stages=4))


@pytest.mark.parametrize("argument", ["costs", "first_stage_costs"])
def test_regression_boolean_first_stage_costs_were_planned_as_ones_and_zeros(argument):
    """Cause (probe16 P16-05): `first_stage_costs=<bool mask>` (e.g. "has an image") was planned as costs 1.0/0.0
    while `costs=<bool mask>` was refused; both now share `as_costs`' rule, naming their argument."""
    lengths = np.arange(1, 9) * 10
    with pytest.raises(TypeError, match=rf"^`{argument}` must hold real numbers; got dtype bool$"):
        balance_microbatches(lengths, 4, max_tokens_per_microbatch=200, pipeline=Pipeline(stages=2),
                             **{argument: lengths > 50})

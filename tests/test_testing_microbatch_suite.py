"""`check_microbatch_conformance` fails kernels it passed (probe56 F7, F8): one that never packs (None on every input,
though one item per cell fits: 0 plans certified, no error), and one that claims `optimal` falsely on 6 items or more
(the suite certified only its runs of up to max_items = 5 items, brute force's reach; Hypothesis draws few larger
ones, so seeded larger cases are certified too)."""

import numpy as np
import pytest

from orchmllm.balancers import MICROBATCH_ALGORITHMS, Status
from orchmllm.balancers.microbatch.plan import cell_accounts
from orchmllm.testing import ConformanceError, check_microbatch_conformance


def never_packs(problem, num_microbatches):
    return None


def packs_only_one_cell_a_rank(problem, num_microbatches):
    """'greedy' at M = 1 only, else None: a kernel that gives up on every M above one."""
    return MICROBATCH_ALGORITHMS["greedy"](problem, 1) if num_microbatches == 1 else None


def greedy_claiming_optimal_from_six_items(problem, num_microbatches):
    """'greedy', its plan claimed optimal (bound = its own Σ_m max_r load) from 6 items up."""
    result = MICROBATCH_ALGORITHMS["greedy"](problem, num_microbatches)
    if result is None or problem.num_items < 6:
        return result
    loads, _ = cell_accounts(problem, np.asarray(result.rank), np.asarray(result.microbatch), num_microbatches)
    return result._replace(status=Status.OPTIMAL, lower_bound=float(loads.max(axis=1).sum()))


@pytest.mark.parametrize("kernel", [never_packs, packs_only_one_cell_a_rank])
def test_a_kernel_without_a_packing_where_one_item_per_cell_fits_fails(kernel):
    with pytest.raises(ConformanceError, match=rf"{kernel.__name__} found no packing into num_microbatches=\d+ on \d+ "
                                               r"ranks, though one item per cell packs them \(n = \d+ <= M · D"):
        check_microbatch_conformance(kernel, processes=False, examples=10)


def test_a_false_optimum_above_max_items_is_caught_by_the_larger_runs():
    with pytest.raises(ConformanceError, match=r"greedy_claiming_optimal_from_six_items: micro-batch plan .* \((\d\d|"
                                               r"[6-9]) items.*do not bracket the optimum"):
        check_microbatch_conformance(greedy_claiming_optimal_from_six_items, processes=False, examples=5)

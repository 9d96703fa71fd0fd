"""The unpadded joint greedy's row writes (`greedy_sweep.merge`, `_Group.close`, `greedy._Rows.release`): pairs go
back into a micro-batch's sorted row of (load, cell) by one sort of a short span, by slices where the span is long,
and freed cells a row at a time where many come back at once.  The rows stay sorted unions, and the cells the plain
scan's (`_scan_greedy`), item for item."""

import bisect

import numpy as np
import pytest

from orchmllm.balancers import CostModel
from orchmllm.balancers.microbatch import greedy, greedy_sweep
from orchmllm.balancers.microbatch.api import make_microbatch_problem
from orchmllm.balancers.problem import sorted_order


@pytest.mark.parametrize("size, added, seed", [(0, 5, 0), (40, 1, 1), (40, 2, 2), (400, 3, 3), (400, 30, 4),
                                               (2000, 12, 5), (50, 400, 6)])
def test_merge_leaves_the_sorted_union(size, added, seed):
    """Short spans (one sort), long spans (places by binary search, the span rebuilt from slices), one or two pairs
    (insort), ties of loads (the cell decides)."""
    rng = np.random.default_rng(seed)
    cells = rng.permutation(size + added).tolist()
    loads = rng.integers(0, max(2, (size + added) // 3), size + added).astype(float).tolist()
    pairs = list(zip(loads, cells))
    row, back = sorted(pairs[:size]), sorted(pairs[size:])
    greedy_sweep.merge(row, back)
    assert row == sorted(pairs)


def test_many_freed_cells_and_long_spans_keep_the_scans_cells(monkeypatch):
    """Capped Pareto at D 256 (T 16k, M 3): runs that free 8 or more waiting cells at once and merges over long spans
    both occur, and the cells are the scan's."""
    lengths = np.minimum((np.random.default_rng(0).pareto(0.8, 256 * 32) * 200).astype(np.int64) + 1, 16384)
    problem = make_microbatch_problem(lengths, 256, max_tokens_per_microbatch=16384,
                                      cost=CostModel(linear=1.0, quadratic=1e-4))
    freed, long_spans = [], []
    release, merge = greedy._Rows.release, greedy_sweep.merge

    def counted_release(rows, length):
        waiting = len(rows.waiting)
        release(rows, length)
        freed.append(waiting - len(rows.waiting))

    def counted_merge(row, back):
        if len(back) >= 3:
            low = bisect.bisect_left(row, back[0])
            long_spans.append(bisect.bisect_left(row, back[-1], low) - low > greedy_sweep.SPAN * len(back))
        merge(row, back)

    monkeypatch.setattr(greedy._Rows, "release", counted_release)
    monkeypatch.setattr(greedy_sweep, "merge", counted_merge)
    monkeypatch.setattr(greedy, "merge", counted_merge)
    found = greedy.greedy_cells(problem, 3)
    assert sum(count >= greedy.RELEASED for count in freed) >= 5 and sum(long_spans) >= 10  # 10 and 32
    np.testing.assert_array_equal(found, greedy._scan_greedy(problem, 3, sorted_order(problem.item_costs))[0])

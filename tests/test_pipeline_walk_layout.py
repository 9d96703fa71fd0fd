"""`schedules.replica_times` walks contiguous duration rows whatever the layout of the rows given."""

import numpy as np
import pytest

from orchmllm.balancers import Pipeline
from orchmllm.balancers.pipeline import schedules


@pytest.mark.parametrize("pipeline", [Pipeline(8, "1f1b"), Pipeline(8, "interleaved", 2), Pipeline(4, "gpipe")])
@pytest.mark.parametrize("staged", [False, True])
def test_regression_gathered_rows_were_walked_strided(pipeline, staged):
    """Regression (planning time at D = 2560 x 32, M = 16, issue 28): rows (replicas, M) in C order, as the search's
    and the probes' rows are gathered (`grid[replicas]`), made np.concatenate lay the duration rows out in F order,
    so every operation of the walk read a strided row: 1.6-2x the walk's time (2705 rows, 1F1B: 1.50 -> 0.74 ms;
    interleaved 3.18 -> 2.15).  Each duration row is contiguous now, in either layout, and the times are the same
    floats."""
    rng = np.random.default_rng(5)
    cost = rng.random((300, pipeline.stages, 16) if staged else (300, 16)) * 1e15
    forward, backward = pipeline.stage_times(cost) if not staged else (cost * 0.3, cost * 0.7)
    gathered = (forward[rng.permutation(300)], backward[rng.permutation(300)])  # C order, as the search's rows
    durations = schedules._durations(pipeline, *gathered)
    assert all(row.flags.c_contiguous for row in durations)
    assert len(durations) == 2 * 16 * (pipeline.stages if staged else 1)
    fortran = tuple(np.asfortranarray(array) for array in gathered)
    assert np.array_equal(schedules.replica_times(pipeline, *gathered).view(np.int64),
                          schedules.replica_times(pipeline, *fortran).view(np.int64))

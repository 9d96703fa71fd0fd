"""probe26 P26-09: a search step timed all its move rows at once, (items x light replicas x slots) rows of M cells
each: 7.6 GiB at M 512 on 8 ranks x 1024 items (numpy's MemoryError, or the process killed).  Rows are now timed in
runs of at most WALK_ENTRIES operations (the same floats: each row is timed alone), and a step with more than
MOVE_ROWS move rows tries its swaps alone."""
import numpy as np
import pytest

from orchmllm import CostModel, Pipeline, balance_microbatches
from orchmllm.balancers.pipeline import search


def _plan(monkeypatch, **constants):
    for name, value in constants.items():
        monkeypatch.setattr(search, name, value)
    # every move row timed, as before a step kept those that may be its choice alone (`CellSearch._moves_kept`)
    monkeypatch.setattr(search.CellSearch, "_moves_kept", lambda self, *args: np.arange(args[-1][0].size))
    monkeypatch.setattr(search, "STAGED_ROWS", 2**40)
    rows, timed = [], search.replica_times
    monkeypatch.setattr(search, "replica_times", lambda p, f, b: rows.append(len(f)) or timed(p, f, b))
    lengths = np.random.default_rng(5).integers(1, 100, 128)
    plan = balance_microbatches(lengths, 8, max_tokens_per_microbatch=200, num_microbatches=64,
                                cost=CostModel(linear=1.0, quadratic=1e-3), pipeline=Pipeline(8, "1f1b"))
    return plan, rows


def test_regression_a_step_timed_every_move_row_at_once(monkeypatch):
    most = search.WALK_ENTRIES // (2 * 8 * 64)  # rows of 2 P M operations each
    plan, rows = _plan(monkeypatch)
    assert max(rows) <= most  # the parent timed 4000-odd rows in one walk here
    whole, whole_rows = _plan(monkeypatch, WALK_ENTRIES=2**40)  # every step's rows in one walk: the same plan
    assert max(whole_rows) > most
    assert plan.digest() == whole.digest() and plan.pipeline.step_time == whole.pipeline.step_time


@pytest.mark.parametrize("move_rows, moves_tried", [(0, False), (2**16, True)])
def test_a_step_over_move_rows_tries_its_swaps_alone(monkeypatch, move_rows, moves_tried):
    tried, best_move = [], search.CellSearch._best_move
    monkeypatch.setattr(search.CellSearch, "_best_move", lambda self, *args: tried.append(1) or best_move(self, *args))
    plan, _ = _plan(monkeypatch, MOVE_ROWS=move_rows)
    assert bool(tried) == moves_tried and plan.pipeline.step_time <= plan.pipeline.unaware_step_time

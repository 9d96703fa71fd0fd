"""A search whose first round is certainly its last and which then ends behind its rival is not made
(`behind.behind_after_a_round`, `planner.arrange`): the same plans, bit for bit, without that round's rows
(issue 28, planning at D = 2560 x 32, P = 8, M = 32, 1F1B: the shaped start's search, ~6 % above the reordered
start, ran one round, ~3 ms, then was dropped); and where the reordered plain cells are shown behind for good
(`planner._behind_for_good`), only the rows that show it are reordered, not the whole start."""

import numpy as np
import pytest

from orchmllm.balancers import Pipeline, balance_microbatches
from orchmllm.balancers.pipeline import behind, planner, search
from orchmllm.study.models import MODELS
from orchmllm.study.workloads import sample_workload

COST = MODELS["84b"].llm.cost(causal=True)


def test_regression_a_search_dropped_after_its_first_round_was_made(monkeypatch, fewer_start_off):
    """D = 2560 x 32, M = 32, 1F1B, seed 29: two searches were made (the shaped start's one round, then dropped; the
    reordered start's, kept), now one; the plan is the one made with both."""
    fewer_start_off()
    rounds, run_rounds = [], search.CellSearch.rounds
    monkeypatch.setattr(search.CellSearch, "rounds", lambda self: rounds.append(1) or run_rounds(self))
    lengths = sample_workload("default", 2560, 32, 29).sample_llm_length
    kwargs = dict(max_tokens_per_microbatch=16384, cost=COST, num_microbatches=32, pipeline=Pipeline(8, "1f1b"))
    plan = balance_microbatches(lengths, 2560, **kwargs)
    assert len(rounds) == 1  # the parent: 2
    rounds.clear()
    monkeypatch.setattr(planner, "behind_after_a_round", lambda found: False)
    made = balance_microbatches(lengths, 2560, **kwargs)
    assert len(rounds) == 2
    assert np.array_equal(plan.rank, made.rank) and np.array_equal(plan.microbatch, made.microbatch)
    assert plan.pipeline.step_time == made.pipeline.step_time
    assert np.array_equal(plan.pipeline.replica_times, made.pipeline.replica_times)


@pytest.mark.parametrize("pipeline", [Pipeline(3, "1f1b"), Pipeline(2, "interleaved", 2), Pipeline(4, "gpipe")],
                         ids=lambda p: f"{p.schedule}-P{p.stages}")
def test_a_search_certified_behind_after_a_round_ends_behind(pipeline):
    """The certificate against the search itself: random cells (200-400 replicas of 10-40 items, giants among them,
    tokens tight enough that some offers do not fit), budgets of 1-4 rows a replica, rivals just below the step after
    a round: wherever it holds, rounds then steps end above the rival (it holds on some of them)."""
    held = 0
    for seed in range(24):
        rng = np.random.default_rng(seed)
        ranks, microbatches = int(rng.integers(200, 401)), int(rng.choice([4, 8, 16]))
        replica = np.repeat(np.arange(ranks), rng.integers(10, 41, ranks))
        slot = rng.integers(0, microbatches, replica.size)
        costs = rng.choice([1.0, 2.0, 3.0, 5.0, 40.0], replica.size, p=[0.4, 0.3, 0.2, 0.09, 0.01])
        lengths = rng.integers(1, 5, replica.size)
        cells, tokens = np.zeros((ranks, microbatches)), np.zeros((ranks, microbatches), dtype=np.int64)
        np.add.at(cells, (replica, slot), costs)
        np.add.at(tokens, (replica, slot), lengths)
        times = search.replica_times(pipeline, *pipeline.stage_times(cells))
        work = int(rng.integers(1, 5)) * 2 * pipeline.stages * microbatches * pipeline.virtual_stages * ranks
        after = float(np.sort(times)[-(search.round_count(ranks) + 2)])
        rival = after / (1 + float(rng.choice([2e-9, 1e-3, 1e-2])))
        found = search.CellSearch(pipeline, costs, lengths, False, cells, tokens, replica, slot,
                                  int(tokens.max()) + int(rng.integers(0, 4)), work, times, rival=rival)
        if behind.behind_after_a_round(found):
            held += 1
            found.rounds()
            found.run()
            assert found.behind(), seed
    assert held >= 3, held


def test_regression_the_reordered_start_was_made_whole_to_show_it_behind(monkeypatch, fewer_start_off):
    """D = 2560 x 32, M = 32, interleaved, seed 29: the reordered plain cells, not searched (every replica ~24 % above
    the rival), were reordered on all 2560 replicas and their items placed (~5 ms of ~50) to time ~440 rows; now
    those rows alone are reordered (`planner._mountain_rows`); the same plan as making it (test_pipeline_moves_kept)."""
    fewer_start_off()
    reordered, mountain = [], planner.mountain
    monkeypatch.setattr(planner, "mountain", lambda cost: reordered.append(cost.shape[0]) or mountain(cost))
    lengths = sample_workload("default", 2560, 32, 29).sample_llm_length
    plan = balance_microbatches(lengths, 2560, max_tokens_per_microbatch=16384, cost=COST, num_microbatches=32,
                                pipeline=Pipeline(8, "interleaved", 2))
    assert 0 < max(reordered) < 2560  # the parent: 2560
    assert plan.pipeline.step_time < plan.pipeline.unaware_step_time


def test_regression_the_reordered_rows_shown_behind_were_a_walk_of_their_own(monkeypatch, fewer_start_off):
    """D = 2560 x 32, M = 32, interleaved, seed 29: `_behind_for_good` timed the reordered plain cells' ~440 rows of
    largest sums in a walk of its own (one walk's fixed cost, ~1 ms); they are timed in the starts' walk now
    (`planner._reordered_rows`, M >= AHEAD_FROM·P), and the plan is the one their own walk gave."""
    fewer_start_off()
    walks, inside, timed, shown_behind = [], [], planner._timed, planner._behind_for_good
    monkeypatch.setattr(planner, "_timed", lambda *args: walks.append(bool(inside)) or timed(*args))

    def watched(*args):
        inside.append(1)
        try:
            return shown_behind(*args)
        finally:
            inside.pop()
    monkeypatch.setattr(planner, "_behind_for_good", watched)
    lengths = sample_workload("default", 2560, 32, 29).sample_llm_length
    kwargs = dict(max_tokens_per_microbatch=16384, cost=COST, num_microbatches=32,
                  pipeline=Pipeline(8, "interleaved", 2))
    plan = balance_microbatches(lengths, 2560, **kwargs)
    assert walks and not any(walks)  # the parent: one walk inside `_behind_for_good`
    walks.clear()
    monkeypatch.setattr(planner, "AHEAD_FROM", 10**6)  # those rows not timed with the starts: their own walk
    alone = balance_microbatches(lengths, 2560, **kwargs)
    assert any(walks)
    for ours, theirs in ((plan.rank, alone.rank), (plan.microbatch, alone.microbatch),
                         (plan.pipeline.replica_times, alone.pipeline.replica_times)):
        np.testing.assert_array_equal(ours, theirs)

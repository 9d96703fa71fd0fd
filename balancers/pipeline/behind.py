"""Certificates that a pipeline search (`search.CellSearch`) ends behind a rival step: the planner skips such a
search (`planner.arrange`), which it would drop, so the plan is the same with fewer rows walked.

Each rests on two facts of the search: only a round's slow replicas and a step's slowest one lose items or time,
every other replica's time only rises (an item added to a cell: `schedules.step_rows`; uniform stages), and every
round and step charges a known least number of rows to the work budget.
"""

from __future__ import annotations

import numpy as np

from .candidates import heaviest, lightest, swap_pairs
from .search import (ROUND_GAIN, ROUND_ITEMS, ROUND_TIMINGS, SUMS_DRIFT, CellSearch, round_count, stalled,
                     steps_bought)
from .spec import Pipeline


def lowered_at_most(pipeline: Pipeline, num_microbatches: int, counts: np.ndarray, work: int, padded: bool) -> int:
    """At most how many replicas a search (`CellSearch`: `rounds`, then `run`; a budget of `work`) lowers, its
    replicas holding `counts` items now.  Only a round's slow replicas and a step's slowest one lose items or time;
    every other replica's time only rises (an item added to a cell: `schedules.step_rows`; uniform stages).  Rounds
    start while they have charged less than ROUND_TIMINGS rows per replica (B), and a round charges at least its slow
    replicas' items, each at least its count now the first time it is lowered (it only gained items before): so the
    replicas first lowered in a round are at most a round's (the last) and the most of least counts summing below B;
    a step charges its swaps' rows at least (`steps_bought`): at most B / swaps + 1 steps after rounds, and those of
    `run`.  So a search whose (lowered + 1)-th slowest replica runs above a rival ends above it (`CellSearch.behind`).

    >>> lowered_at_most(Pipeline(stages=2), 8, np.full(200, 30), 8960, False)  # 26 + 32 in rounds, 29 + 10 steps
    97
    """
    size, swaps, count = counts.size, max(len(swap_pairs(num_microbatches)), 1), round_count(counts.size)
    steps = steps_bought(work, swaps, 2 * pipeline.stages * num_microbatches * pipeline.virtual_stages)
    if not padded and count >= 1:
        budget = ROUND_TIMINGS * size
        steps += int(np.searchsorted(np.cumsum(np.sort(counts)), budget)) + count + budget // swaps + 1
    return min(steps, size)


def stalls_at_once(times: np.ndarray, num_ranks: int, padded: bool) -> bool:
    """Whether `rounds` then `run` end without a change from these replica times, or from any of `num_ranks` that
    holds them where none of the others is above their max (what `stalled` finds then holds for all): more
    replicas near the max than a round lowers (or no rounds: padded, too few replicas) and than WINDOW steps do.

    >>> stalls_at_once(np.array([5.0, 5.0, 5.0, 5.0, 5.0, 1.0]), 6, False), stalls_at_once(np.full(4, 5.0), 6, False)
    (True, False)
    """
    mark, count = float(times.max()), round_count(num_ranks)
    return (padded or count < 1 or stalled(times, mark, count + 1, ROUND_GAIN)) and stalled(times, mark)


def behind_after_a_round(search: CellSearch) -> bool:
    """Whether `search`'s `rounds` then `run` must end `behind` its rival, their first round certainly their last
    (uniform stages, unpadded).  A round lowers at most its `round_count` slow replicas and the slowest (its `_step`),
    a step of `run` one: after the first round the step is at least the (count + 2)-th largest time now, and after
    the steps the budget left buys (`steps_bought`) at least the (count + 2 + steps)-th.  A round charges its slow
    replicas' items and every fitting slot of their chosen items' partners (`_round`), so at least the slots that fit
    each group's longest item: where the most a first round can gain, kept up at that charge for the budget left,
    stays behind the rival, it is `_hopeless` and the rounds end there (D = 2560 x 32, M = 32, 1F1B: the shaped start
    ~5-6 % above the reordered one ran one round, ~3 ms, then was dropped)."""
    count, size = round_count(search.num_ranks), search.num_ranks
    if search.padded or count < 1 or search.first_stage is not None or not np.isfinite(search.rival):
        return False
    mark, work = float(search.times.max()), search.work - search.rounds_forfeit()
    lowered = count + 1 + steps_bought(work, len(search.swaps), search.row_work)
    level = search.rival * (1 + SUMS_DRIFT)
    if lowered >= size or not float(np.partition(search.times, size - lowered - 1)[size - lowered - 1]) > level:
        return False
    after = float(np.partition(search.times, size - count - 2)[size - count - 2])  # the step after a round, at least
    slow, fast = heaviest(search.times, count), lightest(search.times, count * ROUND_ITEMS).reshape(ROUND_ITEMS, count)
    owner = np.full(size, -1)
    owner[slow] = np.arange(count)
    group = owner[search.replica]
    mine = group >= 0
    held, longest = np.bincount(group[mine], minlength=count), np.zeros(count, dtype=search.lengths.dtype)
    np.maximum.at(longest, group[mine], search.lengths[mine])
    chosen = np.arange(ROUND_ITEMS)[:, None] < held[None, :]  # candidate c of group g offered an item
    fitting = (search.tokens[fast] + longest[None, :, None] <= search.max_tokens) & chosen[:, :, None]
    charge = (int(held.sum()) + int(np.count_nonzero(fitting))) * search.row_work
    return (mark - after) * max(work - charge, 0) < (after - search.rival) * charge

"""Two tiers' token-room checks (`context_parallel.tiers._deal`) keep every group's per-rank tokens as items join:
a check no bound settles reads the group's ranks, not its items' shards (P22-15: a micro-batch of 22k items of
~2k tokens beside 400 giants at D = 2560, T = 32k, made 79k such checks over ~32 items each, 0.67 s of a 0.89 s
plan).  The layouts equal the rank-by-rank reference (`test_cp_layout_structures`)."""

from dataclasses import replace

import numpy as np

from orchmllm import ContextParallel
from orchmllm.balancers.context_parallel import planner, tiers
from orchmllm.balancers.problem import make_problem
from orchmllm.tests.test_cp_layout_structures import COST, GPUS, _reference_two_tiers, _same_layout


class _CountedReads(np.ndarray):
    """A shard table that counts the reads of its rows by an index array (`table[rows]`)."""

    reads = 0

    def __getitem__(self, index):
        if isinstance(index, (np.ndarray, list)):
            _CountedReads.reads += 1
        return super().__getitem__(index)


def test_regression_each_open_room_check_summed_the_groups_items_shards(monkeypatch):
    """1380 items of 40-47 tokens on 64 ranks at 1000 tokens a rank (99 % of them): at degree 8 their shards of
    5-6 tokens leave the bounds on a group's fullest rank (its items' fewest to most shard tokens) open as groups
    fill, and the deal finds no room, as the giants_ties micro-batch's.  Each open check read the group's items'
    shards (21 reads); the table is read once now (its rows, in `two_tiers`), and the answer is the reference's."""
    lengths = 40 + np.random.default_rng(0).integers(0, 8, 1380)
    problem = replace(make_problem(lengths, 64, cost=COST), max_tokens_per_rank=1000)
    spec, long = ContextParallel(gpus_per_node=GPUS), np.arange(lengths.size)
    times = planner.TimeTable(problem, spec, GPUS, long)
    reference = _reference_two_tiers(problem, spec, times, long, 0.0, planner.water_level)
    times.shards[8] = times.shards[8].view(_CountedReads)
    _CountedReads.reads = 0
    deals, deal = [], tiers._deal
    monkeypatch.setattr(tiers, "_deal", lambda *args: deals.append(args[6]) or deal(*args))
    found = tiers.two_tiers(problem, spec, GPUS, times, long, 0.0, planner.water_level)
    assert deals == [0] and _CountedReads.reads == 1
    _same_layout(found, reference)

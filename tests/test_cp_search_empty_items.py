"""The CP local search weighs no move of an unsplit item of no time: the rank it leaves keeps its load, so such a
move never lowers the makespan (issue 24: zeros_giants, 90 % empty items, D = 2560 x 16)."""

import numpy as np

from orchmllm import ContextParallel, CostModel
from orchmllm.balancers.context_parallel import search
from orchmllm.balancers.problem import make_problem


def test_regression_the_makespan_ranks_empty_items_were_weighed_as_moves(monkeypatch):
    """A rank holding a long item and 50 empty ones: its block moves weighed 51 items, now the long one only; the
    search still splits the long item over the idle ranks."""
    weighed = []
    block_moves = search._State._block_moves

    def counted(self, rank, items, *args):
        weighed.extend(items.tolist())
        return block_moves(self, rank, items, *args)

    monkeypatch.setattr(search._State, "_block_moves", counted)
    lengths = np.array([400] + [0] * 50 + [30, 30])
    problem = make_problem(lengths, 4, cost=CostModel(linear=1.0))
    spec = ContextParallel(degrees=(1, 2, 4), gpus_per_node=4, seconds_per_cost=1.0, latency_s=0.0,
                           kv_bytes_per_token=0.0, half_efficiency_tokens=0.0)
    start = np.array([0] * 51 + [1, 2])
    start_after, degree_after, (loads, _, _) = search.improve(problem, spec, 4, start, np.ones(53, dtype=np.int64),
                                                              0.0)
    assert 0 in weighed and not set(weighed) & set(range(1, 51))
    assert degree_after[0] > 1 and float(loads.max()) < 400.0

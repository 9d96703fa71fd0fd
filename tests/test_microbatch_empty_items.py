"""Padding a batch with empty items (no tokens, no cost) never changes `balance_microbatches`' step.

probe27 P27-07: 11 items on 4 ranks, step 16.3; with two empty items appended the 13 items passed the exact
search's MAX_ITEMS = 12 and took the heuristic: 16.5.  The kernels now plan the items that cost or hold tokens
(`microbatch.empty.apart_from_empty_items`) and deal the empty ones one a cell in turn.
"""

import numpy as np
import pytest

from orchmllm import balance_microbatches
from orchmllm.balancers.microbatch.exact import MAX_ITEMS
from orchmllm.topology import Topology

LENGTHS = [2026, 3923, 2874, 637, 2532, 2036, 2821, 2899, 2848, 2860, 4370]
COSTS = [3.3, 0.8, 6.8, 7.4, 4.5, 8.2, 2.8, 7.1, 6.5, 4.0, 7.8]


def plan(lengths, costs, **options):
    return balance_microbatches(lengths, 4, costs=costs, max_tokens_per_microbatch=7456, microbatch_overhead=0.5,
                                **options)


@pytest.mark.parametrize("options", [{}, {"num_microbatches": 2}, {"algorithm": "exact"},
                                     {"sources": [i % 4 for i in range(11)], "topology": Topology(2, 2)}],
                         ids=["M-free", "M2", "exact", "sources"])
def test_empty_items_keep_the_step(options):
    assert len(LENGTHS) + 2 > MAX_ITEMS  # the empty items would push the instance past the exact search
    alone = plan(LENGTHS, COSTS, **options)
    positions = [0, 5, 11]  # spread among the others
    lengths, costs = np.insert(LENGTHS, positions, 0), np.insert(COSTS, positions, 0.0)
    if "sources" in options:
        options = dict(options, sources=np.insert(options["sources"], positions, [1, 2, 3]))
    padded = plan(lengths, costs, **options)
    assert padded.step_cost == alone.step_cost == 16.3
    others = np.flatnonzero(lengths)
    assert (padded.rank[others] == alone.rank).all() and (padded.microbatch[others] == alone.microbatch).all()
    empty_cells = padded.microbatch[lengths == 0] * 4 + padded.rank[lengths == 0]
    if "sources" not in options:  # dealt one a cell, from the cells holding the fewest items
        assert len(set(empty_cells.tolist())) == 3


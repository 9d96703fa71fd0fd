"""Whole items that crowd the ranks (P22-14): more items cost over half the bound than there are ranks, none of them
a giant, so the canonical allotment splits nothing and every plan without splitting puts two of them on a rank.
The split planner now runs there, its layout moving the shortest of the excess to degree 2
(`pairing.pigeonhole_degrees`), whose halves may share ranks with whole items (the layout and the search go on from
there; at 64 ranks they end at degree 8)."""

import numpy as np
import pytest

from orchmllm import ContextParallel, Topology, balance
from orchmllm.study.models import MODELS

COST = MODELS["84b"].stages()[-1].cost


def crowded_mix(num_ranks: int, ratio: float, seed: int) -> np.ndarray:
    """32 items a rank: `ratio` x D items of ~100k tokens (0.5-0.6 of a rank's mean load) among items of 1-3k."""
    rng = np.random.default_rng(seed)
    n = 32 * num_ranks
    giant = np.zeros(n, dtype=bool)
    giant[rng.choice(n, int(ratio * num_ranks), replace=False)] = True
    return np.where(giant, rng.integers(90000, 110000, n), rng.integers(1000, 3000, n)).astype(np.int64)


@pytest.mark.parametrize("ratio", [1.1, 1.5])
def test_regression_items_over_half_the_bound_crowding_the_ranks_were_never_split(ratio):
    """768 items of ~100k tokens among 15k of ~2k on 512 ranks (the probe's case, here 64 ranks): no item splits at
    the bound, so the split planner never ran and the plan was today's, two whole items on some ranks (gap 0.056 at
    1.5 x D, 0.032 at 1.1 x D).  Now some of them split: within 2 % of the bound, below today's plan."""
    lengths = crowded_mix(64, ratio, 5)
    plan = balance(lengths, 64, cost=COST, context_parallel=ContextParallel(),
                   topology=Topology(num_nodes=8, gpus_per_node=8))
    today = balance(lengths, 64, cost=COST)
    assert plan.makespan <= 1.02 * plan.lower_bound and plan.makespan < today.makespan
    assert (np.asarray(plan.degree)[lengths > 50000] > 1).any()


def test_items_that_fit_one_a_rank_are_not_split():
    """0.9 x D such items: each rank holds one whole, so nothing crowds and the plan is today's."""
    lengths = crowded_mix(64, 0.9, 5)
    plan = balance(lengths, 64, cost=COST, context_parallel=ContextParallel(),
                   topology=Topology(num_nodes=8, gpus_per_node=8))
    assert not plan.split_items.size
    assert plan.makespan == balance(lengths, 64, cost=COST).makespan

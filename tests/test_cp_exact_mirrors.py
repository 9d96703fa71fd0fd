"""The exact split search skips blocks mirroring a twin half tried before (probe25 P25-05): fewer nodes, same
optimum."""

from dataclasses import replace

import numpy as np
import pytest

from orchmllm import ContextParallel, CostModel
from orchmllm.balancers.context_parallel import exact
from orchmllm.balancers.problem import make_problem

T = 32768
COST_84B = CostModel(linear=426233561088.0, quadratic=3932160.0)  # study.models MODELS['84b'].llm, causal


def _search(lengths, num_ranks, spec, cap, cost, mirrors=True):
    problem = replace(make_problem(np.asarray(lengths), num_ranks, cost=cost), max_tokens_per_rank=cap)
    search = exact._Search(problem, spec, spec.gpus_per_node, np.inf)
    if not mirrors:
        search._mirrored = lambda start, degree: False
    search.run(0, 0.0)
    return search


def test_items_just_over_half_a_cell_take_few_nodes():
    """P25-05's pass: 8 items of 51-60 % of the budget on 8 ranks took 9800 nodes (a node budget of 20 000 per
    micro-batch pass, ~30 passes a plan); the twins' mirrors are skipped now."""
    lengths = np.random.default_rng(11).integers(int(T * 0.51), int(T * 0.6), 8)
    search = _search(lengths, 8, ContextParallel(), T, COST_84B)
    full = _search(lengths, 8, ContextParallel(), T, COST_84B, mirrors=False)
    assert full.nodes > 5000 and search.nodes <= 1000
    assert search.best == full.best


def test_a_search_cut_short_without_mirrors_finishes_with_them():
    """Seed 3: the search without mirrors ran out of nodes above the optimum the mirrored one proves."""
    lengths = np.random.default_rng(3).integers(int(T * 0.51), int(T * 0.6), 8)
    search = _search(lengths, 8, ContextParallel(), T, COST_84B)
    full = _search(lengths, 8, ContextParallel(), T, COST_84B, mirrors=False)
    assert full.nodes > exact.EXACT_NODES and search.nodes <= exact.EXACT_NODES
    assert search.best < full.best


@pytest.mark.parametrize("seed", range(40))
def test_mirrors_keep_the_optimum(seed):
    """Same optimum (and proof) with and without the mirrors, over node sizes the halves' swap does and does not
    keep (3, 6), caps, inter-node groups and latency; never worse where the plain search ran out of nodes."""
    rng = np.random.default_rng(seed)
    num_ranks, gpus = int(rng.choice([2, 4, 6, 8])), int(rng.choice([2, 3, 4, 6, 8]))
    lengths = rng.integers(1, 60, int(rng.integers(1, 8)))
    cap = None if seed % 2 else int(lengths.max()) // 2 + 1 + int(rng.integers(0, 20))
    degrees = tuple(c for c in (1, 2, 4, 8) if c <= num_ranks)
    spec = ContextParallel(degrees=degrees, gpus_per_node=gpus, allow_inter_node=bool(seed % 3 or degrees[-1] > gpus),
                           latency_s=float(seed % 4 == 0) / 2, kv_bytes_per_token=0.0,
                           half_efficiency_tokens=4.0 * (seed % 5 == 0), seconds_per_cost=1.0)
    cost = CostModel(linear=1, quadratic=0.05)
    search, full = _search(lengths, num_ranks, spec, cap, cost), _search(lengths, num_ranks, spec, cap, cost, False)
    assert search.nodes <= full.nodes
    if full.nodes <= exact.EXACT_NODES:
        assert search.best == full.best and (search.best_choice is None) == (full.best_choice is None)
    else:
        assert search.best <= full.best

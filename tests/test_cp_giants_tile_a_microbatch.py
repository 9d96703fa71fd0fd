"""Giants that hold their ranks alone and together tile the D ranks within D · T tokens share a micro-batch past the
fill's room (`grouping.group_microbatches`): the 95 % room left the second of two such giants (95.7 % of D · T) to
lead micro-batch 1, a second pass of a giant's time (documents, D 64 x 32, 2 %, seed 401: 1.1095x the bound)."""

import numpy as np

from orchmllm import ContextParallel, balance_microbatches
from orchmllm.balancers.context_parallel.grouping import group_microbatches
from orchmllm.balancers.context_parallel.microbatch_bound import split_bound
from orchmllm.study.models import MODELS

COST = MODELS["84b"].llm.cost(causal=True)
SPEC = ContextParallel()
NUM_RANKS, BUDGET = 16, 32768


def _lengths() -> np.ndarray:
    """Two giants of degree 8 (shards over T / 2: each holds its 8 ranks alone) and 120 small items."""
    small = np.random.default_rng(0).integers(500, 12_000, 120)
    return np.concatenate(([252_000, 250_000], small)).astype(np.int64)


def test_regression_giants_that_tile_the_ranks_share_micro_batch_0():
    lengths = _lengths()
    _, fewest, _, items = split_bound(lengths, NUM_RANKS, SPEC, COST, BUDGET, 0.0, None)
    room = int(0.95 * NUM_RANKS * BUDGET)
    microbatch = group_microbatches(items, NUM_RANKS, max(fewest, -(-int(lengths.sum()) // room)), room)
    assert microbatch[0] == microbatch[1] == 0
    assert np.bincount(microbatch, weights=lengths)[0] <= NUM_RANKS * BUDGET


def test_the_plan_runs_the_giants_in_one_pass():
    """Was 1.454x the certified bound (the giants in micro-batches 0 and 1), now 1.019x."""
    plan = balance_microbatches(_lengths(), NUM_RANKS, cost=COST, max_tokens_per_microbatch=BUDGET,
                                context_parallel=SPEC)
    assert plan.microbatch[0] == plan.microbatch[1]
    assert plan.step_cost <= 1.05 * plan.lower_bound and plan.cell_tokens.max() <= BUDGET

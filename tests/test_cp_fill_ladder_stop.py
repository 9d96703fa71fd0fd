"""The split micro-batch fills stop at the first complete plan within RETRY_GAP of the bound, the repaired plan's too.

The fills went on after a repaired plan within RETRY_GAP of the bound (a fill's plan that close ended them):
ties_giant at D = 512 x 16 planned 5 more fills for the same plan, 5.5x the default mix's time (1.7x now)."""

import inspect

import numpy as np
import pytest

from orchmllm import ContextParallel, balance_microbatches
from orchmllm.balancers.context_parallel import microbatch
from orchmllm.study.models import MODELS

COST = MODELS["84b"].llm.cost(causal=True)
LENGTHS = np.full(64 * 16, 40000)  # ties_giant at D = 64: the first fill has no layout, its repair 1.013x the bound
NUM_RANKS, BUDGET = 64, 32768


def _free_fills(monkeypatch) -> list:
    """One entry per fill of the free M's ladder (`_split_cells` with M not fixed), its micro-batch count."""
    fills, original = [], microbatch._split_cells
    signature = inspect.signature(original)

    def spy(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        if not arguments["fixed"]:
            fills.append(arguments["num_microbatches"])
        return original(*args, **kwargs)
    monkeypatch.setattr(microbatch, "_split_cells", spy)
    return fills


@pytest.mark.parametrize("gap, one_fill", [(None, True), (0.01, False)], ids=["within", "above"])
def test_regression_a_repaired_plan_within_the_gap_ends_the_fills(monkeypatch, gap, one_fill):
    if gap is not None:
        monkeypatch.setattr(microbatch, "RETRY_GAP", gap)
    fills = _free_fills(monkeypatch)
    plan = balance_microbatches(LENGTHS, NUM_RANKS, cost=COST, max_tokens_per_microbatch=BUDGET,
                                context_parallel=ContextParallel())
    assert plan.lower_bound * 1.01 < plan.step_cost <= plan.lower_bound * 1.03
    assert (len(fills) == 1) == one_fill
    assert plan.split_items.size == LENGTHS.size and plan.cell_tokens.max() <= BUDGET
    assert plan.digest() == balance_microbatches(LENGTHS, NUM_RANKS, cost=COST, max_tokens_per_microbatch=BUDGET,
                                                 context_parallel=ContextParallel()).digest()

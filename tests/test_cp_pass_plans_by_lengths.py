"""CP micro-batch passes are planned once per sequence of lengths, not per set of items: a pass plan, its bound and
its certificate depend only on its items' lengths in order (issue 24: the ties_giant family, every item 40000
tokens at T = 32k, planned the same micro-batch of equal items again and again)."""

import numpy as np

from orchmllm import ContextParallel, CostModel, balance, balance_microbatches
from orchmllm.balancers.context_parallel import microbatch

T = 32768
COST_84B = CostModel(linear=426233561088.0, quadratic=3932160.0)  # study.models MODELS['84b'].llm, causal


def test_regression_equal_items_in_other_micro_batches_were_planned_again(planned_passes):
    """16 x 16 items of 40000 tokens: 23 pass plans before, each micro-batch of equal items planned anew; now one
    per distinct micro-batch size.  Every pass is the plan `balance` makes of its items alone."""
    calls = planned_passes
    lengths, spec = np.full(256, 40000), ContextParallel()
    plan = balance_microbatches(lengths, 16, cost=COST_84B, max_tokens_per_microbatch=T, context_parallel=spec)
    assert len(calls) <= 5 and len(calls) == len(set(calls))
    for m, planned in enumerate(plan.passes):
        items = np.flatnonzero(plan.microbatch == m)
        alone = balance(lengths[items], 16, cost=COST_84B, algorithm="lpt", max_tokens_per_rank=T,
                        context_parallel=spec)
        assert planned.assignment.tolist() == alone.assignment.tolist()
        assert planned.degree.tolist() == alone.degree.tolist() and planned.makespan == alone.makespan


def test_regression_the_packing_bound_of_equal_micro_batches_was_built_again(monkeypatch):
    """64 x 16 items of 40000 tokens: the later fills' deferrals built 84 packing bounds (`Pieces`) of micro-batches
    of equal lengths; now one per sequence of lengths (6), the same plan."""
    made = []

    class Counted(microbatch.Pieces):
        def __init__(self, lengths, *args):
            made.append(hash(lengths.tobytes()))
            super().__init__(lengths, *args)

    monkeypatch.setattr(microbatch, "Pieces", Counted)
    monkeypatch.setattr(microbatch, "RETRY_GAP", 0.01)  # its repaired plan (1.013x the bound) ends the fills at 3 %
    plan = balance_microbatches(np.full(1024, 40000), 64, cost=COST_84B, max_tokens_per_microbatch=T,
                                context_parallel=ContextParallel())
    assert made and len(made) == len(set(made)) <= 10 and plan.num_microbatches == 22

"""A fixed M's fills are deferred against the best plan found, as a free M's are (`microbatch._deferred`): a fill
whose floor (its micro-batches' peaks found and pass bounds) is above the best step cannot become the best, and a
fixed M has no repaired plan, so its plan is the one every fill planned would give, in fewer passes (zeros_giants,
D = 512 x 16, seed 11: the free M's fixed retries (`_more_counts`) 133 -> 125 passes)."""

import numpy as np

from orchmllm import ContextParallel, balance_microbatches
from orchmllm.balancers.context_parallel import microbatch
from orchmllm.benchmarks.bench_context_parallel import COST, issue24_families

SPEC = ContextParallel()


def _planned(lengths: np.ndarray, count: int, fixed_deferred: bool, monkeypatch) -> tuple:
    """(the plan of `count` micro-batches fixed, the passes planned, the fixed fills deferred); with
    `fixed_deferred` False, every fill of a fixed M planned (the parent's rule)."""
    passes, deferred, plan_pass, cells = [0], [0], microbatch._plan_pass, microbatch._split_cells

    def counted(*args, **kwargs):
        passes[0] += 1
        return plan_pass(*args, **kwargs)

    def split_cells(*args, **kwargs):
        if args[9] and not fixed_deferred:  # a fixed M (`_split_cells`' `fixed`)
            kwargs["defer"] = None
        found = cells(*args, **kwargs)
        deferred[0] += args[9] and isinstance(found[0], microbatch._Deferred)
        return found

    with monkeypatch.context() as patch:
        patch.setattr(microbatch, "_plan_pass", counted)
        patch.setattr(microbatch, "_split_cells", split_cells)
        plan = balance_microbatches(lengths, 16, max_tokens_per_microbatch=32768, cost=COST, context_parallel=SPEC,
                                    num_microbatches=count)
    return plan, passes[0], deferred[0]


def test_a_fixed_count_plan_is_the_one_every_fill_planned_gives(monkeypatch):
    """pow2, D = 16 x 8, seed 2, M = 4 fixed: 3 of its fills deferred."""
    lengths, count = issue24_families(16, 8, 2)["pow2"], 4  # 128 powers of two, 16 to 64k tokens
    plan, passes, deferred = _planned(lengths, count, True, monkeypatch)
    every, every_passes, _ = _planned(lengths, count, False, monkeypatch)
    assert plan.digest() == every.digest() and plan.step_cost == every.step_cost
    assert plan.lower_bound == every.lower_bound and plan.status == every.status
    assert deferred and passes < every_passes

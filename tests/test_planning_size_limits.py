"""Regressions of issue 24 (fix24d): planning inputs whose work grows past any bound are refused before the
work, naming the limit. Named after their cause."""

import re

import numpy as np
import pytest

from orchmllm.balancers import balance_microbatches
from orchmllm.balancers.pipeline.spec import MAX_PIPELINE_SLOTS, Pipeline
from orchmllm.balancers.validation import SizeLimitError

LENGTHS = [9000, 300, 200, 100, 4000, 50, 60, 70, 500, 800, 1200, 30]


@pytest.fixture
def planner_runs(monkeypatch):
    """The calls of the pipeline planner's work (`arrange`: the shape program, the timed starts, the search)."""
    from orchmllm.balancers.pipeline import planner

    calls, arrange = [], planner.arrange

    def counted(*args, **kwargs):
        calls.append(args[3])  # its number of micro-batches
        return arrange(*args, **kwargs)

    monkeypatch.setattr(planner, "arrange", counted)
    return calls


@pytest.mark.parametrize("pipeline, num_microbatches", [(Pipeline(stages=8), 513), (Pipeline(stages=2), 2049),
                                                        (Pipeline(stages=32, schedule="interleaved", virtual_stages=4),
                                                         64)])
def test_regression_pipeline_planning_grew_with_the_square_of_its_micro_batches(pipeline, num_microbatches,
                                                                               planner_runs):
    """Cause (fix24d F24-01): a pipeline's planning walks the schedule's 2·M·P·v operations for every candidate
    and every dual path (O(M² · P · v)), with no limit on M but the cells': M = 1000 over 2 stages took 15 s on
    12 items, M = 10 000 grew past 15 GB.  Micro-batches × model chunks are at most MAX_PIPELINE_SLOTS, refused
    before the planner runs."""
    chunks = pipeline.stages * pipeline.virtual_stages
    with pytest.raises(SizeLimitError, match=rf"`num_microbatches`={num_microbatches} micro-batches × {chunks} model "
                                             rf"chunks must be at most MAX_PIPELINE_SLOTS = {MAX_PIPELINE_SLOTS}"):
        balance_microbatches(LENGTHS, 4, max_tokens_per_microbatch=16384, num_microbatches=num_microbatches,
                             pipeline=pipeline)
    assert planner_runs == []


def test_a_free_number_of_micro_batches_beyond_the_pipeline_limit_is_refused_naming_the_budget(planner_runs):
    """Items that need more micro-batches than the limit allows (one item per micro-batch here)."""
    with pytest.raises(SizeLimitError, match=r"micro-batches × 4 model chunks must be at most MAX_PIPELINE_SLOTS .*"
                                             r"a larger `max_tokens_per_microbatch`"):
        balance_microbatches(np.full(4 * 1100, 1000), 4, max_tokens_per_microbatch=1000, pipeline=Pipeline(stages=4))
    assert planner_runs == []
    balance_microbatches(LENGTHS, 4, max_tokens_per_microbatch=16384, num_microbatches=2, pipeline=Pipeline(stages=2))
    assert planner_runs == [2]  # within the limit the planner runs: the count above watches the right call


def test_regression_a_node_size_past_int64_overflowed_in_the_context_parallel_blocks():
    """Cause (fix24d F24-02): `ContextParallel(gpus_per_node=10**30)` passed validation (an int >= 1), and
    `balance` then died in numpy with a raw OverflowError (Python int too large to convert to C long) placing
    blocks of ranks.  A node holds at most MAX_RANKS ranks, as `num_ranks`."""
    from orchmllm.balancers import balance
    from orchmllm.balancers.context_parallel.spec import ContextParallel
    from orchmllm.balancers.problem import MAX_RANKS

    with pytest.raises(ValueError, match=rf"`gpus_per_node` must be at most 2\*\*20 = {MAX_RANKS} \(a node's "
                                         rf"ranks, as `num_ranks`\); got 1000000000000000000000000000000"):
        balance([90000, 300, 200, 100, 4000, 50, 60, 70], 8, context_parallel=ContextParallel(gpus_per_node=10**30))
    assert ContextParallel(gpus_per_node=MAX_RANKS).gpus_per_node == MAX_RANKS


GIANTS = [*range(100, 5000, 163), 60000, 90000]


@pytest.mark.filterwarnings("error")
@pytest.mark.parametrize("field, value", [("half_efficiency_tokens", 1e308), ("latency_s", 1e300),
                                          ("kv_bytes_per_token", 1e300), ("seconds_per_cost", 1e308)])
def test_regression_split_times_near_float64s_limit_ran_nan_through_the_planner(field, value):
    """Cause (probe13 P13-15, fix24d F24-03): the split times were checked finite one by one, not as the sums the
    planner makes of them nor the products it forms on the way: `half_efficiency_tokens=1e308` ran inf and nan
    through the bound, the pairing and the deal (7 numpy RuntimeWarnings) and returned status optimal at makespan
    1e308, the nan changing the other ranks' plan; `latency_s=1e300` printed numpy's overflow warnings before the
    clear refusal, `seconds_per_cost=1e308` planned through them (attention time inf).  Split times whose sums or
    intermediate products overflow float64 are refused, with no numpy warning."""
    from orchmllm.balancers import CostModel, balance
    from orchmllm.balancers.context_parallel.spec import ContextParallel

    cost = CostModel.from_transformer(num_layers=32, hidden_size=4096)
    with pytest.raises(ValueError, match=r"`context_parallel`'s split times overflow float64"):
        balance(GIANTS, 8, cost=cost, max_tokens_per_rank=50000, context_parallel=ContextParallel(**{field: value}))


@pytest.mark.parametrize("plan", [
    lambda limit: balance_microbatches([9, 8, 7, 6, 5, 4, 3, 3], 2, max_tokens_per_microbatch=12, time_limit=limit),
    lambda limit: balance_microbatches([9, 8, 7, 6, 5, 4, 3, 3], 2, max_tokens_per_microbatch=12, time_limit=limit,
                                       algorithm="exact"),
    lambda limit: balance_microbatches([9, 8, 7, 6, 5, 4, 3, 3], 2, max_tokens_per_microbatch=12, time_limit=limit,
                                       pipeline=Pipeline(stages=2))], ids=["auto", "exact", "pipeline"])
def test_regression_a_finite_time_limit_past_float_range_of_work_raised_overflow_error(plan):
    """Cause (fix24d F24-12): time limits become operation budgets, int(time_limit · operations per second), and
    `time_limit=1e308` (finite, so accepted) made that product inf: a raw "OverflowError: cannot convert float
    infinity to integer" from balance_microbatches.  A time limit is at most MAX_TIME_LIMIT seconds."""
    from orchmllm.balancers.problem import MAX_TIME_LIMIT

    with pytest.raises(ValueError, match=re.escape(f"`time_limit` must be at most MAX_TIME_LIMIT = {MAX_TIME_LIMIT:g} "
                                                   f"seconds")):
        plan(1e308)
    assert plan(MAX_TIME_LIMIT).num_microbatches >= 1

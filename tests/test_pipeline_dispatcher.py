"""`PostBalancingDispatcher(pipeline=)` over real gloo ranks: every rank plans the same pipeline step from
the exchanged lengths and runs micro-batch m of the plan m-th, with exactly the items of its cell (replica,
slot m), each with its own data; split items (`context_parallel`) with a pipeline are refused."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from orchmllm.balancers import ContextParallel, Pipeline  # noqa: E402
from orchmllm.runtime import PostBalancingDispatcher  # noqa: E402
from orchmllm.runtime.launch import spawn  # noqa: E402
from orchmllm.testing.pipeline import replica_step  # noqa: E402

LENGTHS = {0: [9, 1, 7, 12, 3, 5, 6], 1: [2, 2, 8], 2: [15, 4, 4, 11, 1]}  # 90 tokens, 3 replicas
BUDGET, MICROBATCHES = 16, 4
PIPELINES = [Pipeline(stages=2, schedule="1f1b"), Pipeline(stages=2, schedule="interleaved", virtual_stages=2)]


def pipeline_job(rank, size, pipeline):
    lengths = LENGTHS[rank]
    tokens = torch.arange(sum(lengths)) + 1000 * rank  # token t of rank r's items: unique over the step
    dispatcher = PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET, num_microbatches=MICROBATCHES,
                                         pipeline=pipeline)
    plan = dispatcher.plan(lengths)
    moved = dispatcher.dispatch({"tokens": tokens}, plan)
    ran = [(micro.index, micro.items.tolist(), micro.data["tokens"].tolist())
           for micro in dispatcher.microbatches(plan, moved)]
    step = plan.balance.pipeline
    return (plan.balance.digest(), step.step_time, step.replica_times.tolist(), plan.balance.rank.tolist(),
            plan.balance.microbatch.tolist(), plan.lengths.tolist(),
            (plan.balance.cell_loads.T + plan.balance.microbatch_overhead).tolist(), ran)


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: p.schedule)
def test_every_rank_runs_its_cells_of_the_pipeline_plan_in_slot_order(pipeline):
    results = spawn(pipeline_job, len(LENGTHS), args=(pipeline,), timeout_s=120)
    digest, step, times, rank_of, slot_of, lengths, costs, _ = results[0]
    assert all(r[:7] == results[0][:7] for r in results)  # the same plan and step on every rank
    rank_of, slot_of, lengths = np.array(rank_of), np.array(slot_of), np.array(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    home = np.repeat(np.arange(len(LENGTHS)), [len(LENGTHS[r]) for r in LENGTHS])
    first = np.concatenate([[0], np.cumsum([len(LENGTHS[r]) for r in LENGTHS])])
    for replica, (*_, ran) in enumerate(results):
        assert [index for index, _, _ in ran] == list(range(MICROBATCHES))
        for index, items, data in ran:
            assert items == np.flatnonzero((rank_of == replica) & (slot_of == index)).tolist()
            expected = [1000 * int(home[i]) + t for i in items for t in range(
                int(starts[i] - starts[first[home[i]]]), int(starts[i + 1] - starts[first[home[i]]]))]
            assert data == expected  # each item's own tokens, whatever rank drew it
            assert int(lengths[items].sum()) <= BUDGET
        # the reported time of this replica is the event simulation of its cells in run order
        assert times[replica] == replica_step(pipeline, costs[replica])
    assert step == max(times)


def test_dispatcher_refuses_split_items_with_a_pipeline():
    with pytest.raises(ValueError, match=r"`pipeline` and `context_parallel` cannot be combined yet: a split "
                                         r"item's group would run its micro-batch in lockstep"):
        PostBalancingDispatcher(max_tokens_per_microbatch=BUDGET, pipeline=Pipeline(stages=2),
                                context_parallel=ContextParallel(degrees=(1, 2)))

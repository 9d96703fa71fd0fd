"""The pipeline's slot limit (`spec.MAX_PIPELINE_SLOTS`) bounds the work of the best shape's linear program
(`profile.best_profile`: one row per edge, start and end of the schedule's 2·M·P·v operations; HiGHS's time grows
with about their square), counted in rows, not timed."""

import pytest

from orchmllm.balancers import Pipeline
from orchmllm.balancers.pipeline.profile import _Graph
from orchmllm.balancers.pipeline.spec import MAX_PIPELINE_SLOTS
from orchmllm.balancers.validation import SizeLimitError

PROGRAM_ROWS = 6144  # 3 rows per operation at 2048 operations: ~2.6 s CPU at most (interleaved 2 x 2, M 256)

PIPELINES = [Pipeline(stages=1), Pipeline(stages=2), Pipeline(stages=8), Pipeline(stages=128),
             Pipeline(stages=2, schedule="interleaved", virtual_stages=2),
             Pipeline(stages=4, schedule="interleaved", virtual_stages=2),
             Pipeline(stages=2, schedule="interleaved", virtual_stages=4),
             Pipeline(stages=8, schedule="interleaved", virtual_stages=16)]


def _largest_plannable(pipeline: Pipeline) -> int:
    m = MAX_PIPELINE_SLOTS // (pipeline.stages * pipeline.virtual_stages)
    return m - m % pipeline.stages if pipeline.schedule == "interleaved" else m


def test_regression_the_interleaved_limit_took_forty_seconds_of_shape_program():
    """Cause (probe31 P31-02): at the limit of 4096 slots, interleaved 4 x 2 at M = 512 spent ~40 s CPU (1F1B over
    8 stages at M = 512: 15 s) in `best_profile`'s linear program over 8192 operations and its path split, against
    0.2 s without the pipeline.  The limit is now 1024 slots, refused naming it."""
    pipeline = Pipeline(stages=4, schedule="interleaved", virtual_stages=2)
    with pytest.raises(SizeLimitError, match=rf"`num_microbatches`=512 micro-batches × 8 model chunks must be at "
                                             rf"most MAX_PIPELINE_SLOTS = {MAX_PIPELINE_SLOTS}"):
        pipeline.check_microbatches(512)
    with pytest.raises(SizeLimitError, match="MAX_PIPELINE_SLOTS"):
        Pipeline(stages=8).check_microbatches(512)


@pytest.mark.parametrize("pipeline", PIPELINES, ids=lambda p: f"{p.schedule}-{p.stages}x{p.virtual_stages}")
def test_the_largest_plannable_shape_program_stays_within_its_rows(pipeline):
    m = _largest_plannable(pipeline)
    assert pipeline.check_microbatches(m) == m
    graph = _Graph(pipeline, m)
    assert graph.tail.size + graph.start.size + graph.slot.size <= PROGRAM_ROWS


def test_issue_28s_sizes_stay_plannable():
    """P 4-8, M up to 32, the interleaved schedule over 2 chunks a stage: 512 slots at most."""
    for stages in (4, 8):
        for schedule, virtual in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
            assert Pipeline(stages=stages, schedule=schedule, virtual_stages=virtual).plannable(32)
